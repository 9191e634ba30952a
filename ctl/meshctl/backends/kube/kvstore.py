# SPDX-License-Identifier: Apache-2.0
"""`--kvstore`: a Kubernetes cluster's nodes mirrored into an etcd, so other clusters' agents can
join it in a cluster mesh (they read it with `backends.clustermesh.RemoteClusters`, the same way
they read a cluster that runs the etcd backend).

Layout: exactly that of `backends.etcd` (docs/agent.md):

    /meshctl/<cluster>/cluster        {"name", "id", "subnet"}       from the ConfigMap (or flags)
    /meshctl/<cluster>/mesh           records.mesh_to_record
    /meshctl/<cluster>/nodes/<name>   records.node_to_record        the ADMITTED nodes, leaders
                                                                     with their WireGuard address
    /meshctl/<cluster>/forwarding/<name>  leaders.ForwardingReport  the admitted nodes' reports
                                                                     (ConfigMaps meshctl-forwarding-*)
    /meshctl/<cluster>/writer         the node whose agent writes    on that agent's lease

One writer per cluster, chosen by etcd: the agent that creates the `writer` key on its lease
writes; the others look again every lease TTL and take over when the key has expired with its
writer (or was released by a writer that stopped). Why one writer, not every agent its own record:
a remote cluster derives the segments and WireGuard addresses from the WHOLE record set (the
i-th segment gets the subnet's address i+1), so the set must be the one the local agents plan
with, written from one view; and a node whose agent cannot reach that etcd must not vanish
from the other clusters while it works at home. Node records carry no lease: when the writer
dies they stay (remote routes keep working) until the next writer corrects them. A writer whose
Kubernetes view is not ready stops writing and resigns, so a fresher agent takes over.

`mirror_records` is the pure part (a ClusterState in, the keys and values out);
`KvstoreMirror` compares them with etcd and writes only what differs.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from meshctl.backends.base import ClusterState, KvstoreStatus
from meshctl.backends.etcd import (
    ROOT,
    cluster_key,
    cluster_prefix,
    cluster_record,
    forwarding_key,
    forwarding_prefix,
    mesh_key,
    node_key,
)
from meshctl.errors import InputError
from meshctl.etcd import EtcdClient, EtcdError
from meshctl.mesh import admit, records
from meshctl.mesh.leaders import choose_leaders, with_leaders
from meshctl.mesh.model import Topology
from meshctl.mesh.segments import segments

log = logging.getLogger("meshctl.kube.kvstore")


def writer_key(cluster: str) -> str:
    return f"{ROOT}/{cluster}/writer"


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def mirror_records(state: ClusterState) -> dict[str, str]:
    """What etcd should hold for `state`: the cluster and mesh records, one record per node that
    the cluster's own agents admit (admit.admit_nodes, in the state's order) and those nodes'
    forwarding reports, so other clusters choose this cluster's leaders from the facts its own
    agents choose them from. A segment's leader (chosen from those reports, mesh.leaders) carries the
    segment's WireGuard address, as its own agent's plan gives it."""
    admitted, _ = admit.admit_nodes(state.nodes, state.mesh.subnets, allow_default_route=state.mesh.allow_default_route)
    try:
        topo = Topology(state.cluster, state.mesh, tuple(admitted))
        led = with_leaders(topo, choose_leaders(topo, state.forwarding))
        wg_of = {s.leader.name: s.addresses for s in segments(led)}
    except InputError:
        wg_of = {}  # a subnet too small for the segments: the records go out without addresses
    name = state.cluster.name
    out = {
        cluster_key(name): _dumps(cluster_record(state.cluster, state.mesh)),
        mesh_key(name): _dumps(records.mesh_to_record(state.mesh)),
    }
    for n in admitted:
        wgs = wg_of.get(n.name, ())
        out[node_key(name, n.name)] = _dumps(records.node_to_record(
            replace(n, wireguard_ip=wgs[0] if wgs else None, wireguard_ips=wgs)))
        report = state.forwarding.get(n.name)
        if report is not None:
            out[forwarding_key(name, n.name)] = _dumps(report.to_json())
    return out


def _same(have: bytes | None, want: str) -> bool:
    if have is None:
        return False
    try:
        return bool(json.loads(have) == json.loads(want))
    except ValueError:
        return False


def record_changes(have: Mapping[str, bytes], desired: Mapping[str, str], cluster: str
                   ) -> tuple[list[tuple[str, str]], list[str]]:
    """(puts, deletes) that turn `have` (every key under the cluster's prefix) into `desired`.
    Values compare as JSON, so another writer's formatting is no change; only node records and
    forwarding reports are ever deleted (peers and the writer key are not the mirror's)."""
    puts = [(k, v) for k, v in sorted(desired.items()) if not _same(have.get(k), v)]
    mirrored = (cluster_prefix(cluster) + "nodes/", forwarding_prefix(cluster))
    deletes = sorted(k for k in have if k.startswith(mirrored) and k not in desired)
    return puts, deletes


class KvstoreMirror:
    """Mirrors the latest offered ClusterState into etcd while this agent holds the writer key.

    `offer` is cheap and called from the backend's snapshot; `run` does the etcd work in its own
    thread, so a slow or absent etcd never delays the agent's reconcile."""

    def __init__(self, client: EtcdClient, node_name: str, *, lease_ttl: int = 10,
                 full_sync_seconds: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.node_name = node_name
        self.lease_ttl = lease_ttl
        self.full_sync_seconds = full_sync_seconds
        self.clock = clock
        self._state: ClusterState | None = None
        self._wake = threading.Event()
        self._lease = 0
        self._lease_due = 0.0
        self._check_due = 0.0
        self._full_due = 0.0
        self._synced: dict[str, str] | None = None
        self._cluster = ""
        self._logged = ""
        self.writing = False
        self.writer: str | None = None
        self.stats = {"puts": 0, "deletes": 0, "errors": 0, "takeovers": 0}

    # --- called by the backend ------------------------------------------------------------------

    def offer(self, state: ClusterState) -> None:
        self._state = state
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """Until `stop`: take the writer key when it is free, mirror while holding it; on the way
        out, release it so another agent takes over at once."""
        try:
            while not stop.is_set():
                self._wake.wait(timeout=max(0.2, self.lease_ttl / 3))
                self._wake.clear()
                if stop.is_set():
                    break
                try:
                    self.step()
                except EtcdError as e:
                    self.stats["errors"] += 1
                    self._log(logging.WARNING, f"kvstore: {e}")
                    self._synced = None  # etcd may have lost or been restored: compare again
        finally:
            self.release()
            self.client.close()

    def status(self) -> KvstoreStatus:
        return KvstoreStatus(self.writing, self.writer, self._lease, **self.stats)

    # --- one pass -----------------------------------------------------------------------------

    def step(self) -> None:
        st = self._state
        if st is None:
            return
        if not st.ready:
            if self.writing:
                self._log(logging.WARNING, f"kvstore: resigning as writer, the Kubernetes view is not ready "
                                           f"({st.reason})")
                self.release()
            return
        if self._cluster and self._cluster != st.cluster.name:
            self.release()  # the cluster was renamed: the writer key of the new name is to be taken
        self._cluster = st.cluster.name
        if not self._hold():
            return
        desired = mirror_records(st)
        now = self.clock()
        if desired == self._synced and now < self._full_due:
            return
        kvs, _ = self.client.range(cluster_prefix(st.cluster.name), prefix=True)
        puts, deletes = record_changes({kv.key: kv.value for kv in kvs}, desired, st.cluster.name)
        if puts:
            self.client.put_many(puts)
        for k in deletes:
            self.client.delete(k)
        self.stats["puts"] += len(puts)
        self.stats["deletes"] += len(deletes)
        if puts or deletes:
            log.info("kvstore: %d record(s) written, %d deleted for cluster %s", len(puts), len(deletes),
                     st.cluster.name)
        self._synced = desired
        self._full_due = now + self.full_sync_seconds

    def _hold(self) -> bool:
        """Keep (or try to take) the writer key; True while this agent is the writer."""
        now = self.clock()
        key = writer_key(self._cluster)
        if self.writing:
            if now < self._lease_due:
                return True
            if self.client.lease_keepalive(self._lease) > 0:
                self._lease_due = now + self.lease_ttl / 3
                return True
            self._log(logging.WARNING, f"kvstore: writer lease {self._lease:x} expired; trying to write again")
            self.writing, self._lease, self._synced = False, 0, None
        if now < self._check_due:
            return False
        self._check_due = now + self.lease_ttl
        kv = self.client.get(key)
        if kv is not None and kv.value.decode(errors="replace") != self.node_name:
            self.writer = kv.value.decode(errors="replace")
            return False
        if not self._lease or self.client.lease_keepalive(self._lease) <= 0:
            self._lease = self.client.lease_grant(self.lease_ttl)
        if kv is None:
            won = self.client.put_if_absent(key, self.node_name, lease=self._lease)
        else:
            # Our own name on an older lease: this node's previous agent (a restart). Take it over.
            self.client.put(key, self.node_name, lease=self._lease)
            won = True
        if not won:
            return False
        self.writing, self.writer, self._synced = True, self.node_name, None
        self._lease_due = now + self.lease_ttl / 3
        self.stats["takeovers"] += 1
        log.info("kvstore: %s writes cluster %s's records (lease %x)", self.node_name, self._cluster, self._lease)
        return True

    def release(self) -> None:
        """Give up the writer key now (revoking the lease deletes it)."""
        lease, self._lease = self._lease, 0
        self.writing, self._synced = False, None
        if lease:
            try:
                self.client.lease_revoke(lease)
            except EtcdError as e:
                log.debug("kvstore: revoking lease %x: %s", lease, e)

    def _log(self, level: int, msg: str) -> None:
        if msg != self._logged:
            log.log(level, "%s", msg)
            self._logged = msg
