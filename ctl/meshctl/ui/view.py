# SPDX-License-Identifier: Apache-2.0
"""What the page's panels say, computed from the topology, a node's plan and the summaries the
agents publish (mesh.observed): one node's record with its peers and paths, and the search box's
answers. Pure: no I/O, no clock; the server hands in what it read.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshctl.errors import InputError
from meshctl.mesh.model import Path, Topology
from meshctl.mesh.observed import NodeSeen, PeerSeen
from meshctl.mesh.plan import plan_node
from meshctl.mesh.records import node_to_record

JSON = dict[str, Any]
POLL_S = 2.0  # how often the page asks for the map: a fallback shows within a few seconds of the summary
# The colour of an edge by the rung its pair uses now (docs/ui.md), cheapest first: the order the
# legend lists them in. A pair no path joins is NO_PATH_COLOUR; one that fell back is dashed.
RUNG_COLOURS: dict[Path, str] = {
    Path.DIRECT: "#2e7d32", Path.DIRECT_IPIP: "#1565c0", Path.DIRECT_VXLAN: "#00838f",
    Path.WIREGUARD_PRIVATE: "#6a1b9a", Path.TUNNEL: "#546e7a", Path.RELAY: "#ef6c00",
}
NO_PATH_COLOUR = "#d50000"
MAX_QUERY = 253  # characters of a search: a node name or an address is shorter
MAX_HITS = 20  # answers the search box lists


@dataclass(frozen=True)
class Hit:
    """One answer of the search box: the node, its location and what matched (`name`, `pod`)."""

    node: str
    location: str
    matched: str
    why: str

    def to_json(self) -> JSON:
        return {"node": self.node, "location": self.location, "matched": self.matched, "why": self.why}


def location_key(cluster: str, location: str) -> str:
    """The key the graph model gives a location: unique across the clusters of a mesh."""
    return f"{cluster}/{location}"


def search(topo: Topology, query: str, remotes: Sequence[Topology] = ()) -> list[Hit]:
    """The nodes `query` finds, in `topo` and the other clusters' `remotes` (their nodes by
    `cluster/node`): the node whose pod CIDR holds it (a pod address), the node whose internal or
    WireGuard address it is, else the nodes whose name contains it (case-insensitive, an exact
    name first). InputError for an empty or overlong query."""
    q = query.strip()
    if not q or len(q) > MAX_QUERY:
        raise InputError("q", query, f"is not a node name or an address (1 to {MAX_QUERY} characters)")
    nodes = [(n.qualified_name, location_key(t.cluster.name, n.location), n) for t in (topo, *remotes) for n in t.nodes]
    try:
        ip = ipaddress.ip_address(q)
    except ValueError:
        ip = None
    if ip is not None:
        hits = [Hit(name, loc, "pod", f"pod address {ip} is in {name}'s pod CIDR {c}")
                for name, loc, n in nodes for c in n.pod_cidrs if ip.version == c.version and ip in c]
        hits += [Hit(name, loc, "address", f"{ip} is {name}'s {what} address")
                 for name, loc, n in nodes for what, a in (("internal", n.internal_ip), ("WireGuard", n.wireguard_ip))
                 if a is not None and a.ip == ip]
        return hits[:MAX_HITS]
    low = q.lower()
    named = sorted((x for x in nodes if low in x[0].lower()), key=lambda x: (x[2].name.lower() != low, x[0]))
    return [Hit(name, loc, "name", f"node {name} in location {n.location or '-'}") for name, loc, n in named[:MAX_HITS]]


def _peer_json(p: PeerSeen | None) -> JSON | None:
    return p.to_json() | {"fell_back": p.fell_back} if p is not None else None


def node_detail(topo: Topology, name: str, seen: Mapping[str, NodeSeen], live: bool) -> JSON:
    """One node as the side panel shows it: its record (as its agent publishes it), its location
    and role, and every other node with how the plan reaches it (`planned`: a rung, via-leader or
    relay), what this node sees of it now (`here`) and what that node sees of this one (`there`).
    `live` False: no summaries were read (a file, or the Kubernetes backend). InputError when no
    node of the topology has the name."""
    node = topo.node(name)
    if node is None:
        raise InputError("node", name, "is not a node of the mesh")
    plan = plan_node(topo, name)
    mine = seen.get(name)
    wg = {p.name: p for p in plan.peers}
    peers = []
    for other in sorted(n.name for n in topo.nodes if n.name != name):
        theirs = seen.get(other)
        relay = plan.relays.get(other)
        peers.append({
            "peer": other,
            "planned": plan.paths.get(other),
            "relay": relay[0] if relay else None,
            "wireguard": other in wg,
            "endpoint": wg[other].endpoint if other in wg else None,
            "here": _peer_json(mine.peers.get(other)) if mine is not None else None,
            "there": _peer_json(theirs.peers.get(name)) if theirs is not None else None,
        })
    others = [{"peer": p.name, "kind": p.kind, "endpoint": p.endpoint,
               "allowed_ips": [str(a) for a in p.allowed_ips]} for p in plan.peers if p.kind == "peer"]
    return {"node": name, "cluster": topo.cluster.name, "location": location_key(topo.cluster.name, node.location),
            "record": node_to_record(node), "leader": plan.leader, "granularity": plan.granularity,
            "live": live, "summary_at": mine.at if mine is not None else None,
            "peers": peers, "extra_peers": others}


def meta(source: str, backend: str, lab: str | None, live: bool, explain: str | None, expand_up_to: int) -> JSON:
    """What the page reads once: where the map comes from, whether it is live (the agents'
    summaries) and whether pairs can be explained (None, or why not), the poll interval, the
    rungs' colours, and up to how many nodes every location starts expanded."""
    return {"source": source, "backend": backend, "lab": lab, "live": live, "explain": explain,
            "poll_ms": int(POLL_S * 1000), "colours": RUNG_COLOURS, "no_path": NO_PATH_COLOUR,
            "expand_up_to": expand_up_to}


def graph_doc(model: JSON, ok_at: float, error: str | None, warnings: list[str]) -> JSON:
    """What /api/graph answers: the graph model's JSON (mesh.graph.GraphModel.to_json), when the
    backend last answered (unix seconds), the backend's error since then (None: it answers) and the
    warnings its records gave."""
    return {"model": model, "ok_at": ok_at, "error": error, "warnings": warnings}
