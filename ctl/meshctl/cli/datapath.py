# SPDX-License-Identifier: Apache-2.0
"""`meshctl` commands of the datapath area: `maps dump` and `datapath load|unload|status`.

They read and change the pinned objects of one node. A lab node (`--node N` while a lab is up)
is found through the lab's state: its pin root and its network namespace (interface names are
resolved there). Elsewhere `--bpf-pin-root` and `--netns` say where to look; by default the node's
pins are under /sys/fs/bpf/meshctl and the current namespace is the node's.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from typing import Any, TypeVar

import click

from meshctl import defaults
from meshctl.cli import targets
from meshctl.cli.options import file_option, lab_option, node_option, option, output_option, pin_root_option
from meshctl.errors import InputError, MeshError

T = TypeVar("T")

_node = node_option(help="The node whose pins to read, by its name (the agent's --node; in a lab, found there; "
                    "default: every node pinned here, else this host's name).")
_lab = lab_option("Lab name, when several labs are up.")
_pin = pin_root_option(default=None, help=f"bpffs folder of the pins (default {defaults.PIN_ROOT}).")
_ns = click.option("--netns", default=None, help="Network namespace of the node (default: the lab's, or this one).")
_out = output_option()


def pinned_targets(node: str | None, lab: str | None, pin_root: str | None, netns: str | None, *,
                   host_default: bool = True) -> list[tuple[str, str, str | None]]:
    """The (node, pin root, netns) triples a command acts on: a lab node's, the named node's, or
    every node pinned under the root (none pinned: this host's name, unless not `host_default`)."""
    if node is not None and not pin_root and (lab is not None or targets.has_lab()):
        found = targets.lab("--lab").pins(lab, node)
        if found:
            return [(found.name, found.pin_root, netns or found.netns)]
    root = pin_root or defaults.PIN_ROOT
    if node is None:
        names = sorted(os.listdir(root)) if os.path.isdir(root) else []
        if not names and host_default:
            names = [socket.gethostname()]
        return [(n, root, netns) for n in names]
    return [(node, root, netns)]


def _in(ns: str | None, fn: Callable[[], T]) -> T:
    from meshctl.setns import in_netns

    if ns is not None and not os.path.exists(ns if ns.startswith("/") else f"/run/netns/{ns}"):
        raise InputError("--netns", ns, "is not a network namespace")
    return in_netns(ns, fn)


def _read(node: str, root: str, ns: str | None, counters: bool) -> dict[str, Any]:
    from meshctl.datapath import Datapath

    def read() -> dict[str, Any]:
        dp = Datapath.pinned(node, pin_root=root)
        try:
            out: dict[str, Any] = {"node": node, "counters": {k: {"packets": p, "bytes": b}
                                                              for k, (p, b) in dp.counters().items()}}
            if not counters:
                out["entries"] = dp.entries()
                out["pods"] = dp.pods()
                ranges = dp.global_ranges()
                if ranges:  # the cluster's global ranges (docs/clustermesh.md); absent without
                    out["global_ranges"] = ranges
            return out
        finally:
            dp.close()

    return _in(ns, read)


def _counters_table(c: dict[str, dict[str, int]]) -> list[str]:
    lines = [f"  {'ACTION':<10} {'PACKETS':>14} {'BYTES':>18}"]
    lines += [f"  {k:<10} {v['packets']:>14} {v['bytes']:>18}" for k, v in c.items()]
    return lines


@click.group()
def maps() -> None:
    """The fast path's pinned maps."""


@maps.command("dump")
@_node
@_lab
@_pin
@_ns
@_out
@click.option("--counters", "only_counters", is_flag=True, help="Only the per-action counters.")
def maps_dump(node: str | None, lab_name: str | None, pin_root: str | None, netns: str | None, output: str,
              only_counters: bool) -> None:
    """Every LPM entry (prefix, action, next hop, interface, encapsulation and outer addresses), the
    local pods and the counters."""
    dumps = [_read(n, root, ns, only_counters) for n, root, ns in pinned_targets(node, lab_name, pin_root, netns)]
    if output == "json":
        click.echo(json.dumps(dumps if node is None else dumps[0], indent=2))
        return
    for d in dumps:
        click.echo(f"node {d['node']}")
        if not only_counters:
            click.echo(f"  {'PREFIX':<28} {'ACTION':<8} {'NEXTHOP':<26} {'IFNAME':<12} {'ENCAP':<6} OUTER SRC -> DST")
            for e in d["entries"]:
                outer = f"{e['outer_src']} -> {e['outer_dst']}" if e.get("encap") else "-"
                click.echo(f"  {e['prefix']:<28} {e['action']:<8} {e['nexthop'] or '-':<26} {e['ifname'] or '-':<12} "
                           f"{e.get('encap') or '-':<6} {outer}".rstrip())
            click.echo(f"  ({len(d['entries'])} entries)")
            click.echo(f"  {'LOCAL POD':<28} HOST VETH")
            for p in d["pods"]:
                click.echo(f"  {p['ip']:<28} {p['ifname'] or p['ifindex']}")
            if d.get("global_ranges"):
                click.echo(f"  {'POD RANGE':<28} GLOBAL RANGE")
                for g in d["global_ranges"]:
                    click.echo(f"  {g['pod_range']:<28} {g['global_range']}")
        click.echo("\n".join(_counters_table(d["counters"])))


@click.group()
def datapath() -> None:
    """Load, unload or inspect one node's fast path (debugging; the agent does this itself)."""


@datapath.command("load")
@node_option(required=True, help="Node name (its pins go under PIN_ROOT/NODE).")
@_lab
@_pin
@_ns
@option("--private-interface", "private_if", aliases=("--private-if",), required=True, help="The private NIC.")
@option("--wg-interface", "tunnel_if", aliases=("--tunnel-if",), default=None,
        help="The WireGuard device (kilo0), if any.")
@option("--pod-interfaces", "pod_ifs", aliases=("--pod-if",), multiple=True,
        help="A host-side pod veth; repeatable.")
@file_option("topo_path", type=click.Path(dir_okay=False),
              help="Topology YAML: sync the node's fast-path entries from its plan.")
def datapath_load(node: str, lab_name: str | None, pin_root: str | None, netns: str | None, private_if: str,
                  tunnel_if: str | None, pod_ifs: tuple[str, ...], topo_path: str | None) -> None:
    """Load (or reopen) the programs, attach them and optionally sync the plan's entries."""
    from meshctl.datapath import Datapath
    from meshctl.node import discovery

    entries = None
    if topo_path:
        from meshctl.backends.file import load_topology
        from meshctl.mesh.plan import plan_node
        from meshctl.process import gc_paused

        topo = load_topology(topo_path)
        if topo.node(node) is None:
            raise InputError("--node", node, f"is not a node in {os.path.basename(topo_path)}")
        with gc_paused():
            entries = plan_node(topo, node).fastpath
    [(name, root, ns)] = pinned_targets(node, lab_name, pin_root, netns)

    def load() -> dict[str, Any]:
        dp = Datapath.open(name, pin_root=root)
        try:
            if dp.mode != "ebpf":
                raise MeshError(f"datapath: kernel-routes ({dp.reason})")
            dp.attach(private_if, tunnel_if, pod_ifs, pods=discovery.pod_routes(pod_ifs),
                      private4=discovery.private_ipv4(private_if), private6=discovery.private_ipv6(private_if))
            st = dp.sync(entries, private_if) if entries is not None else None
            return {"status": dp.status(), "sync": st}
        finally:
            dp.close()

    out = _in(ns, load)
    s = out["status"]
    click.echo(f"{name}: ebpf, {'loaded' if s['compiled'] else 'reopened'}, objects: {s['objects']}, "
               f"{len(s['links'])} links, {s['routes']} routes, {s['pods']} local pods")
    if out["sync"] is not None:
        st = out["sync"]
        click.echo(f"sync: {st.added} added, {st.changed} changed, {st.deleted} deleted")


@datapath.command("unload")
@node_option(required=True, help="Node name.")
@_lab
@_pin
@_ns
def datapath_unload(node: str, lab_name: str | None, pin_root: str | None, netns: str | None) -> None:
    """Detach the programs and remove the node's pinned maps (traffic keeps the kernel's routes)."""
    from meshctl.datapath import Datapath

    [(name, root, ns)] = pinned_targets(node, lab_name, pin_root, netns)
    _in(ns, lambda: Datapath.unload(name, pin_root=root))
    click.echo(f"{name}: unloaded (kernel routes)")


@datapath.command("build-objects")
@option("--out", "out", required=True, type=click.Path(file_okay=False),
        help="Folder to write the compiled objects to (the image's: /usr/lib/meshctl/bpf-objects).")
@pin_root_option(default=defaults.PIN_ROOT, help="bpffs folder under which bcc's throwaway maps go "
                 "(in build-<pid>, removed after); when it is not a writable bpffs (an image build), "
                 "a private bpffs mounted for the build.")
def datapath_build_objects(out: str, pin_root: str) -> None:
    """Compile with bcc the programs of every variant the feature probes can select, in the object
    cache's format, for nodes without kernel headers (the image build runs it; needs CAP_BPF)."""
    from pathlib import Path

    from meshctl.datapath import loader

    with loader.build_pin_dir(pin_root) as pin_dir:
        written = loader.build_objects(Path(out), pin_dir)
    for path in written:
        click.echo(f"wrote {path}")
    click.echo(f"{len(written)} variants built into {out}")


@datapath.command("status")
@_node
@_lab
@_pin
@_ns
@_out
def datapath_status(node: str | None, lab_name: str | None, pin_root: str | None, netns: str | None,
                    output: str) -> None:
    """Mode, programs, links and map sizes of the pinned fast path."""
    from meshctl.agent.status import objects_line
    from meshctl.datapath import Datapath, recorded_outcome

    rows: list[dict[str, Any]] = []
    for name, root, ns in pinned_targets(node, lab_name, pin_root, netns):
        if not os.path.exists(f"{root}/{name}/config"):  # never loaded, or on kernel routes since
            reason = f"nothing pinned under {root}"
            recorded = recorded_outcome(f"{root}/{name}")
            rows.append({"node": name, "mode": "kernel-routes", "reason": reason,
                         "objects": recorded or f"kernel routes: {reason}"})
            continue

        def st(name: str = name, root: str = root) -> dict[str, Any]:
            dp = Datapath.pinned(name, pin_root=root)
            try:
                return dp.status()
            finally:
                dp.close()

        rows.append(_in(ns, st))
    if output == "json":
        click.echo(json.dumps(rows if node is None else rows[0], indent=2))
        return
    for r in rows:
        click.echo(f"node {r['node']}: datapath {r['mode']}{' (' + r['reason'] + ')' if r.get('reason') else ''}")
        click.echo("  " + objects_line(r["objects"], r.get("objects_refused")))
        if r["mode"] != "ebpf":
            continue
        click.echo(f"  pins {r['pin_dir']} (layout {r['layout']}), {r['routes']} routes, {r['pods']} local pods, "
                   f"attached by {r['attach']}")
        ff = r["flow_filter"]
        state = f"on, {ff['slots_set']} of {ff['slots']} slots set" if ff["on"] else "off (every tuple looked up)"
        click.echo(f"  {r['flows']} tracked flows; flow filter {state}")
        rc = r["route_cache"]
        state = (f"on (generation {rc['generation']}), {rc['held']} of {rc['slots']} slots held"
                 if rc["generation"] else "off (every packet walks the trie)")
        click.echo(f"  route cache {state}; {rc['fills']} fills")
        click.echo("  programs " + ", ".join(f"{p}#{i}" for p, i in r["programs"].items()))
        if r.get("features"):
            f = r["features"]
            click.echo(f"  kernel features: tcx {'yes' if f['tcx'] else 'no (clsact filters)'}; "
                       f"missing: {', '.join(f['missing']) or 'nothing'}"
                       + (f"; fallbacks for: {', '.join(f['fallbacks'])}" if f.get("fallbacks") else ""))
        for lk in r["links"]:
            dev = f"{lk['ifname'] or '(gone)'}#{lk['ifindex']}"
            click.echo(f"  {lk['kind']} {lk['hook']:<12} {dev:<20} prog #{lk['prog_id']}")

