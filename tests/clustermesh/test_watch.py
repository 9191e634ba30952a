# SPDX-License-Identifier: Apache-2.0
"""RemoteClusters against real etcd servers on loopback with TLS and client-certificate auth."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from meshctl.backends.clustermesh import RemoteClusters, config_name, parse_config, summary_line
from meshctl.backends.etcd import cluster_key, node_key, withdraw_record, write_topology
from meshctl.errors import InputError
from meshctl.lab.rigs.etcd_process import EtcdServer
from meshctl.lab.rigs.pki import make_ca, make_cert
from meshctl.mesh.model import Cluster
from meshctl.mesh.records import node_to_record, parse_topology
from tests.plan.fixtures import key
from tests.waiting import WAIT_S, wait_until

from .fixtures import CLUSTER1, CLUSTER2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Remote:
    """A TLS etcd standing in for a remote cluster's, with its PKI."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.dir = tmp / name
        self.ca = make_ca(self.dir / "pki", f"{name}-ca")
        server = make_cert(self.ca, self.dir / "pki", "server", server=True, hosts=("127.0.0.1",))
        self.client_cert = make_cert(self.ca, self.dir / "pki", "client")
        self.etcd = EtcdServer(name=name, data_dir=self.dir / "data", port=free_port(), peer_port=free_port(),
                               tls=server)
        self.etcd.start(client_tls=self.client_cert)
        self.kv = self.etcd.client(self.client_cert)

    def config(self, ca: Path | None = None) -> dict:
        return {"endpoints": [self.etcd.url], "trusted-ca-file": str(ca or self.ca.cert),
                "cert-file": str(self.client_cert.cert), "key-file": str(self.client_cert.key)}

    def publish(self, doc: dict) -> None:
        t = parse_topology(doc)
        write_topology(self.kv, t.cluster, t.mesh)
        for n in t.nodes:
            self.kv.put(node_key(t.cluster.name, n.name), json.dumps(node_to_record(n)))

    def stop(self) -> None:
        self.kv.close()
        self.etcd.stop()


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[Remote]:
    r = Remote(tmp_path, "cluster2")
    try:
        yield r
    finally:
        r.stop()


def wait_for(cond: Callable[[], bool], timeout: float = WAIT_S) -> float:
    """Seconds until `cond()` held; an AssertionError after `timeout`."""
    t0 = time.monotonic()
    wait_until(cond, timeout, step=0.02)
    return time.monotonic() - t0


def rewrite(f: Path, text: str) -> None:
    """Write `f` with an mtime the watcher has not seen (it compares mtimes, and two writes within
    one tick of the file system's clock would share one)."""
    before = f.stat().st_mtime_ns
    f.write_text(text)
    if f.stat().st_mtime_ns <= before:
        os.utime(f, ns=(before + 1_000_000, before + 1_000_000))


@pytest.fixture
def watcher(tmp_path: Path) -> Iterator[tuple[RemoteClusters, Path, threading.Event]]:
    d = tmp_path / "clustermesh"
    d.mkdir()
    woke = threading.Event()
    rc = RemoteClusters(d, Cluster("cluster1", 1), woke.set, poll=0.1)
    rc.start()
    try:
        yield rc, d, woke
    finally:
        rc.stop()


def nodes_of(rc: RemoteClusters, local: dict = CLUSTER1) -> set[str]:
    remotes, _ = rc.admit(parse_topology(local))
    return {n.qualified_name for r in remotes for n in r.nodes}


def test_file_added_connects_and_removed_drains(remote: Remote, watcher) -> None:
    rc, d, woke = watcher
    remote.publish(CLUSTER2)
    (d / "cluster2").write_text(yaml.safe_dump(remote.config()))
    wait_for(lambda: nodes_of(rc) == {"cluster2/g1", "cluster2/g2", "cluster2/g3", "cluster2/g4"})
    st = rc.status()
    assert summary_line(st) == "ClusterMesh: 1/1 remote clusters ready, 0 global-services"
    c = st["clusters"][0]
    assert c["ready"] and c["nodes"] == 4 and c["connected"] and c["endpoints"] == [remote.etcd.url]
    # a node added in the remote cluster reaches us by itself
    woke.clear()
    remote.kv.put(node_key("cluster2", "g5"), json.dumps({"name": "g5", "pod_cidr": "10.43.5.0/24",
                                                          "public_key": key(205)}))
    took = wait_for(lambda: "cluster2/g5" in nodes_of(rc))
    print(f"\na remote join seen {took:.3f} s after its put (bench/clustermesh.py measures remote joins)")
    assert woke.is_set()
    remote.kv.delete(node_key("cluster2", "g2"))
    wait_for(lambda: "cluster2/g2" not in nodes_of(rc))
    (d / "cluster2").unlink()
    wait_for(lambda: nodes_of(rc) == set())
    assert rc.status()["total"] == 0


def test_a_remote_node_whose_lease_ran_out_is_kept_through_the_lapse_grace(remote: Remote, tmp_path: Path) -> None:
    """As inside its own cluster (docs/security.md, 'Restarts lose nothing'): a remote node whose
    lease ran out (its agent restarting, or refused at start) stays in the view for the lapse
    grace, so its routes stay; a record withdrawn for good (taken off its lease first) goes at once."""
    grace = 3.0
    d = tmp_path / "clustermesh"
    d.mkdir()
    rc = RemoteClusters(d, Cluster("cluster1", 1), lambda: None, poll=0.1, lapse_grace=grace)
    rc.start()
    try:
        remote.publish(CLUSTER2)
        lease = remote.kv.lease_grant(30)
        for i, name in ((5, "g5"), (6, "g6")):
            remote.kv.put(node_key("cluster2", name), json.dumps(
                {"name": name, "pod_cidr": f"10.43.{i}.0/24", "public_key": key(200 + i)}), lease=lease)
        (d / "cluster2").write_text(yaml.safe_dump(remote.config()))
        wait_for(lambda: {"cluster2/g5", "cluster2/g6"} <= nodes_of(rc))
        withdraw_record(remote.kv, "cluster2", "g6")
        remote.kv.lease_revoke(lease)  # g5's agent away past its TTL: etcd deletes its record
        t0 = time.monotonic()
        # the experiment: g5 watched through the grace (which starts when the watch sees the delete)
        while time.monotonic() - t0 < grace - 0.5:
            assert "cluster2/g5" in nodes_of(rc), f"g5 dropped {time.monotonic() - t0:.2f} s after its lease went"
            assert node_key("cluster2", "g5") in rc.records()["cluster2"]  # what a cache mirrors: kept too
            time.sleep(0.05)
        assert "cluster2/g6" not in nodes_of(rc)  # withdrawn: not kept through the grace
        wait_for(lambda: "cluster2/g5" not in nodes_of(rc))
        assert nodes_of(rc) == {"cluster2/g1", "cluster2/g2", "cluster2/g3", "cluster2/g4"}
    finally:
        rc.stop()


def test_etcd_away_keeps_the_view_and_comes_back(remote: Remote, watcher) -> None:
    rc, d, _ = watcher
    remote.publish(CLUSTER2)
    (d / "cluster2").write_text(yaml.safe_dump(remote.config()))
    wait_for(lambda: len(nodes_of(rc)) == 4)
    remote.etcd.stop()
    wait_for(lambda: not rc.status()["clusters"][0]["ready"])
    assert len(nodes_of(rc)) == 4, "routes learned from a cluster whose etcd went away must stay"
    st = rc.status()["clusters"][0]
    assert not st["ready"] and st["reason"] and not st["connected"]
    assert summary_line(rc.status()) == "ClusterMesh: 0/1 remote clusters ready, 0 global-services"
    remote.etcd.start(client_tls=remote.client_cert)
    wait_for(lambda: rc.status()["clusters"][0]["ready"])
    assert rc.status()["clusters"][0]["reconnects"] >= 1


def test_wrong_ca_is_a_clear_reason_and_installs_nothing(remote: Remote, watcher, tmp_path: Path) -> None:
    rc, d, _ = watcher
    remote.publish(CLUSTER2)
    other = make_ca(tmp_path / "other-pki", "someone-else")
    (d / "cluster2").write_text(yaml.safe_dump(remote.config(ca=other.cert)))

    def settled() -> bool:
        cs = rc.status()["clusters"]
        return bool(cs) and cs[0]["reason"] not in ("", "connecting")

    wait_for(settled)
    c = rc.status()["clusters"][0]
    assert not c["ready"] and "TLS" in c["reason"] and "ca-file" in c["reason"], c["reason"]
    assert nodes_of(rc) == set()


def test_name_mismatch_and_duplicate_id_are_refused(remote: Remote, watcher) -> None:
    rc, d, _ = watcher
    remote.publish(CLUSTER2)
    (d / "cluster9").write_text(yaml.safe_dump(remote.config()))
    wait_for(lambda: rc.status()["total"] == 1 and "no cluster record" in rc.status()["clusters"][0]["reason"])
    assert "its etcd holds: cluster2" in rc.status()["clusters"][0]["reason"]
    (d / "cluster9").unlink()
    # the remote publishes the local cluster's id
    remote.kv.put(cluster_key("cluster2"), json.dumps({"name": "cluster2", "id": 1, "subnet": "10.5.0.0/16"}))
    (d / "cluster2").write_text(yaml.safe_dump(remote.config()))
    wait_for(lambda: rc.status()["total"] == 1 and "id 1" in rc.status()["clusters"][0]["reason"])
    assert nodes_of(rc) == set()


def test_overlapping_remote_record_is_rejected_and_counted(remote: Remote, watcher) -> None:
    rc, d, _ = watcher
    remote.publish(CLUSTER2)
    remote.kv.put(node_key("cluster2", "evil"), json.dumps({"name": "evil", "pod_cidr": "10.42.1.0/24",
                                                            "public_key": CLUSTER2["nodes"][0]["public_key"]}))
    remote.kv.put(node_key("cluster2", "junk"), "{not json")
    (d / "cluster2").write_text(yaml.safe_dump(remote.config()))
    wait_for(lambda: len(nodes_of(rc)) == 4)
    c = rc.status()["clusters"][0]
    assert c["ready"] and c["rejected"] == 2
    reasons = {r["name"]: r["reason"] for r in c["rejections"]}
    assert "overlaps local node c1's pod CIDR" in reasons["cluster2/evil"]
    assert "is not JSON" in reasons["junk"]


def test_bad_files_are_one_line_errors(tmp_path: Path) -> None:
    p = tmp_path / "cluster2"
    p.write_text("endpoints: [ftp://x]\n")
    with pytest.raises(InputError, match="endpoints: 'ftp://x' is not an https URL"):
        parse_config(p)
    p.write_text("endpoints: [https://127.0.0.1:1]\nca-file: /nonexistent\n")
    with pytest.raises(InputError, match="ca-file: '/nonexistent' does not exist"):
        parse_config(p)
    bad = tmp_path / "Cluster_2"
    bad.write_text("endpoints: [https://127.0.0.1:1]\n")
    with pytest.raises(InputError, match="is not a cluster name"):
        parse_config(bad)


def test_cilium_layout_reads_only_cluster_configs(remote: Remote, watcher) -> None:
    """A mounted cilium-clustermesh Secret: `cluster2` beside its certificates and the Secret
    volume's `..data` entries. Only the config is a cluster; nothing else is an error."""
    import shutil

    rc, d, _ = watcher
    remote.publish(CLUSTER2)
    for src, name in ((remote.ca.cert, "cluster2.etcd-client.ca.crt"), (remote.client_cert.cert,
                      "cluster2.etcd-client.crt"), (remote.client_cert.key, "cluster2.etcd-client.key")):
        shutil.copy(src, d / name)
    (d / "..data").mkdir()
    (d / "common-etcd-client.key").write_text("not a config")
    (d / "cluster2").write_text(yaml.safe_dump({
        "endpoints": [remote.etcd.url], "trusted-ca-file": str(d / "cluster2.etcd-client.ca.crt"),
        "cert-file": str(d / "cluster2.etcd-client.crt"), "key-file": str(d / "cluster2.etcd-client.key")}))
    wait_for(lambda: len(nodes_of(rc)) == 4)
    st = rc.status()
    assert st["total"] == 1 and st["clusters"][0]["ready"], st
    assert [c["name"] for c in st["clusters"]] == ["cluster2"]
    assert config_name("cluster2.etcd-client.crt") is None and config_name("cluster2.yaml") == "cluster2"
    assert config_name("..data") is None and config_name("Cluster_2") is None


def test_changed_file_reconnects_and_keeps_the_view_until_the_new_one_syncs(remote: Remote, watcher,
                                                                             tmp_path: Path) -> None:
    rc, d, _ = watcher
    remote.publish(CLUSTER2)
    f = d / "cluster2"
    f.write_text(yaml.safe_dump(remote.config()))
    wait_for(lambda: len(nodes_of(rc)) == 4)
    # a broken edit: the running connection stays, the status says what is wrong
    rewrite(f, "endpoints: 42\n")
    wait_for(lambda: "endpoints" in rc.status()["clusters"][0]["reason"])
    assert len(nodes_of(rc)) == 4
    # trust moved to a CA the server does not use: the learned view stays, the reason says TLS
    other = make_ca(tmp_path / "other-pki", "someone-else")
    rewrite(f, yaml.safe_dump(remote.config(ca=other.cert)))
    wait_for(lambda: "TLS" in rc.status()["clusters"][0]["reason"])
    assert len(nodes_of(rc)) == 4 and not rc.status()["clusters"][0]["ready"]
    # the right CA again: ready, and changes flow
    rewrite(f, yaml.safe_dump(remote.config()))
    wait_for(lambda: rc.status()["clusters"][0]["ready"])
    remote.kv.delete(node_key("cluster2", "g4"))
    wait_for(lambda: "cluster2/g4" not in nodes_of(rc))


def learn_and_save(remote: Remote, tmp_path: Path) -> tuple[Path, Path]:
    """A watcher that learns cluster2 and saves its view, then stops (an agent going away).
    Returns (the clustermesh dir, the cache dir)."""
    d, cache = tmp_path / "cm", tmp_path / "state" / "clustermesh"
    d.mkdir()
    remote.publish(CLUSTER2)
    (d / "cluster2").write_text(yaml.safe_dump(remote.config()))
    first = RemoteClusters(d, Cluster("cluster1", 1), lambda: None, poll=0.1, cache_dir=cache)
    first.start()
    try:
        wait_for(lambda: len(nodes_of(first)) == 4)
        wait_for(lambda: (cache / "cluster2.json").exists())
    finally:
        first.stop()
    return d, cache


def test_a_restarted_agent_plans_with_the_saved_view_while_the_remote_etcd_is_away(remote: Remote,
                                                                                  tmp_path: Path) -> None:
    d, cache = learn_and_save(remote, tmp_path)
    remote.etcd.stop()
    # "restart": a new watcher, the remote etcd unreachable
    second = RemoteClusters(d, Cluster("cluster1", 1), lambda: None, poll=0.1, cache_dir=cache)
    second.start()
    try:
        assert nodes_of(second) == {"cluster2/g1", "cluster2/g2", "cluster2/g3", "cluster2/g4"}
        c = second.status()["clusters"][0]
        assert not c["ready"] and not c["connected"]
        remote.etcd.start(client_tls=remote.client_cert)
        wait_for(lambda: second.status()["clusters"][0]["ready"])
        remote.kv.delete(node_key("cluster2", "g4"))
        wait_for(lambda: "cluster2/g4" not in nodes_of(second))
        # removing the file drains the cluster and forgets its saved view
        (d / "cluster2").unlink()
        wait_for(lambda: nodes_of(second) == set())
        wait_for(lambda: not (cache / "cluster2.json").exists())
    finally:
        second.stop()


def test_a_view_saved_under_another_trust_is_not_used(remote: Remote, tmp_path: Path) -> None:
    d, cache = learn_and_save(remote, tmp_path)
    other = make_ca(tmp_path / "other-pki", "someone-else")
    (d / "cluster2").write_text(yaml.safe_dump(remote.config(ca=other.cert)))
    second = RemoteClusters(d, Cluster("cluster1", 1), lambda: None, poll=0.1, cache_dir=cache)
    second.start()
    try:
        wait_for(lambda: "TLS" in second.status()["clusters"][0]["reason"])
        assert nodes_of(second) == set()
    finally:
        second.stop()
