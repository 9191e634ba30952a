# SPDX-License-Identifier: Apache-2.0
"""Global services, the pure part: which Services a cluster publishes, what it publishes (the
ready endpoints of its own EndpointSlices), how a reader admits another cluster's records, and
the EndpointSlices a cluster should hold for the other clusters' endpoints (docs/clustermesh.md,
"Global services").

A Service is global when annotated `service.cilium.io/global: "true"` (Cilium's key, so its users
recognise it; `meshctl.io/global` is an alias) or exported by an MCS `ServiceExport` of the same
namespace and name. `service.cilium.io/shared: "false"` keeps the cluster's own endpoints to
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
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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
    """What a Service's annotations (and a ServiceExport) make of it."""

    global_: bool
    shared: bool = True
    affinity: str = "none"
    exported: bool = False


@dataclass(frozen=True, order=True)
class ServicePort:
    name: str
    port: int
    protocol: str = "TCP"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "port": self.port, "protocol": self.protocol}


@dataclass(frozen=True, order=True)
class ServiceEndpoint:
    address: IPAddress
    zone: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"addresses": [str(self.address)], **({"zone": self.zone} if self.zone else {})}


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


def service_settings(svc: Obj, exported: bool) -> ServiceSettings:
    """A Service's settings; InputError naming the annotation and its value when one is neither
    `true` nor `false` (or, for affinity, none of local|remote|none)."""
    ns, name = ref_of(svc)
    ann = _meta(svc).get("annotations") or {}
    where = f"service {ns}/{name}: annotations"
    is_global = exported
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
    return ServiceSettings(is_global, shared, affinity, exported)


def managed_by_meshctl(obj: Obj) -> bool:
    """A slice meshctl wrote (and the only kind it ever changes or deletes)."""
    return (_meta(obj).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY


def _ready(ep: Obj) -> bool:
    """Ready as Kubernetes means it: `conditions.ready` unset counts as ready."""
    cond = ep.get("conditions") or {}
    return cond.get("ready") is not False


def local_endpoints(cluster: str, ns: str, name: str, slices: Iterable[Obj]) -> GlobalService:
    """The READY endpoints and ports of a Service's own slices (those of the EndpointSlice
    controller, never meshctl's, so a cluster never republishes what it imported)."""
    ports: set[ServicePort] = set()
    eps: set[ServiceEndpoint] = set()
    for s in slices:
        labels = _meta(s).get("labels") or {}
        if managed_by_meshctl(s) or ref_of(s)[0] != ns or labels.get(SERVICE_NAME_LABEL) != name:
            continue
        for p in s.get("ports") or ():
            if isinstance(p.get("port"), int):
                ports.add(ServicePort(str(p.get("name") or ""), p["port"], str(p.get("protocol") or "TCP")))
        for ep in s.get("endpoints") or ():
            if not _ready(ep):
                continue
            for a in ep.get("addresses") or ():
                try:
                    eps.add(ServiceEndpoint(ipaddress.ip_address(a), str(ep.get("zone") or "")))
                except ValueError:
                    continue  # not ours to judge: the controller wrote it; only addresses are published
    return GlobalService(cluster, ns, name, tuple(sorted(ports)), tuple(sorted(eps)))


@dataclass(frozen=True)
class LocalServices:
    """The local cluster's global Services: their settings by (namespace, name), the records it
    publishes, and what was refused (bad annotations, exports of missing Services)."""

    settings: Mapping[tuple[str, str], ServiceSettings]
    published: Mapping[tuple[str, str], GlobalService]
    rejections: tuple[Rejection, ...]
    zones: tuple[str, ...]


def local_services(cluster: str, services: Sequence[Obj], exports: Sequence[Obj], slices: Sequence[Obj]
                   ) -> LocalServices:
    """What this cluster publishes: every global Service that is shared, with its ready endpoints.
    A Service with a bad annotation, and a ServiceExport whose Service does not exist, are rejected
    alone and named."""
    exported = {ref_of(e) for e in exports}
    have = {ref_of(s) for s in services}
    rejections = [Rejection(f"serviceexport/{ns}/{n}", f"serviceexport {ns}/{n}: the Service {ns}/{n} does not exist")
                  for ns, n in sorted(exported - have)]
    settings: dict[tuple[str, str], ServiceSettings] = {}
    published: dict[tuple[str, str], GlobalService] = {}
    for svc in services:
        ref = ref_of(svc)
        try:
            st = service_settings(svc, ref in exported)
        except InputError as e:
            rejections.append(Rejection(f"service/{ref[0]}/{ref[1]}", str(e)))
            continue
        if not st.global_:
            continue
        settings[ref] = st
        if st.shared:
            published[ref] = local_endpoints(cluster, ref[0], ref[1], slices)
    zones = sorted({str(ep.get("zone")) for s in slices if not managed_by_meshctl(s)
                    for ep in s.get("endpoints") or () if ep.get("zone")})
    return LocalServices(settings, published, tuple(rejections), tuple(zones))


# --- a reader's admission ---------------------------------------------------------------------


def parse_service_record(doc: Any, path: str, key_cluster: str, key_ns: str, key_name: str) -> GlobalService:
    """One published record (its JSON, decoded by the reader under MAX_SERVICE_RECORD_BYTES);
    InputError naming the field (a name that is not its key's, a bad port or address)."""
    d = fields.mapping(doc, path)
    for f, want in (("cluster", key_cluster), ("namespace", key_ns), ("name", key_name)):
        if d.get(f) != want:
            raise InputError(f"{path}.{f}", d.get(f), f"is not its key's {want!r}")
    ports = []
    for i, p in enumerate(d.get("ports") or ()):
        p = fields.mapping(p, f"{path}.ports[{i}]")
        proto = p.get("protocol", "TCP")
        if proto not in PROTOCOLS:
            raise InputError(f"{path}.ports[{i}].protocol", proto, f"is not one of {', '.join(PROTOCOLS)}")
        ports.append(ServicePort(str(p.get("name") or ""), fields.port(p.get("port"), f"{path}.ports[{i}].port"),
                                 proto))
    eps = []
    for i, e in enumerate(d.get("endpoints") or ()):
        e = fields.mapping(e, f"{path}.endpoints[{i}]")
        addrs = e.get("addresses")
        if not isinstance(addrs, list):
            raise InputError(f"{path}.endpoints[{i}].addresses", addrs, "is not a list of addresses")
        for j, a in enumerate(addrs):
            try:
                eps.append(ServiceEndpoint(ipaddress.ip_address(a), str(e.get("zone") or "")))
            except (ValueError, TypeError):
                raise InputError(f"{path}.endpoints[{i}].addresses[{j}]", a, "is not an IP address") from None
    return GlobalService(key_cluster, key_ns, key_name, tuple(ports), tuple(eps))


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


def admit_services(records: Iterable[RecordIn], nodes: Mapping[str, Sequence[Node]],
                   global_cidrs: Mapping[str, Sequence[Pair]] | None = None
                   ) -> tuple[list[GlobalService], list[Rejection]]:
    """The remote records this cluster may serve, and the rejections. `nodes`: each remote
    cluster's ADMITTED nodes (a cluster with global ranges: with their images); `global_cidrs`:
    each remote cluster's global ranges, whose endpoints are served at their images. A record under
    another cluster's key than its etcd's identity, or malformed, is rejected whole; an endpoint
    outside the cluster's admitted pod CIDRs alone."""
    out: list[GlobalService] = []
    rejected: list[Rejection] = []
    for r in sorted(records, key=lambda r: r.key):
        label = f"{r.source}/services/{r.namespace}/{r.name}"
        if r.key_cluster != r.source:
            rejected.append(Rejection(label, f"{r.key}: cluster {r.source} cannot publish for cluster "
                                      f"{r.key_cluster}"))
            continue
        if r.error is not None:
            rejected.append(Rejection(label, r.error))
            continue
        try:
            svc = parse_service_record(r.doc, r.key, r.key_cluster, r.namespace, r.name)
        except InputError as e:
            rejected.append(Rejection(label, str(e)))
            continue
        held = nodes.get(r.source, ())
        mapping = (global_cidrs or {}).get(r.source, ())
        keep = []
        for i, ep in enumerate(svc.endpoints):
            seen = ServiceEndpoint(dial_address(ep.address, mapping), ep.zone)
            if any(in_pod_cidrs(seen.address, n) for n in held):
                keep.append(seen)
            else:
                image = f" (global {seen.address})" if seen.address != ep.address else ""
                rejected.append(Rejection(f"{label}/{ep.address}", f"{r.key}.endpoints[{i}]: {str(ep.address)!r}"
                                          f"{image} is in no pod CIDR of cluster {r.source}'s admitted nodes"))
        out.append(GlobalService(svc.cluster, svc.namespace, svc.name, svc.ports, tuple(keep)))
    return out, rejected


# --- the slices a cluster holds for the others ------------------------------------------------


def slice_name(service: str, cluster: str, family: int, index: int) -> str:
    """`<service>-<cluster>-<v4|v6>-<n>`, cut with a hash when longer than a name may be."""
    name = f"{service}-{cluster}-v{family}-{index}"
    if len(name) <= 63:
        return name
    return f"{name[:52]}-{_fnv1a(name):010x}"[:63]


def _fnv1a(text: str) -> int:
    """A 40-bit FNV-1a hash: the same name always gets the same cut."""
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
        for fam in (4, 6):
            eps = [e for e in svc.endpoints if e.address.version == fam]
            if not eps:
                continue
            for k in range(0, len(eps), SLICE_ENDPOINTS):
                name = slice_name(svc.name, svc.cluster, fam, k // SLICE_ENDPOINTS)
                items = []
                for e in eps[k:k + SLICE_ENDPOINTS]:
                    item: dict[str, Any] = {"addresses": [str(e.address)], "conditions": {"ready": True}}
                    if e.zone:
                        item["zone"] = e.zone
                    hints = _hints(st.affinity, e, local.zones)
                    if hints is not None:
                        item["hints"] = hints
                    items.append(item)
                out[(svc.namespace, name)] = {
                    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                    "metadata": {"name": name, "namespace": svc.namespace,
                                 "labels": {SERVICE_NAME_LABEL: svc.name, MANAGED_BY_LABEL: MANAGED_BY,
                                            SOURCE_CLUSTER_LABEL: svc.cluster}},
                    "addressType": f"IPv{fam}",
                    "ports": [p.to_json() for p in svc.ports],
                    "endpoints": items,
                }
    return out


_COMPARED = ("addressType", "ports", "endpoints")


def _same_slice(have: Obj, want: Obj) -> bool:
    labels = _meta(have).get("labels") or {}
    if any(labels.get(k) != v for k, v in want["metadata"]["labels"].items()):
        return False
    return all((have.get(k) or None) == (want.get(k) or None) for k in _COMPARED)


@dataclass(frozen=True)
class SliceChanges:
    creates: tuple[dict[str, Any], ...] = ()
    updates: tuple[dict[str, Any], ...] = ()  # desired objects carrying the resourceVersion they replace
    deletes: tuple[tuple[str, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.creates or self.updates or self.deletes)


def slice_changes(have: Iterable[Obj], want: Mapping[tuple[str, str], dict[str, Any]],
                  keep: Collection[str] = ()) -> SliceChanges:
    """What turns the slices there are into the desired ones, touching only slices meshctl wrote:
    a desired name held by a slice someone else wrote is left alone (and not created). Slices from
    the clusters in `keep` (configured, but not connected yet: an agent that just started) stay as
    they are until their cluster's view arrives."""
    ours: dict[tuple[str, str], Obj] = {}
    theirs: set[tuple[str, str]] = set()
    for s in have:
        if not managed_by_meshctl(s):
            theirs.add(ref_of(s))
        elif (_meta(s).get("labels") or {}).get(SOURCE_CLUSTER_LABEL) in keep:
            theirs.add(ref_of(s))  # not ours to change now
        else:
            ours[ref_of(s)] = s
    creates, updates = [], []
    for ref, obj in sorted(want.items()):
        if ref in theirs:
            continue
        old = ours.get(ref)
        if old is None:
            creates.append(obj)
        elif not _same_slice(old, obj):
            rv = _meta(old).get("resourceVersion")
            updates.append({**obj, "metadata": {**obj["metadata"], "resourceVersion": rv}})
    deletes = tuple(sorted(ref for ref in ours if ref not in want))
    return SliceChanges(tuple(creates), tuple(updates), deletes)
