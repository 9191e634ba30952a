# SPDX-License-Identifier: Apache-2.0
"""The mesh plan: a pure function from node records to one node's WireGuard peers, routes and
fast-path entries. Nothing here touches the system; appliers consume a `NodePlan`.

The semantics (segments, leaders, private pairs, WireGuard IPs) are the contract written down in
docs/mesh.md; the topology is computed once (`segments`) and routes are derived from it, as in
Kilo's pkg/mesh. Each role a node plays towards the others is one function that returns its
`Share` of the plan as values: a location's members (`_location_members`), a location member
that does not lead (`_location_member`) or the leader (`_location_leader`), one end of a
full/cross pair (`_pair`), the holder of the extra peers (`_extra_peers`) and a neighbour of
remote clusters (`_remote_shares`). `_merge` joins the shares in that order.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from typing import Literal, NamedTuple

from meshctl.errors import InputError
from meshctl.mesh.ladder import choose_rung, member_rungs, pair_rungs
from meshctl.mesh.model import (
    ENCAP_RUNGS,
    EncapKind,
    Endpoint,
    Granularity,
    IPAddress,
    IPInterface,
    IPNetwork,
    KeyRef,
    MeshSettings,
    Node,
    PathState,
    Peer,
    Rung,
    Topology,
    host_net,
    private_neighbours,
    sort_key_net,
)
from meshctl.mesh.natview import NatView, choose_relay, nat_view
from meshctl.mesh.segments import Remote, Segment, segment_addresses, segments

Dev = Literal["private", "wireguard"]
Action = Literal["local", "direct", "tunnel"]
PeerKind = Literal["node", "segment", "peer"]


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
class Encap:
    """How a `direct` entry wraps the pod packet before it leaves on the private NIC: `kind` is the
    rung's encapsulation, `local` this node's private address (the outer source) and `remote` the
    peer's (the outer destination). Outer addresses are what a VPC fabric forwards; the pod
    addresses travel inside."""

    kind: EncapKind
    local: IPAddress
    remote: IPAddress


@dataclass(frozen=True, slots=True)
class Route:
    """A route the route applier installs. Encapsulated rungs have none: their pod CIDR's
    fast-path entry carries the encapsulation (the eBPF program, or the tunnel devices of the
    kernel fallback, node/tunnels.py, carry it)."""

    dst: IPNetwork
    via: IPAddress | None
    dev: Dev


@dataclass(frozen=True, slots=True)
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


# --- the shares of a plan ----------------------------------------------------------------------

# A destination and how it is reached: a route, or (a pod CIDR on an encapsulated rung) the
# encapsulation its fast-path entry carries instead of a route.
Claim = tuple[IPNetwork, Route | Encap]
# A WireGuard peer, and the address of its endpoint when `_no_loops` must check it.
OfferedPeer = tuple[PeerPlan, IPAddress | None]


class Share(NamedTuple):
    """One role's part of a node's plan, as values. `claims` are in the order the role decides
    them: across the whole plan the first claim on a destination wins. `paths` name how each node
    is reached, `relays` the relaying node and why, for nodes reached through a relay. A named
    tuple, which is immutable and the cheapest record to build: a full mesh of 10,000 nodes
    builds one per pair on every plan."""

    peers: tuple[OfferedPeer, ...] = ()
    claims: tuple[Claim, ...] = ()
    paths: tuple[tuple[str, str], ...] = ()
    relays: tuple[tuple[str, tuple[str, str]], ...] = ()


@dataclass(frozen=True)
class _Seat:
    """What every role of node `me` reads: its segment among all segments, the mesh settings, the
    probes' verdicts, what the records say about NAT, and the relays `me` uses when it leads
    (segment key -> (relaying segment, why); relaying segment key -> what its peer also carries).
    `leads`: `me` holds its segment's WireGuard identity (always, outside location granularity);
    `leader_ip`: where a member sends what leaves its location (its leader's private address)."""

    me: Node
    my_seg: Segment
    segs: Sequence[Segment]
    mesh: MeshSettings
    state: PathState
    view: NatView
    relayed: dict[str, tuple[Segment, str]]
    extra: dict[str, list[IPNetwork]]
    leads: bool
    leader_ip: IPAddress | None
    keepalive: int


def plan_node(topo: Topology, name: str, remotes: Sequence[Remote] = (),
              granularity: Granularity | None = None, path_state: PathState | None = None) -> NodePlan:
    """The plan of node `name`. `remotes` are other clusters' topologies (already admitted:
    see mesh.admit.admit_remotes); `granularity` overrides the topology's; `path_state` holds
    the probes' verdicts under `intra_subnet: auto` (None: every rung works)."""
    if granularity is not None and granularity != topo.mesh.granularity:
        topo = replace(topo, mesh=replace(topo.mesh, granularity=granularity))
    seat = _seat(topo, name, path_state or {})
    own = [Share(paths=((seat.me.qualified_name, "local"),)), *_own_cluster(seat), _extra_peers(seat, topo.peers)]
    blocks = _remote_blocks(seat, remotes)
    merged = _merge_blocks(seat.me, topo, own, blocks)
    if merged is None:  # a destination claimed in two blocks: first claim wins, over all shares
        peers, claimed, paths, relays = _merge([*own, *(s for b in blocks for s in b.shares)])
        routes = tuple(sorted([c for c in claimed.values() if isinstance(c, Route)], key=lambda r: sort_key_net(r.dst)))
        fastpath = _fastpath(seat.me, topo, remotes, claimed)
    else:
        peers, routes, fastpath, paths, relays = merged
    return NodePlan(
        node=seat.me.name,
        granularity=seat.mesh.granularity,
        leader=seat.my_seg.leader.name,
        wireguard_ip=seat.my_seg.wireguard_ip if seat.leads else None,
        peers=tuple(sorted(peers, key=lambda p: p.name)),
        routes=routes,
        fastpath=fastpath,
        paths=paths,
        relays=relays,
    )


def _seat(topo: Topology, name: str, state: PathState) -> _Seat:
    """Where node `name` sits in the topology, computed once for all its roles."""
    me = topo.node(name)
    if me is None:
        raise InputError("--node", name, "is not a node of the topology")
    mesh = topo.mesh
    segs = segments(topo)
    my_seg = next(s for s in segs if any(m.name == name for m in s.members))
    if mesh.intra_subnet != "auto":
        state = {}  # the fixed modes switch probing off: their rungs do not depend on it
    view = nat_view(topo.nodes)
    relayed, extra = _relays(view, me, my_seg, segs, mesh)
    leads = mesh.granularity != "location" or my_seg.leader.name == me.name
    internal = my_seg.leader.internal_ip
    return _Seat(me, my_seg, segs, mesh, state, view, relayed, extra, leads,
                 internal.ip if internal is not None else None, me.persistent_keepalive)


def _own_cluster(seat: _Seat) -> list[Share]:
    """The shares of `me`'s roles towards the nodes of its own cluster (docs/mesh.md's table of
    cases): by granularity, and in location granularity by whether `me` leads."""
    if seat.mesh.granularity == "location":
        others = _location_leader(seat) if seat.leads else [_location_member(seat)]
        return [_location_members(seat), *others]
    return [_pair(seat, s) for s in seat.segs if s.leader.name != seat.me.name]


def _merge(shares: Sequence[Share]) -> tuple[list[PeerPlan], dict[IPNetwork, Route | Encap], dict[str, str],
                                            dict[str, tuple[str, str]]]:
    """The shares joined in order: peers as they come; for each destination the first claim (a
    route, or an encapsulation) wins, which is deterministic because every role walks nodes and
    segments in sorted order; a later path for a node replaces an earlier one. Peers whose
    endpoint this plan routes into WireGuard lose it (`_no_loops`)."""
    # Built from the claims last to first, so the first claim on a destination is the one kept.
    claimed: dict[IPNetwork, Route | Encap] = dict(reversed(list(chain.from_iterable(s.claims for s in shares))))
    offered = list(chain.from_iterable(s.peers for s in shares))
    checked = [(i, inside) for i, (_, inside) in enumerate(offered) if inside is not None]
    peers = _no_loops([peer for peer, _ in offered], checked, claimed)
    paths = dict(chain.from_iterable(s.paths for s in shares))
    relays = dict(chain.from_iterable(s.relays for s in shares))
    return peers, claimed, paths, relays


# --- the pieces every role uses ----------------------------------------------------------------


def _peer(name: str, kind: PeerKind, key: str, endpoint: Endpoint | None, allowed: Iterable[IPNetwork],
          keepalive: int, psk: KeyRef | None = None, *, roaming: bool = False, discovered: bool = False
          ) -> OfferedPeer:
    """A WireGuard peer (its allowed IPs once each, in the project's order), with its endpoint's
    address when that address is private (only those can be routed into the mesh)."""
    uniq = sorted(set(allowed), key=sort_key_net)
    inside = endpoint.ip if endpoint is not None and endpoint.ip is not None and not endpoint.is_public else None
    plan = PeerPlan(name, kind, key, str(endpoint) if endpoint else None, tuple(uniq), keepalive,
                    preshared_key=psk, roaming=roaming, discovered=discovered)
    return plan, inside


def _private_claim(dst: IPNetwork, me: Node, to: Node, rung: Rung) -> Claim:
    """`dst` over the private network to node `to`: routed to its private address on a direct
    rung, wrapped on an encapsulated one."""
    assert to.internal_ip is not None and me.internal_ip is not None
    kind = ENCAP_RUNGS.get(rung)
    if kind is None:
        return dst, Route(dst, to.internal_ip.ip, "private")
    return dst, Encap(kind, me.internal_ip.ip, to.internal_ip.ip)


def _into_wireguard(dsts: Iterable[IPNetwork], gateway: IPAddress) -> tuple[Claim, ...]:
    return tuple([(d, Route(d, gateway, "wireguard")) for d in dsts])


def _roams(r: Node) -> bool:
    """r may sit behind NAT: no public endpoint of its own, or it keeps NAT mappings open."""
    return r.reachable_endpoint is None or r.persistent_keepalive > 0


def _relayed(seat: _Seat, s: Segment, kind: PeerKind, dsts: Iterable[IPNetwork]) -> Share:
    """Segment s reached through its relay: a peer with s's WireGuard IP only (for the direct
    attempt), `dsts` routed to the relay's WireGuard IP, and s's members named as relayed."""
    via, reason = seat.relayed[s.key]
    r = s.leader
    peer = _peer(s.peer_name, kind, r.public_key, seat.view.endpoint(r), [host_net(s.wireguard_ip)], seat.keepalive,
                 roaming=_roams(r), discovered=seat.view.discovered(r))
    return Share(peers=(peer,), claims=_into_wireguard(dsts, via.wireguard_ip.ip),
                 paths=tuple((m.qualified_name, "relay") for m in s.members),
                 relays=tuple((m.qualified_name, (via.leader.qualified_name, reason)) for m in s.members))


# --- location granularity ----------------------------------------------------------------------


def _member_rung(seat: _Seat, m: Node) -> Rung:
    return choose_rung(member_rungs(seat.mesh.intra_subnet, seat.me, m), seat.state.get(m.qualified_name))


def _location_members(seat: _Seat) -> Share:
    """Every node of a location, leader or not: the other members' pod CIDRs over the private
    network, each on the rung of its pair's ladder."""
    claims: list[Claim] = []
    paths: list[tuple[str, str]] = []
    for m in seat.my_seg.members:
        if m.name != seat.me.name and m.internal_ip is not None:
            rung = _member_rung(seat, m)
            claims.extend(_private_claim(c, seat.me, m, rung) for c in m.pod_cidrs)
            paths.append((m.qualified_name, rung))
    return Share(claims=tuple(claims), paths=tuple(paths))


def _location_member(seat: _Seat) -> Share:
    """A location member that does not lead: everything outside its location goes to its leader
    over the private network, every segment's WireGuard IP included. Pod CIDRs take the rung the
    member uses to its leader; other addresses are routed raw to the leader's private address
    (an encapsulation is carried by a fast-path entry, and those exist for pod CIDRs only)."""
    leader = seat.my_seg.leader
    rung: Rung = _member_rung(seat, leader) if leader.internal_ip is not None else "direct"
    claims = [_to_leader(seat, rung, host_net(s.wireguard_ip), False) for s in seat.segs]
    paths: list[tuple[str, str]] = []
    for s in seat.segs:
        if s is seat.my_seg:
            continue
        pods = {c for m in s.members for c in m.pod_cidrs}
        claims.extend(_to_leader(seat, rung, dst, dst in pods) for dst in segment_addresses(s.members, None, None))
        paths.extend((m.qualified_name, "via-leader") for m in s.members)
    return Share(claims=tuple(claims), paths=tuple(paths))


def _to_leader(seat: _Seat, rung: Rung, dst: IPNetwork, pod: bool) -> Claim:
    """`dst` from a member to its leader: a pod CIDR on the member's rung to the leader, anything
    else (and everything on a direct rung) routed to the leader's private address."""
    if rung == "direct" or not pod or seat.me.internal_ip is None:
        return dst, Route(dst, seat.leader_ip, "private")
    return _private_claim(dst, seat.me, seat.my_seg.leader, rung)


def _location_leader(seat: _Seat) -> list[Share]:
    """A location's leader: one WireGuard peer per other segment, carrying the segment's
    addresses, its WireGuard IP and what it relays for others, with those addresses routed into
    WireGuard; or, for a segment reached through a relay, the relayed share."""
    out: list[Share] = []
    for s in seat.segs:
        if s is seat.my_seg:
            continue
        addrs = segment_addresses(s.members, None, None)
        if s.key in seat.relayed:
            out.append(_relayed(seat, s, "segment", addrs))
            continue
        r = s.leader
        peer = _peer(s.peer_name, "segment", r.public_key, seat.view.endpoint(r),
                     addrs + [host_net(s.wireguard_ip)] + seat.extra.get(s.key, []), seat.keepalive,
                     roaming=_roams(r), discovered=seat.view.discovered(r))
        out.append(Share(peers=(peer,), claims=_into_wireguard(addrs, s.wireguard_ip.ip),
                         paths=tuple((m.qualified_name, "tunnel") for m in s.members)))
    return out


# --- full and cross granularity ----------------------------------------------------------------


def _pair(seat: _Seat, s: Segment) -> Share:
    """One end of a full/cross pair with node r (s's only member): r's pod CIDR on the pair's
    rung, and unless a fixed private rung carries the pair, a WireGuard peer with r's other
    addresses routed into it (directly, or through r's relay)."""
    me, r, mesh = seat.me, s.leader, seat.mesh
    rungs = pair_rungs(mesh.intra_subnet, mesh.granularity, mesh.private_networks, me, r)
    working = seat.state.get(r.qualified_name)
    rung = choose_rung(rungs, working)
    path = ((r.qualified_name, rung),)
    private: tuple[Claim, ...] = ()
    if rung != "tunnel" and rung != "wireguard-private":
        private = tuple(_private_claim(c, me, r, rung) for c in r.pod_cidrs)
        if mesh.intra_subnet != "auto":
            return Share(claims=private, paths=path)  # a fixed private rung carries everything: no peer
    dsts = _pair_destinations(me, r, rungs)
    if s.key in seat.relayed:  # a relayed pair (both ends behind NAT): through a public node
        relayed = _relayed(seat, s, "node", dsts)
        return relayed._replace(claims=private + relayed.claims)
    ep = _pair_endpoint(seat, r, rung, rungs, working)
    peer = _peer(r.name, "node", r.public_key, ep, dsts + [host_net(s.wireguard_ip)] + seat.extra.get(s.key, []),
                 seat.keepalive, roaming=_roams(r), discovered=seat.view.discovered(r) and ep == seat.view.endpoint(r))
    return Share(peers=(peer,), claims=private + _into_wireguard(dsts, s.wireguard_ip.ip), paths=path)


def _pair_destinations(me: Node, r: Node, rungs: Sequence[Rung]) -> list[IPNetwork]:
    """What the pair's WireGuard carries to r: its pod CIDR and location IPs, and its internal
    address only when no private network joins the pair (then the encapsulated rungs and
    WireGuard's private endpoint are sent to that address, which must stay on the private NIC)."""
    dsts = list(r.pod_cidrs)
    if r.internal_ip is not None and not private_neighbours(me, r) and len(rungs) == 1:
        dsts.append(host_net(r.internal_ip))
    dsts.extend(r.allowed_location_ips)
    return dsts


def _pair_endpoint(seat: _Seat, r: Node, rung: Rung, rungs: Sequence[Rung], working: frozenset[str] | None
                   ) -> Endpoint | None:
    """Where the pair's WireGuard peer is called: r's private address when the pair's rung is
    wireguard-private, or (auto) while that rung stands by, so either end may switch to it at any
    time and the other still accepts what arrives (make-before-break); else where the records
    say r is reached."""
    standby = seat.mesh.intra_subnet == "auto" and "wireguard-private" in rungs and (
        working is None or "wireguard-private" in working)
    if rung != "wireguard-private" and not standby:
        return seat.view.endpoint(r)
    assert r.internal_ip is not None
    return Endpoint(str(r.internal_ip.ip), r.endpoint.port if r.endpoint else seat.mesh.port)


# --- every granularity -------------------------------------------------------------------------


def _extra_peers(seat: _Seat, peers: Sequence[Peer]) -> Share:
    """The extra peers (laptops, gateways): a leader has each as a WireGuard peer and routes its
    allowed IPs into WireGuard; a member routes them to its leader."""
    leads = seat.leads
    offered: list[OfferedPeer] = []
    claims: list[Claim] = []
    for p in sorted(peers, key=lambda p: p.name):
        if leads:
            peer, _ = _peer(p.name, "peer", p.public_key, p.endpoint, p.allowed_ips, seat.keepalive, p.preshared_key)
            # Checked whatever its range: a node's location IPs may be public and hold a peer's endpoint.
            offered.append((peer, p.endpoint.ip if p.endpoint is not None else None))
        claims.extend((a, Route(a, None, "wireguard") if leads else Route(a, seat.leader_ip, "private"))
                      for a in p.allowed_ips)
    return Share(peers=tuple(offered), claims=tuple(claims))


def _no_loops(peers: list[PeerPlan], checked: Sequence[tuple[int, IPAddress]],
              claimed: dict[IPNetwork, Route | Encap]) -> list[PeerPlan]:
    """The peers, each without its endpoint when that address (`checked`: index in
    `peers`, address) is routed into WireGuard by this plan: its packets would enter the tunnel
    they carry (a loop, or a direct attempt through a relay). This happens to a node behind NAT,
    whose configured endpoint is its inside address, which is also its internal address; such a
    peer calls us (keepalive) and WireGuard learns where it is. Only nodes' private endpoint
    addresses are looked up (a public one is never inside a mesh route: admission keeps location
    IPs off nodes' endpoints) and extra peers' endpoints, at the prefix lengths the
    WireGuard routes use, so the check stays linear in the peers. Remote segments' peers are
    not offered for the check: they keep the endpoint their cluster publishes."""
    if not checked:
        return peers
    plens = sorted({(r.dst.version, r.dst.prefixlen) for r in claimed.values()
                    if isinstance(r, Route) and r.dev == "wireguard"})
    out = list(peers)
    for i, ip in checked:
        net = ipaddress.IPv4Network if ip.version == 4 else ipaddress.IPv6Network
        for version, plen in plens:
            r = claimed.get(net((int(ip), plen), strict=False)) if version == ip.version else None
            if isinstance(r, Route) and r.dev == "wireguard":
                out[i] = replace(out[i], endpoint=None, discovered=False)
                break
    return out


# --- relays ------------------------------------------------------------------------------------


def _node_addresses(me: Node, r: Node) -> list[IPNetwork]:
    """What node r's peer carries for `me` in full/cross granularity (besides r's WireGuard IP):
    its pod CIDR, its internal address unless the two are private neighbours, its location IPs."""
    out = list(r.pod_cidrs)
    if r.internal_ip is not None and not private_neighbours(me, r):
        out.append(host_net(r.internal_ip))
    out.extend(r.allowed_location_ips)
    return out


# The fixed intra_subnet modes whose private rung has no WireGuard peer behind it.
_PEERLESS_MODES = ("direct", *ENCAP_RUNGS.values())


def _no_peer(mesh: MeshSettings, a: Node, b: Node) -> bool:
    """Nodes a and b hold no WireGuard peer for each other: a fixed private rung (direct, ipip,
    vxlan) carries their pair (`_pair`), so it is never relayed and neither relays for the other.
    Symmetric in a and b (pair_rungs is)."""
    return mesh.granularity != "location" and mesh.intra_subnet in _PEERLESS_MODES and \
        pair_rungs(mesh.intra_subnet, mesh.granularity, mesh.private_networks, a, b)[0] != "tunnel"


def _relays(view: NatView, me: Node, my_seg: Segment, segs: Sequence[Segment], mesh: MeshSettings
            ) -> tuple[dict[str, tuple[Segment, str]], dict[str, list[IPNetwork]]]:
    """The segments this node (when it leads) reaches through a relay: segment key -> (relaying
    segment, why); and what each relaying segment's peer carries for them. A pure function of
    the pair's records, so both ends choose the same: pairs without a WireGuard peer are never
    relayed, and a relay must hold a WireGuard peer for both ends (`_no_peer`), so a public
    private neighbour of one end relays for neither. Pairs without a relay candidate stay
    direct attempts at both ends."""
    relayed: dict[str, tuple[Segment, str]] = {}
    extra: dict[str, list[IPNetwork]] = {}
    if my_seg.leader.name != me.name:
        return relayed, extra
    wanted = []
    for s in segs:
        if s is my_seg:
            continue
        reason = view.relay_reason(me, s.leader)  # cheap, and None for almost every pair
        if reason is not None and not _no_peer(mesh, me, s.leader):
            wanted.append((s, reason))
    if not wanted:
        return relayed, extra
    candidates = {s.leader.name: s for s in segs if s.leader.reachable_endpoint is not None and s is not my_seg
                  and not _no_peer(mesh, me, s.leader)}
    for s, reason in wanted:
        r = s.leader
        via = choose_relay(view, me, r, [c.leader for c in candidates.values() if not _no_peer(mesh, r, c.leader)])
        if via is None:
            continue
        seg = candidates[via.name]
        relayed[s.key] = (seg, reason)
        carried = segment_addresses(s.members, None, None) if mesh.granularity == "location" \
            else _node_addresses(me, r)
        extra.setdefault(seg.key, []).extend(carried)
    return relayed, extra


# --- remote clusters ---------------------------------------------------------------------------


def _remote_shares(me: Node, leads: bool, leader_ip: IPAddress | None, keepalive: int, remote: Remote
                   ) -> tuple[list[Share], list[IPNetwork]]:
    """One other cluster's admitted nodes, one share per remote segment (see `_remote_segment`),
    and their pod CIDRs."""
    out: list[Share] = []
    pods: list[IPNetwork] = []
    for s in remote.segments or segments(remote.topology):
        members = tuple(m for m in s.members if m.name in remote.admitted)
        out.append(_remote_segment(me, s.wireguard_ip, s.leader, members, leads, leader_ip, keepalive))
        pods.extend(c for m in members for c in m.pod_cidrs)
    return out, pods


SortKey = tuple[int, int, int]


class _Block(NamedTuple):
    """Shares merged among themselves: what they claim (first claim wins), their routes and
    their pod CIDRs' fast-path entries, each sorted by the project's order with its sort key,
    and their peers, paths and relays in share order."""

    shares: tuple[Share, ...]
    claimed: dict[IPNetwork, Route | Encap]
    routes: list[tuple[SortKey, Route]]
    fastpath: list[tuple[SortKey, FastPathEntry]]
    peers: tuple[OfferedPeer, ...]
    paths: dict[str, str]
    relays: dict[str, tuple[str, str]]


class _SameRemote:
    """A remote cluster as seen from one seat, as a cache key: the Remote by identity (admission
    hands out the same object while the cluster's admission stands: mesh.admit_memo), the seat's
    part by value."""

    __slots__ = ("remote", "seat", "_hash")

    def __init__(self, remote: Remote, seat: tuple[Node, bool, IPAddress | None, int]) -> None:
        self.remote = remote
        self.seat = seat
        self._hash = hash((id(remote), seat))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SameRemote) and other.remote is self.remote and other.seat == self.seat


def _block(shares: Sequence[Share], pods: Iterable[IPNetwork]) -> _Block:
    """`shares` merged among themselves (`_merge`'s rule: the first claim on a destination wins),
    with the fast-path entries of `pods`. Sorted on (key, value) pairs without a key function:
    keys are unique (one per destination), so values are never compared."""
    claimed: dict[IPNetwork, Route | Encap] = dict(reversed(list(chain.from_iterable(s.claims for s in shares))))
    routes = sorted([(sort_key_net(c.dst), c) for c in claimed.values() if isinstance(c, Route)])
    fast = sorted([(sort_key_net(e.prefix), e) for e in (_fast_entry(c, claimed.get(c)) for c in pods)
                   if e is not None])
    return _Block(tuple(shares), claimed, routes, fast, tuple(chain.from_iterable(s.peers for s in shares)),
                  dict(chain.from_iterable(s.paths for s in shares)),
                  dict(chain.from_iterable(s.relays for s in shares)))


@functools.lru_cache(maxsize=64)
def _remote_block(key: _SameRemote) -> _Block:
    """One remote cluster's block, memoised on its Remote and the seat: a pass after a remote
    change merges and sorts again only the cluster it touched (its segments' shares come from
    `_remote_segment`'s memo)."""
    me, leads, leader_ip, keepalive = key.seat
    shares, pods = _remote_shares(me, leads, leader_ip, keepalive, key.remote)
    return _block(shares, pods)


def _remote_blocks(seat: _Seat, remotes: Sequence[Remote]) -> list[_Block]:
    """Other clusters' blocks, by cluster name."""
    where = (seat.me, seat.leads, seat.leader_ip, seat.keepalive)
    return [_remote_block(_SameRemote(r, where)) for r in sorted(remotes, key=lambda r: r.topology.cluster.name)]


def _merge_blocks(me: Node, topo: Topology, own: Sequence[Share], blocks: Sequence[_Block]
                  ) -> tuple[list[PeerPlan], tuple[Route, ...], tuple[FastPathEntry, ...], dict[str, str],
                             dict[str, tuple[str, str]]] | None:
    """The plan's peers, routes, fast path, paths and relays from this cluster's shares and the
    remote blocks, the same as `_merge` over all their shares would give, as long as no
    destination is claimed in two of them (admission keeps clusters apart); None when one is."""
    mine = _block(own, ())
    claimed = dict(mine.claimed)
    for b in blocks:
        claimed.update(b.claimed)
    if len(claimed) != len(mine.claimed) + sum(len(b.claimed) for b in blocks):
        return None
    offered = [*mine.peers, *(p for b in blocks for p in b.peers)]
    checked = [(i, inside) for i, (_, inside) in enumerate(offered) if inside is not None]
    peers = _no_loops([peer for peer, _ in offered], checked, claimed)
    paths = dict(mine.paths)
    relays = dict(mine.relays)
    for b in blocks:
        paths.update(b.paths)
        relays.update(b.relays)
    # Each block is sorted already: the sort merges runs. Keys are unique (one per destination).
    routes = tuple(r for _, r in sorted(chain(mine.routes, *(b.routes for b in blocks))))
    # This cluster's entries from every claim (a remote block's are its own: no claim is in two).
    local = [(sort_key_net(e.prefix), e) for e in _fastpath(me, topo, (), claimed)]
    fast = tuple(e for _, e in sorted(chain(local, *(b.fastpath for b in blocks))))
    return peers, routes, fast, paths, relays


@functools.lru_cache(maxsize=4096)
def _remote_segment(me: Node, wg_ip: IPInterface, leader: Node, members: tuple[Node, ...], leads: bool,
                    leader_ip: IPAddress | None, keepalive: int) -> Share:
    """One remote segment's share: its private neighbours of `me` go direct whatever the
    granularities; the rest is one WireGuard peer reached at the segment's leader (a member
    routes it to its own leader). Memoised (a pure function of its arguments): a remote change
    recomputes only the segment it touches, so a reconcile with thousands of remote nodes
    redoes only what changed."""
    direct = [m for m in members if private_neighbours(me, m)]
    rest = [m for m in members if not private_neighbours(me, m)]
    claims: list[Claim] = []
    for m in direct:
        assert m.internal_ip is not None
        claims.extend((c, Route(c, m.internal_ip.ip, "private")) for c in m.pod_cidrs)
    paths = [(m.qualified_name, "direct") for m in direct]
    if not rest:
        return Share(claims=tuple(claims), paths=tuple(paths))
    wg = host_net(wg_ip)
    addrs = segment_addresses(rest, None, me)
    peers: tuple[OfferedPeer, ...] = ()
    if leads:
        peer, _ = _peer(leader.qualified_name, "segment", leader.public_key, leader.endpoint, addrs + [wg], keepalive)
        peers = ((peer, None),)
        claims.append((wg, Route(wg, None, "wireguard")))
        claims.extend(_into_wireguard(addrs, wg_ip.ip))
    else:
        claims.extend((d, Route(d, leader_ip, "private")) for d in [wg, *addrs])
    paths += [(m.qualified_name, "tunnel" if leads else "via-leader") for m in rest]
    return Share(peers=peers, claims=tuple(claims), paths=tuple(paths))


def _fastpath(me: Node, topo: Topology, remotes: Sequence[Remote], claimed: dict[IPNetwork, Route | Encap]
              ) -> tuple[FastPathEntry, ...]:
    """One entry per node pod CIDR: local for our own, direct (encapsulated, or to a next hop) for
    an encapsulation or a route on the private NIC, tunnel for a route through WireGuard."""
    out = [FastPathEntry(c, "local", None) for c in me.pod_cidrs]
    for n in [*topo.nodes, *(n for r in remotes for n in r.nodes)]:
        if n is me:
            continue
        out.extend(e for e in (_fast_entry(c, claimed.get(c)) for c in n.pod_cidrs) if e is not None)
    return tuple(sorted(out, key=lambda e: sort_key_net(e.prefix)))


def _fast_entry(c: IPNetwork, r: Route | Encap | None) -> FastPathEntry | None:
    """The fast-path entry of pod CIDR `c` claimed as `r` (None: not claimed)."""
    if r is None:
        return None
    if isinstance(r, Encap):
        return FastPathEntry(c, "direct", None, r)
    if r.dev == "private":
        return FastPathEntry(c, "direct", r.via)
    return FastPathEntry(c, "tunnel", None)


def mesh_cidrs(topo: Topology, remotes: list[Remote]) -> frozenset[IPNetwork]:
    """Everything inside the mesh (never masqueraded): pod CIDRs, the WireGuard subnet, location
    IPs and extra peers' allowed IPs, of this cluster and admitted remote ones. A set, not a sorted
    list: the NAT applier diffs sets, so an order would only cost sorting thousands of networks."""
    out: set[IPNetwork] = {topo.mesh.subnet}
    for n in [*topo.nodes, *(n for r in remotes for n in r.nodes)]:
        out.update(n.pod_cidrs)
        out.update(n.allowed_location_ips)
    for r in remotes:
        out.add(r.topology.mesh.subnet)
    for p in topo.peers:
        out.update(p.allowed_ips)
    return frozenset(out)
