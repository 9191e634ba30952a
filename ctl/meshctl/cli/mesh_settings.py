# SPDX-License-Identifier: Apache-2.0
"""`meshctl mesh get` and `meshctl mesh set KEY=VALUE...`: the live cluster's mesh settings (the
etcd record `/meshctl/<cluster>/mesh`, or the ConfigMap of the Kubernetes backend).

`set` judges the new settings as a topology file's `mesh:` section is judged (records.parse_mesh,
then the same admission every agent runs), prints what changes on every node (mesh.plandiff) and
only then, without `--dry-run`, writes them: every agent re-plans from the record it watches.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import click

from meshctl.backends.base import ClusterState
from meshctl.cli.options import TEXT_FORMATS, output_option
from meshctl.cli.plan import Source, live_options
from meshctl.errors import InputError
from meshctl.mesh.admit import Rejection, admit_local
from meshctl.mesh.checks import topology_warnings
from meshctl.mesh.fields import unknown_field
from meshctl.mesh.model import MeshSettings, Topology
from meshctl.mesh.plandiff import diff_json, diff_text, diff_topologies, setting_text, settings_view
from meshctl.mesh.records import MESH_FIELDS, mesh_to_record, parse_mesh
from meshctl.mesh.render import table
from meshctl.process import gc_paused

STORES = ("etcd", "kubernetes")


def parse_assignments(args: Sequence[str]) -> dict[str, str]:
    """`KEY=VALUE` arguments to {key: value}; a key that is not a mesh setting, an argument without
    `=` or a key given twice is one InputError naming it."""
    out: dict[str, str] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if not sep or not key:
            raise InputError("KEY=VALUE", arg, f"is not KEY=VALUE (KEY one of {', '.join(MESH_FIELDS)})")
        if key not in MESH_FIELDS:
            raise unknown_field(key, MESH_FIELDS, "mesh")
        if key in out:
            raise InputError(f"mesh.{key}", arg, "is given twice")
        out[key] = value
    return out


def changed_settings(current: MeshSettings, changes: Mapping[str, str]) -> MeshSettings:
    """`current` with `changes` applied, parsed as a topology file's `mesh:` section is."""
    return parse_mesh({**settings_view(current), **changes}, "mesh")


def _warn(rejections: Sequence[Rejection]) -> None:
    for r in rejections:
        click.echo(f"warning: rejected {r.name}: {r.reason}", err=True)


def admitted_both(state: ClusterState, after: MeshSettings, changes: Mapping[str, str]) -> tuple[Topology, Topology]:
    """The topology the agents plan from now and under the new settings. New settings under which
    admission would turn away a record it admits now are refused (a topology file with them is an
    error): the line names the settings and the first record they would reject."""
    before, rejected_now = admit_local(state.topology())
    _warn([*state.rejections, *rejected_now])
    topo, rejected = admit_local(replace(state.topology(), mesh=after))
    now = {r.name for r in rejected_now}
    new = [r for r in rejected if r.name not in now]
    if new:
        given = " ".join(f"{k}={v}" for k, v in changes.items())
        raise InputError("mesh", given, f"would reject {new[0].name}: {new[0].reason}")
    for w in topology_warnings(topo):
        click.echo(f"warning: {w}", err=True)
    return before, topo


def _source(backend: str | None, lab_name: str | None, **store: Any) -> Source:
    """The settings' store: etcd unless --backend or --kubeconfig says kubernetes (Source decides
    that, and refuses --lab beside it)."""
    if backend is None and not store.get("kubeconfig"):
        backend = "etcd"
    return Source(path=None, backend=backend, lab_name=lab_name, **store).one_cluster()


def _store_options(f: Any) -> Any:
    f = live_options(f)
    return click.option("--backend", default=None, type=click.Choice(STORES),
                        help="Where the settings are: the cluster's etcd (the default: --etcd-* flags, or --lab NAME) "
                        "or the mesh ConfigMap of the Kubernetes API (implied by --kubeconfig).")(f)


@click.group("mesh")
def mesh() -> None:
    """The live cluster's mesh settings: show them, and change them with a per-node diff first."""


@mesh.command("get")
@_store_options
@output_option(TEXT_FORMATS)
def get(output: str, **store: Any) -> None:
    """Print the mesh settings every agent plans with now."""
    state = _source(**store).state()
    _warn(state.rejections)
    view = settings_view(state.mesh)
    if output == "json":
        click.echo(json.dumps(view, indent=2))
    else:
        click.echo(table([(k, setting_text(v) or "-") for k, v in view.items()], ["KEY", "VALUE"]))


@mesh.command("set")
@click.argument("assignments", nargs=-1, required=True, metavar="KEY=VALUE...")
@click.option("--dry-run", is_flag=True, help="Print what would change on every node; write nothing.")
@_store_options
@output_option(TEXT_FORMATS)
def set_(assignments: tuple[str, ...], dry_run: bool, output: str, **store: Any) -> None:
    """Change mesh settings (KEY as in a topology file's `mesh:` section): print per node the
    WireGuard peers, routes, fast-path entries and rungs that change, then write the settings."""
    changes = parse_assignments(assignments)
    changed_settings(MeshSettings(), changes)  # each value judged before any store is asked
    src = _source(**store)
    state = src.state()
    after = changed_settings(state.mesh, changes)
    before_topo, after_topo = admitted_both(state, after, changes)
    with gc_paused():
        diff = diff_topologies(before_topo, after_topo)
    click.echo(json.dumps(diff_json(diff), indent=2) if output == "json" else diff_text(diff))
    if dry_run:
        return
    if after == state.mesh:
        click.echo("the settings are unchanged: nothing written", err=True)
        return
    where = _write(src, after, changes)
    click.echo(f"wrote {where}", err=output == "json")


def _write(src: Source, after: MeshSettings, changes: Mapping[str, str]) -> str:
    """Store the new settings where the agents read them; the name of what was written."""
    if src.backend == "kubernetes":
        be = src.kube_backend()
        try:
            view = settings_view(after)
            be.write_settings({k: setting_text(view[k]) for k in changes})
            return f"configmap {be.namespace}/{be.configmap}"
        finally:
            be.close()
    from meshctl.backends.etcd import mesh_key

    client = src.etcd_client()
    try:
        client.put(mesh_key(src.cluster_name), json.dumps(mesh_to_record(after)))
    finally:
        client.close()
    return mesh_key(src.cluster_name)

