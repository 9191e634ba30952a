# SPDX-License-Identifier: Apache-2.0
"""`meshctl clustermesh cache`, the imperative part: one watch per remote cluster, the admitted
records written into the local etcd's cache prefix (layout and rules: backends.clustermesh_cache).

The cache admits exactly as agents do (`RemoteClusters.admit` against the local cluster's records,
read from the local etcd), so what it writes is what agents would install; agents admit it again
on read. Each pass compares what the prefix should hold with what it holds and writes only the
difference; a heartbeat on a short lease says which clusters it serves.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from meshctl.backends.clustermesh import ReadOnlyEtcdBackend, RemoteClusters
from meshctl.backends.clustermesh_cache import (
    HEARTBEAT_SECONDS,
    HEARTBEAT_TTL,
    cache_changes,
    cache_prefix,
    cache_status_key,
    desired_cache,
    heartbeat,
)
from meshctl.etcd import EtcdClient, EtcdError
from meshctl.mesh.model import Cluster
from meshctl.mesh.segments import Remote

log = logging.getLogger("meshctl.clustermesh.cache")


class ClusterMeshCache:
    """The cache of cluster `local`: `connect` opens a client to its etcd as the cache's user."""

    def __init__(self, connect: Callable[[], EtcdClient], local: Cluster, directory: Path, state_dir: Path,
                 *, poll: float = 0.5, lapse_grace: float = 0.0) -> None:
        self.local = local
        # The remote clusters as the last pass admitted them (None before it), and who hears of
        # each pass (the Multi-Cluster Services controller, backends.kube.mcs_controller).
        self.admitted: list[Remote] | None = None
        self.on_pass: Callable[[], None] | None = None
        self.client = connect()
        self._wake = threading.Event()
        self._local = ReadOnlyEtcdBackend(connect(), local)
        # A remote node whose lease ran out stays in the cache for `lapse_grace` (the mirrored
        # records carry no lease: agents drop them when the cache does), as agents keep it.
        self.remotes = RemoteClusters(directory, local, changed=self._wake.set, poll=poll,
                                      cache_dir=state_dir / "clustermesh", lapse_grace=lapse_grace)
        self._written: dict[str, bytes] | None = None
        self._lease = 0
        self._beaten: dict[str, tuple[bool, str]] | None = None
        self._beat_at = 0.0
        self.passes = 0
        self.last_error = ""

    def run(self, stop: threading.Event) -> None:
        """Mirror until `stop` is set; the mirrored records stay behind (agents keep routing)."""
        threading.Thread(target=self._local.run, args=(stop, self._wake.set), name="cache-local", daemon=True).start()
        self.remotes.start()
        try:
            while not stop.is_set():
                self._wake.wait(HEARTBEAT_SECONDS)
                self._wake.clear()
                try:
                    self.sync_once()
                    self.last_error = ""
                except EtcdError as e:
                    if str(e) != self.last_error:
                        log.warning("cache: %s", e)
                    self.last_error = str(e)
                    self._written, self._lease = None, 0
                    stop.wait(0.2)
        finally:
            self.remotes.stop()
            if self._lease:
                with contextlib.suppress(EtcdError):
                    self.client.lease_revoke(self._lease)

    def sync_once(self) -> None:
        """One pass: admit, write what differs, beat. Nothing is written before the local view
        has been listed (admitting against an empty local cluster would let anything in)."""
        local = self._local.snapshot()
        if not local.ready and local.revision == 0:
            return
        admitted, _ = self.remotes.admit(local.topology())
        self.admitted = admitted
        if self.on_pass is not None:
            self.on_pass()
        status = self.remotes.status()
        if self._written is None:
            kvs, _ = self.client.range(cache_prefix(self.local.name), prefix=True)
            self._written = {kv.key: kv.value for kv in kvs if kv.key != cache_status_key(self.local.name)}
        want = desired_cache(self.local.name, {r.topology.cluster.name: r.admitted for r in admitted},
                             self.remotes.records(), self.remotes.undecided(), self._written)
        puts, deletes = cache_changes(want, self._written)
        for key, value in puts:
            self.client.put(key, value)
            self._written[key] = value
        for key in deletes:
            self.client.delete(key)
            self._written.pop(key, None)
        if puts or deletes:
            log.info("cache: %d record(s) written, %d deleted", len(puts), len(deletes))
        self._beat({c["name"]: (bool(c["ready"]), str(c["reason"] or "")) for c in status["clusters"]})
        self.passes += 1

    def _beat(self, clusters: dict[str, tuple[bool, str]]) -> None:
        """Write the status key when what it says changed, or its last beat is a period old."""
        now = time.monotonic()
        if clusters == self._beaten and now - self._beat_at < HEARTBEAT_SECONDS * 0.9:
            return
        if not self._lease or self.client.lease_keepalive(self._lease) <= 0:
            self._lease = self.client.lease_grant(HEARTBEAT_TTL)
        self.client.put(cache_status_key(self.local.name), heartbeat(time.time(), clusters), lease=self._lease)
        self._beaten, self._beat_at = clusters, now
