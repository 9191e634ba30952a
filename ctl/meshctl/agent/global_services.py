# SPDX-License-Identifier: Apache-2.0
"""Global services, the agent's step: one elected agent per cluster (a Kubernetes Lease,
backends.kube.services.LeaseElector) publishes the ready endpoints of the cluster's global Services
to its etcd and writes, for every other cluster's admitted endpoints, the EndpointSlices of the
Service of the same namespace and name; every agent computes the same view for its status.

Data flows as for nodes: Kubernetes objects and the remote clusters' mirrored records ->
mesh.services (local_services, admit_services, desired_slices, slice_changes: pure) -> the writes
that differ. The remote records come from the cluster-mesh watcher's mirrors (no watch of its own);
a remote cluster's endpoints are admitted against that cluster's nodes as the last reconcile pass
admitted them, so they go with its nodes: when the cluster goes, or when its nodes' grace ends.
The step runs in its own thread every `interval` seconds (0.2 s while leading: slices follow a
remote change well within a second) and never lets one bad record stop the others.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

from meshctl.backends.base import RecordMirror
from meshctl.backends.etcd import (
    MCS_EXPORTS,
    cluster_prefix,
    parse_record,
    service_key,
    services_prefix,
    split_service_key,
)
from meshctl.backends.kube.services import KubeServiceApi, LeaseElector
from meshctl.backends.remote_status import (
    ClusterSetStatus,
    GlobalServiceStatus,
    ImportStatus,
    Rejected,
    RemotesStatus,
)
from meshctl.errors import InputError
from meshctl.etcd import EtcdClient
from meshctl.mesh.admit import Rejection
from meshctl.mesh.mcs import import_endpoints
from meshctl.mesh.model import Topology
from meshctl.mesh.segments import Remote
from meshctl.mesh.services import (
    MAX_SERVICE_RECORD_BYTES,
    GlobalService,
    LocalServices,
    RecordIn,
    admit_services,
    desired_slices,
    local_services,
    slice_changes,
)

log = logging.getLogger("meshctl.globalsvc")

LEADER_INTERVAL_S = 0.2
FOLLOWER_INTERVAL_S = 1.0
FULL_SYNC_S = 30.0
CLUSTERSET_READ_S = 5.0  # how often every agent counts ServiceExports and ServiceImports (status only: two lists)


class MirroredRemotes(Protocol):
    """The cluster-mesh watcher (backends.clustermesh.RemoteClusters), as this step reads it."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def admit(self, local: Topology) -> tuple[list[Remote], list[Rejection]]: ...

    def report(self) -> RemotesStatus: ...

    def mirrors(self) -> Mapping[str, RecordMirror]: ...


def remote_records(mirrors: Mapping[str, RecordMirror], admitted: Collection[str]) -> list[RecordIn]:
    """The service records of every admitted remote cluster (by name), as its mirror holds them
    (only its own prefix: the watcher mirrors nothing else), decoded under the size limit."""
    out = []
    for name, m in sorted(mirrors.items()):
        if name not in admitted:
            continue
        for kv in m.records_under(services_prefix(name)):
            parts = split_service_key(kv.key)
            if parts is None:
                continue
            try:
                doc, error = parse_record(kv, kv.key, MAX_SERVICE_RECORD_BYTES), None
            except InputError as e:
                doc, error = None, str(e)
            out.append(RecordIn(name, parts[0], parts[1], parts[2], kv.key, doc, error))
    return out


def pending_clusters(mirrors: Mapping[str, RecordMirror], admitted: Collection[str]) -> set[str]:
    """Configured remote clusters whose view has not arrived yet (never listed): their slices,
    written before this agent started, stay until it does."""
    return {n for n, m in mirrors.items() if n not in admitted and not m.snapshot().revision}


class GlobalServices:
    """The step. `cluster` gives the local cluster's name (it may come from the ConfigMap)."""

    def __init__(self, cluster: Callable[[], str], api: KubeServiceApi, elector: LeaseElector, etcd: EtcdClient,
                 remotes: MirroredRemotes, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.cluster = cluster
        self.api = api
        self.elector = elector
        self.etcd = etcd
        self.remotes = remotes
        self.clock = clock
        self._lock = threading.Lock()
        self._admitted: dict[str, Remote] | None = None  # None until the first pass admitted
        self._published: dict[str, str] | None = None  # what our etcd holds, as last written or read
        self._full_due = 0.0
        self._services: tuple[tuple[GlobalServiceStatus, ...], tuple[Rejected, ...], str | None] = ((), (), None)
        self._logged: set[str] = set()
        self.stats = {"record_puts": 0, "record_deletes": 0, "slice_writes": 0, "errors": 0}
        self.last_write: float | None = None
        self._kick = threading.Event()
        self._clusterset: ClusterSetStatus | None = None
        self._clusterset_due = 0.0
        # Called when what `report` says of the Multi-Cluster Services changed (the agent's loop
        # takes the status block at a pass: agent.run wires this to its wake).
        self.report_changed: Callable[[], None] | None = None

    def kick(self) -> None:
        """Run the next pass now (a remote mirror changed: its records reach the slices at once)."""
        self._kick.set()

    # --- fed by the reconcile pass ------------------------------------------------------------

    def set_admitted(self, remotes: list[Remote]) -> None:
        with self._lock:
            self._admitted = {r.topology.cluster.name: r for r in remotes}

    # --- the thread ----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    self.step()
                except Exception as e:  # noqa: BLE001 - the API or etcd away: try again next tick
                    self.stats["errors"] += 1
                    self._log(logging.WARNING, f"global services: {e}")
                    self._published = None
                if stop.is_set():
                    break
                self._kick.wait(LEADER_INTERVAL_S if self.elector.leading else FOLLOWER_INTERVAL_S)
                self._kick.clear()
        finally:
            self.elector.release()

    def step(self) -> None:
        """One pass: elect, read, publish (leader), admit, write slices (leader), record status."""
        leading = self.elector.tick()
        cluster = self.cluster()
        services, slices = self.api.services(), self.api.slices()
        local = local_services(cluster, services, slices)
        if leading:
            self._publish(cluster, local)
        with self._lock:
            admitted = dict(self._admitted) if self._admitted is not None else None
        mirrors = self.remotes.mirrors()
        records = remote_records(mirrors, admitted or {})
        held = {name: r.nodes for name, r in (admitted or {}).items()}
        remote, rejected = admit_services(records, held, {name: r.topology.mesh.global_cidrs
                                                          for name, r in (admitted or {}).items()})
        want = desired_slices(local, remote)
        if leading and admitted is not None:  # before the first pass, nothing is known to be gone
            changes = slice_changes(slices, want, keep=pending_clusters(mirrors, admitted))
            if changes:
                n, failed = self.api.apply(changes)
                self.stats["slice_writes"] += n
                self.stats["errors"] += len(failed)
                for f in failed:
                    self._log(logging.WARNING, f"global services: {f}")
                self.last_write = time.time()
                log.info("global services: %d slice(s) created, %d replaced, %d deleted", len(changes.creates),
                         len(changes.updates), len(changes.deletes))
        for r in [*local.rejections, *rejected]:
            self._log(logging.WARNING, f"global services: rejected {r.name}: {r.reason}")
        self._record(local, remote, [*local.rejections, *rejected])
        if self.clock() >= self._clusterset_due:
            self._clusterset_due = self.clock() + CLUSTERSET_READ_S
            self._count_clusterset(slices, mirrors, admitted or {})

    def _count_clusterset(self, slices: list[dict[str, Any]], mirrors: Mapping[str, RecordMirror],
                          admitted: Collection[str]) -> None:
        """This cluster's ServiceExports and ServiceImports (with the endpoints of each exporting
        cluster), and each remote cluster's published exports: none where the MCS CRDs are not
        served."""
        try:
            exports, imports = self.api.exports(), self.api.imports()
        except Exception as e:  # noqa: BLE001 - status only (an older install's RBAC): never the step's failure
            self._log(logging.WARNING, f"global services: cannot count ServiceExports and ServiceImports: {e}")
            exports = imports = None
        if exports is None and imports is None:
            cs = None
        else:
            cs = ClusterSetStatus(len(exports or ()), tuple(
                ImportStatus(ref[0], ref[1], typ, ips, eps)
                for ref, typ, ips, eps in import_endpoints(imports or [], slices)),
                {n: len(m.records_under(f"{cluster_prefix(n)}{MCS_EXPORTS}/")) for n, m in sorted(mirrors.items())
                 if n in admitted})
        with self._lock:
            changed, self._clusterset = cs != self._clusterset, cs
        if changed and self.report_changed is not None:
            self.report_changed()

    def _publish(self, cluster: str, local: LocalServices) -> None:
        """Put the records that differ and delete ours that no Service wants any more."""
        desired = {service_key(cluster, s.namespace, s.name): json.dumps(s.to_record(), sort_keys=True)
                   for s in local.published.values()}
        now = self.clock()
        if self._published is None or now >= self._full_due:
            kvs, _ = self.etcd.range(services_prefix(cluster), prefix=True)
            self._published = {kv.key: kv.value.decode(errors="replace") for kv in kvs}
            self._full_due = now + FULL_SYNC_S
        have = self._published
        puts = [(k, v) for k, v in sorted(desired.items()) if have.get(k) != v]
        deletes = sorted(k for k in have if k not in desired)
        if puts:
            self.etcd.put_many(puts)
        for k in deletes:
            self.etcd.delete(k)
        if puts or deletes:
            log.info("global services: %d record(s) published, %d withdrawn for cluster %s", len(puts),
                     len(deletes), cluster)
        self.stats["record_puts"] += len(puts)
        self.stats["record_deletes"] += len(deletes)
        self._published = desired

    def _record(self, local: LocalServices, remote: list[GlobalService], rejected: list[Rejection]) -> None:
        by_ref: dict[tuple[str, str], dict[str, int]] = {}
        for s in remote:
            if (s.namespace, s.name) in local.settings:
                by_ref.setdefault((s.namespace, s.name), {})[s.cluster] = len(s.endpoints)
        rows = []
        for ref, st in sorted(local.settings.items()):
            pub = local.published.get(ref)
            rows.append(GlobalServiceStatus(ref[0], ref[1], st.shared, st.affinity,
                                            len(pub.endpoints) if pub else 0, by_ref.get(ref, {})))
        with self._lock:
            self._services = (tuple(rows), tuple(Rejected(r.name, r.reason) for r in rejected)[:50],
                              self.elector.holder)

    def report(self, remotes: RemotesStatus) -> RemotesStatus:
        """`remotes` with this step's global Services, their rejected records and who publishes."""
        with self._lock:
            services, rejections, leader = self._services
            clusterset = self._clusterset
        return dataclasses.replace(remotes, services=services, service_rejections=rejections, services_leader=leader,
                                   clusterset=clusterset)

    def status(self) -> dict[str, Any]:
        """The step's part of the ClusterMesh block, as JSON."""
        st = self.report(RemotesStatus())
        return {"services": [s.to_json() for s in st.services],
                "service_rejections": [r.to_json() for r in st.service_rejections],
                "services_leader": st.services_leader}

    def _log(self, level: int, msg: str) -> None:
        if msg not in self._logged:
            log.log(level, "%s", msg)
            self._logged.add(msg)
            if len(self._logged) > 1000:
                self._logged.clear()


class MeshWithServices:
    """The cluster-mesh watcher with global services beside it (agent.loop.RemoteSource): the
    pass's admission feeds the step, the step's view joins the ClusterMesh status block, and the
    step's thread starts and stops with the watcher. Build the watcher with `changed` calling
    `kick` too (see agent.run.remotes_factory)."""

    def __init__(self, remotes: MirroredRemotes, services: GlobalServices) -> None:
        self.remotes = remotes
        self.services = services
        self._stop = threading.Event()
        self._thread = threading.Thread(target=services.run, args=(self._stop,), name="global-services",
                                        daemon=True)

    def start(self) -> None:
        self.remotes.start()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.services.kick()
        self._thread.join(5)
        self.remotes.stop()

    def admit(self, local: Topology) -> tuple[list[Remote], list[Rejection]]:
        remotes, rejections = self.remotes.admit(local)
        self.services.set_admitted(remotes)
        return remotes, rejections

    def report(self) -> RemotesStatus:
        return self.services.report(self.remotes.report())
