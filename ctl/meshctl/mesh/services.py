# SPDX-License-Identifier: Apache-2.0
"""Global services, the pure part: which Services a cluster publishes, what it publishes (the
ready endpoints of its own EndpointSlices), how a reader admits another cluster's records, and
the EndpointSlices a cluster should hold for the other clusters' endpoints (docs/clustermesh.md,
"Global services").

A Service is global when annotated `service.cilium.io/global: "true"` (Cilium's key, so its users
recognise it; `meshctl.io/global` is an alias): its own name then balances over every cluster's
endpoints. An MCS `ServiceExport` does not make it global: exported Services get a ServiceImport and
a `clusterset.local` name, and the Service's own name stays the cluster's (mesh.mcs, KEP-1645).
`service.cilium.io/shared: "false"` keeps the cluster's own endpoints to
itself (it still receives the others'); `service.cilium.io/affinity: local|remote|none` puts
zone hints on the slices meshctl writes (see `desired_slices`).

A published record is admitted like a node record: the cluster it names must be the cluster whose
etcd it came from and whose key prefix it sits under (a cluster cannot publish for another), and
every endpoint address must lie in a pod CIDR that cluster's ADMITTED nodes hold; a cluster with
global ranges (mesh.global_cidrs) publishes its pods' own addresses and every reader serves their
global images, as its nodes' pod CIDRs are admitted (docs/clustermesh.md); a bad endpoint
is rejected alone (the rest of its record stands), a malformed record alone (the other records
stand), each named. Nothing here does I/O: the callers read Kubernetes and etcd.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

from meshctl.errors import InputError
from meshctl.mesh import fields
from meshctl.mesh.admit import Rejection
from meshctl.mesh.global_ranges import Pair, dial_address
from meshctl.mesh.model import IPAddress, Node

GLOBAL = "service.cilium.io/global"
GLOBAL_ALIAS = "meshctl.io/global"
SHARED = "service.cilium.io/shared"
AFFINITY = "service.cilium.io/affinity"
AFFINITIES = ("local", "remote", "none")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
MANAGED_BY = "meshctl.io"
# The managed-by value of the Multi-Cluster Services controller's slices and derived Services
# (mesh.mcs): another writer than the agents', so neither ever changes the other's.
MCS_MANAGED_BY = "mcs.meshctl.io"
SOURCE_CLUSTER_LABEL = "meshctl.io/source-cluster"
# The biggest service record a reader parses (a record of 1,000 endpoints is about 60 KB).
MAX_SERVICE_RECORD_BYTES = 256 * 1024
# Endpoints per EndpointSlice meshctl writes (the EndpointSlice controller's default is 100; the
# API allows 1,000).
SLICE_ENDPOINTS = 100
PROTOCOLS = ("TCP", "UDP", "SCTP")

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class ServiceSettings:
    """What a Service's annotations make of it."""

    global_: bool
    shared: bool = True
    affinity: str = "none"


@dataclass(frozen=True, order=True)
class ServicePort:
    name: str
    port: int
    protocol: str = "TCP"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "port": self.port, "protocol": self.protocol}


@dataclass(frozen=True, order=True)
class ServiceEndpoint:
    """One ready endpoint; `hostname` (the EndpointSlice's, a StatefulSet pod's name) is carried
    by Multi-Cluster Services exports only (mesh.mcs: per-pod clusterset.local names)."""

    address: IPAddress
    zone: str = ""
    hostname: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"addresses": [str(self.address)], **({"zone": self.zone} if self.zone else {}),
                **({"hostname": self.hostname} if self.hostname else {})}


@dataclass(frozen=True)
class GlobalService:
    """One cluster's published endpoints of one Service."""

    cluster: str
    namespace: str
    name: str
    ports: tuple[ServicePort, ...]
    endpoints: tuple[ServiceEndpoint, ...]

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def to_record(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "namespace": self.namespace, "name": self.name,
                "ports": [p.to_json() for p in self.ports], "endpoints": [e.to_json() for e in self.endpoints]}


def _meta(obj: Obj) -> Obj:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def ref_of(obj: Obj) -> tuple[str, str]:
    m = _meta(obj)
    return str(m.get("namespace") or "default"), str(m.get("name") or "")


def service_settings(svc: Obj) -> ServiceSettings:
    """A Service's settings; InputError naming the annotation and its value when one is neither
    `true` nor `false` (or, for affinity, none of local|remote|none)."""
    ns, name = ref_of(svc)
    ann = _meta(svc).get("annotations") or {}
    where = f"service {ns}/{name}: annotations"
    is_global = False
    for key in (GLOBAL, GLOBAL_ALIAS):
        if key in ann:
            if str(ann[key]).lower() not in ("true", "false"):
                raise InputError(f"{where}.{key}", ann[key], "is not true or false")
            is_global = is_global or str(ann[key]).lower() == "true"
    shared = True
    if SHARED in ann:
        if str(ann[SHARED]).lower() not in ("true", "false"):
            raise InputError(f"{where}.{SHARED}", ann[SHARED], "is not true or false")
        shared = str(ann[SHARED]).lower() == "true"
    affinity = str(ann.get(AFFINITY, "none")).lower()
    if affinity not in AFFINITIES:
        raise InputError(f"{where}.{AFFINITY}", ann.get(AFFINITY), f"is not one of {'|'.join(AFFINITIES)}")
    return ServiceSettings(is_global, shared, affinity)


def written_by_meshctl(obj: Obj) -> bool:
    """A slice of meshctl's, the agent's or the Multi-Cluster Services controller's (mesh.mcs):
    never published again as a cluster's own endpoints."""
    return (_meta(obj).get("labels") or {}).get(MANAGED_BY_LABEL) in (MANAGED_BY, MCS_MANAGED_BY)


def _ready(ep: Obj) -> bool:
    """Ready as Kubernetes means it: `conditions.ready` unset counts as ready."""
    cond = ep.get("conditions") or {}
    return cond.get("ready") is not False


def local_endpoints(cluster: str, ns: str, name: str, slices: Iterable[Obj], *, hostnames: bool = False
                    ) -> GlobalService:
    """The READY endpoints and ports of a Service's own slices (those of the EndpointSlice
    controller, never meshctl's, so a cluster never republishes what it imported); with
    `hostnames`, each endpoint's hostname as the slice gives it."""
    ports: set[ServicePort] = set()
    eps: set[ServiceEndpoint] = set()
    for s in slices:
        labels = _meta(s).get("labels") or {}
        if written_by_meshctl(s) or ref_of(s)[0] != ns or labels.get(SERVICE_NAME_LABEL) != name:
            continue
        for p in s.get("ports") or ():
            if isinstance(p.get("port"), int):
                ports.add(ServicePort(str(p.get("name") or ""), p["port"], str(p.get("protocol") or "TCP")))
        for ep in s.get("endpoints") or ():
            if not _ready(ep):
                continue
            host = str(ep.get("hostname") or "") if hostnames else ""
            for a in ep.get("addresses") or ():
                try:
                    eps.add(ServiceEndpoint(ipaddress.ip_address(a), str(ep.get("zone") or ""), host))
                except ValueError:
                    continue  # not ours to judge: the controller wrote it; only addresses are published
    return GlobalService(cluster, ns, name, tuple(sorted(ports)), tuple(sorted(eps)))


@dataclass(frozen=True)
class LocalServices:
    """The local cluster's global Services: their settings by (namespace, name), the records it
    publishes, and what was refused (bad annotations)."""

    settings: Mapping[tuple[str, str], ServiceSettings]
    published: Mapping[tuple[str, str], GlobalService]
    rejections: tuple[Rejection, ...]
    zones: tuple[str, ...]


def local_services(cluster: str, services: Sequence[Obj], slices: Sequence[Obj]) -> LocalServices:
    """What this cluster publishes: every global Service that is shared, with its ready endpoints.
    A Service with a bad annotation is rejected alone and named."""
    rejections: list[Rejection] = []
    settings: dict[tuple[str, str], ServiceSettings] = {}
    published: dict[tuple[str, str], GlobalService] = {}
    for svc in services:
        ref = ref_of(svc)
        try:
            st = service_settings(svc)
        except InputError as e:
            rejections.append(Rejection(f"service/{ref[0]}/{ref[1]}", str(e)))
            continue
        if not st.global_:
            continue
        settings[ref] = st
        if st.shared:
            published[ref] = local_endpoints(cluster, ref[0], ref[1], slices)
    zones = sorted({str(ep.get("zone")) for s in slices if not written_by_meshctl(s)
                    for ep in s.get("endpoints") or () if ep.get("zone")})
    return LocalServices(settings, published, tuple(rejections), tuple(zones))


# --- a reader's admission ---------------------------------------------------------------------


def record_names(doc: Any, path: str, key_cluster: str, key_ns: str, key_name: str) -> Mapping[str, Any]:
    """A published record's mapping, once its cluster, namespace and name are its key's."""
    d = fields.mapping(doc, path)
    for f, want in (("cluster", key_cluster), ("namespace", key_ns), ("name", key_name)):
        if d.get(f) != want:
            raise InputError(f"{path}.{f}", d.get(f), f"is not its key's {want!r}")
    return d


def parse_ports(items: Any, path: str) -> tuple[ServicePort, ...]:
    """A record's `ports` list: each a name, a port and one of PROTOCOLS (TCP when absent)."""
    ports = []
    for i, p in enumerate(items or ()):
        p = fields.mapping(p, f"{path}[{i}]")
        proto = p.get("protocol", "TCP")
        if proto not in PROTOCOLS:
            raise InputError(f"{path}[{i}].protocol", proto, f"is not one of {', '.join(PROTOCOLS)}")
        ports.append(ServicePort(str(p.get("name") or ""), fields.port(p.get("port"), f"{path}[{i}].port"), proto))
    return tuple(ports)


def parse_endpoints(items: Any, path: str, *, hostnames: bool = False) -> tuple[ServiceEndpoint, ...]:
    """A record's `endpoints` list; with `hostnames`, each endpoint's optional hostname, which must
    be a DNS label (it becomes part of a clusterset.local name)."""
    eps = []
    for i, e in enumerate(items or ()):
        e = fields.mapping(e, f"{path}[{i}]")
        addrs = e.get("addresses")
        if not isinstance(addrs, list):
            raise InputError(f"{path}[{i}].addresses", addrs, "is not a list of addresses")
        host = ""
        if hostnames and e.get("hostname"):
            host = str(e["hostname"])
            if not DNS_LABEL.fullmatch(host):
                raise InputError(f"{path}[{i}].hostname", host, "is not a DNS label (lowercase alnum and '-', "
                                 "at most 63)")
        for j, a in enumerate(addrs):
            try:
                eps.append(ServiceEndpoint(ipaddress.ip_address(a), str(e.get("zone") or ""), host))
            except (ValueError, TypeError):
                raise InputError(f"{path}[{i}].addresses[{j}]", a, "is not an IP address") from None
    return tuple(eps)


DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def parse_service_record(doc: Any, path: str, key_cluster: str, key_ns: str, key_name: str) -> GlobalService:
    """One published record (its JSON, decoded by the reader under MAX_SERVICE_RECORD_BYTES);
    InputError naming the field (a name that is not its key's, a bad port or address)."""
    d = record_names(doc, path, key_cluster, key_ns, key_name)
    return GlobalService(key_cluster, key_ns, key_name, parse_ports(d.get("ports"), f"{path}.ports"),
                         parse_endpoints(d.get("endpoints"), f"{path}.endpoints"))


def in_pod_cidrs(address: IPAddress, node: Node) -> bool:
    """Whether `address` lies in one of the pod CIDRs `node` holds (every one: each family, each
    of a Calico node's blocks); the one place that reads a node's pod CIDRs for services."""
    return any(address.version == net.version and address in net for net in node.pod_cidrs)


@dataclass(frozen=True)
class RecordIn:
    """A record as a reader found it: the cluster whose etcd it came from (its identity), the
    cluster, namespace and name its key names, the key, and its decoded JSON, or `error`: why it
    could not be decoded (too large, not JSON)."""

    source: str
    key_cluster: str
    namespace: str
    name: str
    key: str
    doc: Any
    error: str | None = None


class Published(Protocol):
    """A published record as admission sees it: its endpoints (GlobalService, mesh.mcs.Export)."""

    @property
    def endpoints(self) -> tuple[ServiceEndpoint, ...]: ...


R = TypeVar("R", bound=Published)


def admit_services(records: Iterable[RecordIn], nodes: Mapping[str, Sequence[Node]],
                   global_cidrs: Mapping[str, Sequence[Pair]] | None = None
                   ) -> tuple[list[GlobalService], list[Rejection]]:
    """The remote global-service records this cluster may serve, and the rejections (admit_records)."""
    return admit_records(records, nodes, global_cidrs, parse_service_record, "services")


def admit_records(records: Iterable[RecordIn], nodes: Mapping[str, Sequence[Node]],
                  global_cidrs: Mapping[str, Sequence[Pair]] | None,
                  parse: Callable[[Any, str, str, str, str], R], kind: str) -> tuple[list[R], list[Rejection]]:
    """The remote records this cluster may serve, and the rejections. `nodes`: each remote
    cluster's ADMITTED nodes (a cluster with global ranges: with their images); `global_cidrs`:
    each remote cluster's global ranges, whose endpoints are served at their images. A record under
    another cluster's key than its etcd's identity, or malformed, is rejected whole; an endpoint
    outside the cluster's admitted pod CIDRs alone. `parse` reads one record (global services',
    or mesh.mcs's exports with `kind` "mcs/exports", the word rejections are named with)."""
    out: list[R] = []
    rejected: list[Rejection] = []
    for r in sorted(records, key=lambda r: r.key):
        label = f"{r.source}/{kind}/{r.namespace}/{r.name}"
        if r.key_cluster != r.source:
            rejected.append(Rejection(label, f"{r.key}: cluster {r.source} cannot publish for cluster "
                                      f"{r.key_cluster}"))
            continue
        if r.error is not None:
            rejected.append(Rejection(label, r.error))
            continue
        try:
            svc = parse(r.doc, r.key, r.key_cluster, r.namespace, r.name)
        except InputError as e:
            rejected.append(Rejection(label, str(e)))
            continue
        held = nodes.get(r.source, ())
        mapping = (global_cidrs or {}).get(r.source, ())
        keep = []
        for i, ep in enumerate(svc.endpoints):
            seen = replace(ep, address=dial_address(ep.address, mapping))
            if any(in_pod_cidrs(seen.address, n) for n in held):
                keep.append(seen)
            else:
                image = f" (global {seen.address})" if seen.address != ep.address else ""
                rejected.append(Rejection(f"{label}/{ep.address}", f"{r.key}.endpoints[{i}]: {str(ep.address)!r}"
                                          f"{image} is in no pod CIDR of cluster {r.source}'s admitted nodes"))
        out.append(replace(svc, endpoints=tuple(keep)))  # type: ignore[type-var]
    return out, rejected


# --- the slices a cluster holds for the others ------------------------------------------------


def slice_name(service: str, cluster: str, family: int, index: int) -> str:
    """`<service>-<cluster>-<v4|v6>-<n>`, cut with a hash when longer than a name may be."""
    return cut_name(f"{service}-{cluster}-v{family}-{index}")


def cut_name(name: str) -> str:
    """`name` when it fits an object name (63), else its first 52 characters and a hash of the
    whole: the same name always gets the same cut."""
    if len(name) <= 63:
        return name
    return f"{name[:52]}-{_fnv1a(name):010x}"[:63]


def _fnv1a(text: str) -> int:
    """A 40-bit FNV-1a hash."""
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h >> 24


def _hints(affinity: str, ep: ServiceEndpoint, local_zones: Sequence[str]) -> dict[str, Any] | None:
    """`local`: a remote endpoint is hinted only for its own zone, so a proxy that honours hints
    keeps each zone's traffic on the endpoints of that zone (local ones, which the endpoint
    controller hints the same way, win wherever the zones are local); `remote`: hinted for every
    local zone, so remote endpoints serve all of them; `none`: no hints."""
    if affinity == "local":
        return {"forZones": [{"name": ep.zone or "meshctl.io/remote"}]}
    if affinity == "remote" and local_zones:
        return {"forZones": [{"name": z} for z in local_zones]}
    return None


def endpoint_slices(namespace: str, service: str, cluster: str, endpoints: Sequence[ServiceEndpoint],
                    ports: Sequence[ServicePort], labels: Mapping[str, str],
                    hints: Callable[[ServiceEndpoint], dict[str, Any] | None]) -> dict[tuple[str, str], dict[str, Any]]:
    """One cluster's endpoints of `service` as EndpointSlices: one set per address family in
    chunks of SLICE_ENDPOINTS (named by slice_name), every endpoint ready, with its zone, its
    hostname and `hints(endpoint)`; `labels` on each."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for fam in (4, 6):
        eps = [e for e in endpoints if e.address.version == fam]
        for k in range(0, len(eps), SLICE_ENDPOINTS):
            name = slice_name(service, cluster, fam, k // SLICE_ENDPOINTS)
            items = []
            for e in eps[k:k + SLICE_ENDPOINTS]:
                item: dict[str, Any] = {"addresses": [str(e.address)], "conditions": {"ready": True}}
                if e.hostname:
                    item["hostname"] = e.hostname
                if e.zone:
                    item["zone"] = e.zone
                hint = hints(e)
                if hint is not None:
                    item["hints"] = hint
                items.append(item)
            out[(namespace, name)] = {
                "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
                "addressType": f"IPv{fam}",
                "ports": [p.to_json() for p in ports],
                "endpoints": items,
            }
    return out


def desired_slices(local: LocalServices, remote: Sequence[GlobalService]) -> dict[tuple[str, str], dict[str, Any]]:
    """The EndpointSlices (by namespace and name) that carry the remote clusters' endpoints of the
    local global Services: one set per (Service, cluster, address family), in chunks of
    SLICE_ENDPOINTS, labelled `kubernetes.io/service-name` and managed by meshctl.io. A remote
    record whose Service is not global here gets no slice."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for svc in sorted(remote, key=lambda s: (s.namespace, s.name, s.cluster)):
        st = local.settings.get((svc.namespace, svc.name))
        if st is None:
            continue
        labels = {SERVICE_NAME_LABEL: svc.name, MANAGED_BY_LABEL: MANAGED_BY, SOURCE_CLUSTER_LABEL: svc.cluster}
        affinity = st.affinity
        out.update(endpoint_slices(svc.namespace, svc.name, svc.cluster, svc.endpoints, svc.ports, labels,
                                   lambda e, a=affinity: _hints(a, e, local.zones)))  # type: ignore[misc]
    return out


_COMPARED = ("addressType", "ports", "endpoints")


def _same_slice(have: Obj, want: Obj) -> bool:
    labels = _meta(have).get("labels") or {}
    if any(labels.get(k) != v for k, v in want["metadata"]["labels"].items()):
        return False
    return all((have.get(k) or None) == (want.get(k) or None) for k in _COMPARED)


@dataclass(frozen=True)
class ObjectChanges:
    """Creates, replaces and deletes of one kind of object (slices, and mesh.mcs's imports and
    derived Services)."""

    creates: tuple[dict[str, Any], ...] = ()
    updates: tuple[dict[str, Any], ...] = ()  # desired objects carrying the resourceVersion they replace
    deletes: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.creates or self.updates or self.deletes)


def object_changes(have: Iterable[Obj], want: Mapping[tuple[str, str], dict[str, Any]], *,
                   owned: Callable[[Obj], bool], same: Callable[[Obj, Obj], bool],
                   kept: Callable[[Obj], bool] = lambda _o: False) -> ObjectChanges:
    """What turns the objects there are into the desired ones, touching only those `owned`: a
    desired name held by an object someone else wrote is left alone (and not created), and so is
    one that is `kept` (its source not known yet). An update carries the resourceVersion it
    replaces."""
    ours: dict[tuple[str, str], Obj] = {}
    theirs: set[tuple[str, str]] = set()
    for o in have:
        if not owned(o) or kept(o):
            theirs.add(ref_of(o))
        else:
            ours[ref_of(o)] = o
    creates, updates = [], []
    for ref, obj in sorted(want.items()):
        if ref in theirs:
            continue
        old = ours.get(ref)
        if old is None:
            creates.append(obj)
        elif not same(old, obj):
            rv = _meta(old).get("resourceVersion")
            updates.append({**obj, "metadata": {**obj["metadata"], "resourceVersion": rv}})
    deletes = tuple(sorted(ref for ref in ours if ref not in want))
    return ObjectChanges(tuple(creates), tuple(updates), deletes)


def slice_changes(have: Iterable[Obj], want: Mapping[tuple[str, str], dict[str, Any]],
                  keep: Collection[str] = (), *, managed_by: str = MANAGED_BY,
                  source_label: str = SOURCE_CLUSTER_LABEL) -> ObjectChanges:
    """What turns the slices there are into the desired ones, touching only slices labelled
    managed by `managed_by` (the agents' meshctl.io, or the Multi-Cluster Services controller's):
    a desired name held by a slice someone else wrote is left alone (and not created). Slices from
    the clusters in `keep` (configured, but not connected yet: an agent that just started) stay as
    they are until their cluster's view arrives."""
    return object_changes(
        have, want, owned=lambda o: (_meta(o).get("labels") or {}).get(MANAGED_BY_LABEL) == managed_by,
        same=_same_slice, kept=lambda o: (_meta(o).get("labels") or {}).get(source_label) in keep)
