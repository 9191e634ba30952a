# SPDX-License-Identifier: Apache-2.0
"""What a change of mesh settings (or of a whole topology) does to every node: a pure function of
the plans before and after. `meshctl mesh set --dry-run` and `meshctl plan --diff` print it, so an
operator sees which WireGuard peers, routes, fast-path entries and rungs of which node move before
anything is written.

Items are matched by what identifies them in a plan: a peer by name, a route by destination, a
fast-path entry by prefix, a rung by the node it reaches. The same key on both sides with other
values is a change; a key on one side only is an addition or a removal.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Generic, TypeVar

from meshctl.mesh import global_ranges
from meshctl.mesh.model import MeshSettings, PathState, Topology
from meshctl.mesh.plan import FastPathEntry, NodePlan, PeerPlan, PlanCache, Route, plan_node
from meshctl.mesh.records import MESH_FIELDS
from meshctl.mesh.render import encap_text, fastpath_json, peer_json, route_json
from meshctl.mesh.segments import Remote

T = TypeVar("T")


@dataclass(frozen=True)
class Changes(Generic[T]):
    """One part of a node's plan (its peers, routes or fast-path entries) compared: the items only
    the new plan has, those only the old one has, and (old, new) pairs under one key that differ."""

    added: tuple[T, ...] = ()
    removed: tuple[T, ...] = ()
    changed: tuple[tuple[T, T], ...] = ()

    @property
    def count(self) -> int:
        return len(self.added) + len(self.removed) + len(self.changed)


@dataclass(frozen=True)
class FieldChange:
    """A named value that differs: a mesh setting, a node's leader or WireGuard address, or the
    path to one node (`key` is then that node's name). None: absent on that side."""

    key: str
    before: str | None
    after: str | None


@dataclass(frozen=True)
class NodeDiff:
    node: str
    fields: tuple[FieldChange, ...]  # leader, wireguard_ip; `plan` when the node is on one side only
    peers: Changes[PeerPlan]
    routes: Changes[Route]
    fastpath: Changes[FastPathEntry]
    rungs: tuple[FieldChange, ...]  # how this node reaches each other node

    @property
    def changed(self) -> bool:
        return bool(self.fields or self.rungs or self.peers.count or self.routes.count or self.fastpath.count)


@dataclass(frozen=True)
class MeshDiff:
    settings: tuple[FieldChange, ...]
    nodes: tuple[NodeDiff, ...]


def _changes(before: Iterable[T], after: Iterable[T], key: Callable[[T], Hashable]) -> Changes[T]:
    """Items matched by `key`, in the order of the new plan (removals in the order of the old)."""
    old = {key(x): x for x in before}
    new = {key(x): x for x in after}
    return Changes(
        added=tuple(x for k, x in new.items() if k not in old),
        removed=tuple(x for k, x in old.items() if k not in new),
        changed=tuple((old[k], x) for k, x in new.items() if k in old and old[k] != x),
    )


def _field_changes(before: Mapping[str, str | None], after: Mapping[str, str | None]) -> tuple[FieldChange, ...]:
    keys = [*before, *(k for k in after if k not in before)]
    return tuple(FieldChange(k, before.get(k), after.get(k)) for k in keys if before.get(k) != after.get(k))


def _node_fields(p: NodePlan | None) -> dict[str, str | None]:
    if p is None:
        return {"plan": None}
    return {"plan": "yes", "leader": p.leader, "wireguard_ip": str(p.wireguard_ip) if p.wireguard_ip else None,
            # what the node translates its pods to on the way out of the cluster (and back)
            "global_cidrs": global_ranges.as_text(p.global_cidrs) or None}


def diff_node(node: str, before: NodePlan | None, after: NodePlan | None) -> NodeDiff:
    """Node `node`'s plan `before` against `after` (None: the node has no plan on that side)."""
    fb, fa = _node_fields(before), _node_fields(after)
    if before is not None and after is not None:
        del fb["plan"], fa["plan"]  # a node on both sides: only what its plans hold
    return NodeDiff(
        node=node,
        fields=_field_changes(fb, fa),
        peers=_changes(before.peers if before else (), after.peers if after else (), lambda p: p.name),
        routes=_changes(before.routes if before else (), after.routes if after else (), lambda r: r.dst),
        fastpath=_changes(before.fastpath if before else (), after.fastpath if after else (), lambda e: e.prefix),
        rungs=tuple(sorted(_field_changes(before.paths if before else {}, after.paths if after else {}),
                           key=lambda r: r.key)),
    )


def diff_plans(before: Mapping[str, NodePlan], after: Mapping[str, NodePlan]) -> tuple[NodeDiff, ...]:
    """Every node of either side, by name."""
    return tuple(diff_node(n, before.get(n), after.get(n)) for n in sorted(before.keys() | after.keys()))


def settings_view(m: MeshSettings) -> dict[str, Any]:
    """Every mesh setting under its record key (records.MESH_FIELDS), as JSON values."""
    view: dict[str, Any] = {
        "granularity": m.granularity, "subnet": str(m.subnet),
        "subnet6": str(m.subnet6) if m.subnet6 is not None else None, "port": m.port, "intra_subnet": m.intra_subnet,
        "private_networks": [str(n) for n in m.private_networks], "allow_default_route": m.allow_default_route,
        "wireguard_addressing": m.wireguard_addressing,
        "global_cidrs": global_ranges.as_text(m.global_cidrs) or None,
        "service_cidrs": [str(n) for n in m.service_cidrs], "leader_hold": m.leader_hold,
        "leaders_per_location": m.leaders_per_location,
    }
    assert tuple(view) == MESH_FIELDS
    return view


def setting_text(value: Any) -> str:
    """A setting's value as it is written after KEY= (lists comma-joined, booleans lower case)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def settings_changes(before: MeshSettings, after: MeshSettings) -> tuple[FieldChange, ...]:
    return _field_changes({k: setting_text(v) for k, v in settings_view(before).items()},
                          {k: setting_text(v) for k, v in settings_view(after).items()})


def plan_all(topo: Topology, remotes: Sequence[Remote] = (), path_state: PathState | None = None,
             only: Sequence[str] = ()) -> dict[str, NodePlan]:
    """The plan of every node of `topo` (or of the nodes named in `only` that it has)."""
    names = [n.name for n in topo.nodes if not only or n.name in only]
    cache = PlanCache()  # the topology's segments, computed once for all its nodes
    return {n: plan_node(topo, n, remotes, path_state=path_state, cache=cache) for n in names}


def diff_topologies(before: Topology, after: Topology, *, remotes: tuple[Sequence[Remote], Sequence[Remote]] = ((), ()),
                    path_state: PathState | None = None, only: Sequence[str] = ()) -> MeshDiff:
    """The settings that differ and every node's plan diff (`remotes`: each side's admitted remote
    clusters)."""
    return MeshDiff(settings_changes(before.mesh, after.mesh),
                    diff_plans(plan_all(before, remotes[0], path_state, only),
                               plan_all(after, remotes[1], path_state, only)))


# --- how a diff is shown --------------------------------------------------------------------------

_PARTS = ("peers", "routes", "fastpath")
_PART_NAMES = {"peers": "peers", "routes": "routes", "fastpath": "fast path"}


def _counts(c: Changes[Any]) -> str:
    return f"+{len(c.added)} -{len(c.removed)} ~{len(c.changed)}"


def summary(d: NodeDiff) -> str:
    """The one line a node's diff starts with."""
    if not d.changed:
        return f"{d.node}: no change"
    parts = [f"{_PART_NAMES[p]} {_counts(getattr(d, p))}" for p in _PARTS]
    extra = [f"{len(d.rungs)} rung(s)"] + [f"{f.key} changed" for f in d.fields if f.key != "plan"]
    side = next((f for f in d.fields if f.key == "plan"), None)
    head = "" if side is None else (" (new node)" if side.before is None else " (node gone)")
    return f"{d.node}{head}: {', '.join(parts + extra)}"


def _shown(v: Any) -> str:
    return "-" if v is None or v == "" else str(v)


def _peer_text(p: PeerPlan) -> str:
    return (f"peer {p.name} ({p.kind}) endpoint {_shown(p.endpoint)} allowed-ips "
            f"{','.join(map(str, p.allowed_ips)) or '-'} keepalive {p.persistent_keepalive}")


def _route_text(r: Route) -> str:
    return f"route {r.dst} via {_shown(r.via)} dev {r.dev}"


def _entry_text(e: FastPathEntry) -> str:
    return f"fast-path {e.prefix} {e.action} nexthop {_shown(e.nexthop)} encap {_shown(encap_text(e.encap))}"


def _what_changed(a: Any, b: Any) -> str:
    """`field old -> new` for every dataclass field of `a` and `b` that differs."""
    out = []
    for f in fields(a):
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if va != vb:
            if isinstance(va, tuple):
                va, vb = ",".join(map(str, va)), ",".join(map(str, vb))
            out.append(f"{f.name} {_shown(va)} -> {_shown(vb)}")
    return "; ".join(out)


def node_lines(d: NodeDiff) -> list[str]:
    """A node's summary line, then one indented line per change (+ added, - removed, ~ changed)."""
    out = [summary(d)]
    out += [f"  ~ {f.key} {_shown(f.before)} -> {_shown(f.after)}" for f in d.fields if f.key != "plan"]
    shows: list[tuple[Changes[Any], Callable[[Any], str], Callable[[Any], str]]] = [
        (d.peers, _peer_text, lambda p: f"peer {p.name}"), (d.routes, _route_text, lambda r: f"route {r.dst}"),
        (d.fastpath, _entry_text, lambda e: f"fast-path {e.prefix}")]
    for c, text, name in shows:
        out += [f"  + {text(x)}" for x in c.added]
        out += [f"  - {text(x)}" for x in c.removed]
        out += [f"  ~ {name(a)}: {_what_changed(a, b)}" for a, b in c.changed]
    out += [f"  ~ rung {r.key}: {_shown(r.before)} -> {_shown(r.after)}" for r in d.rungs]
    return out


def _totals(diff: MeshDiff) -> dict[str, dict[str, int]]:
    """Per part (peers, routes, fastpath): how many items were added, removed and changed in all."""
    return {p: {k: sum(len(getattr(getattr(d, p), k)) for d in diff.nodes) for k in ("added", "removed", "changed")}
            for p in _PARTS}


def total_line(diff: MeshDiff) -> str:
    changed = sum(d.changed for d in diff.nodes)
    parts = [f"{_PART_NAMES[p]} +{t['added']} -{t['removed']} ~{t['changed']}" for p, t in _totals(diff).items()]
    rungs = sum(len(d.rungs) for d in diff.nodes)
    return f"total: {len(diff.nodes)} node(s), {changed} changed; {', '.join(parts)}, {rungs} rung(s)"


def diff_text(diff: MeshDiff) -> str:
    """The settings that change, each node's lines, and the total line."""
    out = [f"mesh: {s.key} {_shown(s.before)} -> {_shown(s.after)}" for s in diff.settings]
    for d in diff.nodes:
        out += node_lines(d)
    out.append(total_line(diff))
    return "\n".join(out)


def _changes_json(c: Changes[Any], as_json: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    return {"added": [as_json(x) for x in c.added], "removed": [as_json(x) for x in c.removed],
            "changed": [{"before": as_json(a), "after": as_json(b)} for a, b in c.changed]}


def _fields_json(fs: Sequence[FieldChange], key: str = "key") -> list[dict[str, Any]]:
    return [{key: f.key, "before": f.before, "after": f.after} for f in fs]


def node_json(d: NodeDiff) -> dict[str, Any]:
    return {
        "node": d.node, "changed": d.changed, "summary": summary(d), "fields": _fields_json(d.fields),
        "peers": _changes_json(d.peers, peer_json), "routes": _changes_json(d.routes, route_json),
        "fastpath": _changes_json(d.fastpath, fastpath_json), "rungs": _fields_json(d.rungs, "node"),
    }


def diff_json(diff: MeshDiff) -> dict[str, Any]:
    """`{"settings": [{"key","before","after"}], "nodes": [...], "total": {...}}` (docs/mesh.md)."""
    total: dict[str, Any] = {"nodes": len(diff.nodes), "changed": sum(d.changed for d in diff.nodes),
                             **_totals(diff), "rungs": sum(len(d.rungs) for d in diff.nodes)}
    return {"settings": _fields_json(diff.settings), "nodes": [node_json(d) for d in diff.nodes], "total": total}
