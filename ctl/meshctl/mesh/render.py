# SPDX-License-Identifier: Apache-2.0
"""Plans and topologies as people and programs read them: JSON, tables, Graphviz DOT and
wg-quick configs. Pure functions of the plan."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from meshctl.errors import InputError
from meshctl.mesh.model import (
    ENCAP_RUNGS,
    PRIVATE_RUNGS,
    RUNGS,
    Endpoint,
    IPInterface,
    IPNetwork,
    KeyRef,
    Node,
    Peer,
    Topology,
    sort_key_net,
)
from meshctl.mesh.plan import Encap, FastPathEntry, NodePlan, PeerPlan, Route, plan_node
from meshctl.mesh.segments import Remote, Segment, segment_addresses, segments


def plan_to_json(p: NodePlan) -> dict[str, Any]:
    return {
        "node": p.node,
        "granularity": p.granularity,
        "leader": p.leader,
        "wireguard_ip": str(p.wireguard_ip) if p.wireguard_ip else None,
        "peers": [peer_json(x) for x in p.peers],
        "routes": [route_json(r) for r in p.routes],
        "fastpath": [fastpath_json(e) for e in p.fastpath],
    }


def peer_json(x: PeerPlan) -> dict[str, Any]:
    """One WireGuard peer of a plan as `plan -o json` prints it."""
    return {
        "name": x.name,
        "kind": x.kind,
        "public_key": x.public_key,
        "endpoint": x.endpoint,
        "allowed_ips": [str(a) for a in x.allowed_ips],
        "persistent_keepalive": x.persistent_keepalive,
        **({"preshared_key": str(x.preshared_key)} if x.preshared_key else {}),
    }


def route_json(r: Route) -> dict[str, Any]:
    return {"dst": str(r.dst), "via": str(r.via) if r.via else None, "dev": r.dev}


def fastpath_json(e: FastPathEntry) -> dict[str, Any]:
    return {"prefix": str(e.prefix), "action": e.action, "nexthop": str(e.nexthop) if e.nexthop else None,
            **_encap_json(e.encap)}


def _encap_json(e: Encap | None) -> dict[str, Any]:
    """The encapsulation keys of a fast-path entry: none for a raw entry, whose JSON is its
    prefix, action and next hop only."""
    if e is None:
        return {}
    return {"encap": e.kind, "outer_src": str(e.local), "outer_dst": str(e.remote)}


def encap_text(e: Encap | None) -> str | None:
    return f"{e.kind} {e.local}->{e.remote}" if e is not None else None


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A plain aligned table (no colours: it goes to logs and pipes as often as to terminals)."""
    cells = [[str(h) for h in header]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def plan_to_table(p: NodePlan) -> str:
    wg = str(p.wireguard_ip) if p.wireguard_ip else "- (not a leader)"
    out = [f"node {p.node}  granularity {p.granularity}  leader {p.leader}  wireguard {wg}", ""]
    out.append(f"PEERS ({len(p.peers)})")
    out.append(table([(x.name, x.kind, x.endpoint, ",".join(map(str, x.allowed_ips)), x.persistent_keepalive or None)
                      for x in p.peers], ["NAME", "KIND", "ENDPOINT", "ALLOWED IPS", "KEEPALIVE"]))
    out += ["", f"ROUTES ({len(p.routes)})"]
    out.append(table([(r.dst, r.via, r.dev) for r in p.routes], ["DST", "VIA", "DEV"]))
    out += ["", f"FAST PATH ({len(p.fastpath)})"]
    out.append(table([(e.prefix, e.action, e.nexthop, encap_text(e.encap)) for e in p.fastpath],
                     ["PREFIX", "ACTION", "NEXT HOP", "ENCAP"]))
    if p.paths:
        out += ["", "PATHS"]
        out.append(table(sorted(p.paths.items()), ["NODE", "PATH"]))
    return "\n".join(out)


def _dot_id(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def graph_dot(topo: Topology) -> str:
    """Graphviz DOT: one cluster subgraph per location, and one edge per pair of nodes (or node
    and peer) drawn as the plan carries it (EDGE_ATTRS: solid WireGuard, dotted private rungs,
    the encapsulated ones coloured and labelled with their kind); in location granularity dashed
    arrows go from each segment's leader to its members (their way into the mesh), so no node
    looks cut off. The graph is labelled with the cluster and its WireGuard subnet, and carries a
    legend of every edge kind."""
    segs = segments(topo)
    title = f"cluster {topo.cluster.name} ({topo.mesh.granularity}): WireGuard subnet {topo.mesh.subnet}"
    lines = [f"digraph {_dot_id(topo.cluster.name)} {{",
             f"  graph [compound=true, rankdir=LR, labelloc=t, label={_dot_id(title)}];",
             "  node [shape=box, style=rounded, fontname=Helvetica, fontsize=10];", "  edge [dir=none];"]
    lines += _dot_locations(topo, segs)
    for p in sorted(topo.peers, key=lambda p: p.name):
        lines.append(f"  {_dot_id('peer:' + p.name)} [label=\"{p.name}\\npeer\\n"
                     f"{', '.join(map(str, p.allowed_ips))}\", shape=ellipse];")
    for (a, b), attrs in sorted(_dot_edges(topo).items()):
        lines.append(f"  {_dot_id(a)} -> {_dot_id(b)} [{attrs}];")
    if topo.mesh.granularity == "location":
        for s in segs:
            for m in s.members:
                if m.name != s.leader.name:
                    lines.append(f"  {_dot_id(s.leader.name)} -> {_dot_id(m.name)} [style=dashed, dir=forward];")
    return "\n".join([*lines, *_DOT_LEGEND]) + "\n"


def _legend_attrs(attrs: str, label: str) -> str:
    """An edge's attributes with the legend's label in place of its own."""
    kept = [a for a in attrs.split(", ") if not a.startswith("label=")]
    return ", ".join([*kept, f'label="{label}"'])


# How an edge is drawn, by the pair's rung in the plan (docs/mesh.md, "graph"): WireGuard solid,
# the private rungs dotted, each encapsulation in its own colour and labelled with its kind.
_ENCAP_COLOUR: dict[str, str] = {"ipip": "blue", "vxlan": "darkgreen"}
EDGE_ATTRS: dict[str, str] = {
    "direct": "style=dotted",
    **{rung: f'style=dotted, color={_ENCAP_COLOUR[kind]}, label="{kind}"' for rung, kind in ENCAP_RUNGS.items()},
    "wireguard-private": 'style=solid, color=gray40, label="private endpoint"',
    "tunnel": "style=solid",
    "relay": "style=solid, color=orange",
}
# When the two ends of a pair report different rungs (they agree offline), the costlier is drawn.
_EDGE_COST: tuple[str, ...] = (*RUNGS, "relay")
_LEGEND_LABELS: dict[str, str] = {
    "tunnel": "WireGuard (tunnel)", "wireguard-private": "WireGuard to the private address",
    "direct": "direct (raw, private network)", "direct+ipip": "direct+ipip (IP-in-IP, private network)",
    "direct+vxlan": "direct+vxlan (VXLAN, private network)",
    "relay": "WireGuard through a relay",
}
_DOT_LEGEND = ("  subgraph cluster_legend {", '    label="legend"; fontsize=9;',
               '    node [shape=plaintext, fontsize=9, label=""];',
               *(f'    legend_{i}_a -> legend_{i}_b [{_legend_attrs(EDGE_ATTRS[r], _LEGEND_LABELS[r])}];'
                 for i, r in enumerate(_LEGEND_LABELS)),
               '    legend_leader_a -> legend_leader_b [style=dashed, dir=forward, label="leader to member"];',
               "  }", "}")


def _dot_locations(topo: Topology, segs: Sequence[Segment]) -> list[str]:
    """One subgraph per location, a box per node with its addresses (the WireGuard one on leaders)."""
    wg_of = {}
    for s in segs:
        for m in s.members:
            wg_of[m.name] = s.wireguard_ip if m.name == s.leader.name else None
    by_loc: dict[str, list[Node]] = {}
    for n in sorted(topo.nodes, key=lambda n: n.name):
        by_loc.setdefault(n.location, []).append(n)
    lines = []
    for i, (loc, members) in enumerate(sorted(by_loc.items())):
        lines.append(f"  subgraph cluster_{i} {{")
        lines.append(f"    label={_dot_id('location: ' + (loc or '(none)'))};")
        for n in members:
            label = "\\n".join([
                n.name + (" (leader)" if any(s.leader.name == n.name and len(s.members) > 1 for s in segs) else ""),
                f"location: {n.location or '-'}", f"pod: {n.pod_cidr}",
                f"internal: {n.internal_ip or '-'}", f"wireguard: {wg_of.get(n.name) or '-'}",
                f"endpoint: {n.endpoint or '-'}",
            ])
            lines.append(f"    {_dot_id(n.name)} [label=\"{label}\"];")
        lines.append("  }")
    return lines


def _dot_edges(topo: Topology) -> dict[tuple[str, str], str]:
    """The graph's links, read from every node's plan: (a, b) with a < b -> the edge's attributes.
    A node's WireGuard peers are drawn on the rung its plan gives the pair (tunnel,
    wireguard-private or relay; a pair whose private rung carries it, with WireGuard standing by,
    on that rung), non-node peers as WireGuard, and the pairs on a private rung (a location's
    members, or nodes no WireGuard peer joins) on that rung."""
    rungs: dict[tuple[str, str], str] = {}
    relays: dict[tuple[str, str], str] = {}

    def add(n: str, other: str, rung: str) -> None:
        pair = (min(n, other), max(n, other))
        old = rungs.get(pair)
        if old is None or _EDGE_COST.index(rung) > _EDGE_COST.index(old):
            rungs[pair] = rung

    for n in topo.nodes:
        plan = plan_node(topo, n.name)
        for peer in plan.peers:
            other = ("peer:" + peer.name) if peer.kind == "peer" else peer.name
            add(n.name, other, plan.paths.get(peer.name, "tunnel") if peer.kind != "peer" else "tunnel")
        for other, rung in plan.paths.items():
            if rung in PRIVATE_RUNGS and rung != "wireguard-private":
                add(n.name, other, rung)
        for other, (via, _) in plan.relays.items():
            relays[(min(n.name, other), max(n.name, other))] = via
    return {pair: EDGE_ATTRS[rung] + (f', label="relay via {relays[pair]}"' if rung == "relay" and pair in relays
                                      else "") for pair, rung in rungs.items()}


PRIVATE_KEY_PLACEHOLDER = "# PrivateKey = <kept on the node, never printed>"
# The formats of `meshctl showconf -o`: `wireguard` is what `wg setconf` reads (Kilo's kgctl
# default); `wg-quick` adds the Address lines wg-quick wants; json and yaml are for programs.
SHOWCONF_FORMATS: tuple[str, ...] = ("wireguard", "wg-quick", "json", "yaml")


@dataclass(frozen=True)
class WgPeer:
    """One [Peer] section. `preshared_key` is where the key comes from (a Secret reference), never
    the key: showconf prints configs people paste and pipe."""

    name: str
    public_key: str
    endpoint: Endpoint | None
    allowed_ips: tuple[IPNetwork, ...]
    persistent_keepalive: int | None = None
    preshared_key: KeyRef | None = None
    # Only in the config a peer itself uses (showconf peer): the key read from `preshared_key`
    # where the shell could read it, else why not and where it is. Never in a repr or a log.
    preshared_key_value: str | None = field(default=None, repr=False)
    preshared_key_note: str | None = None


# Why a peer's config leaves a node out (showconf peer).
NO_REACHABLE_ENDPOINT = "no endpoint the peer can reach"


@dataclass(frozen=True)
class WgConf:
    """A whole WireGuard config without its private key: [Interface] and its peers; `left_out`:
    the nodes it has no [Peer] for, because neither end could start a handshake."""

    listen_port: int | None
    addresses: tuple[IPInterface | IPNetwork, ...]
    peers: tuple[WgPeer, ...]
    note: str | None = None
    left_out: tuple[str, ...] = ()


def _endpoint_of(text: str | None) -> Endpoint | None:
    if not text:
        return None
    host, _, port = text.rpartition(":")
    return Endpoint(host.strip("[]"), int(port))


def node_conf(topo: Topology, plan: NodePlan) -> WgConf:
    """The config of node `plan.node`'s WireGuard device, from its plan."""
    peers = tuple(WgPeer(p.name, p.public_key, _endpoint_of(p.endpoint), p.allowed_ips, p.persistent_keepalive or None,
                         p.preshared_key) for p in plan.peers)
    note = None if plan.wireguard_ip is not None else \
        f"{plan.node} is not a segment leader: it reaches the mesh through {plan.leader}"
    return WgConf(topo.mesh.port, (plan.wireguard_ip,) if plan.wireguard_ip else (), peers, note)


def _segment_peer(s: Segment, keepalive: int | None, extra: Sequence[IPNetwork] = (),
                  psk: KeyRef | None = None) -> WgPeer:
    addrs = [*segment_addresses(s.members, s.wireguard_ip, None), *extra]
    return WgPeer(s.peer_name, s.leader.public_key, s.leader.endpoint, tuple(sorted(set(addrs), key=sort_key_net)),
                  keepalive, psk)


def _peer_of(topo: Topology, name: str) -> Peer:
    peer = next((p for p in topo.peers if p.name == name), None)
    if peer is None:
        raise InputError("peer", name, "is not a peer of the topology")
    return peer


def peer_conf(topo: Topology, name: str) -> WgConf:
    """The config a non-node peer uses to join the mesh: one [Peer] per segment leader, carrying
    that segment's addresses and the peer's pre-shared key reference (Kilo's `kgctl showconf
    peer`). A segment whose leader has no endpoint is left out when the peer has none either:
    neither end could ever start the handshake (its nodes are named in `left_out`)."""
    peer = _peer_of(topo, name)
    kept, left_out = [], []
    for s in segments(topo):
        if s.leader.endpoint is None and peer.endpoint is None:
            left_out += [m.name for m in s.members]
        else:
            kept.append(_segment_peer(s, peer.persistent_keepalive, psk=peer.preshared_key))
    return WgConf(None, peer.allowed_ips, tuple(kept), left_out=tuple(left_out))


def node_as_peer(topo: Topology, name: str, extra: Sequence[IPNetwork] = ()) -> WgPeer:
    """Node `name` as other WireGuard devices (another cluster, a laptop) must know it: its
    segment's leader key and endpoint, the segment's addresses plus `extra` (Kilo's `--as-peer`
    with `--allowed-ips`). For a member that does not lead, that is its leader's segment."""
    s = next(s for s in segments(topo) if any(m.name == name for m in s.members))
    return _segment_peer(s, s.leader.persistent_keepalive or None, extra)


def peer_as_peer(topo: Topology, name: str, extra: Sequence[IPNetwork] = ()) -> WgPeer:
    """Peer `name` as the mesh's nodes know it."""
    p = _peer_of(topo, name)
    allowed = tuple(sorted(set(p.allowed_ips) | set(extra), key=sort_key_net))
    return WgPeer(p.name, p.public_key, p.endpoint, allowed, p.persistent_keepalive, p.preshared_key)


def _peer_lines(p: WgPeer) -> list[str]:
    out = ["[Peer]", f"# {p.name}", f"PublicKey = {p.public_key}"]
    if p.preshared_key_value is not None:
        out.append(f"PresharedKey = {p.preshared_key_value}")
    elif p.preshared_key_note is not None:
        out.append(f"# PresharedKey: {p.preshared_key_note}")
    elif p.preshared_key:
        out.append(f"# PresharedKey = <from {p.preshared_key}, never printed>")
    if p.endpoint is not None:
        out.append(f"Endpoint = {p.endpoint}")
    out.append(f"AllowedIPs = {', '.join(map(str, p.allowed_ips))}")
    if p.persistent_keepalive:
        out.append(f"PersistentKeepalive = {p.persistent_keepalive}")
    return out


def conf_text(conf: WgConf, fmt: str) -> str:
    """`wireguard` (what `wg setconf` accepts: the addresses are comments) or `wg-quick`."""
    out = ["[Interface]", PRIVATE_KEY_PLACEHOLDER]
    if conf.listen_port:
        out.append(f"ListenPort = {conf.listen_port}")
    if conf.addresses:
        out.append(f"{'' if fmt == 'wg-quick' else '# '}Address = {', '.join(map(str, conf.addresses))}")
    if conf.note:
        out.append(f"# Note: {conf.note}")
    out += [f"# left out: {n} ({NO_REACHABLE_ENDPOINT})" for n in conf.left_out]
    for p in conf.peers:
        out += ["", *_peer_lines(p)]
    return "\n".join(out) + "\n"


def peer_text(p: WgPeer) -> str:
    return "\n".join(_peer_lines(p)) + "\n"


def _peer_dict(p: WgPeer) -> dict[str, Any]:
    """A [Peer] for programs: the pre-shared key itself only where it was read, else where it is."""
    psk: dict[str, Any] = {}
    if p.preshared_key_value is not None:
        psk = {"preshared_key": p.preshared_key_value}
    elif p.preshared_key is not None:
        psk = {"preshared_key_from": str(p.preshared_key),
               **({"preshared_key_note": p.preshared_key_note} if p.preshared_key_note else {})}
    return {"name": p.name, "public_key": p.public_key, "endpoint": str(p.endpoint) if p.endpoint else None,
            "allowed_ips": [str(a) for a in p.allowed_ips], "persistent_keepalive": p.persistent_keepalive or 0,
            **psk}


def conf_dict(conf: WgConf) -> dict[str, Any]:
    left_out = [{"name": n, "reason": NO_REACHABLE_ENDPOINT} for n in conf.left_out]
    return {"interface": {"listen_port": conf.listen_port, "addresses": [str(a) for a in conf.addresses],
                          **({"note": conf.note} if conf.note else {})},
            "peers": [_peer_dict(p) for p in conf.peers], **({"left_out": left_out} if left_out else {})}


def peer_resource(p: WgPeer, api_version: str, name: str | None = None) -> dict[str, Any]:
    """A Peer object (meshctl.io or kilo.squat.ai v1alpha1) another cluster can apply."""
    spec: dict[str, Any] = {"allowedIPs": [str(a) for a in p.allowed_ips], "publicKey": p.public_key}
    if p.endpoint is not None:
        host = "ip" if p.endpoint.ip is not None else "dns"
        spec["endpoint"] = {"dnsOrIP": {host: p.endpoint.host}, "port": p.endpoint.port}
    if p.persistent_keepalive:
        spec["persistentKeepalive"] = p.persistent_keepalive
    if p.preshared_key is not None and p.preshared_key.source == "secret":
        spec["presharedKey"] = {"secretKeyRef": {"name": p.preshared_key.name, "key": p.preshared_key.key}}
    return {"apiVersion": api_version, "kind": "Peer", "metadata": {"name": name or p.name}, "spec": spec}


def node_rows(topo: Topology, remotes: Sequence[Remote], plan: NodePlan) -> list[dict[str, Any]]:
    """`meshctl node list` from one node's point of view: every local and remote node, its
    addresses, its segment's WireGuard address (leaders only) and the path this node takes to it
    (with the relaying node and why, for path `relay`)."""
    rows: list[dict[str, Any]] = []
    relays = plan.relays

    def add(nodes: Sequence[Node], segs: Sequence[Segment], source: str, cluster: str) -> None:
        wg = {s.leader.name: s.wireguard_ip for s in segs}
        for n in nodes:
            rows.append({
                "name": n.qualified_name, "cluster": cluster, "source": source, "location": n.location,
                "internal_ip": str(n.internal_ip) if n.internal_ip else None,
                "endpoint": str(n.endpoint) if n.endpoint else None, "pod_cidr": str(n.pod_cidr),
                "wireguard_ip": str(wg[n.name]) if n.name in wg else None,
                "path": plan.paths.get(n.qualified_name, "none"),
                "relay": relays[n.qualified_name][0] if n.qualified_name in relays else None,
                "relay_reason": relays[n.qualified_name][1] if n.qualified_name in relays else None,
            })

    add(topo.nodes, segments(topo), "local", topo.cluster.name)
    for r in remotes:
        add(r.nodes, r.segments or segments(r.topology), "remote", r.topology.cluster.name)
    rows.sort(key=lambda r: (r["source"] != "local", r["name"]))
    return rows


def node_rows_table(rows: Sequence[dict[str, Any]]) -> str:
    return table([(r["name"], r["source"], r["location"] or None, r["internal_ip"], r["pod_cidr"], r["wireguard_ip"],
                   r["path"], r.get("relay")) for r in rows],
                 ["NAME", "SOURCE", "LOCATION", "INTERNAL", "POD CIDR", "WIREGUARD", "PATH", "RELAY"])
