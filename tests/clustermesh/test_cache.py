# SPDX-License-Identifier: Apache-2.0
"""The cluster-mesh cache: what it writes (pure), when agents trust it (pure), and the whole loop
against real etcd servers on loopback: a cache for cluster1 mirroring cluster2, agents' watchers
reading it, falling back to cluster2's etcd when it stops, and coming back."""

from __future__ import annotations

import inspect
import json
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshctl.backends.clustermesh import RemoteClusters, summary_line, via_line
from meshctl.backends.clustermesh_cache import (
    HEARTBEAT_TTL,
    STALE_SECONDS,
    CacheUse,
    cache_changes,
    cache_health,
    cache_status_key,
    cached_key,
    desired_cache,
    heartbeat,
)
from meshctl.backends.clustermesh_mirror import ClusterMeshCache
from meshctl.backends.etcd import cluster_key, forwarding_key, mesh_key, node_key
from meshctl.etcd import EtcdClient, EtcdError
from meshctl.mesh.model import Cluster
from tests.plan.fixtures import key

from .fixtures import CLUSTER1, CLUSTER2
from .test_watch import Remote, nodes_of, wait_for

# a watch that is never woken holds its connection this long (the client's default)
IDLE_TIMEOUT_S = inspect.signature(EtcdClient.watch).parameters["idle_timeout"].default

RECS = {cluster_key("cluster2"): b'{"name":"cluster2","id":2}', mesh_key("cluster2"): b"{}",
        node_key("cluster2", "g1"): b"g1", node_key("cluster2", "g2"): b"g2",
        forwarding_key("cluster2", "g1"): b"r1", forwarding_key("cluster2", "g2"): b"r2"}


@pytest.mark.parametrize(("admitted", "keep", "written", "want"), [
    pytest.param({"cluster2": frozenset({"g1"})}, frozenset(), {},
                 {cluster_key("cluster2"), mesh_key("cluster2"), node_key("cluster2", "g1"),
                  forwarding_key("cluster2", "g1")},
                 id="admitted-only, with their forwarding reports"),
    pytest.param({}, frozenset(), {cached_key("cluster1", node_key("cluster2", "g1")): b"g1"}, set(),
                 id="refused-cluster-is-withdrawn"),
    pytest.param({}, frozenset({"cluster2"}), {cached_key("cluster1", node_key("cluster2", "g1")): b"old"},
                 {node_key("cluster2", "g1")}, id="undecided-cluster-keeps-what-was-written"),
    pytest.param({}, frozenset({"cluster3"}), {cached_key("cluster1", node_key("cluster2", "g1")): b"g1"}, set(),
                 id="keep-is-per-cluster"),
])
def test_desired_cache(admitted: dict, keep: frozenset[str], written: dict, want: set[str]) -> None:
    got = desired_cache("cluster1", admitted, {"cluster2": RECS}, keep, written)
    assert set(got) == {cached_key("cluster1", k) for k in want}
    for k in want:
        assert got[cached_key("cluster1", k)] in (RECS[k], written.get(cached_key("cluster1", k)))


def test_cache_changes_writes_only_the_difference() -> None:
    puts, deletes = cache_changes({"a": b"1", "b": b"2", "c": b"3"}, {"a": b"1", "b": b"old", "d": b"4"})
    assert puts == [("b", b"2"), ("c", b"3")] and deletes == ["d"]
    assert cache_changes({"a": b"1"}, {"a": b"1"}) == ([], [])


@pytest.mark.parametrize(("raw", "age", "why"), [
    pytest.param(None, 0, "no heartbeat", id="absent"),
    pytest.param(b"nope", 0, "heartbeat is not valid JSON", id="garbage"),
    pytest.param("ok", STALE_SECONDS + 5, "heartbeat 15s old", id="stale"),
    pytest.param("ok", 0, "", id="fresh"),
    pytest.param("down", 0, "cluster2 not ready in the cache: connecting", id="cluster-not-ready"),
    pytest.param("other", 0, "does not serve cluster2", id="not-served"),
])
def test_cache_health(raw: bytes | str | None, age: float, why: str) -> None:
    now = 1000.0
    beats = {"ok": {"cluster2": (True, "")}, "down": {"cluster2": (False, "connecting")},
             "other": {"cluster3": (True, "")}}
    value = heartbeat(now - age, beats[raw]).encode() if isinstance(raw, str) else raw
    assert cache_health(value, now, "cluster2").startswith(why) and (why or cache_health(value, now, "cluster2") == "")


@pytest.mark.parametrize(("health", "line"), [
    pytest.param({"cluster2": "", "cluster3": ""}, "via cache", id="all-served"),
    pytest.param({"cluster2": "no heartbeat", "cluster3": "no heartbeat"}, "direct (cache unhealthy: no heartbeat)",
                 id="cache-down"),
    pytest.param({"cluster2": "", "cluster3": "cluster3 not ready in the cache: x"},
                 "direct (cache unhealthy: cluster3 not ready in the cache: x)", id="one-cluster"),
])
def test_via_line(health: dict[str, str], line: str) -> None:
    assert via_line(health) == line


# --- the loop against real etcd servers ----------------------------------------------------------

class Lab:
    """cluster1's etcd (the cache writes here, agents read here), cluster2's (remote), the
    clustermesh dir holding cluster2's credentials, and the cache for cluster1 in a thread."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.local = Remote(tmp, "cluster1")
        self.remote = Remote(tmp, "cluster2")
        self.local.publish(CLUSTER1)
        self.remote.publish(CLUSTER2)
        self.dir = tmp / "clustermesh"
        self.dir.mkdir()
        (self.dir / "cluster2").write_text(yaml.safe_dump(self.remote.config()))
        self.agents: list[RemoteClusters] = []
        self.cache: ClusterMeshCache | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def connect(self):  # noqa: ANN201 - an EtcdClient to cluster1's etcd
        return self.local.etcd.client(self.local.client_cert)

    def start_cache(self) -> None:
        self._stop = threading.Event()
        self.cache = ClusterMeshCache(self.connect, Cluster("cluster1", 1), self.dir, self.tmp / "cache-state",
                                      poll=0.1)
        self._thread = threading.Thread(target=self.cache.run, args=(self._stop,), daemon=True)
        self._thread.start()

    def stop_cache(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)

    def agent(self, i: int) -> RemoteClusters:
        rc = RemoteClusters(self.dir, Cluster("cluster1", 1), lambda: None, poll=0.1,
                            cache_dir=self.tmp / f"agent{i}", cache=CacheUse("cluster1", self.connect))
        rc.start()
        self.agents.append(rc)
        return rc

    def cache_status(self) -> bytes | None:
        kv = self.local.kv.get(cache_status_key("cluster1"))
        return kv.value if kv is not None else None

    def remote_client_ends(self) -> set[str]:
        """This process's established connections to cluster2's etcd, by their local address:port."""
        port = self.remote.etcd.url.rsplit(":", 1)[1]
        out = subprocess.run(["ss", "-Htnp", "state", "established", f"( dport = :{port} )"],
                             capture_output=True, text=True, check=True).stdout
        return {ln.split()[2] for ln in out.splitlines() if f"pid={os.getpid()}," in ln}

    def close(self) -> None:
        for rc in self.agents:
            rc.stop()
        self.stop_cache()
        self.remote.stop()
        self.local.stop()


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(tmp_path)
    try:
        yield lab
    finally:
        lab.close()


G = {"cluster2/g1", "cluster2/g2", "cluster2/g3", "cluster2/g4"}


def test_agents_read_the_cache_fall_back_when_it_stops_and_return(lab: Lab) -> None:
    lab.start_cache()
    wait_for(lambda: cache_health(lab.cache_status(), time.time(), "cluster2") == "")
    held = lab.remote_client_ends()
    agents = [lab.agent(i) for i in range(3)]
    for rc in agents:
        wait_for(lambda rc=rc: nodes_of(rc) == G and rc.status().get("via") == "via cache" and not rc._remotes)
    assert summary_line(agents[0].status()) == "ClusterMesh: 1/1 remote clusters ready, 0 global-services, via cache"
    # the agents hold no connection to cluster2's etcd: only the cache does (no connection is new; the
    # cache may have closed one of its own since)
    assert lab.remote_client_ends() <= held
    assert all(not rc._remotes for rc in agents)

    # a remote join reaches every agent through the cache (the times are printed; bench/clustermesh.py
    # --cache measures them)
    took = []
    for i in range(20):
        name = f"j{i}"
        t0 = time.monotonic()
        lab.remote.kv.put(node_key("cluster2", name), json.dumps(
            {"name": name, "pod_cidr": f"10.43.{100 + i}.0/24", "public_key": key(100 + i)}))
        for rc in agents:
            wait_for(lambda rc=rc, n=name: f"cluster2/{n}" in nodes_of(rc))
        took.append(time.monotonic() - t0)
    took.sort()
    p95 = took[int(0.95 * (len(took) - 1))]
    print(f"remote join through the cache to 3 agents: median {statistics.median(took) * 1000:.0f} ms, "
          f"p95 {p95 * 1000:.0f} ms")
    joined = G | {f"cluster2/j{i}" for i in range(20)}

    # a record the cache could not have admitted, written into the cache prefix: agents re-admit
    evil = {"name": "evil", "pod_cidr": "10.42.1.0/24", "public_key": key(250)}
    lab.local.kv.put(cached_key("cluster1", node_key("cluster2", "evil")), json.dumps(evil))
    def rejected() -> bool:
        assert "cluster2/evil" not in nodes_of(agents[0])   # admission runs here, as in a reconcile pass
        return any(r["name"] == "cluster2/evil" and "overlaps local node c1's pod CIDR" in r["reason"]
                   for r in agents[0].status()["clusters"][0]["rejections"])

    wait_for(rejected)
    lab.local.kv.delete(cached_key("cluster1", node_key("cluster2", "evil")))

    # the cache stops: agents fall back to cluster2's etcd and never lose a node meanwhile
    lab.stop_cache()
    lost: list[set[str]] = []

    def direct_and_ready() -> bool:
        """Every agent direct and synced; what any of them lost on the way is kept in `lost`."""
        for rc in agents:
            seen = nodes_of(rc)
            if seen != joined:
                lost.append(joined - seen)
        return all(rc.status().get("via", "").startswith("direct") and rc._remotes
                   and rc._remotes["cluster2"].snapshot().ready for rc in agents)

    wait_for(direct_and_ready)
    assert all(rc.status()["via"] == "direct (cache unhealthy: no heartbeat)" for rc in agents), \
        [rc.status()["via"] for rc in agents]
    assert not lost, lost
    assert all(nodes_of(rc) == joined for rc in agents)
    direct = lab.remote_client_ends() - held
    assert len(direct) >= 3, direct  # one (at least) per agent now

    # and come back once it runs again, closing their connections to cluster2's etcd at once (the
    # watch stream too: an idle watch would otherwise hold its connection until its idle timeout)
    lab.start_cache()
    for rc in agents:
        wait_for(lambda rc=rc: rc.status().get("via") == "via cache" and not rc._remotes)
    assert all(nodes_of(rc) == joined for rc in agents)
    wait_for(lambda: not lab.remote_client_ends() & direct, timeout=IDLE_TIMEOUT_S - 5)  # before an idle one would


def test_a_failed_heartbeat_read_is_no_verdict_but_reads_failing_past_the_ttl_are(lab: Lab) -> None:
    """An agent does not leave a healthy cache because one read of its heartbeat failed (a slow
    etcd on a busy node): it goes direct only once reads have failed for as long as a killed
    cache's key would take to go (HEARTBEAT_TTL), naming why."""
    lab.start_cache()
    wait_for(lambda: cache_health(lab.cache_status(), time.time(), "cluster2") == "")
    rc = lab.agent(0)
    wait_for(lambda: rc.status().get("via") == "via cache" and not rc._remotes)
    client = rc._health_client
    assert client is not None
    real_get, failing = client.get, threading.Event()

    def get(key: str) -> Any:
        if failing.is_set():
            raise EtcdError("etcd: timed out")
        return real_get(key)

    client.get = get  # type: ignore[method-assign]
    failing.set()
    t0 = time.monotonic()
    # the experiment: for the heartbeat's TTL the poll (0.1 s) fails several times, and the agent stays
    while time.monotonic() - t0 < HEARTBEAT_TTL - 0.5:
        assert rc.status().get("via") == "via cache" and not rc._remotes, rc.status().get("via")
        time.sleep(0.05)
    wait_for(lambda: rc.status().get("via", "").startswith("direct (cache unhealthy: cannot read the heartbeat: "
                                                           "etcd: timed out") and bool(rc._remotes))
    failing.clear()
    wait_for(lambda: rc.status().get("via") == "via cache" and not rc._remotes)
