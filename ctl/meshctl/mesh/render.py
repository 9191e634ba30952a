"""Plans and topologies as people and programs read them: JSON, tables, Graphviz DOT and
wg-quick configs. Pure functions of the plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from meshctl.mesh.model import Node, Topology, private_neighbours, sort_key_net
from meshctl.mesh.plan import NodePlan, Remote, Segment, segments


def plan_to_json(p: NodePlan) -> dict[str, Any]:
    return {
        "node": p.node,
        "granularity": p.granularity,
        "leader": p.leader,
        "wireguard_ip": str(p.wireguard_ip) if p.wireguard_ip else None,
        "peers": [
            {
                "name": x.name,
                "kind": x.kind,
                "public_key": x.public_key,
                "endpoint": x.endpoint,
                "allowed_ips": [str(a) for a in x.allowed_ips],
                "persistent_keepalive": x.persistent_keepalive,
            }
            for x in p.peers
        ],
        "routes": [{"dst": str(r.dst), "via": str(r.via) if r.via else None, "dev": r.dev} for r in p.routes],
        "fastpath": [
            {"prefix": str(e.prefix), "action": e.action, "nexthop": str(e.nexthop) if e.nexthop else None}
            for e in p.fastpath
        ],
    }


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
    out.append(table([(e.prefix, e.action, e.nexthop) for e in p.fastpath], ["PREFIX", "ACTION", "NEXT HOP"]))
    return "\n".join(out)


def _dot_id(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def graph_dot(topo: Topology) -> str:
    """Graphviz DOT: one cluster subgraph per location; solid edges are WireGuard links (between
    segment leaders, or between nodes in full/cross), dotted edges are direct private pairs."""
    from meshctl.mesh.plan import plan_node

    segs = segments(topo)
    wg_of = {}
    for s in segs:
        for m in s.members:
            wg_of[m.name] = s.wireguard_ip if m.name == s.leader.name else None
    lines = [f"digraph {_dot_id(topo.cluster.name)} {{", "  graph [compound=true, rankdir=LR];",
             "  node [shape=box, style=rounded, fontname=Helvetica, fontsize=10];", "  edge [dir=none];"]
    by_loc: dict[str, list] = {}
    for n in sorted(topo.nodes, key=lambda n: n.name):
        by_loc.setdefault(n.location, []).append(n)
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
    for p in sorted(topo.peers, key=lambda p: p.name):
        lines.append(f"  {_dot_id('peer:' + p.name)} [label=\"{p.name}\\npeer\\n"
                     f"{', '.join(map(str, p.allowed_ips))}\", shape=ellipse];")
    edges: set[tuple[str, str, str]] = set()
    for n in topo.nodes:
        plan = plan_node(topo, n.name)
        for peer in plan.peers:
            other = ("peer:" + peer.name) if peer.kind == "peer" else peer.name
            a, b = sorted((n.name, other))
            edges.add((a, b, "solid"))
        for r in plan.routes:
            if r.dev != "private":
                continue
            for m in topo.nodes:
                if m.pod_cidr == r.dst and m.internal_ip is not None and r.via == m.internal_ip.ip \
                        and private_neighbours(n, m):
                    a, b = sorted((n.name, m.name))
                    edges.add((a, b, "dotted"))
    for a, b, style in sorted(edges):
        lines.append(f"  {_dot_id(a)} -> {_dot_id(b)} [style={style}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


PRIVATE_KEY_PLACEHOLDER = "# PrivateKey = <kept on the node, never printed>"


def wg_quick(interface: Mapping[str, str | None], peers: Sequence[dict[str, Any]]) -> str:
    """A wg-quick style config: [Interface] then one [Peer] a peer; None values are left out."""
    out = ["[Interface]", PRIVATE_KEY_PLACEHOLDER]
    out += [f"{k} = {v}" for k, v in interface.items() if v]
    for p in peers:
        out += ["", "[Peer]", f"# {p['name']}", f"PublicKey = {p['public_key']}"]
        if p.get("endpoint"):
            out.append(f"Endpoint = {p['endpoint']}")
        out.append(f"AllowedIPs = {', '.join(map(str, p['allowed_ips']))}")
        if p.get("persistent_keepalive"):
            out.append(f"PersistentKeepalive = {p['persistent_keepalive']}")
    return "\n".join(out) + "\n"


def showconf_node(topo: Topology, plan: NodePlan) -> str:
    iface = {"ListenPort": str(topo.mesh.port), "Address": str(plan.wireguard_ip) if plan.wireguard_ip else None}
    peers = [{"name": p.name, "public_key": p.public_key, "endpoint": p.endpoint, "allowed_ips": p.allowed_ips,
              "persistent_keepalive": p.persistent_keepalive} for p in plan.peers]
    if plan.wireguard_ip is None:
        iface["# Note"] = f"{plan.node} is not a segment leader: it reaches the mesh through {plan.leader}"
    return wg_quick(iface, peers)


def showconf_peer(topo: Topology, name: str) -> str:
    """The config a non-node peer uses to join the mesh: one [Peer] per segment leader, carrying
    that segment's addresses (Kilo's `kgctl showconf peer`)."""
    from meshctl.errors import InputError
    from meshctl.mesh.plan import segment_addresses

    peer = next((p for p in topo.peers if p.name == name), None)
    if peer is None:
        raise InputError("peer", name, "is not a peer of the topology")
    peers = []
    for s in segments(topo):
        addrs = segment_addresses(s.members, s.wireguard_ip, None)
        peers.append({"name": s.peer_name, "public_key": s.leader.public_key,
                      "endpoint": str(s.leader.endpoint) if s.leader.endpoint else None,
                      "allowed_ips": sorted(set(addrs), key=sort_key_net),
                      "persistent_keepalive": peer.persistent_keepalive})
    iface = {"Address": ", ".join(str(a) for a in peer.allowed_ips)}
    return wg_quick(iface, peers)


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
