# SPDX-License-Identifier: Apache-2.0
"""Warnings about a topology that is valid but will not do what its author most likely meant.

Errors (`InputError`, rejections) are for input that cannot be planned safely; the lines here are
for a plan that is safe but has a part that can never work, or a default the author may not have
meant. They never change the plan: `meshctl plan|graph|showconf` print them on stderr and exit 0.
The table of every case and why it is a warning or an error is in docs/mesh.md.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from meshctl.errors import InputError
from meshctl.mesh.admit import list_field
from meshctl.mesh.fields import endpoint
from meshctl.mesh.ladder import member_rungs, pair_rungs
from meshctl.mesh.model import FAMILIES, PRIVATE_RUNGS, IPNetwork, Node, Path, Topology, host_net, private_neighbours
from meshctl.mesh.natview import choose_relay, family_names, nat_view
from meshctl.mesh.plan import NodePlan
from meshctl.mesh.segments import Remote, segments

# How many unreachable pairs are named before the rest are counted.
MAX_PAIRS_NAMED = 5


def topology_warnings(topo: Topology, doc: Any = None) -> list[str]:
    """Every warning for `topo`; `doc` is the parsed YAML it came from (for what parsing filled in)."""
    out = _endpoint_ports(topo, doc)
    out += host_prefix_warnings(topo)
    out += dead_tunnels(topo)
    out += family_gaps(topo)
    out += unused_fields(topo)
    return out


def family_gaps(topo: Topology, only: str | None = None) -> list[str]:
    """WireGuard identities (segment leaders) that share no IP family, an IPv4-only and an
    IPv6-only node: neither can call the other, so the plan relays the pair through a node both
    can call (natview.choose_relay: a public endpoint in each one's family), or, without such a
    node, the pair can never talk. Named pairs first, then a count. `only`: that node's pairs."""
    leaders = [s.leader for s in segments(topo)] if topo.nodes else []
    ones = {f: sorted((n for n in leaders if n.families == {f}), key=lambda n: n.name) for f in FAMILIES}
    pairs = [(a, b) for a in ones[4] for b in ones[6] if only in (None, a.name, b.name)]
    if not pairs:
        return []
    view = nat_view(topo.nodes)
    relays = [n for n in leaders if n.reachable_endpoint is not None]
    out = []
    for a, b in pairs[:MAX_PAIRS_NAMED]:
        via = choose_relay(view, a, b, relays)
        why = f"relayed through {via.name} (path relay)" if via is not None else \
            "no node with a public endpoint in both families can relay for them, so they can never reach each " \
            "other (give one an endpoint in the other's family)"
        out.append(f"nodes {a.name} ({family_names(a)}) and {b.name} ({family_names(b)}) share no IP family: {why}")
    if len(pairs) > MAX_PAIRS_NAMED:
        out.append(f"{len(pairs) - MAX_PAIRS_NAMED} more pairs of an IPv4-only and an IPv6-only node share no IP "
                   f"family (relayed where a node with both can relay)")
    return out


def unused_fields(topo: Topology) -> list[str]:
    """Fields the plan overrides or ignores: the location of a node without an internal address
    (location granularity), a `leader` hint another node's wins over, a `wireguard_ip` other than
    the one the node's segment gets, reports naming no node."""
    segs = segments(topo) if topo.nodes else []
    seg_of = {m.name: s for s in segs for m in s.members}
    names = {n.name for n in topo.nodes}
    keys = {n.public_key for n in topo.nodes}
    # A location one node holds alone is its segment either way (a Droplet without a VPC, its
    # region label set as on every Kubernetes node): only a location shared with others is lost.
    shared = Counter(n.location for n in topo.nodes if n.location)
    out = []
    for i, n in enumerate(topo.nodes):
        s = seg_of[n.name]
        if topo.mesh.granularity == "location" and n.internal_ip is None and shared[n.location] > 1:
            out.append(f"nodes[{i}].location: {n.location!r} is not used: {n.name} has no internal_ip, so it is a "
                       f"segment of its own (location granularity groups nodes by their private network)")
        if n.leader and s.leader.name != n.name:
            out.append(f"nodes[{i}].leader: true is not used: {s.leader.name} leads location {n.location} "
                       f"({_why_leads(s.leader)})")
        wgs = s.addresses if s.leader.name == n.name else ()
        for j, a in enumerate(n.wireguard_ips):
            if a in wgs:
                continue
            got = next((w for w in wgs if w.version == a.version), None)
            gets = f"{n.name} gets {got}" if got is not None else \
                f"the mesh has no IPv{a.version} WireGuard subnet (mesh.subnet6)" if wgs else \
                f"{n.name} does not lead {s.key} and gets none"
            out.append(f"nodes[{i}].{list_field(n.wireguard_ips, 'wireguard_ip', j)}: {str(a)!r} is not used: "
                       f"WireGuard addresses follow the segments ({gets})")
        out += [f"nodes[{i}].unreached_peers: {x!r} is not a node, so the report is ignored"
                for x in n.unreached_peers if x not in names]
        out += [f"nodes[{i}].discovered_endpoints.{x}: {str(ep)!r} is not about a node, so the report is ignored"
                for x, ep in n.discovered_endpoints if x not in names and x not in keys]
    return out


def _why_leads(n: Node) -> str:
    """Why `n` leads its location (segments.choose_leader's order)."""
    public = n.endpoint is not None and n.endpoint.is_public
    if n.leader:
        return "the first by name with leader and a public endpoint" if public else "the first by name with leader"
    return "the first by name with a public endpoint" if public else "the first by name"


def _endpoint_ports(topo: Topology, doc: Any) -> list[str]:
    if not isinstance(doc, Mapping) or not isinstance(doc.get("nodes"), list):
        return []
    out = []
    for i, raw in enumerate(doc["nodes"]):
        ep = raw.get("endpoint") if isinstance(raw, Mapping) else None
        if not isinstance(ep, str) or not ep:
            continue
        try:
            endpoint(ep, "")
        except InputError:
            out.append(f"nodes[{i}].endpoint: {ep!r} has no port: the mesh port {topo.mesh.port} is used")
    return out


def host_prefix_warnings(topo: Topology, only: str | None = None, label: str = "nodes") -> list[str]:
    """What the plan does with each node whose internal address is a host address (/32, /128; a
    Hetzner NIC), said only where the operator should act. A host address makes the node nobody's
    private neighbour, so raw `direct` never joins it across nodes; a routed private network
    (`mesh.private_networks`, or the node's location in `location` granularity) still joins it,
    and then the ladder's encapsulated rungs carry its pairs and nothing is said. Warned: no
    private network joins it (every path is WireGuard), a fixed mode that leaves such a join
    unused, and location members that reach it raw (a fabric handing out /32s drops that).
    `only`: that node's own warning (an agent's view)."""
    mates = _join_candidates(topo)
    out = []
    for i, n in enumerate(topo.nodes):
        for j, ip in enumerate(n.internal_ips):  # each family's address on its own
            if ip.network.prefixlen != ip.max_prefixlen or only not in (None, n.name):
                continue
            head = f"{label}[{i}].{list_field(n.internal_ips, 'internal_ip', j)}: {str(ip)!r} is a host address"
            joined = next((m for m in mates(n, ip.version) if m.name != n.name), None)
            why = _host_prefix_why(topo, n, joined, ip.version)
            if why is not None:
                out.append(f"{head}: {why}")
    return out


def _join_candidates(topo: Topology) -> Callable[[Node, int], Iterator[Node]]:
    """For a node, the nodes a routed private network joins it to (model.private_joined without
    the neighbour rule, which a host address never meets), lazily: its location's, and in `full`
    granularity also those inside one of `mesh.private_networks` with it. Indexed once, so a file
    of thousands of /32 nodes is checked in linear time."""
    mesh = topo.mesh
    by_loc: dict[tuple[int, str], list[Node]] = {}
    by_net: dict[int, list[Node]] = {}
    nets_of: dict[str, list[int]] = {}
    for m in topo.nodes:
        for ip in m.internal_ips:
            if m.location and not m.cluster:
                by_loc.setdefault((ip.version, m.location), []).append(m)
            if mesh.granularity == "full":
                for k, net in enumerate(mesh.private_networks):
                    if net.version == ip.version and ip.ip in net:
                        by_net.setdefault(k, []).append(m)
                        nets_of.setdefault(m.name, []).append(k)

    def mates(n: Node, family: int) -> Iterator[Node]:
        """The nodes joined to n in IP version `family` (a network holds one family)."""
        if n.location and not n.cluster:
            yield from by_loc.get((family, n.location), [])
        for k in nets_of.get(n.name, []):
            if mesh.private_networks[k].version == family:
                yield from by_net[k]

    return mates


def _host_prefix_why(topo: Topology, n: Node, joined: Node | None, family: int | None = None) -> str | None:
    """What the plan does with host-addressed node `n` and what the operator may do about it;
    None when the plan already uses the private network well. `joined`: a node a routed private
    network joins to `n` (every such node takes the same rung, so one stands for all)."""
    mesh = topo.mesh
    # A dual-stack node's warning names the family: the other family's paths may be private.
    fam = f"IPv{family}" if family is not None and len(n.internal_ips) > 1 else ""
    of, every = (f" of {fam}", f"every {fam} path") if fam else ("", "every path")
    if joined is None:
        return (f"no private network{of} joins {n.name} to another node, so {every} to it is WireGuard "
                f"(list the routed network in mesh.private_networks, or write the subnet's prefix if "
                f"the nodes share one L2 subnet)")
    if mesh.granularity == "location":
        rung = member_rungs(mesh.intra_subnet, n, joined, family)[0]
        if rung == Path.DIRECT:
            return (f"intra_subnet {mesh.intra_subnet} sends the pod packets between {n.name} and its "
                    f"location's members raw (rung direct), which a network handing out host addresses "
                    f"usually drops (set intra_subnet: auto, ipip or vxlan)")
        return None
    rung = pair_rungs(mesh.intra_subnet, mesh.granularity, mesh.private_networks, n, joined, family,
                      cross_family=False)[0]
    if rung == Path.TUNNEL and mesh.intra_subnet != "wireguard":
        return (f"intra_subnet {mesh.intra_subnet} uses the private network only between private "
                f"neighbours, so {every} to {n.name} is WireGuard although a private network{of} "
                f"joins it to {joined.name} (set intra_subnet: auto to use the private network)")
    return None


def dead_tunnels(topo: Topology, only: str | None = None) -> list[str]:
    """WireGuard pairs in which neither side has an endpoint: neither can send the first handshake,
    so the tunnel never starts. Pairs that go direct (or use the private address as endpoint) are
    not tunnels of this kind. `only`: just the pairs of that node (an agent's own view)."""
    gran, intra = topo.mesh.granularity, topo.mesh.intra_subnet
    leaders = [s.leader for s in segments(topo)] if topo.nodes else []
    blind = sorted((n for n in leaders if n.endpoint is None), key=lambda n: n.name)
    pairs: list[str] = []
    total = 0
    for i, a in enumerate(blind):
        for b in blind[i + 1:]:
            if only is not None and only not in (a.name, b.name):
                continue
            if gran != "location" and intra != "wireguard" and private_neighbours(a, b) and \
                    (gran == "full" or a.location == b.location):
                continue  # direct, or WireGuard to the private address
            total += 1
            if len(pairs) < MAX_PAIRS_NAMED:
                pairs.append(f"nodes {a.name} and {b.name}")
        for p in topo.peers if only in (None, a.name) else ():
            if p.endpoint is None:
                total += 1
                if len(pairs) < MAX_PAIRS_NAMED:
                    pairs.append(f"node {a.name} and peer {p.name}")
    why = "neither has an endpoint, so the WireGuard tunnel between them can never start (give one an endpoint)"
    out = [f"{pair}: {why}" for pair in pairs]
    if total > len(pairs):
        out.append(f"{total - len(pairs)} more pairs: {why}")
    return out


def plan_warnings(topo: Topology, p: NodePlan, remotes: Sequence[Remote] = ()) -> list[str]:
    """What node `p.node`'s plan leaves out of the records of `topo` (its own cluster) and of the
    admitted `remotes`, one line each naming the field, the value and why: endpoints it cannot
    call, location IPs it does not route. The plan is safe without them; the operator may not
    have meant it."""
    out = _dropped_endpoints(topo, p) + _unrouted_location_ips(topo, p)
    routed = {r.dst for r in p.routes}
    for remote in remotes:
        for i, n in enumerate(remote.topology.nodes):
            for j, a in enumerate(n.allowed_location_ips if n.name in remote.admitted else ()):
                if a not in routed:
                    out.append(f"{remote.topology.cluster.name}.nodes[{i}].allowed_location_ips[{j}]: {str(a)!r} is "
                               f"not routed on {p.node}: {p.node} reaches {n.qualified_name} over the private "
                               f"network, which takes only the pod CIDR")
    return out


def _owners(topo: Topology) -> dict[IPNetwork, str]:
    """What each destination a plan may route is in the records (pod CIDRs, location IPs,
    internal addresses, extra peers' allowed IPs), built once per warning pass."""
    out: dict[IPNetwork, str] = {}
    for peer in topo.peers:
        out.update((a, f"peer {peer.name}'s allowed IPs") for a in peer.allowed_ips)
    for n in topo.nodes:
        if n.internal_ip is not None:
            out[host_net(n.internal_ip)] = f"{n.name}'s internal address"
        out.update((a, f"{n.name}'s allowed location IP") for a in n.allowed_location_ips)
        out.update((c, f"{n.name}'s pod CIDR") for c in n.pod_cidrs)
    return out


def _dropped_endpoints(topo: Topology, p: NodePlan) -> list[str]:
    """Peers that lost their endpoint because the plan routes its address into WireGuard (the
    endpoint would be sent into the tunnel it carries): such a peer is reached only once it calls.
    The covering route is looked up at the prefix lengths the plan's WireGuard routes use."""
    nodes = {n.name: (f"nodes[{i}]", n.endpoint) for i, n in enumerate(topo.nodes)}
    peers = {q.name: (f"peers[{i}]", q.endpoint) for i, q in enumerate(topo.peers)}
    wg = {r.dst for r in p.routes if r.dev == "wireguard"}
    plens = sorted({(d.version, d.prefixlen) for d in wg}, key=lambda v: -v[1])
    owners: dict[IPNetwork, str] | None = None
    out = []
    for peer in p.peers:
        where, ep = (peers if peer.kind == "peer" else nodes).get(peer.name, ("", None))
        ip = ep.ip if ep is not None and peer.endpoint is None else None
        if ep is None or ip is None:
            continue
        net = ipaddress.IPv4Network if ip.version == 4 else ipaddress.IPv6Network
        dst = next((d for v, plen in plens if v == ip.version for d in [net((int(ip), plen), strict=False)]
                    if d in wg), None)
        if dst is None:
            continue
        owners = owners if owners is not None else _owners(topo)
        out.append(f"{where}.endpoint: {str(ep)!r} is left out of {p.node}'s WireGuard peer {peer.name}: {p.node} "
                   f"routes {dst} ({owners.get(dst, 'a mesh route')}) into WireGuard, so {peer.name} is reached "
                   f"only after it calls {p.node} (persistent_keepalive)")
    return out


def _unrouted_location_ips(topo: Topology, p: NodePlan) -> list[str]:
    """Other nodes' allowed location IPs without a route in the plan (a location's own members
    reach their location's networks natively, so those are not counted)."""
    routed = {r.dst for r in p.routes}
    me = topo.node(p.node)
    out = []
    for i, n in enumerate(topo.nodes):
        if n.name == p.node or (p.granularity == "location" and me is not None and me.internal_ip is not None
                                and n.internal_ip is not None and n.location == me.location):
            continue
        for j, a in enumerate(n.allowed_location_ips):
            if a in routed:
                continue
            path = p.paths.get(n.qualified_name)
            why = "no role of the plan routes it"
            if path in PRIVATE_RUNGS:
                why = (f"intra_subnet {topo.mesh.intra_subnet} carries {p.node} and {n.name} on rung {path} "
                       f"without WireGuard, which takes only the pod CIDR")
            out.append(f"nodes[{i}].allowed_location_ips[{j}]: {str(a)!r} is not routed on {p.node}: {why}")
    return out
