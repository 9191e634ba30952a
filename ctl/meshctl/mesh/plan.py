"""The mesh plan: a pure function from node records to one node's WireGuard peers, routes and
fast-path entries. Nothing here touches the system; appliers consume a `NodePlan`.

The semantics (segments, leaders, private pairs, WireGuard IPs) are the contract written down in
docs/mesh.md; the topology is computed once (`segments`) and routes are derived from it, as in
Kilo's pkg/mesh.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from meshctl.errors import InputError
from meshctl.mesh.model import (
    ENCAP_RUNGS,
    FIXED_RUNG,
    Endpoint,
    Granularity,
    IPAddress,
    IPInterface,
    IPNetwork,
    KeyRef,
    Node,
    PathState,
    Rung,
    Topology,
    gc_paused,
    host_net,
    private_joined,
    private_neighbours,
    sort_key_net,
)
from meshctl.mesh.natview import NatView, choose_relay, nat_view

Dev = Literal["private", "wireguard"]
Action = Literal["local", "direct", "tunnel"]
EncapKind = Literal["vxlan", "ipip"]
ENCAP_KINDS: tuple[EncapKind, ...] = ("vxlan", "ipip")
PeerKind = Literal["node", "segment", "peer"]


@dataclass(frozen=True)
class Segment:
    """Nodes that share one WireGuard identity: a location (location granularity) or one node."""

    key: str
    members: tuple[Node, ...]
    leader: Node
    wireguard_ip: IPInterface
    cluster: str = ""

    @property
    def peer_name(self) -> str:
        return self.leader.qualified_name


@dataclass(frozen=True)
class PeerPlan:
    name: str
    kind: PeerKind
    public_key: str
    endpoint: str | None
    allowed_ips: tuple[IPNetwork, ...]
    persistent_keepalive: int
    preshared_key: KeyRef | None = None  # where the key is (extra peers only); never the key
    # The peer may sit behind NAT (no public endpoint of its own, or it keeps its mappings open):
    # the endpoint WireGuard learned from its handshakes is kept over `endpoint` (docs/nat.md).
    roaming: bool = False
    # `endpoint` is one the mesh discovered (confirmed by other nodes' handshakes), not configured.
    discovered: bool = False


@dataclass(frozen=True)
class Encap:
    """How a `direct` entry wraps the pod packet before it leaves on the private NIC: `kind` is the
    rung's encapsulation, `local` this node's private address (the outer source) and `remote` the
    peer's (the outer destination). Outer addresses are what a VPC fabric forwards; the pod
    addresses travel inside."""

    kind: EncapKind
    local: IPAddress
    remote: IPAddress


@dataclass(frozen=True)
class Route:
    """A route the route applier installs. Encapsulated rungs have none: their pod CIDR's
    fast-path entry carries the encapsulation (the eBPF program, or the tunnel devices of the
    kernel fallback, node/tunnels.py, carry it)."""

    dst: IPNetwork
    via: IPAddress | None
    dev: Dev


@dataclass(frozen=True)
class FastPathEntry:
    """One decision per pod CIDR. `nexthop`: the private next hop of a raw direct entry (None:
    on-link); an encapsulated direct entry (`encap` set) leaves `nexthop` None unless the outer
    packet must go through a gateway. `rung` names the path as the path ladder does."""

    prefix: IPNetwork
    action: Action
    nexthop: IPAddress | None
    encap: Encap | None = None

    @property
    def rung(self) -> str:
        """"local", "tunnel", "direct", "direct+vxlan" or "direct+ipip"."""
        return self.action if self.encap is None else f"{self.action}+{self.encap.kind}"


@dataclass(frozen=True)
class NodePlan:
    node: str
    granularity: str
    leader: str
    wireguard_ip: IPInterface | None
    peers: tuple[PeerPlan, ...]
    routes: tuple[Route, ...]
    fastpath: tuple[FastPathEntry, ...]
    # How this node reaches every other node: qualified name -> local, via-leader, relay or a rung
    # of the path ladder (direct, direct+ipip, direct+vxlan, wireguard-private, tunnel).
    paths: dict[str, str] = field(default_factory=dict, compare=False)
    # Nodes reached through a relay: qualified name -> (the relaying node, why).
    relays: dict[str, tuple[str, str]] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class Remote:
    """Another cluster as this node sees it: its whole topology as its cluster publishes it (its
    segments, leaders and WireGuard addresses come from all of it, as its own plan gives them)
    and the names of the records admitted here (only those get routes)."""

    topology: Topology
    admitted: frozenset[str]
    segments: tuple[Segment, ...] = ()  # segments(topology), when the caller already has them

    @property
    def nodes(self) -> list[Node]:
        return [n for n in self.topology.nodes if n.name in self.admitted]


# --- topology --------------------------------------------------------------------------------


def segment_key(node: Node, granularity: str) -> str:
    if granularity == "location" and node.internal_ip is not None:
        return f"location:{node.location}"
    return f"node:{node.name}"


def choose_leader(members: Sequence[Node]) -> Node:
    """By name: the first with `leader` and a public endpoint; else the first with `leader`;
    else the first with a public endpoint; else the first."""
    if len(members) == 1:
        return members[0]
    ordered = sorted(members, key=lambda n: n.name)

    def public(n: Node) -> bool:
        return n.endpoint is not None and n.endpoint.is_public

    for pick in (lambda n: n.leader and public(n), lambda n: n.leader, public):
        for n in ordered:
            if pick(n):
                return n
    return ordered[0]


def segments(topo: Topology) -> list[Segment]:
    """The topology's segments, sorted by key; the i-th gets the subnet's address i+1."""
    gran = topo.mesh.granularity
    groups: dict[str, list[Node]] = {}
    for n in topo.nodes:
        groups.setdefault(segment_key(n, gran), []).append(n)
    subnet = topo.mesh.subnet
    if len(groups) + 1 >= subnet.num_addresses:
        raise InputError("mesh.subnet", str(subnet), f"has no room for {len(groups)} segments")
    iface = ipaddress.IPv4Interface if subnet.version == 4 else ipaddress.IPv6Interface
    base = int(subnet.network_address)
    out: list[Segment] = []
    for i, key in enumerate(sorted(groups)):
        members = tuple(sorted(groups[key], key=lambda n: n.name))
        wg = iface((base + i + 1, subnet.prefixlen))
        cluster = members[0].cluster
        out.append(Segment(key, members, choose_leader(members), wg, cluster))
    return out


# --- the plan --------------------------------------------------------------------------------


class _Builder:
    """Collects routes and peers; the first route for a destination wins (deterministic because
    callers walk nodes in sorted order)."""

    def __init__(self) -> None:
        self.routes: dict[IPNetwork, Route] = {}
        self.encaps: dict[IPNetwork, Encap] = {}  # pod CIDRs on an encapsulated rung (no route)
        self.peers: list[PeerPlan] = []
        self.private_endpoints: list[tuple[int, IPAddress]] = []  # (index in peers, address)

    def route(self, dst: IPNetwork, via: IPAddress | None, dev: Dev) -> None:
        if dst not in self.encaps:
            self.routes.setdefault(dst, Route(dst, via, dev))

    def private(self, dst: IPNetwork, me: Node, to: Node, rung: Rung) -> None:
        """A pod CIDR over the private network to node `to`, on a direct or encapsulated rung."""
        assert to.internal_ip is not None and me.internal_ip is not None
        kind: EncapKind | None = ENCAP_RUNGS.get(rung)  # type: ignore[assignment]
        if kind is None:
            self.route(dst, to.internal_ip.ip, "private")
        elif dst not in self.routes:
            self.encaps.setdefault(dst, Encap(kind, me.internal_ip.ip, to.internal_ip.ip))

    def peer(self, name: str, kind: PeerKind, key: str, endpoint: Endpoint | str | None,
             allowed: list[IPNetwork], keepalive: int, psk: KeyRef | None = None, *, roaming: bool = False,
             discovered: bool = False) -> None:
        uniq = sorted(set(allowed), key=sort_key_net)
        if isinstance(endpoint, Endpoint) and endpoint.ip is not None and not endpoint.is_public:
            self.private_endpoints.append((len(self.peers), endpoint.ip))
        self.peers.append(PeerPlan(name, kind, key, str(endpoint) if endpoint else None, tuple(uniq), keepalive,
                                   preshared_key=psk, roaming=roaming, discovered=discovered))


def segment_addresses(members: Sequence[Node], wg: IPInterface | None, exclude_internal_of: Node | None
                       ) -> list[IPNetwork]:
    """What a segment's peer carries: pod CIDRs, internal /32s, the WireGuard IP and location IPs."""
    out: list[IPNetwork] = []
    for m in members:
        out.append(m.pod_cidr)
        if m.internal_ip is not None and not (exclude_internal_of and private_neighbours(exclude_internal_of, m)):
            out.append(host_net(m.internal_ip))
        out.extend(m.allowed_location_ips)
    if wg is not None:
        out.append(host_net(wg))
    return out


def pair_rungs(mesh_intra: str, granularity: str, private_networks: tuple[IPNetwork, ...], me: Node, r: Node
               ) -> tuple[Rung, ...]:
    """The rungs node `me` may use towards `r` (full/cross granularity), cheapest first; the last
    is always `tunnel`. The fixed modes direct, wireguard-private and wireguard keep their old
    rule (private neighbours only); vxlan, ipip and auto take every pair one routed private network
    joins (private_joined). In cross granularity a private pair must share a location."""
    same_loc_ok = granularity == "full" or me.location == r.location
    if mesh_intra in ("direct", "wireguard-private", "wireguard"):
        if mesh_intra != "wireguard" and same_loc_ok and private_neighbours(me, r):
            return (FIXED_RUNG[mesh_intra], "tunnel")
        return ("tunnel",)
    if not same_loc_ok or not private_joined(me, r, private_networks):
        return ("tunnel",)
    if mesh_intra != "auto":
        return (FIXED_RUNG[mesh_intra], "tunnel")
    first: tuple[Rung, ...] = ("direct",) if private_neighbours(me, r) else ()
    return (*first, "direct+ipip", "direct+vxlan", "wireguard-private", "tunnel")


def member_rungs(mesh_intra: str, me: Node, m: Node) -> tuple[Rung, ...]:
    """The rungs between two members of one location (location granularity): inside a location
    traffic is private (Kilo's rule) and there is no WireGuard between members, so the ladder
    stops at the encapsulated rungs; the fixed WireGuard modes and `direct` keep today's direct."""
    if mesh_intra in ("vxlan", "ipip"):
        return (FIXED_RUNG[mesh_intra],)
    if mesh_intra == "auto":
        first: tuple[Rung, ...] = ("direct",) if private_neighbours(me, m) else ()
        return (*first, "direct+ipip", "direct+vxlan")
    return ("direct",)


def choose_rung(rungs: Sequence[Rung], working: frozenset[str] | None) -> Rung:
    """The cheapest rung that delivers (`working`: the probed private rungs; None: all of them).
    `tunnel` always delivers; a ladder without it falls back to its first rung."""
    if working is None:
        return rungs[0]
    for rung in rungs:
        if rung == "tunnel" or rung in working:
            return rung
    return rungs[0]


def probe_ladders(topo: Topology, name: str) -> dict[str, tuple[Rung, ...]]:
    """The peers node `name` probes under `intra_subnet: auto`, with each pair's ladder: every
    node whose ladder has a private rung (full/cross: pair_rungs; location: its own members)."""
    mesh = topo.mesh
    me = topo.node(name)
    if me is None or mesh.intra_subnet != "auto" or me.internal_ip is None:
        return {}
    out: dict[str, tuple[Rung, ...]] = {}
    for r in topo.nodes:
        if r.name == me.name or r.internal_ip is None:
            continue
        if mesh.granularity == "location":
            if r.location != me.location:
                continue
            ladder = member_rungs(mesh.intra_subnet, me, r)
        else:
            ladder = pair_rungs(mesh.intra_subnet, mesh.granularity, mesh.private_networks, me, r)
        if any(rung != "tunnel" for rung in ladder):
            out[r.qualified_name] = ladder
    return out


def plan_node(topo: Topology, name: str, remotes: Sequence[Remote] = (),
              granularity: Granularity | None = None, path_state: PathState | None = None) -> NodePlan:
    """The plan of node `name`. `remotes` are other clusters' topologies (already admitted:
    see mesh.admit.admit_remotes); `granularity` overrides the topology's; `path_state` holds
    the probes' verdicts under `intra_subnet: auto` (None: every rung works)."""
    with gc_paused():
        return _plan_node(topo, name, remotes, granularity, path_state or {})


def _plan_node(topo: Topology, name: str, remotes: Sequence[Remote], granularity: Granularity | None,
               state: PathState) -> NodePlan:
    """The plan of one node: segments and leaders, then its peers, routes and fast-path entries
    by the role it has (leader, member, lone node) and the granularity. Long because the table of
    cases (docs/mesh.md) reads top to bottom here, case by case, as the contract states it."""
    if granularity is not None and granularity != topo.mesh.granularity:
        from dataclasses import replace

        topo = replace(topo, mesh=replace(topo.mesh, granularity=granularity))
    me = topo.node(name)
    if me is None:
        raise InputError("--node", name, "is not a node of the topology")
    mesh = topo.mesh
    segs = segments(topo)
    my_seg = next(s for s in segs if any(m.name == name for m in s.members))
    if mesh.intra_subnet != "auto":
        state = {}  # the fixed modes switch probing off: their rungs do not depend on it
    b = _Builder()
    keepalive = me.persistent_keepalive
    paths: dict[str, str] = {me.qualified_name: "local"}
    view = nat_view(topo.nodes)
    relayed, extra = _relays(view, me, my_seg, segs, mesh.granularity, mesh.intra_subnet)
    relays: dict[str, tuple[str, str]] = {}

    def relay_or_none(s: Segment) -> IPInterface | None:
        """Plan segment s as reached through its relay (a peer with s's WireGuard IP only, for the
        direct attempt); returns the relay's WireGuard IP, None when s is reached directly."""
        if s.key not in relayed:
            return None
        via, reason = relayed[s.key]
        r = s.leader
        b.peer(s.peer_name, "node" if mesh.granularity != "location" else "segment", r.public_key,
               view.endpoint(r), [host_net(s.wireguard_ip)], keepalive, roaming=_roams(r),
               discovered=view.discovered(r))
        for m in s.members:
            paths[m.qualified_name] = "relay"
            relays[m.qualified_name] = (via.leader.qualified_name, reason)
        return via.wireguard_ip

    if mesh.granularity == "location":
        leads = my_seg.leader.name == me.name
        leader_ip = my_seg.leader.internal_ip.ip if my_seg.leader.internal_ip is not None else None
        member_rung: dict[str, Rung] = {}
        for m in my_seg.members:
            if m.name != me.name and m.internal_ip is not None:
                rung = choose_rung(member_rungs(mesh.intra_subnet, me, m), state.get(m.qualified_name))
                member_rung[m.name] = rung
                b.private(m.pod_cidr, me, m, rung)
                paths[m.qualified_name] = rung

        def to_leader(dst: IPNetwork, pod: bool = False) -> None:
            # Pod CIDRs follow the leader's rung; other addresses go raw (as before the ladder).
            rung = member_rung.get(my_seg.leader.name, "direct")
            if rung == "direct" or not pod or me.internal_ip is None:
                b.route(dst, leader_ip, "private")
            else:
                b.private(dst, me, my_seg.leader, rung)

        if not leads:
            for s in segs:
                to_leader(host_net(s.wireguard_ip))
        for s in segs:
            if s is my_seg:
                continue
            addrs = segment_addresses(s.members, None, None)
            via = relay_or_none(s) if leads else None
            if leads and via is None:
                b.peer(s.peer_name, "segment", s.leader.public_key, view.endpoint(s.leader),
                       addrs + [host_net(s.wireguard_ip)] + extra.get(s.key, []), keepalive,
                       roaming=_roams(s.leader), discovered=view.discovered(s.leader))
            pods = {m.pod_cidr for m in s.members}
            for dst in addrs:
                if leads:
                    b.route(dst, (via or s.wireguard_ip).ip, "wireguard")
                else:
                    to_leader(dst, dst in pods)
            if via is None:
                for m in s.members:
                    paths[m.qualified_name] = "tunnel" if leads else "via-leader"
    else:
        leads = True
        for s in segs:
            r, wg_r = s.leader, s.wireguard_ip
            if r.name == me.name:
                continue
            rungs = pair_rungs(mesh.intra_subnet, mesh.granularity, mesh.private_networks, me, r)
            working = state.get(r.qualified_name)
            rung = choose_rung(rungs, working)
            paths[r.qualified_name] = rung
            auto = mesh.intra_subnet == "auto"
            if rung != "tunnel" and rung != "wireguard-private":
                b.private(r.pod_cidr, me, r, rung)
                if not auto:
                    continue  # a fixed private rung: no WireGuard peer (the plans of before the ladder)
            # WireGuard: the pair's rung, or (auto) standing by so either end may switch to it at
            # any time and the other still accepts what arrives (make-before-break).
            private_ep = rung == "wireguard-private" or (
                auto and "wireguard-private" in rungs and (working is None or "wireguard-private" in working))
            ep: Endpoint | None = view.endpoint(r)
            if private_ep:
                assert r.internal_ip is not None
                ep = Endpoint(str(r.internal_ip.ip), r.endpoint.port if r.endpoint else mesh.port)
            dsts = [r.pod_cidr]
            # The internal address stays on the private network whenever one joins the pair: the
            # encapsulated rungs and WireGuard's private endpoint are sent to it.
            if r.internal_ip is not None and not private_neighbours(me, r) and len(rungs) == 1:
                dsts.append(host_net(r.internal_ip))
            dsts.extend(r.allowed_location_ips)
            via = relay_or_none(s)  # a relayed pair (both ends behind NAT): through a public node
            if via is None:
                b.peer(r.name, "node", r.public_key, ep, dsts + [host_net(wg_r)] + extra.get(s.key, []), keepalive,
                       roaming=_roams(r), discovered=view.discovered(r) and ep == view.endpoint(r))
            for dst in dsts:
                b.route(dst, (via or wg_r).ip, "wireguard")

    leader_ip = my_seg.leader.internal_ip.ip if my_seg.leader.internal_ip is not None else None
    for p in sorted(topo.peers, key=lambda p: p.name):
        if leads:
            b.peer(p.name, "peer", p.public_key, p.endpoint, list(p.allowed_ips), keepalive, p.preshared_key)
        for a in p.allowed_ips:
            b.route(a, None if leads else leader_ip, "wireguard" if leads else "private")

    for remote in sorted(remotes, key=lambda r: r.topology.cluster.name):
        _plan_remote(b, me, remote, leads, leader_ip, keepalive, paths)

    routes = tuple(sorted(b.routes.values(), key=lambda r: sort_key_net(r.dst)))
    fastpath = _fastpath(me, topo, remotes, b.routes, b.encaps)
    return NodePlan(
        node=me.name,
        granularity=mesh.granularity,
        leader=my_seg.leader.name,
        wireguard_ip=my_seg.wireguard_ip if leads else None,
        peers=tuple(sorted(_no_loops(b), key=lambda p: p.name)),
        routes=routes,
        fastpath=fastpath,
        paths=paths,
        relays=relays,
    )


def _no_loops(b: _Builder) -> list[PeerPlan]:
    """The peers, each without its endpoint when that address is routed into WireGuard by this
    plan: its packets would enter the tunnel they carry (a loop, or a direct attempt through a
    relay). This happens to a node behind NAT, whose configured endpoint is its inside address,
    which is also its internal address; such a peer calls us (keepalive) and WireGuard learns where
    it is. Only private endpoint addresses are looked up (mesh routes carry private ranges), and
    only at the prefix lengths the WireGuard routes use: large plans stay as fast as before."""
    if not b.private_endpoints:
        return b.peers
    plens = sorted({(r.dst.version, r.dst.prefixlen) for r in b.routes.values() if r.dev == "wireguard"})
    out = list(b.peers)
    for i, ip in b.private_endpoints:
        net = ipaddress.IPv4Network if ip.version == 4 else ipaddress.IPv6Network
        for version, plen in plens:
            r = b.routes.get(net((int(ip), plen), strict=False)) if version == ip.version else None
            if r is not None and r.dev == "wireguard":
                out[i] = replace(out[i], endpoint=None, discovered=False)
                break
    return out


def _node_addresses(me: Node, r: Node) -> list[IPNetwork]:
    """What node r's peer carries for `me` in full/cross granularity (besides r's WireGuard IP):
    its pod CIDR, its internal address unless the two are private neighbours, its location IPs."""
    out = [r.pod_cidr]
    if r.internal_ip is not None and not private_neighbours(me, r):
        out.append(host_net(r.internal_ip))
    out.extend(r.allowed_location_ips)
    return out


def _roams(r: Node) -> bool:
    """r may sit behind NAT: no public endpoint of its own, or it keeps NAT mappings open."""
    return r.reachable_endpoint is None or r.persistent_keepalive > 0


def _relays(view: NatView, me: Node, my_seg: Segment, segs: Sequence[Segment], granularity: str,
            intra_subnet: str) -> tuple[dict[str, tuple[Segment, str]], dict[str, list[IPNetwork]]]:
    """The segments this node (when it leads) reaches through a relay: segment key -> (relaying
    segment, why); and what each relaying segment's peer carries for them. Pairs that go over the
    private network are never relayed; pairs without a relay candidate stay direct attempts."""
    relayed: dict[str, tuple[Segment, str]] = {}
    extra: dict[str, list[IPNetwork]] = {}
    if my_seg.leader.name != me.name:
        return relayed, extra

    def over_private(r: Node) -> bool:  # the pair talks over the private network, not WireGuard
        return granularity != "location" and private_neighbours(me, r) and intra_subnet == "direct" \
            and (granularity == "full" or me.location == r.location)

    wanted = []
    for s in segs:
        if s is my_seg:
            continue
        reason = view.relay_reason(me, s.leader)  # cheap, and None for almost every pair
        if reason is not None and not over_private(s.leader):
            wanted.append((s, reason))
    if not wanted:
        return relayed, extra
    candidates = {s.leader.name: s for s in segs
                  if s.leader.reachable_endpoint is not None and s is not my_seg and not over_private(s.leader)}
    for s, reason in wanted:
        r = s.leader
        via = choose_relay(view, me, r, [c.leader for c in candidates.values()])
        if via is None:
            continue
        seg = candidates[via.name]
        relayed[s.key] = (seg, reason)
        carried = segment_addresses(s.members, None, None) if granularity == "location" else _node_addresses(me, r)
        extra.setdefault(seg.key, []).extend(carried)
    return relayed, extra


def _plan_remote(b: _Builder, me: Node, remote: Remote, leads: bool, leader_ip: IPAddress | None,
                 keepalive: int, paths: dict[str, str]) -> None:
    """Another cluster's nodes: private neighbours of `me` go direct whatever the granularities;
    the rest of each remote segment is one WireGuard peer reached at the segment's leader."""
    for s in remote.segments or segments(remote.topology):
        members = tuple(m for m in s.members if m.name in remote.admitted)
        routes, peer, seg_paths = _remote_segment(me, s.wireguard_ip, s.leader, members, leads, leader_ip, keepalive)
        for r in routes:
            b.routes.setdefault(r.dst, r)
        if peer is not None:
            b.peers.append(peer)
        paths.update(seg_paths)


@functools.lru_cache(maxsize=4096)
def _remote_segment(me: Node, wg_ip: IPInterface, leader: Node, members: tuple[Node, ...], leads: bool,
                    leader_ip: IPAddress | None, keepalive: int
                    ) -> tuple[tuple[Route, ...], PeerPlan | None, tuple[tuple[str, str], ...]]:
    """One remote segment's share of the plan. Memoised (it is a pure function of its arguments):
    a remote change recomputes only the segment it touches, which keeps a reconcile with
    thousands of remote nodes fast."""
    b = _Builder()
    paths: list[tuple[str, str]] = []
    direct = [m for m in members if private_neighbours(me, m)]
    rest = [m for m in members if not private_neighbours(me, m)]
    for m in direct:
        assert m.internal_ip is not None
        b.route(m.pod_cidr, m.internal_ip.ip, "private")
        paths.append((m.qualified_name, "direct"))
    if rest:
        wg = host_net(wg_ip)
        addrs = segment_addresses(rest, None, me)
        if leads:
            b.peer(leader.qualified_name, "segment", leader.public_key, leader.endpoint, addrs + [wg], keepalive)
            b.route(wg, None, "wireguard")
        else:
            b.route(wg, leader_ip, "private")
        for dst in addrs:
            b.route(dst, wg_ip.ip if leads else leader_ip, "wireguard" if leads else "private")
        paths += [(m.qualified_name, "tunnel" if leads else "via-leader") for m in rest]
    return tuple(b.routes.values()), (b.peers[0] if b.peers else None), tuple(paths)


def _fastpath(me: Node, topo: Topology, remotes: Sequence[Remote], routes: dict[IPNetwork, Route],
              encaps: dict[IPNetwork, Encap]) -> tuple[FastPathEntry, ...]:
    """One entry per node pod CIDR: local for our own, direct (next hop) for a route on the
    private NIC, tunnel for a route through WireGuard."""
    out = [FastPathEntry(me.pod_cidr, "local", None)]
    for n in [*topo.nodes, *(n for r in remotes for n in r.nodes)]:
        if n is me:
            continue
        enc = encaps.get(n.pod_cidr)
        if enc is not None:
            out.append(FastPathEntry(n.pod_cidr, "direct", None, enc))
            continue
        r = routes.get(n.pod_cidr)
        if r is None:
            continue
        if r.dev == "private":
            out.append(FastPathEntry(n.pod_cidr, "direct", r.via))
        else:
            out.append(FastPathEntry(n.pod_cidr, "tunnel", None))
    return tuple(sorted(out, key=lambda e: sort_key_net(e.prefix)))


def mesh_cidrs(topo: Topology, remotes: list[Remote]) -> frozenset[IPNetwork]:
    """Everything inside the mesh (never masqueraded): pod CIDRs, the WireGuard subnet, location
    IPs and extra peers' allowed IPs, of this cluster and admitted remote ones. A set, not a sorted
    list: sorting 5,000 networks cost a reconcile ~50 ms, and the NAT applier diffs sets anyway."""
    out: set[IPNetwork] = {topo.mesh.subnet}
    for n in [*topo.nodes, *(n for r in remotes for n in r.nodes)]:
        out.add(n.pod_cidr)
        out.update(n.allowed_location_ips)
    for r in remotes:
        out.add(r.topology.mesh.subnet)
    for p in topo.peers:
        out.update(p.allowed_ips)
    return frozenset(out)
