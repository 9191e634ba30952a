# SPDX-License-Identifier: Apache-2.0
"""The mesh's data model: what every backend (topology file, etcd, Kubernetes, remote clusters)
turns its input into, and what the pure planner reads.

All types are frozen and hashable so a plan is a pure function of them and can be cached or compared.
Addresses are `ipaddress` objects, never strings, so comparisons and overlap checks are exact.
"""

from __future__ import annotations

import functools
import ipaddress
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from meshctl.errors import MeshError

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

Granularity = Literal["location", "full", "cross"]
IntraSubnet = Literal["auto", "direct", "vxlan", "ipip", "wireguard-private", "wireguard"]
GRANULARITIES: tuple[str, ...] = ("location", "full", "cross")
# How segments get their WireGuard addresses (mesh.segments): `index`, the i-th segment by key takes
# the subnet's address i+1 (Kilo's scheme, the default); `stable`, each from a hash of its key.
WireGuardAddressing = Literal["index", "stable"]
WIREGUARD_ADDRESSINGS: tuple[str, ...] = ("index", "stable")
DEFAULT_INTRA_SUBNET: IntraSubnet = "auto"

class Path(StrEnum):
    """What a pair does, as `NodePlan.paths` names it, from one node towards another: a rung of
    the path ladder, or one of the ways a pair travels that is no rung of its own. A str: JSON,
    tables and metric labels carry its value, the words operators' scripts read."""

    # The path ladder between two nodes, cheapest first (docs/mesh.md, "The path ladder"): the
    # rungs (`Rung`). The private ones are probed under `intra_subnet: auto`; `tunnel` (WireGuard
    # over the public endpoint) is the last resort and always assumed to work.
    DIRECT = "direct"
    DIRECT_IPIP = "direct+ipip"
    DIRECT_VXLAN = "direct+vxlan"
    # WireGuard to a peer's private address: the rung, and the intra_subnet mode that pins a pair
    # to it (the one spelling of the name outside the IntraSubnet Literal).
    WIREGUARD_PRIVATE = "wireguard-private"
    TUNNEL = "tunnel"
    # The node itself.
    LOCAL = "local"
    # A location member's traffic to other locations: through its leader (location granularity).
    VIA_LEADER = "via-leader"
    # WireGuard through a third node that relays for a pair that cannot reach each other.
    RELAY = "relay"
    # `--cni flannel`: flannel carries the pair's pod traffic (mesh/flannel.py).
    FLANNEL = "flannel"
    # No path: a node the plan does not reach (a node row's path, `lab check`'s measured path).
    NONE = "none"


def path_of(text: object, where: str) -> Path:
    """The Path `text` names (a status or a summary another process wrote); a MeshError naming
    `where` and the value when it names none."""
    if isinstance(text, str):
        try:
            return Path(text)
        except ValueError:
            pass
    raise MeshError(f"{where}: {text!r} is not a path (one of {', '.join(Path)})")


# A rung of the path ladder: the Path members a pair's ladder holds (mesh/ladder.py).
Rung = Literal[Path.DIRECT, Path.DIRECT_IPIP, Path.DIRECT_VXLAN, Path.WIREGUARD_PRIVATE, Path.TUNNEL]
RUNGS: tuple[Rung, ...] = (Path.DIRECT, Path.DIRECT_IPIP, Path.DIRECT_VXLAN, Path.WIREGUARD_PRIVATE, Path.TUNNEL)
PRIVATE_RUNGS: tuple[Rung, ...] = RUNGS[:-1]
# The encapsulations of the private network, the one table of them: each kind is carried by one
# rung (rung -> kind) and is also the fixed intra_subnet mode that pins a pair to that rung. The
# fast path's map codes of the kinds (datapath/layout.py) are keyed by this table.
EncapKind = Literal["vxlan", "ipip"]
ENCAP_RUNGS: dict[Rung, EncapKind] = {Path.DIRECT_VXLAN: "vxlan", Path.DIRECT_IPIP: "ipip"}
ENCAP_KINDS: tuple[EncapKind, ...] = tuple(ENCAP_RUNGS.values())
# What a fixed intra_subnet mode pins an eligible private pair to (auto: the ladder).
FIXED_RUNG: dict[str, Rung] = {"direct": Path.DIRECT, **{kind: rung for rung, kind in ENCAP_RUNGS.items()},
                               Path.WIREGUARD_PRIVATE.value: Path.WIREGUARD_PRIVATE, "wireguard": Path.TUNNEL}
INTRA_SUBNET_MODES: tuple[str, ...] = ("auto", *FIXED_RUNG)
# Probe results as the plan reads them: peer (qualified name) -> the private rungs that deliver.
# A peer the mapping does not name is assumed to deliver on every rung (offline plans).
PathState = dict[str, frozenset[str]]

DEFAULT_SUBNET = ipaddress.ip_network("10.4.0.0/16")
DEFAULT_LEADER_HOLD = 30  # s, mesh.leader_hold
MAX_LEADER_HOLD = 3600
MAX_LEADERS_PER_LOCATION = 16
DEFAULT_PORT = 51820
FAMILIES: tuple[int, ...] = (4, 6)  # IP versions, in the project's order

# Ranges whose endpoints are not public (Kilo's notion, plus CGNAT and link-local).
_NON_PUBLIC = tuple(
    ipaddress.ip_network(n)
    for n in (
        "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "127.0.0.0/8",
        "169.254.0.0/16", "fc00::/7", "fe80::/10", "::1/128",
    )
)


# The default of a Node's one-address fields: "not given" (None means "none"), see Node.
_UNSET: Any = object()

Span = tuple[int, int, int]  # (IP version, first address, last address) as integers


def addr_key(version: int, addr: int) -> int:
    """An address of either version as one integer (IPv4 below IPv6): what admission keys its
    address indexes by (an `ipaddress` address hashes through its hex string, and `.ip` of an
    interface builds a new object on every call)."""
    return (version << 128) | addr


ADDR_BITS = 128  # addr_key's address part (the version above it)


def key_ranges(nets: Iterable[IPNetwork]) -> tuple[tuple[int, int], ...]:
    """`nets` as ranges of `addr_key`s: an address lies in one of them when its key lies in the
    range (integer comparisons instead of ipaddress's `in`)."""
    return tuple((addr_key(v, first), addr_key(v, last)) for v, first, last in map(span, nets))


def span(net: IPNetwork) -> Span:
    """A network as integers (cheaper to compare than broadcast_address). Not memoised: a lookup
    hashes the network, which costs what computing it does (1.1 us either way), and a cache of
    every record's networks kept those of records long gone alive; records keep their pod CIDRs'
    spans (`Node.pod_spans`)."""
    first = int(net.network_address)
    return net.version, first, first + (1 << (net.max_prefixlen - net.prefixlen)) - 1


class _EndpointDerived:
    """Slots for what an Endpoint derives from its host, set when it is made: plans ask them for
    every peer on every reconcile, and a slot is read at C speed (a lazily filled one needs a
    Python-level accessor on every read)."""

    __slots__ = ("ip", "is_public", "family")
    ip: IPAddress | None
    is_public: bool
    # The IP version of an address endpoint; 0 for a DNS name (reachable from either family: its
    # resolver picks).
    family: int


@dataclass(frozen=True, order=True, slots=True)
class Endpoint(_EndpointDerived):
    """A WireGuard endpoint: an IP literal or a DNS name, and a port. Slotted (no `__dict__`): an
    agent following 50,000 remote records holds one per record."""

    host: str
    port: int

    def __post_init__(self) -> None:
        try:
            ip: IPAddress | None = ipaddress.ip_address(self.host)
        except ValueError:
            ip = None
        object.__setattr__(self, "ip", ip)
        # A DNS name counts as public; an IP is public unless it lies in a private range.
        object.__setattr__(self, "is_public",
                           ip is None or not any(ip.version == n.version and ip in n for n in _NON_PUBLIC))
        object.__setattr__(self, "family", ip.version if ip is not None else 0)

    def __reduce__(self) -> tuple[type[Endpoint], tuple[str, int]]:
        return Endpoint, (self.host, self.port)  # copy, pickle: made again, so the slots are derived

    def __str__(self) -> str:
        ip = self.ip
        if ip is not None and ip.version == 6:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class Cluster:
    name: str = "default"
    id: int = 1


@dataclass(frozen=True)
class MeshSettings:
    granularity: Granularity = "location"
    subnet: IPNetwork = DEFAULT_SUBNET
    port: int = DEFAULT_PORT
    intra_subnet: IntraSubnet = DEFAULT_INTRA_SUBNET
    # Routed private networks (a VPC CIDR, a Hetzner network): two nodes whose internal addresses
    # both lie in one of them may use the encapsulated and wireguard-private rungs.
    private_networks: tuple[IPNetwork, ...] = ()
    # A node's allowed_location_ips may hold a default route (0.0.0.0/0, ::/0: an exit node) only
    # when this is set; otherwise one record could pull every node's traffic into its tunnel.
    allow_default_route: bool = False
    # The IPv6 WireGuard subnet of a dual-stack mesh (`subnet` is then IPv4): every segment gets an
    # address in each subnet, so both families' routes into WireGuard have a gateway of their family.
    subnet6: IPNetwork | None = None
    # How segments' WireGuard addresses are derived (mesh.segments.segments; docs/mesh.md,
    # "WireGuard addresses"): `stable` only when asked, so an upgrade never renumbers a mesh.
    wireguard_addressing: WireGuardAddressing = "index"
    # The cluster's global ranges (docs/clustermesh.md, "Clusters whose pod ranges overlap"): each
    # of its pod ranges with a range of the same size, (pod range, global range), at most one per
    # IP family. Every other cluster sees a pod of a mapped range at its one-to-one image (the same
    # host bits) in the global range; traffic inside the cluster is untouched.
    global_cidrs: tuple[tuple[IPNetwork, IPNetwork], ...] = ()
    # The cluster's Service ranges (k3s: 10.43.0.0/16): no global range, of this cluster or another,
    # may overlap them (a pod dialing such an address means a Service of its own cluster).
    service_cidrs: tuple[IPNetwork, ...] = ()
    # Location granularity: how long a location's preferred leader, once replaced for not
    # forwarding, must be seen forwarding again before it leads again (mesh/leaders.py), seconds.
    leader_hold: int = DEFAULT_LEADER_HOLD
    # Location granularity: how many leaders each location has; each other location's traffic
    # goes through one of them, by a rule both ends compute the same (mesh/segments.gateway).
    leaders_per_location: int = 1

    @property
    def subnets(self) -> tuple[IPNetwork, ...]:
        """The WireGuard subnets, one per family the mesh has (`subnet` first)."""
        return (self.subnet,) if self.subnet6 is None else (self.subnet, self.subnet6)


class _NodeDerived:
    """Slots for what a Node derives from its fields, set when it is made (`Node.__post_init__`;
    the hash on first use): admission and plans read them for every record and pair on every
    reconcile, and a slot is read at C speed."""

    __slots__ = ("_hash", "pod_spans", "pod_families", "families", "reachable_endpoint", "qualified_name",
                 "internal_keys", "internal_hosts")
    _hash: int
    # The pod CIDRs' spans (overlap checks run every reconcile).
    pod_spans: tuple[Span, ...]
    # The IP families of the node's pod CIDRs, in the project's order.
    pod_families: tuple[int, ...]
    # The IP families the node's underlay speaks: those of its internal addresses and address
    # endpoints. A node whose records say nothing (no address, or a DNS-name endpoint) is taken to
    # speak both: nothing says it cannot.
    families: frozenset[int]
    # The first configured endpoint anyone on the internet can call (a public one).
    reachable_endpoint: Endpoint | None
    # What the plan calls the node: `cluster2/g1` for a remote one.
    qualified_name: str
    # The internal addresses as `addr_key`s, in `internal_ips` order.
    internal_keys: tuple[int, ...]
    # The /32 (/128) of each internal address (`host_net`), in `internal_ips` order: what a
    # segment's peer carries and its routes name, the same (interned) objects on every plan.
    internal_hosts: tuple[IPNetwork, ...]


@dataclass(frozen=True, slots=True)
class Node(_NodeDerived):
    """One mesh node as published by its agent (or written in a topology file).

    `cluster` is empty for nodes of the local cluster and names the remote cluster otherwise;
    `qualified_name` is what the plan calls the node (`cluster2/g1` for remote ones).

    Slotted (no `__dict__`): an agent following 50,000 remote records holds one per record, and
    an instance dict cost more than all its fields together.
    """

    name: str
    # Every pod CIDR the node holds, in the order its source gave them (never empty): one per
    # family from a record or a Kubernetes Node, any number from a CNI's IPAM (Calico's blocks).
    pod_cidrs: tuple[IPNetwork, ...]
    public_key: str
    location: str = ""
    # The one-address forms of `internal_ips`, `endpoints` and `wireguard_ips`: always their first
    # element (None when empty), kept for readers of one address. Given alone they set the list;
    # given (as `replace` does) with a list, the one address replaces the list's address of its
    # family and goes first, and None empties the list.
    internal_ip: IPInterface | None = field(default=_UNSET)
    endpoint: Endpoint | None = field(default=_UNSET)
    leader: bool = False
    persistent_keepalive: int = 0
    allowed_location_ips: tuple[IPNetwork, ...] = ()
    wireguard_ip: IPInterface | None = field(default=_UNSET)
    cluster: str = ""
    # What this node's WireGuard saw (docs/nat.md): the endpoint each NATed peer's latest fresh
    # handshake came from, by peer name (Kilo's `discovered-endpoints`), and the NATed peers it
    # has tried for longer than the direct wait without any handshake. Claims about OTHER nodes:
    # they route nothing until mesh.admit.confirmed_endpoints / mesh.plan agree with them.
    discovered_endpoints: tuple[tuple[str, Endpoint], ...] = ()
    unreached_peers: tuple[str, ...] = ()
    # Dual stack: the node's private addresses (each with its subnet's prefix), its WireGuard
    # endpoints and the WireGuard addresses its agent published, at most one per IP family each
    # (a DNS-name endpoint counts as a family of its own), in the order the record gave them.
    internal_ips: tuple[IPInterface, ...] = ()
    endpoints: tuple[Endpoint, ...] = ()
    wireguard_ips: tuple[IPInterface, ...] = ()

    def internal(self, family: int) -> IPInterface | None:
        """The internal address of IP version `family`, or None."""
        for i in self.internal_ips:  # at most one per family
            if i.version == family:
                return i
        return None

    def endpoint_for(self, families: Iterable[int]) -> Endpoint | None:
        """The first endpoint a node speaking `families` can call (a DNS name: any), or None."""
        fams = set(families)
        return next((e for e in self.endpoints if e.family == 0 or e.family in fams), None)

    def __hash__(self) -> int:
        # Computed once per record: plans memoise per segment on tuples of thousands of nodes, so
        # the same records are hashed on every reconcile; their fields never change.
        try:
            return self._hash
        except AttributeError:
            pass
        h = hash(tuple(getattr(self, f) for f in _NODE_FIELDS))
        object.__setattr__(self, "_hash", h)
        return h

    def __post_init__(self) -> None:
        if not self.pod_cidrs:
            raise ValueError(f"node {self.name!r} has no pod CIDR")
        for one, many in (("internal_ip", "internal_ips"), ("endpoint", "endpoints"),
                          ("wireguard_ip", "wireguard_ips")):
            _one_and_many(self, one, many)
        derive = functools.partial(object.__setattr__, self)
        derive("pod_spans", tuple(span(c) for c in self.pod_cidrs))
        pod_fams = tuple(f for f in FAMILIES if any(c.version == f for c in self.pod_cidrs))
        derive("pod_families", _FAMILY_TUPLES.get(pod_fams, pod_fams))
        fams = {i.version for i in self.internal_ips} | {e.family for e in self.endpoints}
        derive("families", _FAMILY_SETS[frozenset(FAMILIES) if not fams or 0 in fams else frozenset(fams)])
        derive("reachable_endpoint", next((e for e in self.endpoints if e.is_public), None))
        derive("qualified_name", f"{self.cluster}/{self.name}" if self.cluster else self.name)
        derive("internal_keys", tuple(addr_key(i.version, int(i)) for i in self.internal_ips))
        derive("internal_hosts", tuple(host_net(i) for i in self.internal_ips))

    def __reduce__(self) -> tuple[type[Node], tuple[object, ...]]:
        return Node, tuple(getattr(self, f) for f in _NODE_FIELDS)  # copy, pickle: made again (slots derived)


# One object per value for the small derived sets every record holds (shared, not one per record).
_FAMILY_SETS: dict[frozenset[int], frozenset[int]] = {
    s: s for s in (frozenset(), frozenset({4}), frozenset({6}), frozenset(FAMILIES))}
_FAMILY_TUPLES: dict[tuple[int, ...], tuple[int, ...]] = {t: t for t in ((), (4,), (6,), FAMILIES)}


_NODE_FIELDS = tuple(f for f in Node.__dataclass_fields__)


def _family(x: IPInterface | Endpoint) -> int:
    return x.family if isinstance(x, Endpoint) else x.version


def _one_and_many(n: Node, one: str, many: str) -> None:
    """Make `n.<one>` the first of `n.<many>` (see the fields' comment in Node)."""
    first, items = getattr(n, one), getattr(n, many)
    if first is _UNSET:
        object.__setattr__(n, one, items[0] if items else None)
    elif first is None:
        object.__setattr__(n, many, ())
    elif not items or items[0] != first:
        object.__setattr__(n, many, (first, *(x for x in items if _family(x) != _family(first))))


@dataclass(frozen=True)
class KeyRef:
    """Where a secret key is kept, never the key: a key of a Kubernetes Secret (`secret`, in the
    agent's namespace) or a file on the node (`file`, mode 0600). Records, plans and status carry
    this; the WireGuard step reads the key only to hand it to the device."""

    source: Literal["secret", "file"]
    name: str
    key: str = ""

    def __str__(self) -> str:
        return f"secret {self.name} key {self.key}" if self.source == "secret" else f"file {self.name}"


@dataclass(frozen=True)
class Peer:
    """A WireGuard peer that is not a node: a laptop, a VPN gateway."""

    name: str
    public_key: str
    allowed_ips: tuple[IPNetwork, ...]
    endpoint: Endpoint | None = None
    persistent_keepalive: int | None = None
    preshared_key: KeyRef | None = None


@dataclass(frozen=True)
class Topology:
    """Everything one cluster knows: its identity, mesh settings, nodes and extra peers."""

    cluster: Cluster = field(default_factory=Cluster)
    mesh: MeshSettings = field(default_factory=MeshSettings)
    nodes: tuple[Node, ...] = ()
    peers: tuple[Peer, ...] = ()
    # The leaders mesh/leaders.py chose from the published forwarding reports, per segment key,
    # where they differ from the documented order (segments.leader_order); empty: that order.
    leaders: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # Per segment key, the members the documented order puts first that those reports ruled out:
    # they keep a WireGuard session, without allowed IPs, with the leaders they will peer again
    # when they lead again (a standby peer), so that their return moves allowed IPs only.
    standby: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def node(self, name: str) -> Node | None:
        for n in self.nodes:
            if n.name == name:
                return n
        return None


def shared_families(a: Node, b: Node) -> tuple[int, ...]:
    """The IP families in which both nodes have an internal address."""
    return tuple(f for f in FAMILIES if a.internal(f) is not None and b.internal(f) is not None)


def private_neighbours(a: Node, b: Node, family: int | None = None) -> bool:
    """Both have an internal address of `family` and each lies inside the other's subnet; with
    no family given, in some family."""
    for ia in a.internal_ips:
        if family is not None and ia.version != family:
            continue
        ib = b.internal(ia.version)
        # An interface is an address: `in` tests it without building `.ip` (a new object each time).
        if ib is not None and ia in ib.network and ib in ia.network:
            return True
    return False


def private_joined(a: Node, b: Node, private_networks: tuple[IPNetwork, ...], family: int | None = None) -> bool:
    """One routed private network of `family` (no family given: of some family) joins the two
    nodes' internal addresses: they are private neighbours, or in the same location (Kilo's rule
    for location members), or both inside one of `mesh.private_networks`."""
    same_location = bool(a.location) and a.location == b.location and not a.cluster and not b.cluster
    for ia in a.internal_ips:
        if family is not None and ia.version != family:
            continue
        ib = b.internal(ia.version)
        if ib is None:
            continue
        if same_location or (ia in ib.network and ib in ia.network):
            return True
        if any(n.version == ia.version and ia.ip in n and ib.ip in n for n in private_networks):
            return True
    return False


def global_image(addr: IPAddress, pod: IPNetwork, glob: IPNetwork) -> IPAddress:
    """The image of `addr` (inside `pod`) in the global range `glob` of the same size: the same host
    bits under the global range's prefix (and back, with the two ranges swapped)."""
    host = int(addr) - int(pod.network_address)
    return ipaddress.ip_address(int(glob.network_address) + host) if addr.version == 4 else \
        ipaddress.IPv6Address(int(glob.network_address) + host)


def global_net(net: IPNetwork, pod: IPNetwork, glob: IPNetwork) -> IPNetwork:
    """The image of network `net` (inside `pod`) in the global range `glob`, the one shared
    object of it (`network_of`)."""
    return network_of(net.version, int(glob.network_address) + int(net.network_address) - int(pod.network_address),
                      net.prefixlen)


def mapped_range(addr: IPAddress | IPNetwork, ranges: Iterable[tuple[IPNetwork, IPNetwork]]
                 ) -> tuple[IPNetwork, IPNetwork] | None:
    """The (from, to) pair of `ranges` whose first range holds `addr` (an address or a network
    inside it), or None."""
    for pair in ranges:
        a = pair[0]
        if addr.version == a.version and (addr in a if not isinstance(addr, IPNetwork) else addr.subnet_of(a)):  # type: ignore[arg-type]
            return pair
    return None


def sort_key_net(n: IPNetwork | IPInterface | IPAddress) -> int:
    """The project's one order for addresses and prefixes: IP version, address, prefix length, as
    one integer (compared at C speed). A shared network (`interned`) carries its key, computed
    once: a plan sorts 100,000 routes, fast-path entries and allowed IPs by it."""
    try:
        return n._mesh_key  # type: ignore[union-attr,no-any-return]
    except AttributeError:
        pass
    if isinstance(n, IPNetwork):
        return net_key(n.version, int(n.network_address), n.prefixlen)
    if isinstance(n, IPInterface):
        return net_key(n.version, int(n.ip), n.network.prefixlen)
    return net_key(n.version, int(n), n.max_prefixlen)


def net_key(version: int, addr: int, plen: int) -> int:
    """(version, address, prefix length) as one integer of the same order (`sort_key_net`)."""
    return (version << 136) | (addr << 8) | plen


# One network object per network while anything holds it: at 50,000 nodes a record's pod CIDR,
# the plan's route to it, the route applier's reading of the kernel's table and WireGuard's
# allowed IPs name the same 100,000 networks, each copy 300-500 bytes. Keyed by `net_key`.
_NETWORKS: weakref.WeakValueDictionary[int, IPNetwork] = weakref.WeakValueDictionary()


def _shared(net: IPNetwork, key: int) -> IPNetwork:
    # ipaddress gives each /31 and /32 (/127, /128) its own `hosts` closure (about 200 bytes, more
    # than the rest of the object): the class's `hosts()` serves them instead. Nothing here asks a
    # host prefix for its hosts. The sort key is kept on the object (an int, ~44 bytes).
    d = net.__dict__
    d.pop("hosts", None)
    shared = _NETWORKS.setdefault(key, net)
    if shared is net:
        d["_mesh_key"] = key
    return shared


def interned(net: IPNetwork) -> IPNetwork:
    """The one object of `net`'s network (`net` itself the first time)."""
    key = net_key(net.version, int(net.network_address), net.prefixlen)
    return _NETWORKS.get(key) or _shared(net, key)


def network_of(version: int, addr: int, plen: int) -> IPNetwork:
    """The network of IP `version` at integer `addr` (host bits masked) with prefix `plen`, built
    from integers (no string parsing) and shared (`interned`)."""
    bits = 32 if version == 4 else 128
    addr &= ~((1 << (bits - plen)) - 1)
    key = net_key(version, addr, plen)
    net = _NETWORKS.get(key)
    if net is None:
        net = _shared(ipaddress.IPv4Network((addr, plen)) if version == 4 else ipaddress.IPv6Network((addr, plen)),
                      key)
    return net


def host_net(ip: IPAddress | IPInterface) -> IPNetwork:
    """The /32 (or /128) of an address, built from integers (no string parsing: plans ask it for
    every address they route), the one object of that network (`network_of`). Not memoised: a
    cache keyed by the address hashes it in Python (ipaddress's `__hash__`), which costs three
    times looking up the shared network; nodes keep their internal addresses' (`internal_hosts`)."""
    bits = 32 if ip.version == 4 else 128
    return network_of(ip.version, int(ip), bits)
