# SPDX-License-Identifier: Apache-2.0
"""Admission: which records may join this node's plan, local and remote, over one claims index.

Checks between records never fail as a whole: they admit what is consistent and return the rest
as rejections, so one bad record can never take working routes down. Local records are admitted
older first, so a newcomer can never take an address an existing node holds; a remote cluster's
records are admitted after all local ones, against everything the local cluster and the clusters
admitted before it hold, so a remote cluster can never take over a local route.
"""

from __future__ import annotations

import bisect
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import chain
from operator import itemgetter
from typing import NamedTuple

from meshctl.mesh import global_ranges
from meshctl.mesh.model import (
    ADDR_BITS,
    Cluster,
    IPAddress,
    IPInterface,
    IPNetwork,
    MeshSettings,
    Node,
    Peer,
    Span,
    Topology,
    addr_key,
    host_net,
    key_ranges,
    span,
)
from meshctl.mesh.segments import Remote, segments


def _overlap(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    return a[0] == b[0] and a[1] <= b[2] and b[1] <= a[2]


Held = tuple[int, int, int, "str | tuple[str, Node]"]
_START = itemgetter(0, 1)  # a claim's start: (version, first address)
_SPAN = itemgetter(0, 1, 2)  # a claim's span
_AFTER = 1 << 200  # greater than any address: (v, a, _AFTER) sorts after every span starting at (v, a)
_LAST = {4: (1 << 32) - 1, 6: (1 << 128) - 1}  # the last address of each family


class Claims:
    """Disjoint address ranges with an owner each: answers "who already holds anything that
    overlaps this network?" in O(log n), so admitting 10,000 records stays fast.

    `base`: claims made before these, answered as if they were held here too (as one index
    holding both would answer), while everything added or removed stays in this one: one remote
    cluster's claims are kept apart from the others' and reused while its records do not change
    (mesh.admit_memo)."""

    def __init__(self, base: Claims | None = None) -> None:
        # Identities next to the addresses: a public key names exactly one WireGuard peer, and a
        # peer's name must not read as a node's (plans, graphs and showconf name both alike).
        self.keys: dict[str, str] = {}
        self.node_names: set[str] = set()
        self._base = base
        self._starts: list[tuple[int, int]] = []
        # (version, first, last, owner): an owner is a description, or a (prefix, node) pair
        # described only when someone conflicts with it (admitting thousands of records formats none).
        self._items: list[Held] = []
        self._defaults: dict[int, str] = {}

    def conflict(self, net: IPNetwork | Span) -> str | None:
        """Who holds anything overlapping `net` (a network or its precomputed span), or None."""
        version, first, last = net if isinstance(net, tuple) else span(net)
        # Claims are disjoint and sorted: only the one starting at or before `first` and the first
        # one starting after it can overlap. With a base, the latest such start of both and the
        # earliest after (on equal starts, the one index would hold the older claim first among
        # those at or before `first`, the newer first among those after it).
        before: Held | None = None
        after: Held | None = None
        for layer in (self,) if self._base is None else (self._base, self):
            i = bisect.bisect_right(layer._starts, (version, first))
            if i > 0 and (before is None or layer._starts[i - 1] > before[:2]):
                before = layer._items[i - 1]
            if i < len(layer._items) and (after is None or layer._starts[i] <= after[:2]):
                after = layer._items[i]
        for held in (before, after):
            if held is not None:
                v, f, la, owner = held
                if v == version and f <= last and first <= la:
                    if isinstance(owner, tuple):
                        prefix, node = owner
                        pod = next(c for c, sp in zip(node.pod_cidrs, node.pod_spans, strict=True)
                                   if sp[0] == v and sp[1] == f)
                        return f"{prefix}{node.qualified_name}'s pod CIDR {pod}"
                    return owner
        return None

    def overlaps_any(self, spans: Sequence[Span]) -> bool:
        """Whether any of `spans` (sorted, disjoint) overlaps a claim held here or in the base:
        only the claims from the last one starting at or before the first span to the last one
        starting within the spans are looked at (none, for a cluster's block of pod CIDRs)."""
        if not spans:
            return False
        lo, hi = spans[0][:2], (spans[-1][0], spans[-1][2])
        for layer in (self,) if self._base is None else (self._base, self):
            i = max(bisect.bisect_right(layer._starts, lo) - 1, 0)
            for v, f, la, _ in layer._items[i:bisect.bisect_right(layer._starts, hi)]:
                k = bisect.bisect_right(spans, (v, la, _AFTER)) - 1  # the last span starting at or before `la`
                if k >= 0 and spans[k][0] == v and spans[k][2] >= f:
                    return True
        return False

    def add_all(self, held: list[Held]) -> None:
        """Claim `held` (sorted by start, disjoint from each other and from every claim here: see
        `overlaps_any`; no default route), as `add` one by one would."""
        if self._items and held and self._starts[-1] > held[0][:2]:
            self._items = sorted(chain(self._items, held), key=_START)
            self._starts = list(map(_START, self._items))
        else:
            self._items.extend(held)
            self._starts.extend(map(_START, held))

    @classmethod
    def stacked(cls, layers: Sequence[Claims]) -> Claims:
        """One index holding what `layers` (oldest first, none with a base) hold, as one index
        they had all been added to in turn would hold it."""
        out = cls()
        # A stable sort of the newest first: on equal starts the newer claim comes first, as
        # `add` inserts it.
        out._items = sorted(chain.from_iterable(x._items for x in reversed(layers)), key=itemgetter(0, 1))
        out._starts = list(map(itemgetter(0, 1), out._items))
        for x in layers:
            out.keys.update(x.keys)
            out._defaults.update(x._defaults)
        return out

    def alone(self) -> Claims:
        """What this index holds itself, without its base."""
        out = Claims()
        out.keys, out.node_names, out._starts, out._items, out._defaults = \
            self.keys, self.node_names, self._starts, self._items, self._defaults
        return out

    def held(self) -> frozenset[tuple[object, ...]]:
        """Everything this index holds itself (not its base's), as comparable values."""
        return frozenset([*self._items, *(("default", v, o) for v, o in self._defaults.items()),
                          *(("key", k, o) for k, o in self.keys.items())])

    def key_taken(self, key: str, where: str) -> str | None:
        """The rejection line when `key` already belongs to an admitted node or peer, else None."""
        owner = self.keys.get(key)
        if owner is None and self._base is not None:
            owner = self._base.keys.get(key)
        return None if owner is None else f"{where}.public_key: {key!r} is already the key of {owner}"

    def add_peer(self, peer: Peer, kind: str) -> None:
        """Claim an admitted peer's allowed IPs and key (owners read `<kind> laptop's ...`). Claims
        stay disjoint: the peer's widest networks first, the ones inside them add nothing."""
        for a in sorted(peer.allowed_ips, key=lambda a: a.prefixlen):
            if self.conflict(a) is None:
                self.add(a, f"{kind} {peer.name}'s allowed IPs {a}")
        self.keys[peer.public_key] = f"{kind} {peer.name}"

    def add(self, net: IPNetwork | Span, owner: str | tuple[str, Node]) -> None:
        version, first, last = net if isinstance(net, tuple) else span(net)
        if first == 0 and last == (1 << (32 if version == 4 else 128)) - 1:
            # A default route is kept apart: longest-prefix match lets it coexist with everything.
            self._defaults[version] = owner if isinstance(owner, str) else f"{owner[0]}{owner[1].qualified_name}"
            return
        i = bisect.bisect_left(self._starts, (version, first))
        self._starts.insert(i, (version, first))
        self._items.insert(i, (version, first, last, owner))

    def remove(self, net: IPNetwork | Span) -> None:
        """Give up the claim that starts where `net` starts (a record rejected after all)."""
        version, first, _ = net if isinstance(net, tuple) else span(net)
        i = bisect.bisect_left(self._starts, (version, first))
        if i < len(self._starts) and self._starts[i] == (version, first):
            del self._starts[i]
            del self._items[i]

    def default_route(self, version: int) -> str | None:
        """Who holds the default route of this IP version, or None."""
        owner = self._defaults.get(version)
        return self._base._defaults.get(version) if owner is None and self._base is not None else owner


@dataclass(frozen=True)
class Rejection:
    """A record that was not admitted, and why (one line naming field and value)."""

    name: str
    reason: str


def admit_nodes(
    nodes: Sequence[Node],
    subnet: IPNetwork | Sequence[IPNetwork] | None,
    *,
    claims: Claims | None = None,
    internal_ips: dict[int, str] | None = None,
    hosts: dict[int, str] | None = None,
    allow_default_route: bool = False,
    label: str = "nodes",
) -> tuple[list[Node], list[Rejection]]:
    """Admit nodes in the given order (older records first); reject a node whose name repeats,
    whose pod CIDR overlaps an admitted one or the WireGuard subnet, whose internal subnet
    overlaps the WireGuard subnet, whose internal address is taken, or one of whose allowed
    location IPs is unsafe (see `_location_ips_problem`).
    `claims`, `internal_ips` and `hosts` may carry what other clusters already hold. `subnet`:
    the WireGuard subnet, or one per family (MeshSettings.subnets); every address of a record is
    checked against each.

    Pod CIDRs are admitted first, location IPs after them: a location IP can never take a pod
    CIDR, whichever record is older."""
    claims = claims if claims is not None else Claims()
    internal_ips = internal_ips if internal_ips is not None else {}
    hosts = hosts if hosts is not None else {}
    subnets = _subnets(subnet)
    admitted, rejected = _admit_identities(nodes, subnets, claims, internal_ips, label)
    admitted = _without_covered_hosts(admitted, hosts, claims, internal_ips, rejected, label)
    add_hosts(hosts, (n for _, n in admitted))
    if not any(n.allowed_location_ips for _, n in admitted):
        return [n for _, n in admitted], rejected
    host_index = sorted((k >> ADDR_BITS, k & _ADDR_MASK, owner) for k, owner in hosts.items())
    out: list[Node] = []
    for i, n in admitted:
        problem = _location_ips_problem(n, f"{label}[{i}]", subnets, claims, host_index, allow_default_route)
        if problem is None:
            for a in n.allowed_location_ips:
                claims.add(a, f"{n.qualified_name}'s allowed location IP {a}")
            out.append(n)
            continue
        rejected.append(Rejection(n.qualified_name, problem))
        _release(n, claims, internal_ips)
    return out, rejected


_ADDR_MASK = (1 << ADDR_BITS) - 1


def _subnets(subnet: IPNetwork | Sequence[IPNetwork] | None) -> tuple[tuple[IPNetwork, Span], ...]:
    """The WireGuard subnets with their spans."""
    nets = () if subnet is None else (subnet,) if isinstance(subnet, IPNetwork) else tuple(subnet)
    return tuple((n, span(n)) for n in nets)


def _admit_identities(nodes: Sequence[Node], subnets: tuple[tuple[IPNetwork, Span], ...], claims: Claims,
                      internal_ips: dict[int, str], label: str) -> tuple[list[tuple[int, Node]], list[Rejection]]:
    """The first pass of `admit_nodes`: each node's name, pod CIDR, key and internal address,
    claimed in order; the admitted nodes come with their index in `nodes`."""
    names: set[str] = set()
    admitted: list[tuple[int, Node]] = []
    rejected: list[Rejection] = []
    ranges = key_ranges(s for s, _ in subnets)
    pods = _all_clear(nodes, subnets, ranges, claims, internal_ips)
    if pods is not None:
        claims.add_all(pods)
        claims.keys.update((n.public_key, f"node {n.qualified_name}") for n in nodes)
        claims.node_names.update(n.name for n in nodes if not n.cluster)
        for n in nodes:
            for k in n.internal_keys:
                internal_ips[k] = n.qualified_name
        return list(enumerate(nodes)), []
    for i, n in enumerate(nodes):
        problem = _identity_problem(n, f"{label}[{i}]", names, subnets, ranges, claims, internal_ips)
        if problem is not None:
            rejected.append(Rejection(n.qualified_name, problem))
            continue
        names.add(n.name)
        for sp in n.pod_spans:
            claims.add(sp, ("", n))
        claims.keys[n.public_key] = f"node {n.qualified_name}"
        if not n.cluster:
            claims.node_names.add(n.name)
        for k in n.internal_keys:
            internal_ips[k] = n.qualified_name
        admitted.append((i, n))
    return admitted, rejected


def _host_addresses(n: Node) -> list[tuple[int, str]]:
    """`n`'s internal addresses and literal endpoints as (addr_key, "internal address A" or
    "endpoint A")."""
    out = [(k, f"internal address {ip.ip}") for k, ip in zip(n.internal_keys, n.internal_ips, strict=True)]
    for e in n.endpoints:
        ip = e.ip
        if ip is not None:
            out.append((addr_key(ip.version, int(ip)), f"endpoint {ip}"))
    return out


def _without_covered_hosts(admitted: list[tuple[int, Node]], hosts: dict[int, str], claims: Claims,
                           internal_ips: dict[int, str], rejected: list[Rejection], label: str
                           ) -> list[tuple[int, Node]]:
    """The admitted nodes less those whose pod CIDRs would capture a node's own traffic: a pod
    CIDR is routed to its node on every node, so one that covers a node's internal address or
    endpoint (a private subnet, a public address) would divert that node's WireGuard and private
    traffic into the mesh. Older claims win as everywhere: a pod CIDR covering an address held
    before it (`hosts`: other clusters', or an older record's, or the node's own) rejects its
    record; an address inside an older record's admitted pod CIDR rejects the address's record."""
    addrs: list[tuple[int, int, str]] = []  # (addr_key, the record's order, what) sorted
    for order, (_, n) in enumerate(admitted):
        addrs.extend((k, order, what) for k, what in _host_addresses(n))
    names = [n.qualified_name for _, n in admitted]
    if not addrs and not hosts:
        return admitted
    addrs.sort()
    outside = sorted(hosts.items()) if hosts else []
    outside_keys = [k for k, _ in outside]
    keys = [a[0] for a in addrs]
    gone: dict[int, str] = {}  # order -> why
    for order, (i, n) in enumerate(admitted):
        if order in gone:
            continue
        problem = None
        later: list[tuple[int, str]] = []
        for c, (v, first, last) in zip(n.pod_cidrs, n.pod_spans, strict=True):
            lo, hi = addr_key(v, first), addr_key(v, last)
            field = f"{label}[{i}].{pod_cidr_field(n, admitted_index(n, c))}: {str(c)!r}"
            j = bisect.bisect_left(outside_keys, lo)
            if j < len(outside) and outside_keys[j] <= hi:
                problem = f"{field} covers {outside[j][1]} {_key_ip(outside_keys[j])}"
                break
            for k in range(bisect.bisect_left(keys, lo), bisect.bisect_right(keys, hi)):
                _, other, what = addrs[k]
                if other <= order:
                    whose = "its own" if other == order else f"{names[other]}'s"
                    problem = f"{field} covers {whose} {what}"
                    break
                later.append((other, f"its {what} is inside {n.qualified_name}'s pod CIDR {c}"))
            if problem:
                break
        if problem is not None:
            gone[order] = problem
            continue
        for other, why in later:
            gone.setdefault(other, why)
    if not gone:
        return admitted
    out = []
    for order, (i, n) in enumerate(admitted):
        if order in gone:
            why = gone[order]
            rejected.append(Rejection(n.qualified_name, why if why.startswith(label) else f"{label}[{i}]: {why}"))
            _release(n, claims, internal_ips)
        else:
            out.append((i, n))
    return out


def admitted_index(n: Node, c: IPNetwork) -> int:
    """The index of pod CIDR `c` among `n`'s."""
    return n.pod_cidrs.index(c)


def _key_ip(k: int) -> IPAddress:
    """The address an `addr_key` stands for."""
    return ipaddress.ip_address(k & _ADDR_MASK) if k >> ADDR_BITS == 4 else ipaddress.IPv6Address(k & _ADDR_MASK)


def _all_clear(nodes: Sequence[Node], subnets: tuple[tuple[IPNetwork, Span], ...], ranges: tuple[tuple[int, int], ...],
               claims: Claims, internal_ips: dict[int, str]) -> list[Held] | None:
    """The pod CIDR claims of `nodes` (sorted by start) when `_identity_problem` finds nothing for
    any of them admitted in turn, asked of all at once (sets and sorted spans instead of lookups
    per record: the 45,000 remote records of a cold pass are usually all clear); None when one
    of them may have a problem (the caller then judges them one by one)."""
    if len({n.name for n in nodes}) != len(nodes):
        return None
    keys = [n.public_key for n in nodes]
    base = claims._base
    if len(set(keys)) != len(keys) or not claims.keys.keys().isdisjoint(keys) or \
            (base is not None and not base.keys.keys().isdisjoint(keys)):
        return None
    internal = [k for n in nodes for k in n.internal_keys]
    if len(set(internal)) != len(internal) or not internal_ips.keys().isdisjoint(internal):
        return None
    held: list[Held] = sorted([(*sp, ("", n)) for n in nodes for sp in n.pod_spans], key=_SPAN)
    spans = [h[:3] for h in held]
    for a, b in zip(spans, spans[1:], strict=False):  # disjoint among themselves (a node's own CIDRs too)
        if a[0] == b[0] and b[1] <= a[2]:
            return None
    if any(f == 0 and la == _LAST[v] for v, f, la in spans) or claims.overlaps_any(spans):
        return None  # a default route is claimed apart (`Claims.add`)
    for _, (v, c, d) in subnets:
        k = bisect.bisect_right(spans, (v, d, _AFTER)) - 1
        if k >= 0 and spans[k][0] == v and spans[k][2] >= c:
            return None
    if any(_address_problem(n, "", subnets, ranges) is not None for n in nodes):
        return None
    return held


def _identity_problem(n: Node, where: str, names: set[str], subnets: tuple[tuple[IPNetwork, Span], ...],
                      ranges: tuple[tuple[int, int], ...], claims: Claims, internal_ips: dict[int, str]) -> str | None:
    """Why node `n` may not join with its name, pod CIDRs, key, internal addresses or endpoints,
    or None. Each address is judged on its own, in whichever family it is. `ranges`: the
    subnets' `key_ranges` (addresses are asked by integers: 45,000 remote records a pass)."""
    if n.name in names:
        return f"{where}.name: {n.name!r} is a duplicate node name"
    problem = _pod_cidrs_problem(n, where, subnets, claims)
    if problem is not None:
        return problem
    taken = claims.key_taken(n.public_key, where)
    if taken:
        return taken
    problem = _address_problem(n, where, subnets, ranges)
    if problem is not None:
        return problem
    for i, k in enumerate(n.internal_keys):
        held = internal_ips.get(k)
        if held is not None:
            return f"{where}.{list_field(n.internal_ips, 'internal_ip', i)}: {str(n.internal_ips[i])!r} is already " \
                   f"used by {held}"
    return None


def _address_problem(n: Node, where: str, subnets: tuple[tuple[IPNetwork, Span], ...],
                     ranges: tuple[tuple[int, int], ...]) -> str | None:
    """Why one of `n`'s internal subnets overlaps a WireGuard subnet, or one of its endpoints is
    an address of one (`ranges`: theirs as `key_ranges`), or None."""
    for i, (ip, k) in enumerate(zip(n.internal_ips, n.internal_keys, strict=True)):
        for (subnet, _), (lo, hi) in zip(subnets, ranges, strict=True):
            # Two prefixes overlap when one holds the other: the subnet holds the address, or the
            # private subnet is no longer than it and holds its first address.
            net = ip.network
            if lo <= k <= hi or (net.prefixlen <= subnet.prefixlen and subnet.network_address in net):
                # Its private subnet would hold WireGuard addresses: a peer's endpoint could become an
                # address of the tunnel itself, and private neighbours would be judged on tunnel addresses.
                return f"{where}.{list_field(n.internal_ips, 'internal_ip', i)}: {str(ip)!r} overlaps the " \
                       f"WireGuard subnet {subnet}"
    for i, ip in enumerate(n.internal_ips):
        kind = _not_a_host(ip.ip, link_local=False)
        if kind:
            return f"{where}.{list_field(n.internal_ips, 'internal_ip', i)}: {str(ip)!r} is {kind} address"
    for i, e in enumerate(n.endpoints):
        ep = e.ip
        if ep is None:
            continue
        kind = _not_a_host(ep, link_local=True)
        if kind:
            return f"{where}.{list_field(n.endpoints, 'endpoint', i)}: {str(e)!r} is {kind} address: no peer reaches it"
        k = addr_key(e.family, int(ep))
        for (subnet, _), (lo, hi) in zip(subnets, ranges, strict=True):
            if lo <= k <= hi:
                return f"{where}.{list_field(n.endpoints, 'endpoint', i)}: {str(e)!r} is an address of the " \
                       f"WireGuard subnet {subnet}"
    return None


def _not_a_host(ip: IPAddress, *, link_local: bool) -> str:
    """What kind of address `ip` is when it cannot be a node's address on the mesh ("a loopback",
    "an unspecified", "a multicast", with `link_local` "a link-local"), else ""."""
    if ip.is_loopback:
        return "a loopback"
    if ip.is_unspecified:
        return "an unspecified"
    if ip.is_multicast:
        return "a multicast"
    if link_local and ip.is_link_local:
        return "a link-local"
    return ""


def list_field(items: Sequence[object], one: str, i: int) -> str:
    """The record field that holds the i-th of a list field (`one` for the one-element form:
    `internal_ip`, else `internal_ips[1]`)."""
    return one if len(items) == 1 else f"{one}s[{i}]"


def pod_cidr_field(n: Node, i: int) -> str:
    """The record field that holds `n`'s i-th pod CIDR (`pod_cidr` for the one-element form)."""
    return list_field(n.pod_cidrs, "pod_cidr", i)


def _pod_cidrs_problem(n: Node, where: str, subnets: tuple[tuple[IPNetwork, Span], ...], claims: Claims
                       ) -> str | None:
    """Why one of `n`'s pod CIDRs may not be claimed: it overlaps a WireGuard subnet, another
    of its own CIDRs (two blocks of one node would make one route the other's), or a claim."""
    spans = n.pod_spans
    for i, (c, sp) in enumerate(zip(n.pod_cidrs, spans, strict=True)):
        # The field's name is formatted only for a problem (50,000 records have none).
        for subnet, subnet_span in subnets:
            if _overlap(sp, subnet_span):
                return f"{where}.{pod_cidr_field(n, i)}: {str(c)!r} overlaps the WireGuard subnet {subnet}"
        for j in range(i):
            if _overlap(sp, spans[j]):
                return f"{where}.{pod_cidr_field(n, i)}: {str(c)!r} overlaps the node's own pod CIDR {n.pod_cidrs[j]}"
        owner = claims.conflict(sp)
        if owner is not None:
            return f"{where}.{pod_cidr_field(n, i)}: {str(c)!r} overlaps {owner}"
    return None


def _release(n: Node, claims: Claims, internal_ips: dict[int, str]) -> None:
    """Everything a record rejected after its first pass claimed is free again: its pod CIDR,
    its key, its name and its internal address."""
    for sp in n.pod_spans:
        claims.remove(sp)
    if claims.keys.get(n.public_key) == f"node {n.qualified_name}":
        del claims.keys[n.public_key]
    if not n.cluster:
        claims.node_names.discard(n.name)
    for k in n.internal_keys:
        if internal_ips.get(k) == n.qualified_name:
            del internal_ips[k]


def add_hosts(hosts: dict[int, str], nodes: Iterable[Node]) -> None:
    """Record the addresses no location IP may cover (by `addr_key`): nodes' internal addresses
    and endpoints."""
    for n in nodes:
        for k in n.internal_keys:
            if k not in hosts:
                hosts[k] = f"{n.qualified_name}'s internal address"
        for e in n.endpoints:
            ip = e.ip
            if ip is not None:
                k = addr_key(ip.version, int(ip))
                if k not in hosts:
                    hosts[k] = f"{n.qualified_name}'s endpoint"


def _location_ips_problem(n: Node, where: str, subnets: tuple[tuple[IPNetwork, Span], ...],
                          claims: Claims, hosts: list[tuple[int, int, str]], allow_default_route: bool) -> str | None:
    """Why one of `n`'s allowed location IPs may not route, or None. A location IP is routed to
    `n`'s tunnel on every node, so it may not cover any pod CIDR, the WireGuard subnet, any node's
    internal address or endpoint, another location IP or an extra peer's IPs; a default route only
    with `mesh.allow_default_route` (then it only has to be the one default route)."""
    mine: list[Span] = []
    for j, a in enumerate(n.allowed_location_ips):
        field = f"{where}.allowed_location_ips[{j}]: {str(a)!r}"
        sp = span(a)
        if a.prefixlen == 0:
            if not allow_default_route:
                return f"{field} is a default route (allowed only with mesh.allow_default_route: true)"
            owner = claims.default_route(a.version)
            if owner is not None:
                return f"{field} overlaps {owner}"
            mine.append(sp)
            continue
        for subnet, subnet_span in subnets:
            if _overlap(sp, subnet_span):
                return f"{field} overlaps the WireGuard subnet {subnet}"
        owner = claims.conflict(sp)
        if owner is not None:
            return f"{field} overlaps {owner}"
        k = bisect.bisect_left(hosts, (sp[0], sp[1], ""))
        if k < len(hosts) and hosts[k][0] == sp[0] and hosts[k][1] <= sp[2]:
            return f"{field} covers {hosts[k][2]} {ipaddress.ip_address(hosts[k][1])}"
        if any(_overlap(sp, m) for m in mine):
            return f"{field} overlaps another of its own location IPs"
        mine.append(sp)
    return None


def admit_peers(peers: Sequence[Peer], claims: Claims, label: str = "peers",
                subnet: IPNetwork | Sequence[IPNetwork] | None = None) -> tuple[list[Peer], list[Rejection]]:
    """Reject extra peers whose names repeat or are a node's, whose key is a node's or another
    peer's, whose allowed IPs overlap a pod CIDR or an earlier peer's (WireGuard would route
    the shared addresses to only one of them), or whose endpoint is an address of the WireGuard
    `subnet` (the tunnel itself). Admitted peers' addresses and keys join `claims`."""
    names: set[str] = set()
    admitted: list[Peer] = []
    rejected: list[Rejection] = []
    subnets = _subnets(subnet)
    for i, p in enumerate(peers):
        ep = p.endpoint.ip if p.endpoint is not None else None
        inside = next((s for s, _ in subnets if ep is not None and ep.version == s.version and ep in s), None)
        if inside is not None:
            rejected.append(Rejection(p.name, f"{label}[{i}].endpoint: {str(p.endpoint)!r} is an address of the "
                                      f"WireGuard subnet {inside}"))
            continue
        if p.name in names:
            rejected.append(Rejection(p.name, f"{label}[{i}].name: {p.name!r} is a duplicate peer name"))
            continue
        if p.name in claims.node_names:
            rejected.append(Rejection(p.name, f"{label}[{i}].name: {p.name!r} is the name of a node"))
            continue
        taken = claims.key_taken(p.public_key, f"{label}[{i}]")
        if taken:
            rejected.append(Rejection(p.name, taken))
            continue
        bad = None
        for j, a in enumerate(p.allowed_ips):
            owner = claims.conflict(a)
            if owner is not None:
                bad = Rejection(p.name, f"{label}[{i}].allowed_ips[{j}]: {str(a)!r} overlaps {owner}")
                break
        if bad:
            rejected.append(bad)
            continue
        names.add(p.name)
        claims.add_peer(p, "peer")
        admitted.append(p)
    return admitted, rejected


def admit_local(topo: Topology) -> tuple[Topology, list[Rejection]]:
    """One cluster's records as its store holds them (nodes older first, then peers) to the
    topology a plan may use, and the rejections: what every agent and `meshctl plan --backend`
    decide alike."""
    claims = Claims()
    candidates, rejected = list(topo.nodes), []
    if topo.mesh.global_cidrs:
        problems = [global_ranges.node_problem(n, f"nodes[{i}]", topo.mesh) for i, n in enumerate(topo.nodes)]
        rejected = [Rejection(n.name, p) for n, p in zip(topo.nodes, problems, strict=True) if p is not None]
        candidates = [n for n, p in zip(topo.nodes, problems, strict=True) if p is None]
    nodes, rejected_nodes = admit_nodes(candidates, topo.mesh.subnets, claims=claims,
                                        allow_default_route=topo.mesh.allow_default_route)
    rejected += rejected_nodes
    peers, rejected_peers = admit_peers(topo.peers, claims, subnet=topo.mesh.subnets)
    return replace(topo, nodes=tuple(nodes), peers=tuple(peers)), [*rejected, *rejected_peers]


def as_remote(topo: Topology) -> Topology:
    """The topology with every node marked as belonging to its cluster (`cluster2/g1`); nodes
    already marked (a remote watcher parses them so) are kept as they are."""
    name = topo.cluster.name
    nodes = topo.nodes if all(n.cluster == name for n in topo.nodes) else \
        tuple(n if n.cluster == name else replace(n, cluster=name) for n in topo.nodes)
    return replace(topo, nodes=nodes, peers=())


def admit_remotes(local: Topology, remotes: Sequence[Topology]) -> tuple[list[Remote], list[Rejection]]:
    """Remote clusters with the records that are safe to install here, and the rejections.

    A whole cluster is refused when its name or id collides with the local one or another
    remote's (`identity_refusals`). A record is rejected when its pod CIDR overlaps a local pod CIDR, the local
    WireGuard subnet or another cluster's records; when its segment's WireGuard address overlaps
    them; when it overlaps a local peer's allowed IPs; when its public key is already a local node's,
    a local peer's or an earlier record's; when its internal address is a local node's; or when one
    of its allowed location IPs covers any of these, a node's address, or is a default route the
    local mesh does not allow. Sharing a private subnet is fine."""
    claims, internal, hosts = _local_claims(local)
    refused = cluster_refusals(local, remotes)
    out: list[Remote] = []
    rejected: list[Rejection] = []
    for remote in sorted(remotes, key=lambda t: t.cluster.name):
        cname = remote.cluster.name
        if cname in refused:
            rejected.append(Rejection(cname, refused[cname]))
            continue
        admitted, rej = _admit_cluster(as_remote(remote), claims, internal, hosts, local.mesh)
        rejected += rej
        out.append(admitted)
    return out, rejected


IDENTITY_DOC = "docs/clustermesh.md, 'Changing a cluster's name or id'"


def cluster_refusals(local: Topology, remotes: Sequence[Topology]) -> dict[str, str]:
    """Remote cluster name -> why the whole cluster is refused: its identity (`identity_refusals`),
    else its global ranges or pod ranges that overlap without them (global_ranges.refusals)."""
    refused = global_ranges.refusals(local, remotes)
    refused.update(identity_refusals(local.cluster, [r.cluster for r in remotes]))
    return refused


def identity_refusals(local: Cluster, remotes: Sequence[Cluster]) -> dict[str, str]:
    """Remote cluster name -> why the whole cluster is refused, for identities that collide.

    A remote that claims the local cluster's name or id is refused. Two (or more) remotes that
    claim one id, or one name, are all refused, each line naming every claimant: admitting the
    first in some order would route one cluster's pods by whichever happened to sort first, and
    the other cluster's operators would see nothing wrong. Nothing is remembered: once the
    claims differ again, the next call admits them (no restart)."""
    by_id: dict[int, list[str]] = {}
    by_name: dict[str, list[Cluster]] = {}
    for c in remotes:
        by_id.setdefault(c.id, []).append(c.name)
        by_name.setdefault(c.name, []).append(c)
    out: dict[str, str] = {}
    for c in remotes:
        if c.name == local.name:
            out[c.name] = f"cluster.name: {c.name!r} is the local cluster's name"
        elif c.id == local.id:
            out[c.name] = f"cluster.id: {c.id} is already used by cluster {local.name}"
        elif len(by_name[c.name]) > 1:
            ids = ", ".join(str(x.id) for x in by_name[c.name])
            out[c.name] = (f"cluster.name: {c.name!r} is claimed by {len(by_name[c.name])} clusters (ids {ids}): "
                           f"none is admitted until one is renamed ({IDENTITY_DOC})")
        elif len(by_id[c.id]) > 1:
            names = ", ".join(sorted(by_id[c.id])[:-1]) + " and " + sorted(by_id[c.id])[-1]
            out[c.name] = (f"cluster.id: {c.id} is claimed by {names}: none is admitted until one "
                           f"changes its id ({IDENTITY_DOC})")
    return out


def _local_claims(local: Topology) -> tuple[Claims, dict[int, str], dict[int, str]]:
    """What the local cluster holds, that no remote record may take: its nodes' pod CIDRs, keys,
    internal addresses, location IPs and endpoints, its peers' allowed IPs and keys, and its
    WireGuard subnet (claims, internal addresses, host addresses)."""
    claims = Claims()
    internal: dict[int, str] = {}
    hosts: dict[int, str] = {}
    for n in local.nodes:
        for sp in n.pod_spans:
            claims.add(sp, ("local node ", n))
        claims.keys[n.public_key] = f"local node {n.name}"
        for k in n.internal_keys:
            internal[k] = f"local node {n.name}"
        for a in n.allowed_location_ips:
            claims.add(a, f"local node {n.name}'s allowed location IP {a}")
    add_hosts(hosts, local.nodes)
    for p in local.peers:
        # A remote node routed over addresses a local peer holds would take that peer's traffic.
        claims.add_peer(p, "local peer")
    for subnet in local.mesh.subnets:
        claims.add(subnet, f"the local WireGuard subnet {subnet}")
    for pod, glob in local.mesh.global_cidrs:  # a remote pod there would be taken for a local one
        if claims.conflict(glob) is None:
            claims.add(glob, f"the local global range {glob} of {pod}")
    return claims, internal, hosts


class _SegmentProblems(NamedTuple):
    """What `_remote_problem` asks about a segment's WireGuard addresses, asked once per segment
    (the answer is the same for every member: nothing is claimed while the members are judged).
    `held`: an address that is an internal address (address, holder); `overlap`: one that
    overlaps a claim (address, owner)."""

    held: tuple[IPAddress, str] | None
    overlap: tuple[IPAddress, str] | None


def _segment_problems(wgs: Sequence[IPInterface], claims: Claims, internal: dict[int, str]) -> _SegmentProblems:
    held = overlap = None
    for a in wgs:
        h = internal.get(addr_key(a.version, int(a)))
        if h is not None:
            held = (a.ip, h)
            break
    for a in wgs:
        owner = claims.conflict(host_net(a))
        if owner is not None:
            overlap = (a.ip, owner)
            break
    return _SegmentProblems(held, overlap)


def _remote_problem(n: Node, label: str, seg: _SegmentProblems, local: MeshSettings,
                    local_subnets: tuple[tuple[int, int], ...]) -> str | None:
    """Why remote node n may not join before `admit_nodes` judges it: one of its segment's
    WireGuard addresses is an internal address or overlaps a claim (`seg`), or one of its internal
    addresses is an address of a local WireGuard subnet (`local_subnets`: their `key_ranges`,
    asked first by integers)."""
    if seg.held is not None:
        return f"{label}.{n.name}.wireguard_ip: {str(seg.held[0])!r} is the internal address of {seg.held[1]}"
    if any(lo <= k <= hi for k in n.internal_keys for lo, hi in local_subnets):
        problem = _local_subnet_problem(n, label, local)
        if problem is not None:
            return problem
    if seg.overlap is not None:
        return f"{label}.{n.name}.wireguard_ip: {str(seg.overlap[0])!r} overlaps {seg.overlap[1]}"
    return None


def _local_subnet_problem(n: Node, label: str, local: MeshSettings) -> str | None:
    """The line naming n's internal address that is an address of a local WireGuard subnet."""
    for i, ip in enumerate(n.internal_ips):
        # An interface is an address: `in` tests it without building `.ip`.
        subnet = next((s for s in local.subnets if ip.version == s.version and ip in s), None)
        if subnet is not None:
            return f"{label}.{n.name}.{list_field(n.internal_ips, 'internal_ip', i)}: {str(ip)!r} is an address " \
                   f"of the local WireGuard subnet {subnet}"
    return None


def _admit_cluster(remote: Topology, claims: Claims, internal: dict[int, str], hosts: dict[int, str],
                   local: MeshSettings) -> tuple[Remote, list[Rejection]]:
    """One remote cluster (its nodes marked as its own) against everything admitted so far: a
    record whose segment's WireGuard address is taken or is an internal address, or whose
    internal address is one of the `local` WireGuard subnet, is rejected first; the rest go
    through `admit_nodes`; the admitted records' segment addresses join `claims` (once per
    segment: the second member's claim of the same address would conflict with the first's)."""
    cname = remote.cluster.name
    label = f"{cname}.nodes"
    remote, outside = global_ranges.as_global(remote, label)
    segs = tuple(segments(remote))
    seg_of = {m.name: i for i, s in enumerate(segs) for m in s.members}
    problems = [_segment_problems(s.addresses, claims, internal) for s in segs]
    local_subnets = key_ranges(local.subnets)
    rejected = [Rejection(name, why) for name, why in outside]
    candidates = []
    for n in remote.nodes:
        problem = _remote_problem(n, label, problems[seg_of[n.name]], local, local_subnets)
        if problem is not None:
            rejected.append(Rejection(n.qualified_name, problem))
            continue
        candidates.append(n)
    admitted, rej = admit_nodes(candidates, remote.mesh.subnets, claims=claims, internal_ips=internal,
                                hosts=hosts, allow_default_route=local.allow_default_route, label=label)
    claimed: set[int] = set()
    for n in admitted:
        i = seg_of[n.name]
        if i in claimed:
            continue
        claimed.add(i)
        for a in segs[i].addresses:
            wg = host_net(a)
            if claims.conflict(wg) is None:
                claims.add(wg, f"cluster {cname}'s WireGuard address {wg.network_address}")
    return Remote(remote, frozenset(n.name for n in admitted), segs), [*rejected, *rej]
