# SPDX-License-Identifier: Apache-2.0
"""The Multi-Cluster Services API (KEP-1645, `multicluster.x-k8s.io/v1alpha1`), the pure part:
what a cluster exports, how the exports of every cluster merge into one ServiceImport (conflicts
and who wins), the objects a cluster should hold for its imports (ServiceImport, the derived
Service whose ClusterIP is the import's ClusterSetIP, EndpointSlices), the ServiceExport
conditions, and the `clusterset.local` DNS answers (docs/clustermesh.md, "Multi-Cluster Services").

- **Export.** A `ServiceExport` names the Service of the same namespace and name. It is `Valid`
  when that Service exists and is not of type ExternalName (reasons `NoService`,
  `InvalidServiceType`). A valid export is published by the cluster-mesh cache to the cluster's
  etcd (backends.kube.mcs_controller) with the Service's type (a Service with `clusterIP: None` exports
  as `Headless`, every other as `ClusterSetIP`), its ports, the export's creation time, and the
  READY endpoints of the Service's own slices with their hostnames.
- **Import.** Every cluster of the mesh (the exporting ones too) merges the exports of one
  namespace and name, oldest export first (ties by cluster name): the import's type is the oldest
  export's; its ports are the union of every export's ports, where two ports with one name, or one
  port number and protocol, that differ are a conflict the oldest export wins. Every export of a
  Service in conflict carries `Conflict: True` (reasons `PortConflict`, `TypeConflict`, joined by
  commas) naming the field, the winner and why; every exporting cluster's endpoints serve the
  import (a port is matched by name, as kube-proxy matches a Service's port to its endpoints').
- **Objects.** In each cluster that has the namespace: a ServiceImport (spec.type, ports, ips: the
  derived Service's ClusterIP; status.clusters: the exporting clusters), a derived Service
  `derived-<name>` without selector (headless for a Headless import), and per exporting cluster
  and address family the EndpointSlices of its endpoints, labelled `kubernetes.io/service-name:
  derived-<name>`, `multicluster.kubernetes.io/service-name`, `multicluster.kubernetes.io/
  source-cluster` and managed by `mcs.meshctl.io`: kube-proxy (or any proxy that reads slices)
  balances the ClusterSetIP over every cluster's endpoints. A cluster without the namespace makes
  none of them and publishes that it lacks it; the exporting clusters' exports then say so
  (`meshctl.io/Imported: False`, reason `NamespaceMissing`).
- **Local endpoints first** (`meshctl.io/local-first: "true"` on the oldest export): the derived
  Service gets `trafficDistribution: PreferClose`, the importing cluster's own endpoints are hinted
  for every zone they are in and the other clusters' for no zone a node has, so kube-proxy sends a
  zone's traffic to the local endpoints while there are any, and to all when there are none.
- **DNS** (`answer`): `<svc>.<ns>.svc.clusterset.local` A/AAAA is the ClusterSetIP (or every
  endpoint of a Headless import), `<host>.<cluster>.<svc>.<ns>.svc.clusterset.local` one endpoint
  of a Headless import (its hostname, or its address with dashes as CoreDNS names pods), SRV per
  port (`_<port>._<proto>.<svc>...` and the service name itself), NXDOMAIN for what is not imported.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshctl.errors import InputError
from meshctl.mesh.model import IPAddress
from meshctl.mesh.services import (
    DNS_LABEL,
    MANAGED_BY_LABEL,
    MCS_MANAGED_BY,
    SERVICE_NAME_LABEL,
    GlobalService,
    Obj,
    ServiceEndpoint,
    ServicePort,
    cut_name,
    endpoint_slices,
    local_endpoints,
    parse_endpoints,
    parse_ports,
    record_names,
    ref_of,
)

API_VERSION = "multicluster.x-k8s.io/v1alpha1"
MCS_SERVICE_NAME_LABEL = "multicluster.kubernetes.io/service-name"
MCS_SOURCE_CLUSTER_LABEL = "multicluster.kubernetes.io/source-cluster"
# Who made a derived Service (the EndpointSlice label key is the one Kubernetes defines for slices).
SERVICE_MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
DERIVED_PREFIX = "derived-"
LOCAL_FIRST = "meshctl.io/local-first"
CLUSTERSET_IP, HEADLESS = "ClusterSetIP", "Headless"
ZONE = "clusterset.local"
DNS_TTL = 5
# The condition meshctl adds beside the KEP's Valid and Conflict: whether every cluster could import.
IMPORTED = "meshctl.io/Imported"

Ref = tuple[str, str]


@dataclass(frozen=True)
class Condition:
    """One metav1.Condition of a ServiceExport, without its time (the writer keeps the time of
    the last change of status: `with_times`)."""

    type: str
    status: str  # "True" | "False"
    reason: str
    message: str

    def to_json(self, when: str) -> dict[str, Any]:
        return {"type": self.type, "status": self.status, "reason": self.reason, "message": self.message,
                "lastTransitionTime": when}


@dataclass(frozen=True)
class Export:
    """One cluster's export of one Service, as published in its etcd."""

    cluster: str
    namespace: str
    name: str
    type: str
    created: str  # the ServiceExport's creationTimestamp (RFC 3339, seconds, Z): the oldest wins
    ports: tuple[ServicePort, ...]  # the Service's ports: what the import exposes
    target_ports: tuple[ServicePort, ...]  # its endpoints' ports (the slices'): what its endpoints serve
    endpoints: tuple[ServiceEndpoint, ...]
    local_first: bool = False

    @property
    def ref(self) -> Ref:
        return self.namespace, self.name

    def to_record(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "namespace": self.namespace, "name": self.name, "type": self.type,
                "created": self.created, "local_first": self.local_first,
                "ports": [p.to_json() for p in self.ports], "target_ports": [p.to_json() for p in self.target_ports],
                "endpoints": [e.to_json() for e in self.endpoints]}


def parse_export_record(doc: Any, path: str, key_cluster: str, key_ns: str, key_name: str) -> Export:
    """One published export (mesh.services.admit_services reads it with kind `mcs/exports`);
    InputError naming the field."""
    d = record_names(doc, path, key_cluster, key_ns, key_name)
    typ = d.get("type")
    if typ not in (CLUSTERSET_IP, HEADLESS):
        raise InputError(f"{path}.type", typ, f"is not {CLUSTERSET_IP} or {HEADLESS}")
    created = d.get("created")
    if not isinstance(created, str) or not created:
        raise InputError(f"{path}.created", created, "is not a time")
    local_first = d.get("local_first", False)
    if not isinstance(local_first, bool):
        raise InputError(f"{path}.local_first", local_first, "is not true or false")
    return Export(key_cluster, key_ns, key_name, typ, created, parse_ports(d.get("ports"), f"{path}.ports"),
                  parse_ports(d.get("target_ports"), f"{path}.target_ports"),
                  parse_endpoints(d.get("endpoints"), f"{path}.endpoints", hostnames=True), local_first)


# --- this cluster's exports -------------------------------------------------------------------


@dataclass(frozen=True)
class LocalExports:
    """This cluster's ServiceExports: the valid ones as published, and each one's Valid condition."""

    published: Mapping[Ref, Export]
    valid: Mapping[Ref, Condition]


def _meta(obj: Obj) -> Obj:
    m = obj.get("metadata")
    return m if isinstance(m, Mapping) else {}


def _bool_annotation(obj: Obj, key: str) -> bool:
    return str((_meta(obj).get("annotations") or {}).get(key, "")).lower() == "true"


def local_exports(cluster: str, exports: Sequence[Obj], services: Sequence[Obj], slices: Sequence[Obj]
                  ) -> LocalExports:
    """Each ServiceExport judged against the Service of its namespace and name: Valid (published
    with the Service's type, ports and ready endpoints) or not (no such Service, an ExternalName
    Service), one condition each."""
    by_ref = {ref_of(s): s for s in services}
    published: dict[Ref, Export] = {}
    valid: dict[Ref, Condition] = {}
    for ex in exports:
        ref = ref_of(ex)
        ns, name = ref
        svc = by_ref.get(ref)
        if svc is None:
            valid[ref] = Condition("Valid", "False", "NoService", f"Service {ns}/{name} does not exist")
            continue
        spec = svc.get("spec") or {}
        if spec.get("type") == "ExternalName":
            valid[ref] = Condition("Valid", "False", "InvalidServiceType",
                                   f"Service {ns}/{name} is of type ExternalName, which cannot be exported")
            continue
        valid[ref] = Condition("Valid", "True", "Valid", f"Service {ns}/{name} is exported")
        ports = tuple(ServicePort(str(p.get("name") or ""), int(p["port"]), str(p.get("protocol") or "TCP"))
                      for p in spec.get("ports") or () if isinstance(p.get("port"), int))
        own: GlobalService = local_endpoints(cluster, ns, name, slices, hostnames=True)
        published[ref] = Export(cluster, ns, name, HEADLESS if spec.get("clusterIP") == "None" else CLUSTERSET_IP,
                                str(_meta(ex).get("creationTimestamp") or ""), ports, own.ports, own.endpoints,
                                _bool_annotation(ex, LOCAL_FIRST))
    return LocalExports(published, valid)


# --- merging every cluster's exports into one import ------------------------------------------


@dataclass(frozen=True)
class Import:
    """One Service as the cluster set serves it: the merge of every cluster's export of it."""

    namespace: str
    name: str
    type: str
    ports: tuple[ServicePort, ...]
    exports: tuple[Export, ...]  # oldest first: the first is the one conflicts are settled by
    conflicts: tuple[tuple[str, str], ...] = ()  # (reason, message)
    local_first: bool = False

    @property
    def clusters(self) -> tuple[str, ...]:
        return tuple(sorted(e.cluster for e in self.exports))


def _age(e: Export) -> tuple[str, str]:
    return e.created, e.cluster


def _port(p: ServicePort) -> str:
    return f"{p.name + ' ' if p.name else ''}{p.port}/{p.protocol}"


def merge_exports(exports: Sequence[Export]) -> Import:
    """The import of one namespace and name (KEP-1645's conflict resolution: the oldest export wins
    every conflict; ports are the union where they do not conflict)."""
    ordered = tuple(sorted(exports, key=_age))
    first = ordered[0]
    why = f"{first.cluster}'s export is the oldest"
    conflicts: list[tuple[str, str]] = []
    for e in ordered[1:]:
        if e.type != first.type:
            conflicts.append(("TypeConflict", f"type: cluster {e.cluster} exports {e.type}, the import is "
                                              f"{first.type} as cluster {first.cluster} exports it ({why})"))
    ports: list[tuple[ServicePort, str]] = []
    for e in ordered:
        for p in e.ports:
            held = next(((q, c) for q, c in ports if q.name == p.name or (q.port, q.protocol) == (p.port, p.protocol)),
                        None)
            if held is None:
                ports.append((p, e.cluster))
            elif held[0] != p:
                conflicts.append(("PortConflict", f"ports: cluster {e.cluster}'s port {_port(p)} conflicts with "
                                                  f"{_port(held[0])} of cluster {held[1]}, which the import keeps "
                                                  f"({held[1]}'s export is older)"))
    return Import(first.namespace, first.name, first.type, tuple(p for p, _ in ports), ordered, tuple(conflicts),
                  first.local_first)


def merge_all(exports: Iterable[Export]) -> dict[Ref, Import]:
    """Every cluster's exports merged, by namespace and name."""
    by_ref: dict[Ref, list[Export]] = {}
    for e in exports:
        by_ref.setdefault(e.ref, []).append(e)
    return {ref: merge_exports(es) for ref, es in sorted(by_ref.items())}


def export_conditions(local: LocalExports, imports: Mapping[Ref, Import], missing: Mapping[Ref, Collection[str]]
                      ) -> dict[Ref, tuple[Condition, ...]]:
    """The conditions of each of this cluster's ServiceExports: Valid, and for a valid one Conflict
    (True with the reasons and what won, on every export of a Service in conflict) and
    meshctl.io/Imported (False naming the clusters that lack the namespace: `missing`)."""
    out: dict[Ref, tuple[Condition, ...]] = {}
    for ref, valid in sorted(local.valid.items()):
        if valid.status != "True":
            out[ref] = (valid,)
            continue
        imp = imports.get(ref)
        conflicts = imp.conflicts if imp is not None else ()
        if conflicts:
            reasons = ",".join(dict.fromkeys(r for r, _ in conflicts))
            conflict = Condition("Conflict", "True", reasons, "; ".join(m for _, m in conflicts))
        else:
            conflict = Condition("Conflict", "False", "NoConflicts", "no conflicts with other clusters' exports")
        lacking = sorted(missing.get(ref, ()))
        if lacking:
            imported = Condition(IMPORTED, "False", "NamespaceMissing",
                                 f"cluster{'s' if len(lacking) > 1 else ''} {', '.join(lacking)} "
                                 f"{'have' if len(lacking) > 1 else 'has'} no namespace {ref[0]}: "
                                 f"no ServiceImport there (create the namespace to import it)")
        else:
            imported = Condition(IMPORTED, "True", "Imported", "imported by every cluster that has the namespace")
        out[ref] = (valid, conflict, imported)
    return out


def with_times(old: Sequence[Obj], new: Sequence[Condition], now: str) -> list[dict[str, Any]]:
    """`new` as metav1.Conditions: each keeps the lastTransitionTime of the old condition of its
    type while its status is the same, and takes `now` when it changed."""
    before = {str(c.get("type")): c for c in old if isinstance(c, Mapping)}
    out = []
    for c in new:
        prev = before.get(c.type)
        same = prev is not None and prev.get("status") == c.status and prev.get("lastTransitionTime")
        out.append(c.to_json(str(prev["lastTransitionTime"]) if same and prev is not None else now))
    return out


def same_conditions(old: Sequence[Obj], new: Sequence[Condition]) -> bool:
    """Whether the conditions written are `new` already (times aside)."""
    have = sorted((str(c.get("type")), c.get("status"), c.get("reason"), c.get("message")) for c in old
                  if isinstance(c, Mapping))
    return have == sorted((c.type, c.status, c.reason, c.message) for c in new)


# --- the objects a cluster holds for its imports ----------------------------------------------


def derived_name(name: str) -> str:
    """The derived Service of the import `name`: `derived-<name>`, cut with a hash when longer
    than a Service name may be."""
    return cut_name(DERIVED_PREFIX + name)


def _k8s_port(p: ServicePort) -> dict[str, Any]:
    return {**({"name": p.name} if p.name else {}), "port": p.port, "protocol": p.protocol}


@dataclass(frozen=True)
class Desired:
    """What a cluster should hold for the imports: by namespace and name."""

    imports: Mapping[Ref, dict[str, Any]]
    services: Mapping[Ref, dict[str, Any]]
    slices: Mapping[Ref, dict[str, Any]]
    statuses: Mapping[Ref, dict[str, Any]]  # each ServiceImport's status
    missing: tuple[Ref, ...] = ()  # imports whose namespace this cluster lacks


# The zone the other clusters' endpoints are hinted for under local-first: one no node is in.
OTHER_CLUSTERS_ZONE = "meshctl.io/other-clusters"


def _hints_for(local: str, zones: Sequence[str], cluster: str, on: bool) -> Callable[[ServiceEndpoint], Any]:
    """Local-first hints for the endpoints of `cluster`: every local zone for the local cluster's,
    a zone no node is in for the others' (`on` False: no hints)."""
    if not on:
        return lambda _e: None
    hint = {"forZones": [{"name": z} for z in (zones if cluster == local else [OTHER_CLUSTERS_ZONE])]}
    return lambda _e: hint


def desired_objects(cluster: str, imports: Mapping[Ref, Import], namespaces: Collection[str],
                    ips: Mapping[Ref, Sequence[str]]) -> Desired:
    """The ServiceImports, derived Services and slices cluster `cluster` should hold. `ips`: each
    derived Service's ClusterIPs as the API server allocated them (an import's ips are its
    derived Service's)."""
    out_imports: dict[Ref, dict[str, Any]] = {}
    services: dict[Ref, dict[str, Any]] = {}
    slices: dict[Ref, dict[str, Any]] = {}
    statuses: dict[Ref, dict[str, Any]] = {}
    missing: list[Ref] = []
    for ref, imp in sorted(imports.items()):
        ns, name = ref
        if ns not in namespaces:
            missing.append(ref)
            continue
        dname = derived_name(name)
        spec: dict[str, Any] = {"type": imp.type, "ports": [_k8s_port(p) for p in imp.ports]}
        if imp.type == CLUSTERSET_IP and ips.get(ref):
            spec["ips"] = list(ips[ref])[:1]
        out_imports[ref] = {"apiVersion": API_VERSION, "kind": "ServiceImport",
                            "metadata": {"name": name, "namespace": ns,
                                         "labels": {SERVICE_MANAGED_BY_LABEL: MCS_MANAGED_BY}},
                            "spec": spec}
        statuses[ref] = {"clusters": [{"cluster": c} for c in imp.clusters]}
        svc_spec: dict[str, Any] = {"type": "ClusterIP", "ports": [_k8s_port(p) for p in imp.ports]}
        if imp.type == HEADLESS:
            svc_spec["clusterIP"] = "None"
        local_zones = sorted({e.zone for x in imp.exports if x.cluster == cluster for e in x.endpoints if e.zone})
        if imp.local_first and local_zones:
            svc_spec["trafficDistribution"] = "PreferClose"
        services[(ns, dname)] = {"apiVersion": "v1", "kind": "Service",
                                 "metadata": {"name": dname, "namespace": ns,
                                              "labels": {MCS_SERVICE_NAME_LABEL: name,
                                                         SERVICE_MANAGED_BY_LABEL: MCS_MANAGED_BY}},
                                 "spec": svc_spec}
        for x in imp.exports:
            labels = {SERVICE_NAME_LABEL: dname, MCS_SERVICE_NAME_LABEL: name, MCS_SOURCE_CLUSTER_LABEL: x.cluster,
                      MANAGED_BY_LABEL: MCS_MANAGED_BY}
            slices.update(endpoint_slices(ns, dname, x.cluster, x.endpoints, x.target_ports, labels,
                                          _hints_for(cluster, local_zones, x.cluster,
                                                     bool(svc_spec.get("trafficDistribution")))))
    return Desired(out_imports, services, slices, statuses, tuple(missing))


def owned(obj: Obj) -> bool:
    """An object the Multi-Cluster Services controller made (and the only kind it changes)."""
    labels = _meta(obj).get("labels") or {}
    return labels.get(SERVICE_MANAGED_BY_LABEL) == MCS_MANAGED_BY or labels.get(MANAGED_BY_LABEL) == MCS_MANAGED_BY


def _labels_hold(have: Obj, want: Obj) -> bool:
    labels = _meta(have).get("labels") or {}
    return all(labels.get(k) == v for k, v in want["metadata"]["labels"].items())


def same_import(have: Obj, want: Obj) -> bool:
    return _labels_hold(have, want) and (have.get("spec") or {}) == want["spec"]


def same_service(have: Obj, want: Obj) -> bool:
    """A derived Service as wanted: its ports, its headlessness, its traffic distribution (the
    server's defaults on the rest are left alone)."""
    h, w = have.get("spec") or {}, want["spec"]
    ports = [{k: p[k] for k in ("name", "port", "protocol") if p.get(k) not in (None, "")}
             for p in h.get("ports") or ()]
    return bool(_labels_hold(have, want) and ports == w["ports"] and not must_recreate(have, want)
                and h.get("trafficDistribution") == w.get("trafficDistribution"))


def must_recreate(have: Obj, want: Obj) -> bool:
    """A derived Service whose headlessness changes (a ClusterIP is immutable): delete, then create."""
    return bool(((have.get("spec") or {}).get("clusterIP") == "None") != (want["spec"].get("clusterIP") == "None"))


# --- clusterset.local ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ZoneService:
    """One import as the DNS server answers for it."""

    type: str
    ips: tuple[IPAddress, ...]
    ports: tuple[ServicePort, ...]
    endpoints: tuple[tuple[str, ServiceEndpoint], ...]  # (cluster, endpoint)


@dataclass(frozen=True)
class Zone:
    """The clusterset.local zone of one cluster: its imports by namespace and name; `serial`
    changes with every new zone (the SOA's)."""

    services: Mapping[Ref, ZoneService] = field(default_factory=dict)
    serial: int = 1


def clusterset_zone(imports: Mapping[Ref, Import], ips: Mapping[Ref, Sequence[str]], present: Collection[Ref],
                    serial: int) -> Zone:
    """The zone of the imports this cluster holds (`present`: those whose ServiceImport exists)."""
    out: dict[Ref, ZoneService] = {}
    for ref, imp in imports.items():
        if ref not in present:
            continue
        addrs = []
        for a in ips.get(ref, ()) if imp.type == CLUSTERSET_IP else ():
            try:
                addrs.append(ipaddress.ip_address(a))
            except ValueError:
                continue
        out[ref] = ZoneService(imp.type, tuple(addrs), imp.ports,
                               tuple((x.cluster, e) for x in imp.exports for e in x.endpoints))
    return Zone(out, serial)


@dataclass(frozen=True)
class Srv:
    priority: int
    weight: int
    port: int
    target: str


@dataclass(frozen=True)
class DnsRecord:
    name: str
    type: str  # A, AAAA, SRV
    data: IPAddress | Srv
    ttl: int = DNS_TTL


@dataclass(frozen=True)
class DnsAnswer:
    """`rcode` NOERROR (records, or none: the name exists without that type), NXDOMAIN or REFUSED
    (outside the zone); `soa`: put the zone's SOA in the authority section (negative answers)."""

    rcode: str
    records: tuple[DnsRecord, ...] = ()
    soa: bool = False
    apex_soa: bool = False  # a question for the zone's own SOA: the SOA is the answer


def host_label(e: ServiceEndpoint) -> str:
    """An endpoint's name under its cluster: its hostname, else its address with dashes."""
    return e.hostname or str(e.address).replace(".", "-").replace(":", "-")


def _addresses(name: str, qtype: str, addrs: Iterable[IPAddress]) -> tuple[DnsRecord, ...]:
    out = []
    for a in sorted(set(addrs), key=lambda a: (a.version, a)):
        t = "A" if a.version == 4 else "AAAA"
        if qtype in (t, "ANY"):
            out.append(DnsRecord(name, t, a))
    return tuple(out)


def _srv(name: str, svc: ZoneService, base: str, ports: Sequence[ServicePort]) -> tuple[DnsRecord, ...]:
    if svc.type == CLUSTERSET_IP:
        return tuple(DnsRecord(name, "SRV", Srv(0, 100, p.port, base)) for p in ports)
    eps = sorted({(c, host_label(e)) for c, e in svc.endpoints})
    weight = max(1, 100 // max(1, len(eps)))
    return tuple(DnsRecord(name, "SRV", Srv(0, weight, p.port, f"{h}.{c}.{base}")) for p in ports for c, h in eps)


def answer(zone: Zone, qname: str, qtype: str) -> DnsAnswer:
    """The answer to one question (`qtype` A, AAAA, SRV, SOA, ANY or another: no records of it)."""
    name = qname.lower().rstrip(".")
    if name != ZONE and not name.endswith("." + ZONE):
        return DnsAnswer("REFUSED")
    labels = name[: -len(ZONE)].rstrip(".").split(".") if name != ZONE else []
    nodata = DnsAnswer("NOERROR", soa=True)
    if not labels:
        return DnsAnswer("NOERROR", apex_soa=True) if qtype in ("SOA", "ANY") else nodata
    if labels[-1] != "svc":
        return DnsAnswer("NXDOMAIN", soa=True)
    rest = labels[:-1]
    if not rest:
        return nodata if zone.services else DnsAnswer("NXDOMAIN", soa=True)
    ns = rest[-1]
    if len(rest) == 1:
        return nodata if any(r[0] == ns for r in zone.services) else DnsAnswer("NXDOMAIN", soa=True)
    svc = zone.services.get((ns, rest[-2]))
    if svc is None:
        return DnsAnswer("NXDOMAIN", soa=True)
    base = f"{rest[-2]}.{ns}.svc.{ZONE}"
    head = rest[:-2]
    if not head:  # the service name
        if qtype == "SRV":
            return DnsAnswer("NOERROR", _srv(name, svc, base, svc.ports))
        addrs = svc.ips if svc.type == CLUSTERSET_IP else (e.address for _, e in svc.endpoints)
        return DnsAnswer("NOERROR", _addresses(name, qtype, addrs), soa=True)
    if len(head) == 2 and head[0].startswith("_") and head[1].startswith("_"):  # _<port>._<proto>
        ports = [p for p in svc.ports if p.name == head[0][1:] and p.protocol.lower() == head[1][1:]]
        if not ports:
            return DnsAnswer("NXDOMAIN", soa=True)
        return DnsAnswer("NOERROR", _srv(name, svc, base, ports) if qtype == "SRV" else (), soa=qtype != "SRV")
    if svc.type != HEADLESS or len(head) > 2:
        return DnsAnswer("NXDOMAIN", soa=True)
    cluster = head[-1]
    mine = [e for c, e in svc.endpoints if c == cluster]
    if not mine:
        return DnsAnswer("NXDOMAIN", soa=True)
    if len(head) == 1:  # <cluster>.<svc>...: a name with names below it
        return nodata
    hits = [e.address for e in mine if host_label(e) == head[0]]
    if not hits:
        return DnsAnswer("NXDOMAIN", soa=True)
    return DnsAnswer("NOERROR", _addresses(name, qtype, hits), soa=True)


def parse_name(name: str) -> Ref | None:
    """`<svc>.<ns>.svc.clusterset.local` -> (ns, svc), or None when it is not such a name."""
    labels = name.lower().rstrip(".").split(".")
    if len(labels) == 5 and ".".join(labels[2:]) == f"svc.{ZONE}":
        return labels[1], labels[0]
    return None


def check_name(value: str, path: str) -> Ref:
    """A `clusterset.local` Service name given by a user; InputError naming the value."""
    ref = parse_name(value)
    if ref is None:
        raise InputError(path, value, f"is not a name <service>.<namespace>.svc.{ZONE}")
    if not all(DNS_LABEL.fullmatch(x) for x in ref):
        raise InputError(path, value, "names a Service or namespace that is not a DNS label")
    return ref


def import_endpoints(imports: Sequence[Obj], slices: Sequence[Obj]
                     ) -> list[tuple[Ref, str, tuple[str, ...], dict[str, tuple[str, ...]]]]:
    """Each ServiceImport as a cluster holds it: (namespace and name, type, ips, the ready
    addresses of each exporting cluster's slices), for `status` and `explain`."""
    eps: dict[Ref, dict[str, set[str]]] = {}
    for s in slices:
        labels = _meta(s).get("labels") or {}
        if labels.get(MANAGED_BY_LABEL) != MCS_MANAGED_BY or MCS_SERVICE_NAME_LABEL not in labels:
            continue
        into = eps.setdefault((ref_of(s)[0], str(labels[MCS_SERVICE_NAME_LABEL])), {}).setdefault(
            str(labels.get(MCS_SOURCE_CLUSTER_LABEL) or ""), set())
        into.update(str(a) for e in s.get("endpoints") or () if (e.get("conditions") or {}).get("ready") is not False
                    for a in e.get("addresses") or ())
    out = []
    for imp in sorted(imports, key=ref_of):
        ref = ref_of(imp)
        spec = imp.get("spec") or {}
        out.append((ref, str(spec.get("type") or ""), tuple(str(a) for a in spec.get("ips") or ()),
                    {c: tuple(sorted(a)) for c, a in sorted(eps.get(ref, {}).items())}))
    return out
