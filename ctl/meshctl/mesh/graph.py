# SPDX-License-Identifier: Apache-2.0
"""The mesh as a picture (`meshctl graph`): a typed graph model computed once from the topology
and every node's plan (`graph_model`), the live overlay of what the agents see (`with_seen`), and
its views as Graphviz DOT or text (`model_dot`, `model_text`).

The model holds every pair of nodes on the rung the plan (or, live, the agents) give it, and the
locations with their node counts, leaders and private subnets. A view draws the model at one
level: `location` (one box per location, one edge per pair of locations labelled with what joins
them), `node` (a box per node), one location expanded (`location=`), or one node and its peers
(`node=`). A view never draws more than MAX_EDGES edges: when one edge per pair would, the pairs
are counted per pair of locations instead, and the nodes listed in their location's box. That
bound, the default font and a grid of boxes keep the picture readable at 50 and 500 nodes.
Pure: no I/O (docs/graph.md).
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from meshctl.errors import InputError
from meshctl.mesh.leaders import Leaders
from meshctl.mesh.model import ENCAP_RUNGS, PRIVATE_RUNGS, RUNGS, Node, Path, Topology
from meshctl.mesh.observed import NodeSeen, PeerSeen
from meshctl.mesh.plan import PlanCache, plan_node
from meshctl.mesh.render import path_text
from meshctl.mesh.segments import Remote, segments

Level = Literal["location", "node"]
LEVELS: tuple[str, ...] = ("location", "node")
GRAPH_FORMATS: tuple[str, ...] = ("dot", "text", "json")
# Up to this many nodes `graph` draws a box per node by default, and labels each with its addresses.
NODE_LEVEL_UP_TO = 20
# The most edges one view draws; past it pairs are counted per pair of locations.
MAX_EDGES = 60
# Boxes per row of the grids a view lays out (locations, names in a location's box).
_GRID = 4
_NAMES_PER_ROW = 8
# Edges with one label that most of a view's (and at least this many) edges share go unlabelled.
_SHARED_LABEL_MIN = 6
# The private subnets a location's box lists before it counts the rest.
_SUBNETS_SHOWN = 3

# How an edge is drawn, by the pair's rung (docs/mesh.md, "graph"): WireGuard solid, the private
# rungs dotted, each encapsulation in its own colour and labelled with its kind.
_ENCAP_COLOUR: dict[str, str] = {"ipip": "blue", "vxlan": "darkgreen"}
EDGE_ATTRS: dict[Path, str] = {
    Path.DIRECT: "style=dotted",
    **{rung: f'style=dotted, color={_ENCAP_COLOUR[kind]}, label="{kind}"' for rung, kind in ENCAP_RUNGS.items()},
    Path.WIREGUARD_PRIVATE: 'style=solid, color=gray40, label="private endpoint"',
    Path.TUNNEL: "style=solid",
    Path.RELAY: "style=solid, color=orange",
}
# A pair no path joins (live: both ends report none), and a pair that fell back from its first rung.
NO_PATH_ATTRS = 'style=bold, color=red, label="no path"'
FELL_BACK_STYLE = "style=dashed"
# When the two ends of a pair report different rungs, the costlier is drawn; no path costs most.
_EDGE_COST: tuple[Path, ...] = (*RUNGS, Path.RELAY)
# The paths WireGuard carries (a pair of leaders on one carries their locations).
_WIREGUARD_PATHS: frozenset[Path] = frozenset({Path.WIREGUARD_PRIVATE, Path.TUNNEL, Path.RELAY})
# The words an edge's label counts its pairs in (`100 wireguard`).
_RUNG_WORD: dict[Path, str] = {Path.TUNNEL: "wireguard"}
_LEGEND_LABELS: dict[Path, str] = {
    Path.TUNNEL: "WireGuard (tunnel)", Path.WIREGUARD_PRIVATE: "WireGuard to the private address",
    Path.DIRECT: "direct (raw, private network)", Path.DIRECT_IPIP: "direct+ipip (IP-in-IP, private network)",
    Path.DIRECT_VXLAN: "direct+vxlan (VXLAN, private network)",
    Path.RELAY: "WireGuard through a relay",
}
# The legend's line samples (an HTML label draws text, not lines): by an edge's style attribute.
_LEGEND_SAMPLE: dict[str, str] = {"solid": "\u2014\u2014\u2014", "dotted": "\u00b7 \u00b7 \u00b7 \u00b7",
                                  "dashed": "\u2013 \u2013 \u2013", "bold": "<B>\u2014\u2014\u2014</B>"}
_LEADER_ROW = "leader to member"
_NO_PATH_ROW = "no path"
_FELL_BACK_ROW = "fell back from its first rung"


# --- the model ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphNode:
    """A node: `name` as the plan calls it (`cluster2/g1` for another cluster's), its location and
    addresses (each family's, comma-separated); `leader` when it leads a location of several
    members; `via_leader` how many nodes it reaches only through its location's leader (location
    granularity)."""

    name: str
    cluster: str
    location: str
    leader: bool
    pod_cidrs: tuple[str, ...]
    internal_ip: str | None
    wireguard_ip: str | None
    endpoint: str | None
    via_leader: int = 0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class GraphPeer:
    """A WireGuard peer that is not a node (a laptop)."""

    name: str
    allowed_ips: tuple[str, ...]

    @property
    def id(self) -> str:
        return "peer:" + self.name


@dataclass(frozen=True)
class Location:
    """A location of a cluster: its nodes (sorted), leader(s) and the private subnets of their
    internal addresses. `key` is unique across the clusters of a mesh."""

    cluster: str
    name: str
    nodes: tuple[str, ...]
    leaders: tuple[str, ...]
    subnets: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.cluster}/{self.name}"

    @property
    def title(self) -> str:
        return self.name or "(none)"

    def to_json(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "name": self.name, "nodes": list(self.nodes), "leaders": list(self.leaders),
                "subnets": list(self.subnets)}


@dataclass(frozen=True)
class Pair:
    """Two ends (`a` < `b`: node names, or `peer:NAME`) and the rung that joins them; `rung` None:
    no path (live only). `leaders`: both ends lead their locations and carry them (location
    granularity). Live: `seen` some end reported the pair, `fell_back` it left its first rung."""

    a: str
    b: str
    rung: Path | None
    relay: str | None = None
    leaders: bool = False
    seen: bool = False
    fell_back: bool = False
    # A pair whose pod families take different rungs (`rung` the cheapest): each family's, as
    # `plan`'s PATHS says it (`IPv4 wireguard-private, IPv6 direct`).
    families: str | None = None

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class GraphModel:
    """The whole mesh, once: `clusters` the local one first; `live` when `with_seen` coloured it."""

    cluster: str
    granularity: str
    subnet: str
    clusters: tuple[str, ...]
    nodes: tuple[GraphNode, ...]
    locations: tuple[Location, ...]
    peers: tuple[GraphPeer, ...]
    pairs: tuple[Pair, ...]
    live: bool = False
    # Locations led by others than the documented order names, and why (with_leader_notes).
    leader_notes: tuple[str, ...] = ()

    @functools.cached_property
    def _by_name(self) -> dict[str, GraphNode]:
        return {n.name: n for n in self.nodes}

    @functools.cached_property
    def _location_of(self) -> dict[str, str]:
        return {n: loc.key for loc in self.locations for n in loc.nodes}

    @functools.cached_property
    def _inner(self) -> dict[str, list[Pair]]:
        out: dict[str, list[Pair]] = {}
        for p in self.pairs:
            loc = self._location_of.get(p.a)
            if loc is not None and loc == self._location_of.get(p.b):
                out.setdefault(loc, []).append(p)
        return out

    def node(self, name: str) -> GraphNode | None:
        return self._by_name.get(name)

    def inner_pairs(self, key: str) -> list[Pair]:
        """The pairs between two members of location `key`."""
        return self._inner.get(key, [])

    def location_of(self, name: str) -> str:
        """The key of the location node `name` is in (a peer is its own: `peer:NAME`)."""
        return self._location_of.get(name, name)

    def find_location(self, text: str) -> Location | None:
        """A location by its key (`cluster/name`) or, when only one cluster has it, its name."""
        hits = self.locations_named(text)
        return hits[0] if len(hits) == 1 else None

    def name_of(self, loc: Location) -> str:
        """How lines name a location: by name, by `cluster/name` in a cluster mesh."""
        return loc.key if len(self.clusters) > 1 else loc.title

    def locations_named(self, text: str) -> list[Location]:
        return [loc for loc in self.locations if text in (loc.key, loc.name)]

    def to_json(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "granularity": self.granularity, "subnet": self.subnet,
                "clusters": list(self.clusters), "live": self.live, "nodes": [n.to_json() for n in self.nodes],
                "locations": [loc.to_json() for loc in self.locations],
                "peers": [{"name": p.name, "allowed_ips": list(p.allowed_ips)} for p in self.peers],
                "pairs": [p.to_json() for p in self.pairs],
                **({"leader_notes": list(self.leader_notes)} if self.leader_notes else {})}


def _cost(rung: Path | None) -> int:
    """A rung's place in the order of cost; None (no path) costs most."""
    return len(_EDGE_COST) if rung is None else _EDGE_COST.index(rung)


def _costlier(a: Path | None, b: Path | None) -> Path | None:
    """The costlier of two rungs."""
    return a if _cost(a) >= _cost(b) else b


def graph_model(topo: Topology, remotes: Sequence[Remote] = ()) -> GraphModel:
    """The model of `topo` (and the remote clusters admitted against it): each node's plan read
    once. A node's WireGuard peers are its pairs on the rung its plan gives them (tunnel,
    wireguard-private or relay), non-node peers on WireGuard, and the pairs on a private rung
    (a location's members, or nodes no WireGuard peer joins) on that rung; where the two ends'
    plans differ, the costlier. Another cluster's own pairs come from its own plans."""
    rungs: dict[tuple[str, str], Path] = {}
    relays: dict[tuple[str, str], str] = {}
    families: dict[tuple[str, str], str] = {}
    via: dict[str, int] = {}

    def add(n: str, other: str, rung: Path) -> None:
        pair = (min(n, other), max(n, other))
        old = rungs.get(pair)
        rungs[pair] = rung if old is None else (_costlier(old, rung) or rung)

    def read(t: Topology, rs: Sequence[Remote]) -> None:
        # A name from `t`'s plans as the model calls it: another cluster's plans name their own
        # nodes bare, the model by cluster (`cluster2/g1`); other names are already qualified.
        names = {n.name: n.qualified_name for n in t.nodes}
        cache = PlanCache()  # what the plans of one topology share (its segments)
        for n in t.nodes:
            me = n.qualified_name
            plan = plan_node(t, n.name, rs, cache=cache)
            for peer in plan.peers:
                if peer.kind == "standby":
                    continue  # a session kept ready (Topology.standby): it carries nothing
                other = ("peer:" + peer.name) if peer.kind == "peer" else names.get(peer.name, peer.name)
                add(me, other, plan.paths.get(peer.name, Path.TUNNEL) if peer.kind != "peer" else Path.TUNNEL)
            for other, rung in plan.paths.items():
                if rung in PRIVATE_RUNGS and rung != Path.WIREGUARD_PRIVATE:
                    add(me, names.get(other, other), rung)
            for other, fams in plan.family_paths.items():
                q = names.get(other, other)
                families[(min(me, q), max(me, q))] = path_text("", fams)
            for other, (relay, _) in plan.relays.items():
                q = names.get(other, other)
                relays[(min(me, q), max(me, q))] = names.get(relay, relay)
            via[me] = sum(1 for p in plan.paths.values() if p == Path.VIA_LEADER)

    read(topo, remotes)
    for r in remotes:
        read(r.topology, ())
    all_nodes = [*((topo.cluster.name, n, topo) for n in topo.nodes),
                 *((r.topology.cluster.name, n, r.topology) for r in remotes for n in r.topology.nodes
                   if n.name in r.admitted)]
    known = {n.qualified_name for _, n, _ in all_nodes} | {"peer:" + p.name for p in topo.peers}
    gnodes, locs = _nodes_and_locations(all_nodes, via)
    # Location granularity: a pair of leaders of different locations carries their locations.
    lead = {n.name: (n.cluster, n.location) for n in gnodes if n.leader and topo.mesh.granularity == "location"}
    pairs = tuple(Pair(a, b, rung, relays.get((a, b)) if rung == Path.RELAY else None,
                       leaders=a in lead and b in lead and lead[a] != lead[b] and rung in _WIREGUARD_PATHS,
                       families=families.get((a, b)))
                  for (a, b), rung in sorted(rungs.items()) if a in known and b in known)
    peers = tuple(GraphPeer(p.name, tuple(map(str, p.allowed_ips))) for p in sorted(topo.peers, key=lambda p: p.name))
    return GraphModel(topo.cluster.name, topo.mesh.granularity, ", ".join(map(str, topo.mesh.subnets)),
                      (topo.cluster.name, *(r.topology.cluster.name for r in remotes)), gnodes, locs, peers, pairs)


def _nodes_and_locations(all_nodes: Sequence[tuple[str, Node, Topology]], via: Mapping[str, int]
                         ) -> tuple[tuple[GraphNode, ...], tuple[Location, ...]]:
    """Every node with its segment's WireGuard address (leaders only), and the locations."""
    wg: dict[str, str] = {}
    lead: set[str] = set()
    for t in {id(t): t for _, _, t in all_nodes}.values():
        for s in segments(t):
            wg[s.leader.qualified_name] = ",".join(map(str, s.addresses))
            if len(s.members) > 1:
                lead.add(s.leader.qualified_name)
    made = [(cluster, n, GraphNode(n.qualified_name, cluster, n.location, n.qualified_name in lead,
                                   tuple(str(c) for c in n.pod_cidrs),
                                   ",".join(map(str, n.internal_ips)) or None, wg.get(n.qualified_name),
                                   ",".join(map(str, n.endpoints)) or None, via.get(n.qualified_name, 0)))
            for cluster, n, _ in all_nodes]
    by_loc: dict[tuple[str, str], list[GraphNode]] = {}
    subnets: dict[tuple[str, str], set[str]] = {}
    for cluster, n, g in made:
        by_loc.setdefault((cluster, n.location), []).append(g)
        for ip in n.internal_ips:
            subnets.setdefault((cluster, n.location), set()).add(str(ip.network))
    order = {c: i for i, c in enumerate(dict.fromkeys(c for c, _, _ in all_nodes))}
    locs = tuple(Location(c, loc, tuple(sorted(m.name for m in members)),
                          tuple(sorted(m.name for m in members if m.leader)), tuple(sorted(subnets.get((c, loc), ()))))
                 for (c, loc), members in sorted(by_loc.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])))
    gnodes = tuple(sorted((g for _, _, g in made), key=lambda g: (order[g.cluster], g.name)))
    return gnodes, locs


# --- the live overlay --------------------------------------------------------------------------


def with_seen(model: GraphModel, seen: Mapping[str, NodeSeen]) -> GraphModel:
    """The model with each pair on the rung its ends use now (mesh.observed, the summaries the
    agents publish, by node name): where both ends report, the costlier (no path, None, costs
    most); `fell_back` when an end that reports it left its first rung. A pair no end reports, or
    reports with a rung the graph does not know, keeps its plan's rung and `seen` False."""
    def report(a: str, b: str) -> PeerSeen | None:
        ns = seen.get(a)
        p = ns.peers.get(b) if ns is not None else None
        return p if p is not None and (p.rung is None or p.rung in EDGE_ATTRS) else None

    out = []
    for pair in model.pairs:
        reports = [r for r in (report(pair.a, pair.b), report(pair.b, pair.a)) if r is not None]
        if not reports:
            out.append(replace(pair, seen=False, fell_back=False))
            continue
        rung: Path | None = reports[0].rung
        for r in reports[1:]:
            rung = _costlier(rung, r.rung)
        out.append(replace(pair, rung=rung, seen=True, fell_back=any(r.fell_back for r in reports),
                           relay=pair.relay if rung == Path.RELAY else None))
    return replace(model, pairs=tuple(out), live=True)


def with_leader_notes(model: GraphModel, leaders: Leaders | None) -> GraphModel:
    """The model saying, for each location led by others than the documented order names (the
    published forwarding reports ruled its leader out: mesh/leaders.py), who leads in place of
    whom and why: the verdicts, who published them and their age."""
    if leaders is None:
        return model
    notes = tuple(f"{loc.location}: {','.join(loc.leaders)} leads in place of {','.join(loc.static)}: {loc.reason}"
                  for _, loc in sorted(leaders.locations.items()) if loc.moved)
    return replace(model, leader_notes=notes)


# --- views -------------------------------------------------------------------------------------


def default_level(model: GraphModel) -> Level:
    return "node" if len(model.nodes) <= NODE_LEVEL_UP_TO else "location"


@dataclass(frozen=True)
class Edge:
    """One edge of a view: between two boxes, the pairs it stands for."""

    a: str
    b: str
    pairs: tuple[Pair, ...]


@dataclass(frozen=True)
class View:
    """What one view draws: `nodes` drawn as their own boxes (the rest listed in their location's
    box), `expanded` locations drawn as an outer box around their node boxes, and the edges
    between boxes; `focus` the node of a node's view; `hidden` the edges past the bound, which
    the title counts and the text lists."""

    title: str
    nodes: frozenset[str]
    expanded: frozenset[str]
    edges: tuple[Edge, ...]
    focus: str | None = None
    hidden: tuple[Edge, ...] = ()

    def shows(self, box: str) -> bool:
        """A node's view draws only its node and the boxes its edges reach; the others all."""
        return self.focus is None or box == self.focus or any(box in (e.a, e.b) for e in self.edges)


def check_view(model: GraphModel, level: str | None, node: str | None, location: str | None) -> None:
    """InputError naming the flag and its value when the view does not exist."""
    if level is not None and level not in LEVELS:
        raise InputError("--level", level, f"is not a level: {', '.join(LEVELS)}")
    if node is not None and model.node(node) is None:
        raise InputError("--node", node, "is not a node of the mesh")
    if location is not None and len(model.locations_named(location)) > 1:
        keys = ", ".join(loc.key for loc in model.locations_named(location))
        raise InputError("--location", location, f"is a location of several clusters: name one of {keys}")
    if location is not None and model.find_location(location) is None:
        known = ", ".join(model.name_of(loc) for loc in model.locations[:10])
        raise InputError("--location", location, f"is not a location of the mesh (locations: {known})")
    if node is not None and location is not None:
        raise InputError("--location", location, "cannot be combined with --node")


def view(model: GraphModel, level: str | None = None, node: str | None = None, location: str | None = None) -> View:
    """The view a level (default: by size), a node or a location asks for; one edge per pair
    unless that draws more than MAX_EDGES edges, then one per pair of locations; and if even those
    are more (a full mesh of many locations), the most common kind of edge is left out and said
    once in the title, and past MAX_EDGES the cheapest ones with it (`hidden`)."""
    v = _view(model, level, node, location)
    if len(v.edges) <= MAX_EDGES:
        return v
    shown, hidden = _bounded(v.edges)
    note = f"; not drawn: {_count(len(hidden), 'edge')} ({counts([p for e in hidden for p in e.pairs])})"
    return replace(v, title=v.title + note, edges=shown, hidden=hidden)


def _edge_kind(e: Edge) -> tuple[Path | None, bool, bool] | None:
    """What every pair of an edge is on (rung, fell back, leaders); None when they differ."""
    kinds = {(p.rung, p.fell_back, p.leaders) for p in e.pairs}
    return next(iter(kinds)) if len(kinds) == 1 else None


def _bounded(edges: Sequence[Edge]) -> tuple[tuple[Edge, ...], tuple[Edge, ...]]:
    """At most MAX_EDGES edges to draw, and the others: the edges of the most common kind go
    first, then the cheapest, so what differs from the rest (a relay, no path) stays drawn."""
    tally = Counter(k for e in edges if (k := _edge_kind(e)) is not None)
    background = tally.most_common(1)[0][0] if tally else None
    rest = sorted((e for e in edges if background is None or _edge_kind(e) != background),
                  key=lambda e: -max(_cost(p.rung) for p in e.pairs))
    hidden = [e for e in edges if background is not None and _edge_kind(e) == background] + rest[MAX_EDGES:]
    return tuple(sorted(rest[:MAX_EDGES], key=lambda e: (e.a, e.b))), tuple(hidden)


def _view(model: GraphModel, level: str | None, node: str | None, location: str | None) -> View:
    check_view(model, level, node, location)
    lvl = level or default_level(model)
    every = frozenset(n.name for n in model.nodes)
    all_locs = frozenset(loc.key for loc in model.locations)
    if node is not None:
        pairs = [p for p in model.pairs if node in (p.a, p.b)]
        here = model.find_location(model.location_of(node))
        # Every peer its own box while they are few; else the node's location-mates, and the
        # other locations as one box each.
        own = every if len(pairs) <= NODE_LEVEL_UP_TO else frozenset({node, *(here.nodes if here else ())})
        edges = _grouped(model, pairs, own)
        if len(edges) > MAX_EDGES:
            own = frozenset({node})
            edges = _grouped(model, pairs, own)
        shown = frozenset({x for e in edges for x in (e.a, e.b) if x in own} | {node})
        gn = model.node(node)
        beyond = f"; {gn.via_leader} more through its leader" if gn is not None and gn.via_leader else ""
        return View(f"node {node} and its peers{beyond}", shown, frozenset(model.location_of(x) for x in shown),
                    tuple(edges), focus=node)
    if location is not None:
        loc = model.find_location(location)
        assert loc is not None
        mine = frozenset(loc.nodes)
        fine = _grouped(model, model.pairs, mine)
        if len(fine) <= MAX_EDGES:
            return View(f"location {model.name_of(loc)} expanded", mine, frozenset({loc.key}), tuple(fine))
        return View(f"location {model.name_of(loc)} (too many pairs to draw one by one)", frozenset(),
                    frozenset({loc.key}), tuple(_grouped(model, model.pairs, frozenset())))
    if lvl == "node":
        fine = _grouped(model, model.pairs, every)
        if len(fine) <= MAX_EDGES:
            return View("every node", every, all_locs, tuple(fine))
        return View(f"every node ({len(model.pairs)} pairs counted per pair of locations)", frozenset(), all_locs,
                    tuple(_grouped(model, model.pairs, frozenset())))
    return View("locations", frozenset(), frozenset(), tuple(_grouped(model, model.pairs, frozenset())))


def _grouped(model: GraphModel, pairs: Iterable[Pair], own: frozenset[str]) -> list[Edge]:
    """The pairs as edges between boxes: nodes in `own` are their own box, the others their
    location's; pairs inside one box are left to its inside line."""
    def box(x: str) -> str:
        return x if x in own or x.startswith("peer:") else "location:" + model.location_of(x)

    groups: dict[tuple[str, str], list[Pair]] = {}
    for p in pairs:
        a, b = box(p.a), box(p.b)
        if a != b:
            groups.setdefault((min(a, b), max(a, b)), []).append(p)
    return [Edge(a, b, tuple(ps)) for (a, b), ps in sorted(groups.items())]


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def _word(rung: Path | None) -> str:
    return "no path" if rung is None else _RUNG_WORD.get(rung, rung)


def counts(pairs: Sequence[Pair]) -> str:
    """What a group of pairs is on, costliest last: `100 wireguard`, `1 wireguard (leaders)`,
    `45 direct+vxlan`, `3 relay`, `2 no path`; fallen-back pairs counted apart."""
    tally: dict[tuple[int, str], int] = {}
    for p in pairs:
        word = _word(p.rung) + (" (leaders)" if p.leaders else "") + (" fell back" if p.fell_back else "")
        tally[(_cost(p.rung), word)] = tally.get((_cost(p.rung), word), 0) + 1
    return ", ".join(f"{n} {word}" for (_, word), n in sorted(tally.items()))


def inside_line(model: GraphModel, loc: Location) -> str:
    """How a location's members reach each other (one line; a location of one node: none)."""
    if len(loc.nodes) == 1:
        return ""
    inner = model.inner_pairs(loc.key)
    if not inner:
        return "members: no pairs"
    via = f"; others through {', '.join(loc.leaders)}" if loc.leaders and model.granularity == "location" else ""
    return f"members: {counts(inner)}{via}"


# --- DOT ---------------------------------------------------------------------------------------


def _esc(s: str) -> str:
    """Text inside a DOT string."""
    return s.replace("\\", "\\\\").replace('"', '\\"')


def _dot_id(s: str) -> str:
    return f'"{_esc(s)}"'


def _html(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _attrs_without_label(attrs: str) -> list[str]:
    return [a for a in attrs.split(", ") if not a.startswith("label=")]


def _legend_attrs(attrs: str, label: str) -> str:
    """An edge's attributes with the legend's label in place of its own."""
    return ", ".join([*_attrs_without_label(attrs), f'label="{label}"'])


def pair_attrs(p: Pair) -> str:
    """How one pair is drawn: its rung's EDGE_ATTRS (a relay named), dashed when it fell back,
    red without a path."""
    if p.rung is None:
        return NO_PATH_ATTRS
    attrs = EDGE_ATTRS[p.rung] + (f', label="relay via {_esc(p.relay)}"' if p.rung == Path.RELAY and p.relay else "")
    if p.families:
        attrs = _legend_attrs(attrs, _esc(p.families))
    if p.fell_back:
        attrs = ", ".join([FELL_BACK_STYLE, *(a for a in attrs.split(", ") if not a.startswith("style="))])
    return attrs


def _drawn_pair(e: Edge, focus: bool) -> Pair:
    """The pair whose look an edge takes: its one pair between two nodes, else its costliest."""
    if "location:" not in e.a + e.b and not focus:
        return e.pairs[0]
    return max(e.pairs, key=lambda p: (_cost(p.rung), p.fell_back))


def _edge_attrs(e: Edge, focus: bool) -> str:
    """Between two nodes: pair_attrs (in a node's view labelled with its rung: the path to each
    peer); to a location's box: the attributes of its costliest pair, labelled with its counts."""
    grouped = "location:" in e.a + e.b
    if not grouped and not focus:
        return pair_attrs(e.pairs[0])
    worst = _drawn_pair(e, focus)
    label = counts(e.pairs) if grouped else _word(worst.rung) + (
        f" via {worst.relay}" if worst.relay else "")
    return _legend_attrs(pair_attrs(worst), _esc(label))


def _label_of(attrs: str) -> str:
    """The text of an attribute list's label."""
    return attrs.split('label="', 1)[1].rsplit('"', 1)[0].replace('\\"', '"')


def _node_label(n: GraphNode, detailed: bool) -> str:
    head = n.name + (" (leader)" if n.leader else "")
    if not detailed:
        return head
    return "\\n".join([head, f"location: {n.location or '-'}", f"pod: {', '.join(n.pod_cidrs)}",
                       f"internal: {n.internal_ip or '-'}", f"wireguard: {n.wireguard_ip or '-'}",
                       f"endpoint: {n.endpoint or '-'}"])


def _location_label(model: GraphModel, loc: Location, names: bool) -> str:
    """A location's box as an HTML-like label: its name, node count, leaders, subnets, the inside
    line, and (a node level that cannot draw each node) its nodes' names in a grid."""
    rows = [f"<B>{_html(loc.title)}</B>", _count(len(loc.nodes), "node")]
    if loc.leaders and model.granularity == "location":
        rows.append(f"leader: {_html(', '.join(loc.leaders))}")
    if loc.subnets:
        more = len(loc.subnets) - _SUBNETS_SHOWN
        shown = _html(", ".join(loc.subnets[:_SUBNETS_SHOWN]))
        rows.append(f"subnets: {shown}" + (f" +{more} more" if more > 0 else ""))
    rows += [_html(x) for x in inside_line(model, loc).split("; ") if x]
    cols = max(1, min(_NAMES_PER_ROW, math.ceil(math.sqrt(len(loc.nodes)))))
    cells = [f"<TR><TD COLSPAN=\"{cols}\" BORDER=\"0\">{r}</TD></TR>" for r in rows]
    if names:
        leaders = set(loc.leaders)
        names_ = [f"<B>{_html(n)}</B>" if n in leaders else _html(n) for n in loc.nodes]
        for i in range(0, len(names_), cols):
            cells.append("<TR>" + "".join(f"<TD>{x}</TD>" for x in names_[i:i + cols]) + "</TR>")
    return "<<TABLE BORDER=\"0\" CELLBORDER=\"1\" CELLSPACING=\"2\">" + "".join(cells) + "</TABLE>>"


def model_dot(model: GraphModel, level: str | None = None, node: str | None = None, location: str | None = None
              ) -> str:
    """The view as Graphviz DOT for `dot` (it draws clusters: a cluster mesh's clusters and the
    expanded locations are boxes around their boxes); boxes in a grid, the default font."""
    v = view(model, level, node, location)
    drawn_edges = [(e, _edge_attrs(e, v.focus is not None)) for e in v.edges]
    # Where most edges say the same (a complete mesh of locations: `2500 wireguard` each), the
    # title says it once and those edges go unlabelled: a dense mesh stays readable.
    tally = Counter(attrs for _, attrs in drawn_edges if 'label="' in attrs)
    shared, n_shared = tally.most_common(1)[0] if tally else (None, 0)
    if n_shared < _SHARED_LABEL_MIN or 2 * n_shared <= len(drawn_edges):
        shared = None
    title = (f"cluster {model.cluster} ({model.granularity}): WireGuard subnet {model.subnet}; {v.title}"
             + (f"; each unlabelled edge: {_label_of(shared)}" if shared else "") + ("; live" if model.live else "")
             + "".join(f"\n{n}" for n in model.leader_notes))
    lines = [f"digraph {_dot_id(model.cluster)} {{",
             f"  graph [compound=true, rankdir=LR, labelloc=t, fontname=Helvetica, label={_dot_id(title)}];",
             "  node [shape=box, style=rounded, fontname=Helvetica];", "  edge [dir=none, fontname=Helvetica];"]
    detailed = len(v.nodes) <= NODE_LEVEL_UP_TO
    # A small view lays itself out along its edges (today's picture); a large one in grids.
    collapsed = any(v.shows("location:" + loc.key) and not (loc.key in v.expanded and set(loc.nodes) & v.nodes)
                    for loc in model.locations)
    large = collapsed or len(v.nodes) > NODE_LEVEL_UP_TO or len(model.locations) > _GRID
    anchors: dict[str, str] = {}  # a drawn box -> the DOT node an edge to it attaches to
    grid: list[str] = []  # the boxes of the top level, in the order of their grid
    for ci, cluster in enumerate(model.clusters):
        outer = len(model.clusters) > 1
        if outer:
            lines += [f"  subgraph cluster_c{ci} {{", f"    label={_dot_id('cluster ' + cluster)}; style=bold;"]
        for li, loc in enumerate(x for x in model.locations if x.cluster == cluster):
            i = f"{ci}_{li}" if outer else str(li)
            box = "location:" + loc.key
            drawn = [n for n in loc.nodes if n in v.nodes]
            if loc.key in v.expanded and drawn:
                lines.append(f"  subgraph cluster_{i} {{" + (" style=solid;" if outer else ""))
                head = "; ".join(x for x in (f"location: {loc.title}", inside_line(model, loc)) if x)
                lines.append(f"    label={_dot_id(head)};")
                for name in drawn:
                    gn = model.node(name)
                    assert gn is not None
                    extra = ", penwidth=3" if name == v.focus else ""
                    lines.append(f"    {_dot_id(name)} [label=\"{_node_label(gn, detailed)}\"{extra}];")
                    anchors[name] = name
                rest = len(loc.nodes) - len(drawn) if v.shows(box) else 0
                if rest:
                    lines.append(f"    {_dot_id(box)} [label=\"{rest} more of {_esc(loc.title)}\"];")
                anchors[box] = box if rest else drawn[0]
                if large:
                    lines += _grid_lines([*drawn, *([box] if rest else [])], "    ")
                lines.append("  }")
                grid.append(drawn[0])
            elif v.shows(box):
                lines.append(f"  {_dot_id(box)} [label={_location_label(model, loc, loc.key in v.expanded)}];")
                anchors[box] = box
                grid.append(box)
        if outer:
            lines.append("  }")
    for p in (p for p in model.peers if v.shows(p.id)):
        label = f"{_esc(p.name)}\\npeer\\n{', '.join(p.allowed_ips)}"
        lines.append(f"  {_dot_id(p.id)} [label=\"{label}\", shape=ellipse];")
        anchors[p.id] = p.id
    if large:
        # Columns for a square: a location's summary box is about twice as wide as tall, one that
        # lists its nodes about square.
        listing = any(loc.key in v.expanded and not set(loc.nodes) & v.nodes for loc in model.locations)
        lines += _grid_lines(grid, "  ", max(_GRID, math.ceil(math.sqrt(len(grid) / (1 if listing else 2)))))
    for e, attrs in drawn_edges:
        a, b = anchors.get(e.a, e.a), anchors.get(e.b, e.b)
        if shared is not None and attrs == shared:
            attrs = ", ".join(_attrs_without_label(attrs))
        if large or e.a.startswith("location:") or e.b.startswith("location:"):
            attrs += ", constraint=false"
        lines.append(f"  {_dot_id(a)} -> {_dot_id(b)} [{attrs}];")
    leads = 0
    if v.focus is None and model.granularity == "location":
        for loc in model.locations:
            for leader in loc.leaders:
                for m in loc.nodes:
                    if m != leader and m in v.nodes and leader in v.nodes:
                        leads += 1
                        lines.append(f"  {_dot_id(leader)} -> {_dot_id(m)} [style=dashed, dir=forward"
                                     f"{', constraint=false' if large else ''}];")
    shown = legend_rows([_drawn_pair(e, v.focus is not None) for e in v.edges], leaders=leads > 0)
    return "\n".join([*lines, *legend_dot(shown), "}"]) + "\n"


def _grid_lines(boxes: Sequence[str], indent: str, columns: int | None = None) -> list[str]:
    """Invisible edges that set boxes in a grid (rankdir LR: each row a chain of ranks, `columns`
    long; default a square), so a complete mesh of locations, or a location of 50 nodes, grows
    as a square, not as a line."""
    cols = columns or max(1, math.ceil(math.sqrt(len(boxes))))
    return [f"{indent}{_dot_id(boxes[i])} -> {_dot_id(boxes[i + 1])} [style=invis];"
            for i in range(len(boxes) - 1) if (i + 1) % cols]


def legend_rows(drawn: Iterable[Pair], *, leaders: bool = False) -> list[tuple[str, str]]:
    """The legend of a picture whose edges look like the pairs `drawn`: (attributes, label) of each
    kind of edge it draws and of nothing else, cheapest rung first, then no path, a fallen-back
    pair and the leader-to-member arrows (`leaders`)."""
    pairs = list(drawn)
    rows = [(EDGE_ATTRS[r], _LEGEND_LABELS[r]) for r in _EDGE_COST if any(p.rung == r for p in pairs)]
    if any(p.rung is None for p in pairs):
        rows.append((NO_PATH_ATTRS, _NO_PATH_ROW))
    if any(p.fell_back for p in pairs):
        rows.append((FELL_BACK_STYLE, _FELL_BACK_ROW))
    if leaders:
        rows.append(("style=dashed, dir=forward", _LEADER_ROW))
    return rows


def legend_dot(rows: Sequence[tuple[str, str]]) -> list[str]:
    """One small box listing the kinds of edge the picture draws, each with a sample of its line
    in its colour (nothing when it draws no edge)."""
    if not rows:
        return []
    cells = []
    for attrs, label in rows:
        kv = dict(a.split("=", 1) for a in attrs.split(", "))
        sample = _LEGEND_SAMPLE[kv.get("style", "solid")] + (" &gt;" if kv.get("dir") == "forward" else "")
        colour = kv.get("color", "black")
        cells.append(f'<TR><TD ALIGN="LEFT"><FONT COLOR="{colour}">{sample}</FONT></TD>'
                     f'<TD ALIGN="LEFT">{_html(label)}</TD></TR>')
    table = ('<<TABLE BORDER="0" CELLBORDER="0" CELLSPACING="0" CELLPADDING="1">'
             + "".join(cells) + "</TABLE>>")
    return [f"  \"legend:\" [shape=box, style=dashed, color=gray60, margin=0.05, label={table}];"]


def graph_dot(topo: Topology, remotes: Sequence[Remote] = (), level: str | None = None, node: str | None = None,
              location: str | None = None) -> str:
    """`meshctl graph`: the model of the topology drawn at a level, for a node or a location."""
    return model_dot(graph_model(topo, remotes), level, node, location)


# --- text --------------------------------------------------------------------------------------


def model_text(model: GraphModel, level: str | None = None, node: str | None = None, location: str | None = None
               ) -> str:
    """The same view as lines: the boxes (a location's count, leaders, subnets, inside line)
    and each edge with what it stands for."""
    v = view(model, level, node, location)
    out = [f"cluster {model.cluster} ({model.granularity}), WireGuard subnet {model.subnet}: {v.title}"
           + (" (live)" if model.live else "")]
    out += [f"leaders: {n}" for n in model.leader_notes]
    for loc in model.locations:
        name = model.name_of(loc)
        lead = f", leader {', '.join(loc.leaders)}" if loc.leaders and model.granularity == "location" else ""
        subnets = f", subnets {', '.join(loc.subnets)}" if loc.subnets else ""
        inside = "; " + inside_line(model, loc) if len(loc.nodes) > 1 else ""
        out.append(f"location {name}: {_count(len(loc.nodes), 'node')}{lead}{subnets}{inside}")
    for e in (*v.edges, *v.hidden):
        out.append(f"{_text_end(model, e.a)} -- {_text_end(model, e.b)}: {counts(e.pairs)}"
                   + (f" (relay via {e.pairs[0].relay})" if len(e.pairs) == 1 and e.pairs[0].relay else "")
                   + (f" ({e.pairs[0].families})" if len(e.pairs) == 1 and e.pairs[0].families else ""))
    return "\n".join(out) + "\n"


def _text_end(model: GraphModel, box: str) -> str:
    key = box.removeprefix("location:")
    if key == box:
        return box
    loc = next(x for x in model.locations if x.key == key)
    return f"location {model.name_of(loc)}"
