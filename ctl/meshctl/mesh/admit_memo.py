# SPDX-License-Identifier: Apache-2.0
"""`admit_remotes`, memoised per remote cluster: on a pass after one remote record changed, only
the cluster that holds it is admitted again (and any later cluster its change could affect), not
all 50,000 records of ten clusters.

Why the result stays exactly `admit_remotes`'s: clusters are admitted in name order, each against
what the local cluster and the clusters before it hold (mesh.admit). Here each cluster keeps what
it holds in a layer of its own (its `Claims`, admitted over a `base` index of the layers before
it, and its internal and host addresses), so admitting one cluster again needs no other
cluster's work. A cluster whose records did not change gives the same result as long as no
question it asks of the earlier layers gets another answer; every such question is about one of
its own addresses or keys (its `Reach`). So an unchanged cluster is reused unless something an
earlier layer holds changed (`Delta`: what a layer held before and not now, or now and not
before) at an address or key within its reach. The local cluster is the first layer: a local
change re-admits only the clusters it touches.
"""

from __future__ import annotations

import bisect
import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from meshctl.mesh.admit import Claims, Rejection, _admit_cluster, _local_claims, as_remote, cluster_refusals
from meshctl.mesh.model import Cluster, IPAddress, MeshSettings, Node, Topology, addr_key, span
from meshctl.mesh.segments import Remote

_at = addr_key


def _point(a: IPAddress) -> tuple[int, int]:
    x = _at(a.version, int(a))
    return x, x


@dataclass(frozen=True)
class Layer:
    """What one cluster (or the local one) holds: its claims, internal addresses and host
    addresses (node addresses no location IP may cover)."""

    claims: Claims
    internal: dict[Any, str]
    hosts: dict[Any, str]

    @functools.cached_property
    def held(self) -> tuple[frozenset[tuple[object, ...]], frozenset[tuple[Any, str]], frozenset[tuple[Any, str]]]:
        """Its content as values (computed once: a layer never changes once built)."""
        return self.claims.held(), frozenset(self.internal.items()), frozenset(self.hosts.items())


@dataclass
class Delta:
    """Addresses (as integer ranges) and keys at which some earlier layer changed."""

    ranges: list[tuple[int, int]] = field(default_factory=list)
    keys: set[str] = field(default_factory=set)
    everything: bool = False

    def add(self, old: Layer | None, new: Layer | None) -> None:
        """What differs between `old` and `new` (None: a layer that is not there)."""
        if self.everything:
            return
        empty: frozenset[Any] = frozenset()
        a = old.held if old is not None else (empty, empty, empty)
        b = new.held if new is not None else (empty, empty, empty)
        for item in a[0] ^ b[0]:
            if item[0] == "key":
                self.keys.add(str(item[1]))
            elif item[0] == "default":
                self.everything = True
            else:
                v, f, la = item[0], item[1], item[2]
                assert isinstance(v, int) and isinstance(f, int) and isinstance(la, int)
                self.ranges.append((_at(v, f), _at(v, la)))
        self.ranges.extend((k, k) for k, _ in itertools.chain(a[1] ^ b[1], a[2] ^ b[2]))

    def __bool__(self) -> bool:
        return self.everything or bool(self.ranges) or bool(self.keys)

    def touches(self, admitted: _Admitted) -> bool:
        """Whether anything here lies within the reach of `admitted`'s records."""
        if not self:
            return False
        reach = admitted.reach
        if self.everything or not self.keys.isdisjoint(reach.keys):
            return True
        for lo, hi in self.ranges:
            i = bisect.bisect_right(reach.starts, hi)
            if i and reach.max_end[i - 1] >= lo:
                return True
        return False


@dataclass(frozen=True)
class Reach:
    """Every address and key a cluster's admission asks about or adds: its records' pod CIDRs,
    location IPs, internal addresses, endpoints, keys and their segments' WireGuard addresses.
    Ranges sorted by start, with the greatest end so far (any overlap found in O(log n))."""

    starts: list[int]
    max_end: list[int]
    keys: frozenset[str]

    @classmethod
    def of(cls, remote: Remote) -> Reach:
        ranges: list[tuple[int, int]] = []
        for s in remote.segments:
            wg = _point(s.wireguard_ip.ip)
            for m in s.members:
                ranges.append(wg)
                ranges.extend((_at(v, f), _at(v, la)) for v, f, la in m.pod_spans)
                ranges.extend((_at(v, f), _at(v, la)) for v, f, la in map(span, m.allowed_location_ips))
                if m.internal_ip is not None:
                    ranges.append(_point(m.internal_ip.ip))
                if m.endpoint is not None and m.endpoint.ip is not None:
                    ranges.append(_point(m.endpoint.ip))
        ranges.sort()
        return cls([lo for lo, _ in ranges], list(itertools.accumulate((hi for _, hi in ranges), max)),
                   frozenset(n.public_key for n in remote.topology.nodes))


@dataclass(frozen=True)
class _Admitted:
    """One remote cluster's admission and what it was computed from."""

    cluster: Cluster
    mesh: MeshSettings
    nodes: tuple[Node, ...]
    remote: Remote
    rejections: list[Rejection]
    layer: Layer
    leaders: tuple[tuple[str, tuple[str, ...]], ...] = ()  # Topology.leaders it was admitted with

    @functools.cached_property
    def reach(self) -> Reach:
        """Computed when a change first has to be checked against it."""
        return Reach.of(self.remote)


def same_items(a: Sequence[object], b: Sequence[object]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class RemoteAdmission:
    """`admit_remotes(local, remotes)` with the last result of each cluster kept: call `admit`
    on every pass with the current views. `readmitted` names the clusters the last call admitted
    anew (the others were reused)."""

    def __init__(self) -> None:
        self._local: Topology | None = None
        self._base: Layer | None = None
        self._done: dict[str, _Admitted] = {}
        self.readmitted: list[str] = []

    def admit(self, local: Topology, remotes: Sequence[Topology]) -> tuple[list[Remote], list[Rejection]]:
        delta = self._local_delta(local)
        assert self._base is not None
        refused = cluster_refusals(local, remotes)
        ordered = sorted(remotes, key=lambda t: t.cluster.name)
        current = {r.cluster.name: r for r in ordered if r.cluster.name not in refused}
        below = _Below(self._base)
        done: dict[str, _Admitted] = {}
        self.readmitted = []
        names = sorted(current.keys() | self._done.keys())
        # Changes matter only while a later cluster may still be reused (none on a first pass).
        last_kept = max((i for i, n in enumerate(names) if n in self._done and n in current), default=-1)
        for i, name in enumerate(names):
            if i > last_kept:
                delta.everything = True  # nothing after this is reused: skip working out what changed
            old, topo = self._done.get(name), current.get(name)
            if topo is None:  # gone or refused now: what it held is free
                delta.add(old.layer if old is not None else None, None)
                continue
            if old is not None and old.cluster == topo.cluster and old.mesh == topo.mesh \
                    and old.leaders == topo.leaders and same_items(old.nodes, topo.nodes) and not delta.touches(old):
                done[name] = old
                below.pending.append(old.layer)
                continue
            new = below.admit(local, topo, old)
            delta.add(old.layer if old is not None else None, new.layer)
            done[name] = new
            self.readmitted.append(name)
        self._done = done
        out: list[Remote] = []
        rejected: list[Rejection] = []
        for r in ordered:
            name = r.cluster.name
            if name in refused:
                rejected.append(Rejection(name, refused[name]))
            else:
                out.append(done[name].remote)
                rejected += done[name].rejections
        return out, rejected

    def _local_delta(self, local: Topology) -> Delta:
        """What changed in the local layer since the last call (everything, when the mesh
        settings a remote is judged by changed: every remote is admitted anew)."""
        delta = Delta()
        if local is self._local:
            return delta
        claims, internal, hosts = _local_claims(local)
        base = Layer(claims, dict(internal), dict(hosts))
        if self._local is None or self._base is None or self._local.mesh != local.mesh:
            self._done = {}
        else:
            delta.add(self._base, base)
        self._local, self._base = local, base
        return delta



class _Recorded(dict[Any, str]):
    """A dict of every layer's addresses so far that also records, in `own`, what the cluster
    being admitted adds (admission only adds addresses no layer holds, and removes only its own)."""

    own: dict[Any, str]

    def __setitem__(self, k: Any, v: str) -> None:
        self.own[k] = v
        super().__setitem__(k, v)

    def __delitem__(self, k: Any) -> None:
        del self.own[k]
        super().__delitem__(k)

    def setdefault(self, k: Any, v: str | None = None) -> str:
        if k not in self:
            assert v is not None
            self[k] = v
            return v
        return self[k]


class _Below:
    """Everything the layers before the next cluster hold, merged only when a cluster is admitted
    (a pass that re-admits one cluster merges once; reused layers wait in `pending`)."""

    def __init__(self, base: Layer) -> None:
        self.claims = base.claims
        self.internal = _Recorded(base.internal)
        self.hosts = _Recorded(base.hosts)
        self.pending: list[Layer] = []

    def admit(self, local: Topology, topo: Topology, old: _Admitted | None) -> _Admitted:
        """Admit `topo` over what the layers so far hold; its layer then joins them."""
        if self.pending:
            self.claims = Claims.stacked([self.claims, *(x.claims for x in self.pending)])
            for x in self.pending:
                dict.update(self.internal, x.internal)
                dict.update(self.hosts, x.hosts)
            self.pending = []
        claims = Claims(base=self.claims)
        self.internal.own, self.hosts.own = {}, {}
        remote, rejections = _admit_cluster(as_remote(topo), claims, self.internal, self.hosts, local.mesh)
        layer = Layer(claims.alone(), self.internal.own, self.hosts.own)
        self.pending.append(Layer(layer.claims, {}, {}))  # its addresses are in the dicts already
        new = _Admitted(topo.cluster, topo.mesh, topo.nodes, remote, rejections, layer, topo.leaders)
        if old is not None and "reach" in old.__dict__ and same_items(old.nodes, topo.nodes):
            new.__dict__["reach"] = old.reach  # the same records reach the same addresses
        return new
