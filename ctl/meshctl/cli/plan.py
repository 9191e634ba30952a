"""Offline commands that read a topology file: `plan`, `graph`, `showconf`."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import click

from meshctl.backends.file import load_topology
from meshctl.errors import InputError, MeshError
from meshctl.mesh.model import GRANULARITIES, Granularity, Topology
from meshctl.mesh.plan import Remote, plan_node
from meshctl.mesh.render import graph_dot, plan_to_json, plan_to_table, showconf_node, showconf_peer

_file = click.option("-f", "--file", "path", required=True, type=click.Path(dir_okay=False),
                     help="Topology YAML.")


def _load_remotes(local: Topology, paths: tuple[str, ...]) -> list[Remote]:
    """Remote clusters' topology files, admitted against the local one (clustermesh rules)."""
    from meshctl.mesh.admit import admit_remotes, as_remote

    remotes = [as_remote(load_topology(p)) for p in paths]
    admitted, rejections = admit_remotes(local, remotes)
    for r in rejections:
        click.echo(f"warning: rejected {r.name}: {r.reason}", err=True)
    return admitted


@click.command()
@_file
@click.option("--node", required=True, help="The node whose plan to print.")
@click.option("--granularity", type=click.Choice(GRANULARITIES), help="Override the file's granularity.")
@click.option("--remote", "remotes", multiple=True, type=click.Path(dir_okay=False),
              help="Another cluster's topology file (cluster mesh); repeatable.")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table")
def plan(path: str, node: str, granularity: Granularity | None, remotes: tuple[str, ...], output: str) -> None:
    """Print one node's WireGuard peers, routes and fast-path entries."""
    topo = load_topology(path)
    if topo.node(node) is None:
        raise InputError("--node", node, f"is not a node in {Path(path).name}")
    p = plan_node(topo, node, _load_remotes(topo, remotes), granularity=granularity)
    if output == "json":
        click.echo(json.dumps(plan_to_json(p), indent=2))
    else:
        click.echo(plan_to_table(p))


@click.command()
@_file
@click.option("--granularity", type=click.Choice(GRANULARITIES), help="Override the file's granularity.")
@click.option("--render", "render_to", type=click.Path(dir_okay=False),
              help="Render with Graphviz to this file (format from its suffix: svg, png, pdf).")
def graph(path: str, granularity: Granularity | None, render_to: str | None) -> None:
    """Print the mesh as Graphviz DOT (solid: WireGuard, dotted: direct private pairs)."""
    from dataclasses import replace

    topo = load_topology(path)
    if granularity:
        topo = replace(topo, mesh=replace(topo.mesh, granularity=granularity))
    dot = graph_dot(topo)
    if not render_to:
        click.echo(dot, nl=False)
        return
    if shutil.which("dot") is None:
        raise MeshError("--render needs Graphviz's `dot` (apt-get install graphviz)")
    fmt = Path(render_to).suffix.lstrip(".") or "svg"
    p = subprocess.run(["dot", f"-T{fmt}", "-o", render_to], input=dot, text=True, capture_output=True)
    if p.returncode != 0:
        raise MeshError(f"dot -T{fmt}: {p.stderr.strip()}")
    click.echo(f"wrote {render_to}")


@click.command()
@_file
@click.argument("kind", type=click.Choice(["node", "peer"]))
@click.argument("name")
def showconf(path: str, kind: str, name: str) -> None:
    """Print the wg-quick config of a node, or the config a peer uses to join the mesh."""
    topo = load_topology(path)
    if kind == "node":
        if topo.node(name) is None:
            raise InputError("node", name, f"is not a node in {Path(path).name}")
        click.echo(showconf_node(topo, plan_node(topo, name)), nl=False)
    else:
        click.echo(showconf_peer(topo, name), nl=False)


COMMANDS: list[click.Command] = [plan, graph, showconf]
