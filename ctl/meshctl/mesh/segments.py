# SPDX-License-Identifier: Apache-2.0
"""The mesh's shape: segments (the nodes that share one WireGuard identity), their leaders and
WireGuard addresses, and other clusters as this node admitted them.

Admission and the plan both read the shape, so it lives apart from both: admission checks a remote
cluster's segment addresses before anything is planned, and the plan derives peers and routes from
the same segments (docs/mesh.md).
"""

from __future__ import annotations

import bisect
import hashlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter

from meshctl.errors import InputError
from meshctl.mesh.model import (
    FAMILIES,
    IPAddress,
    IPInterface,
    IPNetwork,
    Node,
    Topology,
    host_net,
    private_neighbours,
)


@dataclass(frozen=True)
class Segment:
    """Nodes that share one WireGuard identity: a location (location granularity) or one node."""

    key: str
    members: tuple[Node, ...]
    leader: Node
    wireguard_ip: IPInterface
    cluster: str = ""
    # One WireGuard address per subnet of the mesh (`wireguard_ip` first); empty: just that one.
    wireguard_ips: tuple[IPInterface, ...] = ()
    # Every leader of the segment (`mesh.leaders_per_location`), `leader` first; empty: just that one.
    leaders: tuple[Node, ...] = ()

    @property
    def all_leaders(self) -> tuple[Node, ...]:
        """The segment's leaders, `leader` first (one unless mesh.leaders_per_location says more)."""
        return self.leaders or (self.leader,)

    @property
    def peer_name(self) -> str:
        return self.leader.qualified_name

    @property
    def addresses(self) -> tuple[IPInterface, ...]:
        """The segment's WireGuard addresses, one per family of the mesh."""
        return self.wireguard_ips or (self.wireguard_ip,)

    @property
    def hosts(self) -> list[IPNetwork]:
        """The /32 (/128) of each WireGuard address (what peers allow and routes name)."""
        return [host_net(a) for a in self.addresses]

    def gateways(self) -> dict[int, IPAddress]:
        """The WireGuard address of each family, that routes into the segment's tunnel go through;
        a family the mesh has no WireGuard subnet of has none (the route names the device only).
        Not cached: segments are built anew for every plan, and each asks this once."""
        return {a.version: a.ip for a in self.addresses}


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


_NAME = attrgetter("name")  # the members' order (a C-level key: 50,000 records are sorted on a cold pass)


def segment_key(node: Node, granularity: str) -> str:
    if granularity == "location" and node.internal_ips:
        return f"location:{node.location}"
    return f"node:{node.name}"


def _rank(n: Node) -> int:
    """A member's rank in the documented order: 0 `leader` and a public endpoint, 1 `leader`,
    2 a public endpoint, 3 the rest."""
    public = n.endpoint is not None and n.endpoint.is_public
    return (0 if public else 1) if n.leader else (2 if public else 3)


def leader_order(members: Sequence[Node]) -> list[Node]:
    """The documented order in which a segment's members lead (docs/mesh.md): by rank (`leader`
    and a public endpoint; `leader`; a public endpoint; the rest), then by name. The first leads
    unless the published forwarding reports rule it out (mesh/leaders.py)."""
    return sorted(members, key=lambda n: (_rank(n), n.name))


def choose_leader(members: Sequence[Node]) -> Node:
    """The first of `leader_order`."""
    if len(members) == 1:
        return members[0]
    return leader_order(members)[0]


def static_leaders(members: Sequence[Node], count: int) -> tuple[Node, ...]:
    """The first `count` of the documented order (mesh.leaders_per_location)."""
    if count == 1 or len(members) == 1:
        return (choose_leader(members),)
    return tuple(leader_order(members)[:count])


def gateway(seg: Segment, other: Segment, keys: Sequence[str]) -> Node:
    """The leader of `seg` that carries its traffic with segment `other` (`keys`: every segment key
    of the cluster, sorted). With one leader, that one; with several, the others' keys are dealt
    round the leaders in key order (the i-th other key of `seg` goes to leader i mod n), so each
    leader carries about as many locations, and both ends, knowing the same segments, pick the
    same pair of leaders for each pair of locations. Segments of other clusters are carried by
    the first leader (their clusters do not know this one's keys)."""
    leaders = seg.all_leaders
    if len(leaders) == 1 or other.cluster != seg.cluster:
        return leaders[0]
    i = bisect.bisect_left(keys, other.key)
    if i < len(keys) and keys[i] == other.key:
        own = bisect.bisect_left(keys, seg.key)
        rank = i - 1 if own < i else i
        return leaders[rank % len(leaders)]
    return leaders[0]


def segments(topo: Topology) -> list[Segment]:
    """The topology's segments, sorted by key, each with one WireGuard address per subnet of the
    mesh, as `mesh.wireguard_addressing` derives them (`segment_offsets`): a pure function of the
    records and the mesh settings, so every node that admitted the same records agrees."""
    gran = topo.mesh.granularity
    groups: dict[str, list[Node]] = {}
    for n in topo.nodes:
        groups.setdefault(segment_key(n, gran), []).append(n)
    subnets = topo.mesh.subnets
    for field, subnet in zip(("mesh.subnet", "mesh.subnet6"), subnets, strict=False):
        if len(groups) + 1 >= subnet.num_addresses:
            raise InputError(field, str(subnet), f"has no room for {len(groups)} segments")
    keys = sorted(groups)
    offsets = [segment_offsets(keys, topo.mesh.wireguard_addressing, subnet) for subnet in subnets]
    chosen = dict(topo.leaders)
    count = topo.mesh.leaders_per_location if gran == "location" else 1
    out: list[Segment] = []
    for i, key in enumerate(keys):
        members = tuple(sorted(groups[key], key=_NAME))
        wgs = tuple(_nth(subnet, offs[i]) for subnet, offs in zip(subnets, offsets, strict=True))
        cluster = members[0].cluster
        leaders = _leaders_of(members, chosen.get(key), count)
        out.append(Segment(key, members, leaders[0], wgs[0], cluster, wgs if len(wgs) > 1 else (),
                           leaders if len(leaders) > 1 else ()))
    return out


def _leaders_of(members: tuple[Node, ...], chosen: tuple[str, ...] | None, count: int) -> tuple[Node, ...]:
    """The segment's leaders: those `chosen` (mesh/leaders.py) that are members, else the documented order's."""
    if chosen:
        by_name = {m.name: m for m in members}
        picked = tuple(by_name[n] for n in chosen if n in by_name)
        if picked:
            return picked
    return static_leaders(members, count)


def segment_offsets(keys: Sequence[str], addressing: str, subnet: IPNetwork) -> list[int]:
    """The offset into `subnet` of each segment's WireGuard address, for `keys` sorted, each
    within 1 .. num_addresses - 2 (never the network address, nor the last one).

    `index` (Kilo's): the i-th key takes i + 1, so a key that sorts early moves every later one.
    `stable`: each key's home is a hash of the key (blake2b, the same on every node and Python
    version) into that range; keys ordered by (home, key) take their home or, when it is taken, the
    next free offset after it (open addressing, wrapping past the end). A key that joins moves no
    other key's address unless its home falls in a run of taken offsets that the key's arrival
    pushes along (a collision); with the subnet mostly empty, runs are short. The caller checks
    that the subnet has room."""
    if addressing == "index":
        return list(range(1, len(keys) + 1))
    usable = subnet.num_addresses - 2
    homes = sorted((_home(k, usable), k) for k in keys)
    taken: set[int] = set()
    at: dict[str, int] = {}
    for home, k in homes:
        slot = home
        while slot in taken:
            slot = (slot + 1) % usable
        taken.add(slot)
        at[k] = slot + 1
    return [at[k] for k in keys]


def _home(key: str, usable: int) -> int:
    """Where `key`'s address goes when nothing else is there: 0 .. usable - 1."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=16).digest(), "big") % usable


def _nth(subnet: IPNetwork, i: int) -> IPInterface:
    """The subnet's i-th address with the subnet's prefix."""
    iface = ipaddress.IPv4Interface if subnet.version == 4 else ipaddress.IPv6Interface
    return iface((int(subnet.network_address) + i, subnet.prefixlen))


def segment_addresses(members: Sequence[Node], wg: Segment | None, exclude_internal_of: Node | None
                      ) -> list[IPNetwork]:
    """What a segment's peer carries: pod CIDRs, internal /32s (/128s), the WireGuard IPs of
    `wg` and location IPs. The internal address of a family in which a member is a private
    neighbour of `exclude_internal_of` is left out (that node reaches it over the private network),
    and so is the pod CIDR of such a family (it goes direct)."""
    out: list[IPNetwork] = []
    for m in members:
        if exclude_internal_of is None:
            out.extend(m.pod_cidrs)
            out.extend(m.internal_hosts)
            out.extend(m.allowed_location_ips)
            continue
        near = {f for f in FAMILIES if private_neighbours(exclude_internal_of, m, f)}
        out.extend(c for c in m.pod_cidrs if c.version not in near)
        out.extend(h for h in m.internal_hosts if h.version not in near)
        out.extend(m.allowed_location_ips)
    if wg is not None:
        out.extend(wg.hosts)
    return out
