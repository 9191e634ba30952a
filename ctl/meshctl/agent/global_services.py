# SPDX-License-Identifier: Apache-2.0
"""Global services, the agent's step: one elected agent per cluster (a Kubernetes Lease,
backends.kube.services.LeaseElector) publishes the ready endpoints of the cluster's global Services
to its etcd and writes, for every other cluster's admitted endpoints, the EndpointSlices of the
Service of the same namespace and name.

Data flows as for nodes: Kubernetes objects and the remote clusters' mirrored records ->
mesh.services (local_services, admit_services, desired_slices, slice_changes: pure) -> the writes
that differ. The remote records come from the cluster-mesh watcher's mirrors (no watch of its own);
a remote cluster's endpoints are admitted against that cluster's nodes as the last reconcile pass
admitted them, so they go with its nodes: when the cluster goes, or when its nodes' grace ends.

The elected agent reads Kubernetes through informers (backends.kube.services.ServiceCache: one LIST
of Services, EndpointSlices, ServiceExports and ServiceImports each, then a WATCH), started when it
wins the Lease and stopped (their memory given back) when it loses it. A pass runs when something
woke it: an event of those kinds, a remote cluster's records, the reconcile pass admitting other
remote nodes; and every defaults.SERVICES_RESYNC_S. It says what it found (the global Services, the
rejected records, the Multi-Cluster Services counts) in the cluster's etcd
(backends.etcd.services_status_key). Every other agent watches that one key and shows it in
`status`: at 500 nodes a follower that listed Services and EndpointSlices itself cost the API
server 1,000 LISTs a second of every object of the cluster, and each follower the memory of them.
The thread never lets one bad record stop the others.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol

from meshctl import defaults
from meshctl.backends.base import RecordMirror
from meshctl.backends.etcd import (
    MCS_EXPORTS,
    cluster_prefix,
    remote_records,
    service_key,
    services_prefix,
    services_status_key,
)
from meshctl.backends.kube.services import KubeServiceApi, LeaseElector, ServiceCache
from meshctl.backends.remote_status import (
    ClusterSetStatus,
    GlobalServiceStatus,
    ImportStatus,
    Rejected,
    RemotesStatus,
)
from meshctl.errors import MeshError
from meshctl.etcd import EtcdClient
from meshctl.etcd.client import Compacted, EtcdError, WatchIdle
from meshctl.mesh.admit import Rejection
from meshctl.mesh.mcs import import_endpoints
from meshctl.mesh.model import Topology
from meshctl.mesh.segments import Remote
from meshctl.mesh.services import (
    GlobalService,
    LocalServices,
    admit_services,
    desired_slices,
    local_services,
    slice_changes,
)
from meshctl.worker import Worker

log = logging.getLogger("meshctl.globalsvc")


class MirroredRemotes(Protocol):
    """The cluster-mesh watcher (backends.clustermesh.RemoteClusters), as this step reads it."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def admit(self, local: Topology) -> tuple[list[Remote], list[Rejection]]: ...

    def report(self) -> RemotesStatus: ...

    def mirrors(self) -> Mapping[str, RecordMirror]: ...


def pending_clusters(mirrors: Mapping[str, RecordMirror], admitted: Collection[str]) -> set[str]:
    """Configured remote clusters whose view has not arrived yet (never listed): their slices,
    written before this agent started, stay until it does."""
    return {n for n, m in mirrors.items() if n not in admitted and not m.snapshot().revision}


class PublishedStatus:
    """The elected agent's status record (backends.etcd.services_status_key), as a follower holds
    it: read once, then a watch of that one key in the cluster's etcd, from a thread of its own
    between `start` and `stop`; `changed()` after each new value."""

    def __init__(self, etcd: EtcdClient, key: Callable[[], str], changed: Callable[[], None]) -> None:
        self.etcd, self.key, self.changed = etcd, key, changed
        self._value: bytes | None = None
        self._worker = Worker(self._run, "global-services-status")
        self.error = ""

    def value(self) -> bytes | None:
        return self._value

    @property
    def running(self) -> bool:
        return self._worker.running

    def start(self) -> None:
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop(interrupt=self.etcd.abort_watch)

    def _set(self, value: bytes | None) -> None:
        if value != self._value:
            self._value = value
            self.changed()

    def _run(self, stop: threading.Event) -> None:
        rev, backoff = 0, 0.1
        while not stop.is_set():
            try:
                if not rev:
                    kvs, rev = self.etcd.range(self.key())
                    self._set(kvs[0].value if kvs else None)
                for r, events in self.etcd.watch(self.key(), start_revision=rev + 1):
                    if stop.is_set():
                        return
                    for e in events:
                        self._set(None if e.type == "DELETE" else e.kv.value)
                    rev, backoff, self.error = max(rev, r), 0.1, ""
            except WatchIdle:
                continue  # watch again from `rev`
            except Compacted:
                rev = 0  # read it again
            except EtcdError as e:
                if stop.is_set():
                    return
                if self.error != str(e):
                    log.warning("global services: following the elected agent's status: %s", e)
                self.error, rev = str(e), 0
                stop.wait(backoff)
                backoff = min(backoff * 2, 2.0)


def status_record(leader: str, services: tuple[GlobalServiceStatus, ...], rejected: tuple[Rejected, ...],
                  clusterset: ClusterSetStatus | None) -> str:
    """What the elected agent says in the cluster's etcd (`parse_status_record` reads it)."""
    return json.dumps({"leader": leader, "services": [s.to_json() for s in services],
                       "service_rejections": [r.to_json() for r in rejected],
                       "clusterset": clusterset.to_json() if clusterset is not None else None}, sort_keys=True)


def parse_status_record(raw: bytes | None) -> tuple[str | None, tuple[GlobalServiceStatus, ...], tuple[Rejected, ...],
                                                   ClusterSetStatus | None]:
    """A status record as `status_record` wrote it; nothing known for a missing or unreadable one
    (it is status only, written by the cluster's own agents)."""
    try:
        doc = json.loads(raw) if raw else {}
        return (doc.get("leader") or None, tuple(GlobalServiceStatus.from_json(s) for s in doc.get("services") or ()),
                tuple(Rejected.from_json(r) for r in doc.get("service_rejections") or ()),
                ClusterSetStatus.from_json(doc["clusterset"]) if doc.get("clusterset") else None)
    except (ValueError, TypeError, AttributeError) as e:
        log.warning("global services: the elected agent's status record is unreadable: %s", e)
        return None, (), (), None


class GlobalServices:
    """The step. `cluster` gives the local cluster's name (it may come from the ConfigMap);
    `cache` is read while this agent leads."""

    def __init__(self, cluster: Callable[[], str], api: KubeServiceApi, elector: LeaseElector, etcd: EtcdClient,
                 remotes: MirroredRemotes, cache: ServiceCache, *, clock: Callable[[], float] = time.monotonic,
                 resync: float = defaults.SERVICES_RESYNC_S) -> None:
        self.cluster = cluster
        self.api = api
        self.elector = elector
        self.etcd = etcd
        self.remotes = remotes
        self.cache = cache
        cache.on_change = self.kick
        self.feed = PublishedStatus(etcd, lambda: services_status_key(self.cluster()), self.kick)
        self.clock = clock
        self.resync = resync
        self._lock = threading.Lock()
        self._admitted: dict[str, Remote] | None = None  # None until the first pass admitted
        self._published: dict[str, str] | None = None  # what our etcd holds, as last written or read
        self._status_written: str | None = None  # the status record as last written
        self._full_due = 0.0
        self._pass_due = 0.0
        self._dirty = True
        self._services: tuple[tuple[GlobalServiceStatus, ...], tuple[Rejected, ...], str | None] = ((), (), None)
        self._clusterset: ClusterSetStatus | None = None
        self._logged: set[str] = set()
        # passes: of the elected agent; decided: those that knew the admitted remote clusters (and
        # so decided which slices go)
        self.stats = {"record_puts": 0, "record_deletes": 0, "slice_writes": 0, "errors": 0, "passes": 0,
                      "decided": 0}
        self.last_write: float | None = None
        self._kick = threading.Event()
        # Called when what `report`'s summary says changed (which global Services, the rejections,
        # the Multi-Cluster Services): the agent's loop takes the status block at a pass (agent.run
        # wires this to its wake); endpoint counts alone wait for the next pass.
        self.report_changed: Callable[[], None] | None = None

    def kick(self) -> None:
        """Run a pass now: something it reads changed (an informer's event, a remote mirror's
        records, the admitted remote nodes, the elected agent's status record)."""
        self._dirty = True
        self._kick.set()

    # --- fed by the reconcile pass ------------------------------------------------------------

    def set_admitted(self, remotes: list[Remote]) -> None:
        admitted = {r.topology.cluster.name: r for r in remotes}
        with self._lock:
            changed, self._admitted = admitted != self._admitted, admitted
        if changed:
            self.kick()

    # --- the thread ----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                try:
                    self.step()
                except Exception as e:  # noqa: BLE001 - the API or etcd away: try again next tick
                    self.stats["errors"] += 1
                    self._log(logging.WARNING, f"global services: {e}")
                    self._published = self._status_written = None
                    self._dirty = True
                if stop.is_set():
                    break
                self._kick.wait(self._wait())
                self._kick.clear()
        finally:
            self.elector.release()
            self.cache.stop()
            self.feed.stop()

    def _wait(self) -> float:
        """Until the Lease wants renewing (or trying), or the next resync pass; anything else
        wakes the thread by `kick` (the informers' first lists too)."""
        if not (self.elector.leading and self.cache.synced()):
            return self.elector.retry
        return max(0.05, min(self.elector.retry, self._pass_due - self.clock()))

    def step(self) -> None:
        """Elect; the elected agent passes (when woken, or every resync), the others follow its
        status record."""
        leading = self.elector.tick()
        if not leading:
            self._follow()
            return
        if self.feed.running:
            self.feed.stop()
        if not self.cache.running:
            self.cache.start()  # lists each kind once, then watches; a relist kicks us
            self._dirty = True
        if not self.cache.synced():
            if errors := self.cache.errors():
                raise MeshError(errors)
            return
        now = self.clock()
        if not self._dirty and now < self._pass_due:
            return
        self._dirty, self._pass_due = False, now + self.resync
        self._pass()

    def _follow(self) -> None:
        """Not elected: no informer (their memory goes back), the elected agent's status record."""
        if self.cache.running:
            self.cache.stop()
            self._published = self._status_written = None
        self.feed.start()
        leader, services, rejected, clusterset = parse_status_record(self.feed.value())
        self._set_view(services, rejected, self.elector.holder or leader, clusterset)

    def _pass(self) -> None:
        """One pass of the elected agent: read (the informers' caches), publish, admit, write the
        slices, say what it found."""
        self.stats["passes"] += 1
        cluster = self.cluster()
        services, slices = self.cache.services.items(), self.cache.slices.items()
        local = local_services(cluster, services, slices)
        self._publish(cluster, local)
        with self._lock:
            admitted = dict(self._admitted) if self._admitted is not None else None
        mirrors = self.remotes.mirrors()
        records = remote_records(mirrors, admitted or {})
        held = {name: r.nodes for name, r in (admitted or {}).items()}
        remote, rejected = admit_services(records, held, {name: r.topology.mesh.global_cidrs
                                                          for name, r in (admitted or {}).items()})
        want = desired_slices(local, remote)
        for r in [*local.rejections, *rejected]:
            self._log(logging.WARNING, f"global services: rejected {r.name}: {r.reason}")
        rows = self._rows(local, remote)
        refused = tuple(Rejected(r.name, r.reason) for r in [*local.rejections, *rejected])[:50]
        clusterset = self._count_clusterset(slices, mirrors, admitted or {})
        self._set_view(rows, refused, self.elector.holder, clusterset)  # what the writes below make true
        if admitted is not None:  # before the first pass, nothing is known to be gone
            self.stats["decided"] += 1
            changes = slice_changes(slices, want, keep=pending_clusters(mirrors, admitted))
            if changes:
                n, failed = self.api.apply(changes, self.cache.written(self.cache.slices))
                self.stats["slice_writes"] += n
                self.stats["errors"] += len(failed)
                for f in failed:
                    self._log(logging.WARNING, f"global services: {f}")
                self.last_write = time.time()
                log.info("global services: %d slice(s) created, %d replaced, %d deleted", len(changes.creates),
                         len(changes.updates), len(changes.deletes))
        record = status_record(self.elector.me, rows, refused, clusterset)
        if record != self._status_written:
            self.etcd.put(services_status_key(cluster), record)
            self._status_written = record

    def _count_clusterset(self, slices: list[dict[str, Any]], mirrors: Mapping[str, RecordMirror],
                          admitted: Collection[str]) -> ClusterSetStatus | None:
        """This cluster's ServiceExports and ServiceImports (with the endpoints of each exporting
        cluster), and each remote cluster's published exports: none where the MCS CRDs are not
        served."""
        exports, imports = self.cache.present(self.cache.exports), self.cache.present(self.cache.imports)
        if exports is None and imports is None:
            return None
        return ClusterSetStatus(len(exports or ()), tuple(
            ImportStatus(ref[0], ref[1], typ, ips, eps)
            for ref, typ, ips, eps in import_endpoints(imports or [], slices)),
            {n: len(m.records_under(f"{cluster_prefix(n)}{MCS_EXPORTS}/")) for n, m in sorted(mirrors.items())
             if n in admitted})

    def _publish(self, cluster: str, local: LocalServices) -> None:
        """Put the records that differ and delete ours that no Service wants any more."""
        desired = {service_key(cluster, s.namespace, s.name): json.dumps(s.to_record(), sort_keys=True)
                   for s in local.published.values()}
        now = self.clock()
        if self._published is None or now >= self._full_due:
            kvs, _ = self.etcd.range(services_prefix(cluster), prefix=True)
            self._published = {kv.key: kv.value.decode(errors="replace") for kv in kvs}
            self._full_due = now + defaults.SERVICES_FULL_SYNC_S
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

    @staticmethod
    def _rows(local: LocalServices, remote: list[GlobalService]) -> tuple[GlobalServiceStatus, ...]:
        by_ref: dict[tuple[str, str], dict[str, int]] = {}
        for s in remote:
            if (s.namespace, s.name) in local.settings:
                by_ref.setdefault((s.namespace, s.name), {})[s.cluster] = len(s.endpoints)
        rows = []
        for ref, st in sorted(local.settings.items()):
            pub = local.published.get(ref)
            rows.append(GlobalServiceStatus(ref[0], ref[1], st.shared, st.affinity,
                                            len(pub.endpoints) if pub else 0, by_ref.get(ref, {})))
        return tuple(rows)

    def _set_view(self, rows: tuple[GlobalServiceStatus, ...], rejected: tuple[Rejected, ...], leader: str | None,
                  clusterset: ClusterSetStatus | None) -> None:
        """What `report` says from now on; the agent's loop is woken when its summary changed."""
        def summary(rows: tuple[GlobalServiceStatus, ...], rejected: tuple[Rejected, ...],
                    clusterset: ClusterSetStatus | None) -> Any:
            return [(s.namespace, s.name, s.shared, s.affinity) for s in rows], rejected, clusterset

        with self._lock:
            before = summary(*self._services[:2], self._clusterset)
            self._services, self._clusterset = (rows, rejected, leader), clusterset
        if summary(rows, rejected, clusterset) != before and self.report_changed is not None:
            self.report_changed()

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
        self._worker = Worker(services.run, "global-services")

    def start(self) -> None:
        self.remotes.start()
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop(interrupt=self.services.kick)
        self.remotes.stop()

    def admit(self, local: Topology) -> tuple[list[Remote], list[Rejection]]:
        remotes, rejections = self.remotes.admit(local)
        self.services.set_admitted(remotes)
        return remotes, rejections

    def report(self) -> RemotesStatus:
        return self.services.report(self.remotes.report())
