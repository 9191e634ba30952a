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

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from operator import itemgetter
from typing import Literal, NamedTuple

from meshctl.errors import InputError
from meshctl.mesh.flannel import carried
from meshctl.mesh.ladder import ENDPOINT_LADDER, TUNNEL_ONLY, cheapest, choose_rung, member_rungs, pair_rungs
from meshctl.mesh.memo import SameObject, UsedMemo
from meshctl.mesh.model import (
    ENCAP_RUNGS,
    FAMILIES,
    EncapKind,
    Endpoint,
    Granularity,
    IPAddress,
    IPInterface,
    IPNetwork,
    KeyRef,
    MeshSettings,
    Node,
    Path,
    PathState,
    Peer,
    Rung,
    Topology,
    host_net,
    key_ranges,
    net_key,
    private_joined,
    private_neighbours,
    sort_key_net,
)
from meshctl.mesh.natview import NatView, choose_relay, nat_view
from meshctl.mesh.segments import Remote, Segment, gateway, segment_addresses, segments

Dev = Literal["private", "wireguard"]
Action = Literal["local", "direct", "tunnel"]
PeerKind = Literal["node", "segment", "peer", "standby"]
# The keepalive of a standby peer (Topology.standby) at the moved location's end, when the node
# sets none of its own: it keeps the session up, so the documented order's return needs no
# handshake (seconds).
STANDBY_KEEPALIVE_S = 10


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
    fast-path entry carries the encapsulation (the eBPF program, or the encapsulation devices
    of the kernel fallback, node/encap.py, carry it)."""

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
    # The prefix is another cluster's, this cluster has global ranges (mesh.global_cidrs) and the
    # packet leaves the cluster at this node (to the remote node, or into WireGuard; not to the own
    # leader, which sends it on): its source pod address is rewritten to its global image here.
    translate: bool = False

    @property
    def rung(self) -> str:
        """"local", "tunnel", "direct", "direct+vxlan" or "direct+ipip"."""
        return self.action if self.encap is None else f"{self.action}+{self.encap.kind}"


# The rung of each pod family of a pair whose families take different rungs: ((IP version, rung), ...).
FamilyRungs = tuple[tuple[int, Rung], ...]


@dataclass(frozen=True)
class NodePlan:
    node: str
    granularity: str
    leader: str
    wireguard_ip: IPInterface | None
    peers: tuple[PeerPlan, ...]
    routes: tuple[Route, ...]
    fastpath: tuple[FastPathEntry, ...]
    # How this node reaches every node, itself included: qualified name -> its Path (local,
    # via-leader, relay, flannel or a rung of the path ladder).
    paths: dict[str, Path] = field(default_factory=dict, compare=False)
    # Nodes reached through a relay: qualified name -> (the relaying node, why).
    relays: dict[str, tuple[str, str]] = field(default_factory=dict, compare=False)
    # The segment's WireGuard addresses, one per WireGuard subnet of the mesh (`wireguard_ip` the
    # first); empty for a non-leader.
    wireguard_ips: tuple[IPInterface, ...] = ()
    # Pairs whose pod families take different rungs (the v6 private network shared, the v4 one
    # not): qualified name -> ((IP version, rung), ...); `paths` names the cheapest of them.
    family_paths: dict[str, FamilyRungs] = field(default_factory=dict, compare=False)
    # Every leader of the node's location when it has several (mesh.leaders_per_location; `leader`
    # the first); empty when it has one.
    leaders: tuple[str, ...] = ()
    # This cluster's global ranges (mesh.global_cidrs): (pod range, global range). The node
    # rewrites its pods' sources to their images on the way out of the cluster (fast-path entries
    # with `translate`) and destinations in a global range back on the way in.
    global_cidrs: tuple[tuple[IPNetwork, IPNetwork], ...] = ()
    # `--cni flannel`: the nodes flannel carries (path `flannel`), each with the rung the plan
    # would take to it without flannel (the probes' memory of a pair is of rungs: `rung_paths`).
    handed_over: dict[str, Path] = field(default_factory=dict, compare=False)

    @property
    def rung_paths(self) -> dict[str, Path]:
        """`paths` with each node flannel carries named by the rung the plan would take to it."""
        return {**self.paths, **self.handed_over} if self.handed_over else self.paths

    @property
    def device_addresses(self) -> tuple[IPInterface, ...]:
        """The WireGuard device's addresses: one per WireGuard subnet; none for a non-leader."""
        return self.wireguard_ips or ((self.wireguard_ip,) if self.wireguard_ip else ())


# --- the shares of a plan ----------------------------------------------------------------------

# A destination and how it is reached: a route, or (a pod CIDR on an encapsulated rung) the
# encapsulation its fast-path entry carries instead of a route.
Claim = tuple[IPNetwork, Route | Encap]
# The project's order of destinations as one integer (`sort_key_net`).
SortKey = int
# The first claim on each destination, by the destination's sort key (an int hashes at C speed, a
# network through ipaddress's `__hash__` in Python; a cold plan at 50,000 nodes asks 250,000 times).
Claimed = dict[SortKey, Claim]
# The rungs WireGuard carries: a pod CIDR on one is routed into WireGuard, not claimed privately.
_WIREGUARD_RUNGS: tuple[Rung, ...] = (Path.TUNNEL, Path.WIREGUARD_PRIVATE)
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
    paths: tuple[tuple[str, Path], ...] = ()
    relays: tuple[tuple[str, tuple[str, str]], ...] = ()
    family_paths: tuple[tuple[str, FamilyRungs], ...] = ()


@dataclass(frozen=True)
class _Seat:
    """What every role of node `me` reads: its segment among all segments, the mesh settings, the
    probes' verdicts, what the records say about NAT, and the relays `me` uses when it leads
    (segment key -> (relaying segment, why); relaying segment key -> what its peer also carries).
    `leads`: `me` holds its segment's WireGuard identity (always, outside location granularity;
    every leader of a location with several); `first`: `me` is its segment's first leader, which
    alone peers the extra peers and other clusters' segments; `leader_ip`: where a member sends
    what the first leader carries (its private address; of every family in `leader_ips`, see
    `to_leader`); `keys`: every segment key, sorted (segments.gateway)."""

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
    leader_ips: tuple[IPAddress, ...] = ()
    first: bool = True
    keys: tuple[str, ...] = ()

    def far(self, s: Segment) -> Node:
        """The leader of segment s that carries its traffic with this node's location."""
        return gateway(s, self.my_seg, self.keys)

    def near(self, s: Segment) -> Node:
        """The leader of this node's location that carries its traffic with segment s."""
        return gateway(self.my_seg, s, self.keys)

    def to_leader(self, dst: IPNetwork) -> IPAddress | None:
        """The own leader's private address of `dst`'s family (else its first one)."""
        return _of_family(self.leader_ips, dst.version, self.leader_ip)


def plan_node(topo: Topology, name: str, remotes: Sequence[Remote] = (),
              granularity: Granularity | None = None, path_state: PathState | None = None, *,
              flannel: bool = False, cache: PlanCache | None = None) -> NodePlan:
    """The plan of node `name`. `remotes` are other clusters' topologies (already admitted:
    see mesh.admit.admit_remotes); `granularity` overrides the topology's; `path_state` holds
    the probes' verdicts under `intra_subnet: auto` (None: every rung works); `flannel`: flannel
    carries the pod traffic to the nodes of this node's location (`--cni flannel`, `_hand_over`);
    `cache` what this node's earlier plans left (PlanCache; None: a cold plan)."""
    if granularity is not None and granularity != topo.mesh.granularity:
        topo = replace(topo, mesh=replace(topo.mesh, granularity=granularity))
    cache = cache or PlanCache()
    seat = _seat(topo, name, path_state or {}, cache)
    own = [Share(paths=((seat.me.qualified_name, Path.LOCAL),)), *_own_cluster(seat), _extra_peers(seat, topo.peers)]
    blocks = _remote_blocks(seat, remotes, cache)
    cache.plan_done()
    merged = _merge_blocks(seat.me, topo, own, blocks)
    every = [*own, *(s for b in blocks for s in b.shares)]
    if merged is None:  # a destination claimed in two blocks: first claim wins, over all shares
        peers, claimed, paths, relays = _merge(every)
        routes = tuple(r for _, r in _sorted_routes(claimed))
        fastpath = _fastpath(seat.me, topo, remotes, claimed, _leaving(seat))
    else:
        peers, routes, fastpath, paths, relays = merged
    family_paths = dict(chain.from_iterable(s.family_paths for s in every))
    if topo.standby:
        peers = [*peers, *_standby_peers(topo, seat, peers, granularity, path_state, flannel)]
    plan = NodePlan(
        node=seat.me.name,
        granularity=seat.mesh.granularity,
        leader=seat.my_seg.leader.name,
        wireguard_ip=seat.my_seg.wireguard_ip if seat.leads else None,
        peers=tuple(sorted(peers, key=lambda p: p.name)),
        routes=routes,
        fastpath=fastpath,
        paths=paths,
        relays=relays,
        wireguard_ips=seat.my_seg.addresses if seat.leads and seat.my_seg.wireguard_ips else (),
        family_paths=family_paths,
        leaders=tuple(n.name for n in seat.my_seg.leaders),
        global_cidrs=topo.mesh.global_cidrs,
    )
    return _hand_over(plan, topo) if flannel else plan


def _standby_peers(topo: Topology, seat: _Seat, peers: Sequence[PeerPlan], granularity: Granularity | None,
                   path_state: PathState | None, flannel: bool) -> list[PeerPlan]:
    """Standby peers (Topology.standby): the own cluster's WireGuard peers the documented order's
    plan holds that this one lacks, without allowed IPs (they carry nothing: no route or fast-path
    entry follows them), so the sessions are up when the ruled-out leaders return and the return
    moves allowed IPs only (docs/mesh.md, "Leaders that do not forward"). Symmetric, as plans are;
    kept alive from the moved location's end."""
    static = plan_node(replace(topo, leaders=(), standby=()), seat.me.name, (), granularity, path_state,
                       flannel=flannel)
    have = {p.public_key for p in peers}
    moved = {k for k, _ in topo.standby}
    keepalive = seat.keepalive or (STANDBY_KEEPALIVE_S if seat.my_seg.key in moved else 0)
    return [replace(p, kind="standby", allowed_ips=(), persistent_keepalive=keepalive)
            for p in static.peers if p.kind in ("node", "segment") and p.public_key not in have]


def _hand_over(plan: NodePlan, topo: Topology) -> NodePlan:
    """The plan with flannel carrying its nodes (mesh/flannel.py): their pod CIDRs' routes dropped,
    and their fast-path entries but a raw direct one (flannel.1 encapsulates already, and WireGuard
    does not carry them), their paths named `flannel`. A raw direct entry stays: `intra_subnet`
    decides whether the fast path takes a same-subnet pair."""
    names = carried(topo, plan.node, plan.granularity)
    if not names:
        return plan
    pods = {c for n in topo.nodes if n.name in names for c in n.pod_cidrs}
    qualified = {n.qualified_name for n in topo.nodes if n.name in names}
    return replace(
        plan,
        routes=tuple(r for r in plan.routes if r.dst not in pods),
        fastpath=tuple(e for e in plan.fastpath
                       if e.prefix not in pods or (e.action == "direct" and e.encap is None)),
        paths={k: (Path.FLANNEL if k in qualified else v) for k, v in plan.paths.items()},
        handed_over={k: v for k, v in plan.paths.items() if k in qualified},
    )


def _seat(topo: Topology, name: str, state: PathState, cache: PlanCache) -> _Seat:
    """Where node `name` sits in the topology, computed once for all its roles (the topology's
    segments from `cache`)."""
    me = topo.node(name)
    if me is None:
        raise InputError("--node", name, "is not a node of the topology")
    mesh = topo.mesh
    segs = cache.segments_of(topo)
    my_seg = next(s for s in segs if any(m.name == name for m in s.members))
    if mesh.intra_subnet != "auto":
        state = {}  # the fixed modes switch probing off: their rungs do not depend on it
    view = nat_view(topo.nodes)
    keys = tuple(s.key for s in segs)  # sorted (segments() sorts them)
    relayed, extra = _relays(view, me, my_seg, segs, mesh, keys)
    first = mesh.granularity != "location" or my_seg.leader.name == me.name
    leads = first or any(n.name == me.name for n in my_seg.leaders)
    internal = my_seg.leader.internal_ip
    return _Seat(me, my_seg, segs, mesh, state, view, relayed, extra, leads,
                 internal.ip if internal is not None else None, me.persistent_keepalive,
                 tuple(i.ip for i in my_seg.leader.internal_ips), first, keys)


def _own_cluster(seat: _Seat) -> list[Share]:
    """The shares of `me`'s roles towards the nodes of its own cluster (docs/mesh.md's table of
    cases): by granularity, and in location granularity by whether `me` leads."""
    if seat.mesh.granularity == "location":
        others = [s for s in seat.segs if s is not seat.my_seg]
        served = [s for s in others if seat.near(s).name == seat.me.name] if seat.leads else []
        rest = [s for s in others if s not in served]
        shares = [_location_members(seat)]
        if not seat.leads or rest:
            shares.append(_location_member(seat, rest))
        return [*shares, *_location_leader(seat, served)]
    return [_pair(seat, s) for s in seat.segs if s.leader.name != seat.me.name]


def _merge(shares: Sequence[Share]) -> tuple[list[PeerPlan], Claimed, dict[str, Path], dict[str, tuple[str, str]]]:
    """The shares joined in order: peers as they come; for each destination the first claim (a
    route, or an encapsulation) wins, which is deterministic because every role walks nodes and
    segments in sorted order; a later path for a node replaces an earlier one. Peers whose
    endpoint this plan routes into WireGuard lose it (`_no_loops`)."""
    claimed = _claimed(chain.from_iterable(s.claims for s in shares))
    offered = list(chain.from_iterable(s.peers for s in shares))
    checked = [(i, inside) for i, (_, inside) in enumerate(offered) if inside is not None]
    peers = _no_loops([peer for peer, _ in offered], checked, claimed)
    paths = dict(chain.from_iterable(s.paths for s in shares))
    relays = dict(chain.from_iterable(s.relays for s in shares))
    return peers, claimed, paths, relays


def _claimed(claims: Iterable[Claim]) -> Claimed:
    """The first claim on each destination: built from the claims last to first, so the first
    one on a destination is the one kept."""
    return {sort_key_net(c[0]): c for c in reversed(list(claims))}


def _sorted_routes(claimed: Claimed) -> list[tuple[SortKey, Route]]:
    """The claimed routes in the project's order, with their keys (unique: one per destination,
    so routes are never compared)."""
    return sorted([(k, c) for k, (_, c) in claimed.items() if isinstance(c, Route)])


def _claim_of(claimed: Claimed, dst: IPNetwork) -> Route | Encap | None:
    c = claimed.get(sort_key_net(dst))
    return None if c is None else c[1]


# --- the pieces every role uses ----------------------------------------------------------------


def _peer(name: str, kind: PeerKind, key: str, endpoint: Endpoint | None, allowed: Iterable[IPNetwork],
          keepalive: int, psk: KeyRef | None = None, *, roaming: bool = False, discovered: bool = False
          ) -> OfferedPeer:
    """A WireGuard peer (its allowed IPs once each, in the project's order), with its endpoint's
    address when that address is private (only those can be routed into the mesh)."""
    # Sorted by key, then one of each run of equal keys (equal networks): no network is hashed.
    keyed = sorted([(sort_key_net(a), a) for a in allowed], key=itemgetter(0))
    uniq = [a for i, (k, a) in enumerate(keyed) if not i or keyed[i - 1][0] != k]
    inside = endpoint.ip if endpoint is not None and endpoint.ip is not None and not endpoint.is_public else None
    plan = PeerPlan(name, kind, key, str(endpoint) if endpoint else None, tuple(uniq), keepalive,
                    preshared_key=psk, roaming=roaming, discovered=discovered)
    return plan, inside


def _private_claim(dst: IPNetwork, me: Node, to: Node, rung: Rung) -> Claim:
    """`dst` over the private network to node `to`, in `dst`'s IP family: routed to `to`'s private
    address on a direct rung, wrapped on an encapsulated one (outer addresses of that family).
    A location member without an address of that family is routed to its first address (the route
    applier leaves a gateway of another family out, and says so)."""
    mine, theirs = me.internal(dst.version), to.internal(dst.version)
    kind = ENCAP_RUNGS.get(rung)
    if kind is not None and mine is not None and theirs is not None:
        return dst, Encap(kind, mine.ip, theirs.ip)
    hop = theirs or to.internal_ip
    assert hop is not None
    return dst, Route(dst, hop.ip, "private")


def _of_family(ips: Iterable[IPAddress], family: int, default: IPAddress | None = None) -> IPAddress | None:
    return next((a for a in ips if a.version == family), default)


def _into_wireguard(dsts: Iterable[IPNetwork], s: Segment) -> tuple[Claim, ...]:
    """`dsts` routed into WireGuard towards segment s: through s's WireGuard address of each
    destination's family, or (a family the mesh has no WireGuard subnet of) the device alone."""
    gw = s.gateways()
    return tuple([(d, Route(d, gw.get(d.version), "wireguard")) for d in dsts])


def _roams(r: Node) -> bool:
    """r may sit behind NAT: no public endpoint of its own, or it keeps NAT mappings open."""
    return r.reachable_endpoint is None or r.persistent_keepalive > 0


def _relayed(seat: _Seat, s: Segment, kind: PeerKind, dsts: Iterable[IPNetwork]) -> Share:
    """Segment s reached through its relay: a peer with s's WireGuard IP only (for the direct
    attempt), `dsts` routed to the relay's WireGuard IP, and s's members named as relayed."""
    via, reason = seat.relayed[s.key]
    r = seat.far(s)
    relay = Path.RELAY  # a local: read per member (an enum lookup is slow)
    peer = _peer(r.qualified_name, kind, r.public_key, seat.view.endpoint(r, seat.me.families), s.hosts,
                 seat.keepalive, roaming=_roams(r), discovered=seat.view.discovered(r))
    return Share(peers=(peer,), claims=_into_wireguard(dsts, via),
                 paths=tuple([(m.qualified_name, relay) for m in s.members]),
                 relays=tuple((m.qualified_name, (via.leader.qualified_name, reason)) for m in s.members))


# --- location granularity ----------------------------------------------------------------------


def _member_rung(seat: _Seat, m: Node, family: int | None = None) -> Rung:
    return choose_rung(member_rungs(seat.mesh.intra_subnet, seat.me, m, family), seat.state.get(m.qualified_name))


def _split(name: str, rungs: dict[int, Rung]) -> tuple[tuple[str, FamilyRungs], ...]:
    """The family_paths entry of a pair whose families take different rungs (none otherwise)."""
    return ((name, tuple(sorted(rungs.items()))),) if len(set(rungs.values())) > 1 else ()


def _location_members(seat: _Seat) -> Share:
    """Every node of a location, leader or not: the other members' pod CIDRs over the private
    network, each family's on the rung of its pair's ladder in that family."""
    claims: list[Claim] = []
    paths: list[tuple[str, Path]] = []
    split: list[tuple[str, FamilyRungs]] = []
    for m in seat.my_seg.members:
        if m.name != seat.me.name and m.internal_ips:
            rungs = {f: _member_rung(seat, m, f) for f in m.pod_families}
            claims.extend(_private_claim(c, seat.me, m, rungs[c.version]) for c in m.pod_cidrs)
            paths.append((m.qualified_name, cheapest(rungs.values())))
            split.extend(_split(m.qualified_name, rungs))
    return Share(claims=tuple(claims), paths=tuple(paths), family_paths=tuple(split))


def _location_member(seat: _Seat, segs: Sequence[Segment] | None = None) -> Share:
    """A location member towards the segments `segs` it does not carry itself: everything of
    them goes to the leader that carries it (`_Seat.near`: the location's one leader, unless it
    has several) over the private network, their WireGuard IPs included (and, for a member that
    does not lead, its own location's, held by the first leader). Pod CIDRs take the rung the
    member uses to that leader; other addresses are routed raw to the leader's private address
    (an encapsulation is carried by a fast-path entry, and those exist for pod CIDRs only).
    None: every other segment."""
    if segs is None:
        segs = [s for s in seat.segs if s is not seat.my_seg]
    rungs: dict[str, dict[int, Rung]] = {}

    def rung(gw: Node, dst: IPNetwork) -> Rung:
        per = rungs.get(gw.name)
        if per is None:
            per = rungs[gw.name] = {f: _member_rung(seat, gw, f) if gw.internal_ips else Path.DIRECT for f in FAMILIES}
        return per[dst.version]

    wanted = {s.key for s in segs}
    claims: list[Claim] = []
    for s in seat.segs:
        own = s is seat.my_seg
        if (own and not seat.leads) or s.key in wanted:
            gw = seat.my_seg.leader if own else seat.near(s)
            claims.extend(_to_leader(seat, gw, rung(gw, dst), dst, False) for dst in s.hosts)
    paths: list[tuple[str, Path]] = []
    via_leader = Path.VIA_LEADER  # a local: read per member (an enum lookup is slow)
    for s in segs:
        gw = seat.near(s)
        pods = {c for m in s.members for c in m.pod_cidrs}
        claims.extend(_to_leader(seat, gw, rung(gw, dst), dst, dst in pods)
                      for dst in segment_addresses(s.members, None, None))
        paths.extend([(m.qualified_name, via_leader) for m in s.members])
    return Share(claims=tuple(claims), paths=tuple(paths))


def _to_leader(seat: _Seat, gw: Node, rung: Rung, dst: IPNetwork, pod: bool) -> Claim:
    """`dst` from a member to leader `gw`: a pod CIDR on the member's encapsulated rung to it,
    anything else (and everything on a direct rung) routed to its private address."""
    if rung not in ENCAP_RUNGS or not pod or not seat.me.internal_ips:
        hop = seat.to_leader(dst) if gw is seat.my_seg.leader else \
            _of_family((i.ip for i in gw.internal_ips), dst.version, gw.internal_ip.ip if gw.internal_ip else None)
        return dst, Route(dst, hop, "private")
    return _private_claim(dst, seat.me, gw, rung)


def _location_leader(seat: _Seat, segs: Sequence[Segment] | None = None) -> list[Share]:
    """A location's leader towards the segments `segs` it carries (every other one, unless the
    location has several leaders): one WireGuard peer per segment, at the segment's leader that
    carries its traffic with this location, carrying the segment's addresses, its WireGuard IP
    and what it relays for others, with those addresses routed into WireGuard; or, for a segment
    reached through a relay, the relayed share. None: every other segment."""
    out: list[Share] = []
    tunnel = Path.TUNNEL  # a local: read per member (an enum lookup is slow)
    for s in segs if segs is not None else [s for s in seat.segs if s is not seat.my_seg]:
        addrs = segment_addresses(s.members, None, None)
        if s.key in seat.relayed:
            out.append(_relayed(seat, s, "segment", addrs))
            continue
        r = seat.far(s)
        peer = _peer(r.qualified_name, "segment", r.public_key, seat.view.endpoint(r, seat.me.families),
                     addrs + s.hosts + seat.extra.get(s.key, []), seat.keepalive,
                     roaming=_roams(r), discovered=seat.view.discovered(r))
        out.append(Share(peers=(peer,), claims=_into_wireguard(addrs, s),
                         paths=tuple([(m.qualified_name, tunnel) for m in s.members])))
    return out


# --- full and cross granularity ----------------------------------------------------------------


def _pair(seat: _Seat, s: Segment) -> Share:
    """One end of a full/cross pair with node r (s's only member): each of r's pod CIDRs on the
    rung of the pair's ladder in its family, and unless fixed private rungs carry every family, a
    WireGuard peer with r's other addresses routed into it (directly, or through r's relay)."""
    me, r, mesh = seat.me, s.leader, seat.mesh
    ladders = {f: pair_rungs(mesh.intra_subnet, mesh.granularity, mesh.private_networks, me, r, f)
               for f in r.pod_families}
    working = seat.state.get(r.qualified_name)
    rungs = {f: choose_rung(ladder, working) for f, ladder in ladders.items()}
    path = ((r.qualified_name, cheapest(rungs.values())),)
    split = _split(r.qualified_name, rungs)
    private = tuple(_private_claim(c, me, r, rungs[c.version]) for c in r.pod_cidrs
                    if rungs[c.version] not in _WIREGUARD_RUNGS)
    if mesh.intra_subnet != "auto" and len(private) == len(r.pod_cidrs):
        return Share(claims=private, paths=path, family_paths=split)  # fixed private rungs carry everything: no peer
    dsts = _pair_destinations(seat, r, ladders)
    if s.key in seat.relayed:  # a relayed pair (both ends behind NAT, or no family shared): through a public node
        relayed = _relayed(seat, s, "node", dsts)
        return relayed._replace(claims=private + relayed.claims, family_paths=split)
    ep = _pair_endpoint(seat, r, rungs, ladders, working)
    peer = _peer(r.name, "node", r.public_key, ep, dsts + s.hosts + seat.extra.get(s.key, []),
                 seat.keepalive, roaming=_roams(r),
                 discovered=seat.view.discovered(r) and ep == seat.view.endpoint(r, me.families))
    return Share(peers=(peer,), claims=private + _into_wireguard(dsts, s), paths=path, family_paths=split)


def _pair_destinations(seat: _Seat, r: Node, ladders: dict[int, tuple[Rung, ...]]) -> list[IPNetwork]:
    """What the pair's WireGuard carries to r: its pod CIDRs and location IPs, and each internal
    address whose family's private network does not join the pair (a joined family's address
    carries the encapsulated rungs and WireGuard's private endpoint, so it stays on the private NIC).
    `ladders`: the pair's ladder per pod family, which answers that unless only the other
    family's join put wireguard-private on it."""
    me, mesh = seat.me, seat.mesh
    dsts = list(r.pod_cidrs)
    for i in r.internal_ips:
        ladder = ladders.get(i.version)
        if ladder is None or ladder == ENDPOINT_LADDER:
            ladder = pair_rungs(mesh.intra_subnet, mesh.granularity, mesh.private_networks, me, r, i.version,
                                cross_family=False)
        if ladder == TUNNEL_ONLY and not private_neighbours(me, r, i.version):
            dsts.append(host_net(i))
    dsts.extend(r.allowed_location_ips)
    return dsts


def _pair_endpoint(seat: _Seat, r: Node, rungs: dict[int, Rung], ladders: dict[int, tuple[Rung, ...]],
                   working: frozenset[str] | None) -> Endpoint | None:
    """Where the pair's WireGuard peer is called: r's private address when a family's rung is
    wireguard-private, or (auto) while that rung stands by, so either end may switch to it at any
    time and the other still accepts what arrives (make-before-break); else where the records
    say r is reached, in a family `me` speaks. The private address is r's first one of a family
    whose private network joins the pair."""
    mesh, private = seat.mesh, Path.WIREGUARD_PRIVATE
    standby = mesh.intra_subnet == "auto" and any(private in ladder for ladder in ladders.values()) and (
        working is None or private in working)
    if private not in rungs.values() and not standby:
        return seat.view.endpoint(r, seat.me.families)
    fixed = mesh.intra_subnet != "auto"
    joined = next((i for i in r.internal_ips
                   if (private_neighbours(seat.me, r, i.version) if fixed else
                       private_joined(seat.me, r, mesh.private_networks, i.version))), r.internal_ip)
    assert joined is not None
    return Endpoint(str(joined.ip), r.endpoint.port if r.endpoint else mesh.port)


# --- every granularity -------------------------------------------------------------------------


def _extra_peers(seat: _Seat, peers: Sequence[Peer]) -> Share:
    """The extra peers (laptops, gateways): a leader has each as a WireGuard peer and routes its
    allowed IPs into WireGuard; a member routes them to its leader."""
    leads = seat.first
    offered: list[OfferedPeer] = []
    claims: list[Claim] = []
    for p in sorted(peers, key=lambda p: p.name):
        if leads:
            peer, _ = _peer(p.name, "peer", p.public_key, p.endpoint, p.allowed_ips, seat.keepalive, p.preshared_key)
            # Checked whatever its range: a node's location IPs may be public and hold a peer's endpoint.
            offered.append((peer, p.endpoint.ip if p.endpoint is not None else None))
        claims.extend((a, Route(a, None, "wireguard") if leads else Route(a, seat.to_leader(a), "private"))
                      for a in p.allowed_ips)
    return Share(peers=tuple(offered), claims=tuple(claims))


def _no_loops(peers: list[PeerPlan], checked: Sequence[tuple[int, IPAddress]],
              claimed: Claimed) -> list[PeerPlan]:
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
    plens = sorted({(r.dst.version, r.dst.prefixlen) for _, r in claimed.values()
                    if isinstance(r, Route) and r.dev == "wireguard"})
    out = list(peers)
    for i, ip in checked:
        bits = ip.max_prefixlen
        for version, plen in plens:
            c = claimed.get(net_key(version, int(ip) >> (bits - plen) << (bits - plen), plen)) \
                if version == ip.version else None
            r = None if c is None else c[1]
            if isinstance(r, Route) and r.dev == "wireguard":
                out[i] = replace(out[i], endpoint=None, discovered=False)
                break
    return out


# --- relays ------------------------------------------------------------------------------------


def _node_addresses(me: Node, r: Node) -> list[IPNetwork]:
    """What node r's peer carries for `me` in full/cross granularity (besides r's WireGuard IPs):
    its pod CIDRs, its internal addresses of the families the two are not private neighbours in,
    its location IPs."""
    out = list(r.pod_cidrs)
    out.extend(host_net(i) for i in r.internal_ips if not private_neighbours(me, r, i.version))
    out.extend(r.allowed_location_ips)
    return out


# The fixed intra_subnet modes whose private rung has no WireGuard peer behind it.
_PEERLESS_MODES = ("direct", *ENCAP_RUNGS.values())


def _no_peer(mesh: MeshSettings, a: Node, b: Node) -> bool:
    """Nodes a and b hold no WireGuard peer for each other: a fixed private rung (direct, ipip,
    vxlan) carries their pair in every family of either's pod CIDRs (`_pair`), so it is never
    relayed and neither relays for the other. Symmetric in a and b (pair_rungs is)."""
    return mesh.granularity != "location" and mesh.intra_subnet in _PEERLESS_MODES and \
        all(pair_rungs(mesh.intra_subnet, mesh.granularity, mesh.private_networks, a, b, f)[0] != Path.TUNNEL
            for f in {*a.pod_families, *b.pod_families})


def _relays(view: NatView, me: Node, my_seg: Segment, segs: Sequence[Segment], mesh: MeshSettings,
            keys: Sequence[str]) -> tuple[dict[str, tuple[Segment, str]], dict[str, list[IPNetwork]]]:
    """The segments this node (when it leads) reaches through a relay: segment key -> (relaying
    segment, why); and what each relaying segment's peer carries for them. A pure function of
    the pair's records, so both ends choose the same: pairs without a WireGuard peer are never
    relayed, and a relay must hold a WireGuard peer for both ends (`_no_peer`), so a public
    private neighbour of one end relays for neither. Pairs without a relay candidate stay
    direct attempts at both ends."""
    relayed: dict[str, tuple[Segment, str]] = {}
    extra: dict[str, list[IPNetwork]] = {}
    if all(n.name != me.name for n in my_seg.all_leaders):
        return relayed, extra
    wanted = []
    for s in segs:
        if s is my_seg or gateway(my_seg, s, keys).name != me.name:
            continue
        far = gateway(s, my_seg, keys)
        reason = view.relay_reason(me, far)  # cheap, and None for almost every pair
        if reason is not None and not _no_peer(mesh, me, far):
            wanted.append((s, reason))
    if not wanted:
        return relayed, extra
    candidates = {s.leader.name: s for s in segs if s.leader.reachable_endpoint is not None and s is not my_seg
                  and not _no_peer(mesh, me, s.leader)}
    for s, reason in wanted:
        r = gateway(s, my_seg, keys)
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


# A remote segment's share as the seat sees it: me, WireGuard addresses, leader, admitted members,
# whether me leads, its leader's addresses, keepalive (`_remote_segment`'s arguments).
_SegmentKey = tuple[Node, tuple[IPInterface, ...], Node, tuple[Node, ...], bool, tuple[IPAddress, ...], int]


def _remote_shares(me: Node, leads: bool, leader_ips: tuple[IPAddress, ...], keepalive: int, remote: Remote,
                   cache: PlanCache) -> tuple[list[Share], list[IPNetwork], list[_SegmentKey]]:
    """One other cluster's admitted nodes, one share per remote segment (see `_remote_segment`),
    their pod CIDRs, and the segments' memo keys."""
    out: list[Share] = []
    pods: list[IPNetwork] = []
    keys: list[_SegmentKey] = []
    every = len(remote.admitted) == len(remote.topology.nodes)  # names are unique among the admitted
    for s in remote.segments or segments(remote.topology):
        members = s.members if every else tuple(m for m in s.members if m.name in remote.admitted)
        keys.append((me, s.addresses, s.leader, members, leads, leader_ips, keepalive))
        out.append(_remote_segment(keys[-1], cache))
        pods.extend(c for m in members for c in m.pod_cidrs)
    return out, pods, keys


class _Block(NamedTuple):
    """Shares merged among themselves: what they claim (first claim wins), their routes and
    their pod CIDRs' fast-path entries, each sorted by the project's order with its sort key,
    and their peers, paths and relays in share order."""

    shares: tuple[Share, ...]
    claimed: Claimed
    routes: list[tuple[SortKey, Route]]
    fastpath: list[tuple[SortKey, FastPathEntry]]
    peers: tuple[OfferedPeer, ...]
    paths: dict[str, Path]
    relays: dict[str, tuple[str, str]]


def _block(shares: Sequence[Share], pods: Iterable[IPNetwork], leaving: Leaving = None) -> _Block:
    """`shares` merged among themselves (`_merge`'s rule: the first claim on a destination wins),
    with the fast-path entries of `pods`. Sorted on (key, value) pairs without a key function:
    keys are unique (one per destination), so values are never compared."""
    claimed = _claimed(chain.from_iterable(s.claims for s in shares))
    routes = _sorted_routes(claimed)
    fast = []
    for pod in pods:
        k = sort_key_net(pod)
        c = claimed.get(k)
        e = None if c is None else _fast_entry(pod, c[1], leaving)
        if e is not None:
            fast.append((k, e))
    fast.sort()
    return _Block(tuple(shares), claimed, routes, fast, tuple(chain.from_iterable(s.peers for s in shares)),
                  dict(chain.from_iterable(s.paths for s in shares)),
                  dict(chain.from_iterable(s.relays for s in shares)))


class PlanCache:
    """What the plans of one node keep between them (the agent owns one; `plan_node` without one
    computes everything anew, a cold plan): each remote cluster's block, by the Remote (the
    identity rule, mesh.memo) and the seat, and each remote segment's share, by value. A plan
    after a remote change merges again only the cluster it touched and builds only the segments
    it changed; what the last plan did not use is dropped (mesh.memo.UsedMemo)."""

    def __init__(self) -> None:
        self.blocks: UsedMemo[SameObject, tuple[_Block, tuple[_SegmentKey, ...]]] = UsedMemo()
        self.segments: UsedMemo[_SegmentKey, Share] = UsedMemo()
        # The own topology's segments, by the Topology: the plans of every node of one topology
        # (graph_model, plan_all) compute them once, not once a node.
        self.topology_segments: UsedMemo[SameObject, tuple[Segment, ...]] = UsedMemo()

    def segments_of(self, topo: Topology) -> tuple[Segment, ...]:
        return self.topology_segments.get(SameObject(topo, None), lambda: tuple(segments(topo)))

    def plan_done(self) -> None:
        for memo in (self.blocks, self.segments, self.topology_segments):
            memo.done()

    def clear(self) -> None:
        """Drop every block, segment share and segment list (the next plan computes all anew: a
        cold plan)."""
        for memo in (self.blocks, self.segments, self.topology_segments):
            memo.clear()


def _remote_block(remote: Remote, seat: tuple[Node, bool, tuple[IPAddress, ...], int, Leaving], cache: PlanCache
                  ) -> _Block:
    """One remote cluster's block, kept in `cache` by its Remote and the seat: a pass after a
    remote change merges and sorts again only the cluster it touched (its segments' shares come
    from the cache too: `_remote_segment`)."""
    def make() -> tuple[_Block, tuple[_SegmentKey, ...]]:
        me, leads, leader_ips, keepalive, leaving = seat
        shares, pods, keys = _remote_shares(me, leads, leader_ips, keepalive, remote, cache)
        return _block(shares, pods, leaving), tuple(keys)
    block, keys = cache.blocks.get(SameObject(remote, seat), make)
    cache.segments.keep(keys)
    return block


def _remote_blocks(seat: _Seat, remotes: Sequence[Remote], cache: PlanCache) -> list[_Block]:
    """Other clusters' blocks, by cluster name."""
    where = (seat.me, seat.first, seat.leader_ips or ((seat.leader_ip,) if seat.leader_ip else ()), seat.keepalive,
             _leaving(seat))
    return [_remote_block(r, where, cache) for r in sorted(remotes, key=lambda r: r.topology.cluster.name)]


def _merge_blocks(me: Node, topo: Topology, own: Sequence[Share], blocks: Sequence[_Block]
                  ) -> tuple[list[PeerPlan], tuple[Route, ...], tuple[FastPathEntry, ...], dict[str, Path],
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


def _remote_segment(key: _SegmentKey, cache: PlanCache) -> Share:
    """One remote segment's share (`_segment_share` of `key`), kept in `cache` (a pure function of
    its arguments): a remote change recomputes only the segment it touches, so a reconcile with
    thousands of remote nodes redoes only what changed."""
    return cache.segments.get(key, lambda: _segment_share(*key))


def _segment_share(me: Node, wg_ips: tuple[IPInterface, ...], leader: Node, members: tuple[Node, ...], leads: bool,
                   leader_ips: tuple[IPAddress, ...], keepalive: int) -> Share:
    """One remote segment's share: its private neighbours of `me` go direct whatever the
    granularities (each family's pod CIDRs where the two are neighbours in that family); the
    rest is one WireGuard peer reached at the segment's leader (a member routes it to its own
    leader)."""
    claims: list[Claim] = []
    paths: list[tuple[str, Path]] = []
    split: list[tuple[str, FamilyRungs]] = []
    rest = []
    # me's private subnets: a member with no address in them is no private neighbour in any family.
    near = key_ranges(i.network for i in me.internal_ips)
    any_near = False
    direct: Rung = Path.DIRECT  # locals: read per member
    tunnel: Rung = Path.TUNNEL
    for m in members:
        if not any(lo <= k <= hi for k in m.internal_keys for lo, hi in near):
            rest.append(m)  # no address in me's private subnets: never a neighbour, every family tunnels
            continue
        any_near = True
        rungs: dict[int, Rung] = {f: direct if private_neighbours(me, m, f) else tunnel for f in m.pod_families}
        claims.extend(_private_claim(c, me, m, direct) for c in m.pod_cidrs if rungs[c.version] == direct)
        if all(r == direct for r in rungs.values()):
            paths.append((m.qualified_name, direct))
            continue
        rest.append(m)
        split.extend(_split(m.qualified_name, rungs))
    if not rest:
        return Share(claims=tuple(claims), paths=tuple(paths))
    wgs = [host_net(a) for a in wg_ips]
    # Members without an address in me's private subnets keep every address (nothing is near).
    addrs = segment_addresses(rest, None, me if any_near else None)
    peers: tuple[OfferedPeer, ...] = ()
    if leads:
        ep = leader.endpoint_for(me.families) or leader.endpoint
        peer, _ = _peer(leader.qualified_name, "segment", leader.public_key, ep, addrs + wgs, keepalive)
        peers = ((peer, None),)
        claims.extend((wg, Route(wg, None, "wireguard")) for wg in wgs)
        gw = {f: _of_family((a.ip for a in wg_ips), f) for f in FAMILIES}  # per family, not per address
        claims.extend((d, Route(d, gw[d.version], "wireguard")) for d in addrs)
    else:
        hop = {f: _of_family(leader_ips, f, leader_ips[0] if leader_ips else None) for f in FAMILIES}
        claims.extend((d, Route(d, hop[d.version], "private")) for d in [*wgs, *addrs])
    way = tunnel if leads else Path.VIA_LEADER
    paths += [(m.qualified_name, way) for m in rest]
    return Share(peers=peers, claims=tuple(claims), paths=tuple(paths), family_paths=tuple(split))


# Where a remote cluster's packet leaves this one (FastPathEntry.translate): None, this cluster has
# no global ranges; else the own leader's addresses, which a non-leader's routes to other
# locations name (the leader sends the packet on and translates it), empty for a leader.
Leaving = frozenset[IPAddress] | None


def _leaving(seat: _Seat) -> Leaving:
    if not seat.mesh.global_cidrs:
        return None
    return frozenset() if seat.leads else frozenset(seat.leader_ips or ((seat.leader_ip,) if seat.leader_ip else ()))


def _fastpath(me: Node, topo: Topology, remotes: Sequence[Remote], claimed: Claimed,
              leaving: Leaving = None) -> tuple[FastPathEntry, ...]:
    """One entry per node pod CIDR: local for our own, direct (encapsulated, or to a next hop) for
    an encapsulation or a route on the private NIC, tunnel for a route through WireGuard; the
    remote clusters' entries with `translate` where the packet leaves the cluster here."""
    out = [FastPathEntry(c, "local", None) for c in me.pod_cidrs]
    for n in topo.nodes:
        if n is me:
            continue
        out.extend(e for e in (_fast_entry(c, _claim_of(claimed, c)) for c in n.pod_cidrs) if e is not None)
    for n in (n for r in remotes for n in r.nodes):
        out.extend(e for e in (_fast_entry(c, _claim_of(claimed, c), leaving) for c in n.pod_cidrs) if e is not None)
    return tuple(sorted(out, key=lambda e: sort_key_net(e.prefix)))


def _fast_entry(c: IPNetwork, r: Route | Encap | None, leaving: Leaving = None) -> FastPathEntry | None:
    """The fast-path entry of pod CIDR `c` claimed as `r` (None: not claimed); `leaving` (for
    another cluster's `c`): FastPathEntry.translate unless `r` sends it to the own leader."""
    if r is None:
        return None
    translate = leaving is not None and not (isinstance(r, Route) and r.via is not None and r.via in leaving)
    if isinstance(r, Encap):
        return FastPathEntry(c, "direct", None, r, translate)
    if r.dev == "private":
        return FastPathEntry(c, "direct", r.via, None, translate)
    return FastPathEntry(c, "tunnel", None, None, translate)


def mesh_cidrs(topo: Topology, remotes: list[Remote]) -> frozenset[IPNetwork]:
    """Everything inside the mesh (never masqueraded): pod CIDRs, the WireGuard subnet, location
    IPs and extra peers' allowed IPs, of this cluster and admitted remote ones. A set, not a sorted
    list: the NAT applier diffs sets, so an order would only cost sorting thousands of networks."""
    out: set[IPNetwork] = set(topo.mesh.subnets)
    for n in [*topo.nodes, *(n for r in remotes for n in r.nodes)]:
        out.update(n.pod_cidrs)
        out.update(n.allowed_location_ips)
    for r in remotes:
        out.update(r.topology.mesh.subnets)
    for p in topo.peers:
        out.update(p.allowed_ips)
    return frozenset(out)
