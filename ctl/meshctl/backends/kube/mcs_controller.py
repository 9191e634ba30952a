# SPDX-License-Identifier: Apache-2.0
"""The Multi-Cluster Services controller of the cluster-mesh cache (`meshctl clustermesh cache
--mcs`), the imperative part; the decisions are mesh.mcs's.

Why here: the cache runs once per cluster, already follows every remote cluster's etcd and admits
their records against its own cluster's, and holds the remote credentials no agent needs. With its
own ServiceAccount (`meshctl-clustermesh-cache`, narrow grants held by an admission policy) it
writes what the Multi-Cluster Services API asks for, and no agent's node token gains a write.

One pass whenever something it reads changed (an event of the informers that keep the five kinds
it reads: one LIST each, then a WATCH; a pass of the cache, i.e. a remote cluster's records) and
every defaults.SERVICES_RESYNC_S:
    Kubernetes (Services, slices, ServiceExports, ServiceImports, Namespaces, from the informers)
      -> local_exports: the Valid condition of each export, the valid ones published to
         /meshctl/<cluster>/mcs/exports/<ns>/<name> in this cluster's etcd
      + every admitted remote cluster's exports (its endpoints admitted against its admitted nodes,
        mesh.services.admit_records), read from the cache's watch of its etcd
      -> merge_all: one Import per namespace and name; the conditions of this cluster's exports
      -> desired_objects: derived Services (created first: the API server allocates the
         ClusterSetIP), ServiceImports with that IP and their status, EndpointSlices; an import
         whose namespace is missing here is published under /meshctl/<cluster>/mcs/missing/
      -> the writes that differ; the clusterset.local zone for the DNS server.
While a configured remote cluster's view is not known yet (the cache starting, its etcd away), no
import, derived Service or slice is deleted and that cluster's slices stay: a restart withdraws
nothing.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from meshctl import defaults
from meshctl.backends.base import RecordMirror
from meshctl.backends.clustermesh_cache import cache_changes
from meshctl.backends.etcd import (
    MCS_EXPORTS,
    MCS_MISSING,
    mcs_key,
    mcs_prefix,
    remote_records,
)
from meshctl.backends.kube.mcs import KubeMcsApi, McsView, cluster_ips
from meshctl.errors import MeshError
from meshctl.etcd import EtcdClient, EtcdError
from meshctl.mesh.admit import Rejection
from meshctl.mesh.mcs import (
    MCS_SERVICE_NAME_LABEL,
    Export,
    Import,
    Zone,
    clusterset_zone,
    desired_objects,
    export_conditions,
    local_exports,
    merge_all,
    owned,
    parse_export_record,
    same_conditions,
    same_import,
    same_service,
    with_times,
)
from meshctl.mesh.segments import Remote
from meshctl.mesh.services import (
    MCS_MANAGED_BY,
    ObjectChanges,
    admit_records,
    object_changes,
    ref_of,
    slice_changes,
)

log = logging.getLogger("meshctl.clustermesh.mcs")


class RemoteMirrors(Protocol):
    """The cache's view of the remote clusters (backends.clustermesh.RemoteClusters)."""

    def mirrors(self) -> Mapping[str, RecordMirror]: ...

    def undecided(self) -> frozenset[str]: ...


@dataclass
class McsStats:
    passes: int = 0
    writes: int = 0
    errors: int = 0
    rejections: list[Rejection] = field(default_factory=list)
    last_error: str = ""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _no_deletes_while(undecided: frozenset[str], changes: ObjectChanges) -> ObjectChanges:
    """A configured cluster's view not known yet (the cache starting, its etcd away): what it
    exports is not known to be gone, so nothing is deleted (creates and changes go on)."""
    return ObjectChanges(changes.creates, changes.updates, ()) if undecided else changes


class McsController:
    """The controller of cluster `cluster`. `admitted()` gives the remote clusters as the cache's
    last pass admitted them (None before its first); `zone` receives every new clusterset.local
    zone (the DNS server's)."""

    def __init__(self, cluster: str, api: KubeMcsApi, etcd: EtcdClient, remotes: RemoteMirrors,
                 admitted: Callable[[], list[Remote] | None], zone: Callable[[Zone], None]) -> None:
        self.cluster, self.api, self.etcd, self.remotes = cluster, api, etcd, remotes
        self.admitted, self.zone = admitted, zone
        self.stats = McsStats()
        self._published: dict[str, bytes] | None = None
        self._full_due = 0.0
        self._serial = 0
        self._zone_key: Any = None
        self._logged: set[str] = set()
        self._kick = threading.Event()

    def kick(self) -> None:
        self._kick.set()

    def run(self, stop: threading.Event) -> None:
        """Follow the five kinds (api.cache) and pass when woken, until `stop`."""
        self.api.cache.on_change = self.kick
        self.api.cache.start()
        try:
            while not stop.is_set():
                self._kick.clear()
                try:
                    self.step()
                    self.stats.last_error = ""
                except (MeshError, EtcdError, OSError) as e:
                    self._fail(str(e))
                except Exception as e:  # noqa: BLE001 - a write met the API away (lightkube, httpx): next wake
                    self._fail(f"{type(e).__name__}: {e}")
                self._kick.wait(defaults.SERVICES_RESYNC_S if not self.stats.last_error else 1.0)
        finally:
            self.api.cache.stop()

    def _fail(self, msg: str) -> None:
        self.stats.errors += 1
        if msg != self.stats.last_error:
            log.warning("mcs: %s", msg)
        self.stats.last_error = msg
        self._published = None

    def step(self) -> None:
        """One pass (see the module docstring)."""
        remotes = self.admitted()
        if remotes is None:
            return  # the cache has not admitted anything yet: nothing is known to be gone
        if not self.api.cache.synced():
            if errors := self.api.cache.errors():
                raise MeshError(errors)
            return  # the informers wake it once they have listed
        view = self.api.read()
        local = local_exports(self.cluster, view.exports, view.services, view.slices)
        records = self.remotes.mirrors()
        names = {r.topology.cluster.name for r in remotes}
        held = {r.topology.cluster.name: r.nodes for r in remotes}
        cidrs = {r.topology.cluster.name: r.topology.mesh.global_cidrs for r in remotes}
        remote, rejected = admit_records(remote_records(records, names, MCS_EXPORTS), held, cidrs,
                                         parse_export_record, MCS_EXPORTS)
        imports = merge_all([*local.published.values(), *remote])
        undecided = self.remotes.undecided()
        desired = self._write_kubernetes(view, imports, undecided)
        missing: dict[tuple[str, str], list[str]] = {}
        for rec in remote_records(records, names, MCS_MISSING):
            if rec.key_cluster == rec.source:
                missing.setdefault((rec.namespace, rec.name), []).append(rec.source)
        self._publish(local.published.values(), desired)
        conditions = export_conditions(local, imports, missing)
        for ex in view.exports:
            ref = ref_of(ex)
            want = conditions.get(ref)
            have = (ex.get("status") or {}).get("conditions") or []
            if want is None or same_conditions(have, want):
                continue
            self._count(self.api.set_status("serviceexport", ref[0], ref[1],
                                            {"conditions": with_times(have, want, _now())}))
        self.stats.rejections = rejected
        for r in rejected:
            self._log(f"rejected {r.name}: {r.reason}")
        self.stats.passes += 1

    def _write_kubernetes(self, view: McsView, imports: Mapping[tuple[str, str], Import],
                          undecided: frozenset[str]) -> Any:
        derived = {ref_of(s): s for s in view.services if owned(s)}
        ips = {(ns, str((s.get("metadata") or {}).get("labels", {}).get(MCS_SERVICE_NAME_LABEL))): cluster_ips(s)
               for (ns, _), s in derived.items()}
        want = desired_objects(self.cluster, imports, view.namespaces, ips)
        svc_changes = _no_deletes_while(undecided, object_changes(view.services, want.services, owned=owned,
                                                                  same=same_service))
        if svc_changes:
            n, failed, made = self.api.apply_services(svc_changes, derived)
            self._wrote(n, failed)
            for (ns, name), addrs in made.items():
                obj = want.services.get((ns, name))
                if obj is not None:
                    ips[(ns, obj["metadata"]["labels"][MCS_SERVICE_NAME_LABEL])] = addrs
            want = desired_objects(self.cluster, imports, view.namespaces, ips)
        imp_changes = _no_deletes_while(undecided, object_changes(view.imports, want.imports, owned=owned,
                                                                  same=same_import))
        if imp_changes:
            self._wrote(*self.api.apply_imports(imp_changes))
        have_status = {ref_of(i): (i.get("status") or {}) for i in view.imports}
        for ref, status in want.statuses.items():
            if have_status.get(ref, {}).get("clusters") != status["clusters"]:
                self._count(self.api.set_status("serviceimport", ref[0], ref[1], status))
        sl_changes = slice_changes(view.slices, want.slices, keep=undecided, managed_by=MCS_MANAGED_BY,
                                   source_label="multicluster.kubernetes.io/source-cluster")
        if sl_changes:
            self._wrote(*self.api.apply_slices(sl_changes))
        if sl_changes or imp_changes or svc_changes:
            log.info("mcs: %d import(s), %d derived service(s), %d slice(s) written or deleted",
                     len(imp_changes.creates) + len(imp_changes.updates) + len(imp_changes.deletes),
                     len(svc_changes.creates) + len(svc_changes.updates) + len(svc_changes.deletes),
                     len(sl_changes.creates) + len(sl_changes.updates) + len(sl_changes.deletes))
        key = (tuple(sorted(imports.items(), key=lambda t: t[0])),
               tuple(sorted((k, tuple(v)) for k, v in ips.items())), tuple(sorted(want.imports)))
        if key != self._zone_key:
            self._zone_key = key
            self._serial += 1
            self.zone(clusterset_zone(imports, ips, want.imports.keys(), self._serial))
        return want

    def _publish(self, exports: Collection[Export], desired: Any) -> None:
        """This cluster's exports and its missing namespaces, in its etcd: what differs."""
        want = {mcs_key(MCS_EXPORTS, self.cluster, e.namespace, e.name): json.dumps(e.to_record(), sort_keys=True)
                .encode() for e in exports}
        for ns, name in desired.missing:
            want[mcs_key(MCS_MISSING, self.cluster, ns, name)] = json.dumps(
                {"cluster": self.cluster, "namespace": ns, "name": name,
                 "reason": f"namespace {ns} does not exist in cluster {self.cluster}"}, sort_keys=True).encode()
        now = time.monotonic()
        if self._published is None or now >= self._full_due:
            kvs, _ = self.etcd.range(mcs_prefix(self.cluster), prefix=True)
            self._published = {kv.key: kv.value for kv in kvs}
            self._full_due = now + defaults.SERVICES_FULL_SYNC_S
        puts, deletes = cache_changes(want, self._published)
        if puts:
            self.etcd.put_many(puts)
        for k in deletes:
            self.etcd.delete(k)
        if puts or deletes:
            log.info("mcs: %d record(s) published, %d withdrawn", len(puts), len(deletes))
        self._published = want

    def _wrote(self, n: int, failed: list[str]) -> None:
        self.stats.writes += n
        self.stats.errors += len(failed)
        for f in failed:
            self._log(f)

    def _count(self, failed: str | None) -> None:
        if failed is None:
            self.stats.writes += 1
        else:
            self._wrote(0, [failed])

    def _log(self, msg: str) -> None:
        if msg not in self._logged:
            log.warning("mcs: %s", msg)
            self._logged.add(msg)
            if len(self._logged) > 1000:
                self._logged.clear()
