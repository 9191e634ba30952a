# SPDX-License-Identifier: Apache-2.0
"""`--kvstore`: a Kubernetes cluster's nodes (read from a real kube-apiserver) mirrored into a real
etcd (mutual TLS), in the layout of the etcd backend, and read back by another cluster's watcher
(clustermesh_watch.RemoteClusters) exactly as it reads an etcd-backed cluster. One agent writes;
when it stops another takes over."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from lightkube.resources.core_v1 import ConfigMap
from lightkube.resources.core_v1 import Node as KNode
from lightkube.types import PatchType

from meshctl.backends import etcd_identity as identity
from meshctl.backends.base import ClusterState
from meshctl.backends.clustermesh import RemoteClusters
from meshctl.backends.etcd import cluster_key, forwarding_key, mesh_key, node_key, peer_key
from meshctl.backends.kube import nodes as A
from meshctl.backends.kube.backend import backend_from_options
from meshctl.backends.kube.kvstore import KvstoreMirror, mirror_records, record_changes, writer_key
from meshctl.etcd import EtcdClient
from meshctl.lab.rigs.etcd_process import EtcdServer
from meshctl.lab.rigs.pki import CertFiles, make_ca, make_cert
from meshctl.mesh import fields, records
from meshctl.mesh.leaders import ForwardingReport, Judged, choose_leaders
from meshctl.mesh.model import Cluster, MeshSettings, Node, Topology

from .helpers import Running, create_node, node_obj, wait_for, wg_key

net = fields.network
CLUSTER = Cluster("kube1", 3)


def state_of(*nodes: Node, mesh: MeshSettings | None = None, ready: bool = True) -> ClusterState:
    return ClusterState(CLUSTER, mesh or MeshSettings(), tuple(nodes), ready=ready, reason="" if ready else "away")


def node(name: str, pod: str, key: int, loc: str, internal: str | None = None, endpoint: str | None = None) -> Node:
    return records.parse_node({"name": name, "pod_cidr": pod, "public_key": wg_key(key), "location": loc,
                                "internal_ip": internal, "endpoint": endpoint}, name)


# --- the pure part ---------------------------------------------------------------------------------


def test_mirror_records_are_the_admitted_nodes_with_their_leaders_wireguard_ips():
    a1 = node("a1", "10.42.1.0/24", 1, "a", "192.168.1.1/24", "198.51.100.1:51820")
    a2 = node("a2", "10.42.2.0/24", 2, "a", "192.168.1.2/24")
    b1 = node("b1", "10.42.3.0/24", 3, "b", "192.168.2.1/24", "198.51.100.3:51820")
    clash = node("c1", "10.42.2.128/25", 4, "c")  # overlaps a2's pod CIDR: the local agents reject it
    recs = mirror_records(state_of(a1, a2, b1, clash))
    assert set(recs) == {cluster_key("kube1"), mesh_key("kube1"), *(node_key("kube1", n) for n in ("a1", "a2", "b1"))}
    assert json.loads(recs[cluster_key("kube1")]) == {"name": "kube1", "id": 3, "subnet": "10.4.0.0/16"}
    assert json.loads(recs[mesh_key("kube1")]) == records.mesh_to_record(MeshSettings())
    parsed = {n: records.parse_node(json.loads(recs[node_key("kube1", n)]), n) for n in ("a1", "a2", "b1")}
    # the segment leaders carry their segment's address (loc a = 10.4.0.1, loc b = 10.4.0.2), as
    # their own plans give it; the rest of each record is the node as the cluster sees it
    assert str(parsed["a1"].wireguard_ip) == "10.4.0.1/16" and str(parsed["b1"].wireguard_ip) == "10.4.0.2/16"
    assert parsed["a2"].wireguard_ip is None and parsed["a2"] == a2
    assert replace(parsed["a1"], wireguard_ip=None) == a1


def test_mirror_records_carry_the_admitted_nodes_reports_and_the_leaders_they_choose():
    """A Kubernetes cluster's forwarding reports go to its etcd as the etcd backend keeps them
    (`/meshctl/<cluster>/forwarding/<node>`), so another cluster's agents choose its leaders from
    them; a node the cluster's agents reject has no report there. Two members calling a1 bad move
    loc a to a2: a2's record carries the segment's WireGuard address, as its own plan gives it."""
    mesh = MeshSettings(granularity="location")
    a1, a2, a3 = (node(f"a{i}", f"10.42.{i}.0/24", i, "a", f"192.168.1.{i}/24", f"198.51.100.{i}:51820")
                  for i in (1, 2, 3))
    clash = node("c1", "10.42.2.128/25", 4, "c")
    reports = {n: ForwardingReport(n, "kube1", 10.0, {"a1": Judged("bad", 9.0), **{
        o: Judged("ok", 1.0) for o in ("a2", "a3") if o != n}}) for n in ("a2", "a3")}
    reports["c1"] = ForwardingReport("c1", "kube1", 10.0, {"a1": Judged("bad", 9.0)})
    recs = mirror_records(replace(state_of(a1, a2, a3, clash, mesh=mesh), forwarding=reports))
    assert {k for k in recs if "/forwarding/" in k} == {forwarding_key("kube1", "a2"), forwarding_key("kube1", "a3")}
    assert json.loads(recs[forwarding_key("kube1", "a2")]) == reports["a2"].to_json()
    wg = {n: records.parse_node(json.loads(recs[node_key("kube1", n)]), n).wireguard_ip for n in ("a1", "a2")}
    assert wg["a1"] is None and str(wg["a2"]) == "10.4.0.1/16"
    # A report gone from the cluster goes from etcd; other keys stay.
    have = {k: v.encode() for k, v in recs.items()}
    have[forwarding_key("kube1", "gone")] = b"{}"
    puts, deletes = record_changes(have, recs, "kube1")
    assert puts == [] and deletes == [forwarding_key("kube1", "gone")]


def test_record_changes_write_only_what_differs_and_never_touch_other_keys():
    desired = mirror_records(state_of(node("a1", "10.42.1.0/24", 1, "a")))
    have = {k: json.dumps(json.loads(v), indent=2).encode() for k, v in desired.items()}  # other formatting
    have[node_key("kube1", "gone")] = b"{}"
    have[peer_key("kube1", "laptop")] = b"{}"
    have[writer_key("kube1")] = b"a1"
    puts, deletes = record_changes(have, desired, "kube1")
    assert puts == [] and deletes == [node_key("kube1", "gone")]
    have[mesh_key("kube1")] = b'{"granularity": "full"}'
    puts, _ = record_changes(have, desired, "kube1")
    assert [k for k, _ in puts] == [mesh_key("kube1")]


# --- against etcd ------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """A TLS etcd with client-certificate and user auth on loopback, standing in for the cluster's
    kvstore: the mirror writes as `meshctl:kvstore`, the other cluster reads as `remote:other`."""

    def __init__(self, tmp: Path) -> None:
        ca = make_ca(tmp / "pki", "kvstore-ca")
        server = make_cert(ca, tmp / "pki", "server", server=True, hosts=("127.0.0.1",))
        self.client_cert: CertFiles = make_cert(ca, tmp / "pki", "client", common_name=False)
        self.server = EtcdServer(name="kvstore", data_dir=tmp / "data", port=free_port(), peer_port=free_port(),
                                 tls=server, log_file=tmp / "etcd.log")
        self.server.start(client_tls=self.client_cert)
        self.passwords = {u: identity.new_password(tmp / "pki" / f"{u.replace(':', '-')}.password")
                          for u in (identity.ADMIN_USER, identity.KVSTORE_USER, identity.remote_user("other"))}
        identity.provision(self._client(None), "kube1", admin_password=self.passwords[identity.ADMIN_USER], nodes={},
                           readers={"other": self.passwords[identity.remote_user("other")]},
                           kvstore=self.passwords[identity.KVSTORE_USER])

    def _client(self, user: str | None) -> EtcdClient:
        c = self.client_cert
        return EtcdClient([self.server.url], ca=str(c.ca), cert=str(c.cert), key=str(c.key), user=user,
                          password_file=str(self.passwords[user]) if user else None)

    def client(self) -> EtcdClient:
        """The mirror's identity: it may write /meshctl/kube1/ and nothing else."""
        return self._client(identity.KVSTORE_USER)

    def clustermesh_dir(self, tmp: Path) -> Path:
        """The other cluster's clustermesh folder: one file, named after kube1, to read it as `remote:other`."""
        d = tmp / "clustermesh"
        d.mkdir()
        c = self.client_cert
        (d / "kube1").write_text(json.dumps({"endpoints": [self.server.url], "ca-file": str(c.ca),
                                             "cert-file": str(c.cert), "key-file": str(c.key),
                                             "username": identity.remote_user("other"),
                                             "password-file": str(self.passwords[identity.remote_user("other")])}))
        return d

    def records(self) -> dict[str, bytes]:
        c = self._client(identity.ADMIN_USER)
        try:
            kvs, _ = c.range("/meshctl/", prefix=True)
        finally:
            c.close()
        return {kv.key: kv.value for kv in kvs}


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Etcd]:
    e = Etcd(tmp_path / "kvstore")
    try:
        yield e
    finally:
        e.server.stop()


def test_one_writer_mirrors_the_cluster_and_a_remote_cluster_reads_it(api, kclient, etcd, tmp_path):
    kclient.create(ConfigMap.from_dict({"metadata": {"name": "meshctl", "namespace": "meshctl"},
                                        "data": {"cluster_name": "kube1", "cluster_id": "3"}}))
    for name, pod, key, loc, internal, ep in (
            ("a1", "10.42.1.0/24", 1, "a", "192.168.1.1/24", "198.51.100.1:51820"),
            ("a2", "10.42.2.0/24", 2, "a", "192.168.1.2/24", None),
            ("b1", "10.42.3.0/24", 3, "b", "192.168.2.1/24", "198.51.100.3:51820")):
        create_node(kclient, node_obj(name, pod, key=key, internal=internal, endpoint=ep,
                                      ann={A.PREFIX + "location": loc}))
    backends = {}
    for name in ("a1", "b1"):
        be = backend_from_options(api.kubeconfig, name)
        be.mirror = KvstoreMirror(etcd.client(), name, lease_ttl=2, full_sync_seconds=30)
        backends[name] = be
    run_a1, run_b1 = Running(backends["a1"]), Running(backends["b1"])
    # the other cluster: its agents' watcher, configured by a clustermesh file named after kube1
    cm_dir = etcd.clustermesh_dir(tmp_path)
    woke = threading.Event()
    remotes = RemoteClusters(cm_dir, Cluster("other", 9), changed=woke.set, poll=0.2)
    with run_a1, run_b1:
        # the agents' reconcile loops call snapshot; here the test does
        def snap_all() -> None:
            for be in backends.values():
                be.snapshot()

        def writer() -> str | None:
            v = etcd.records().get(writer_key("kube1"))
            return v.decode() if v else None

        wait_for(lambda: snap_all() or len([k for k in etcd.records() if "/nodes/" in k]) == 3, what="3 node records")
        first = writer()
        assert first in ("a1", "b1")
        assert [be.mirror.writing for be in backends.values()].count(True) == 1
        remotes.start()
        try:
            st = wait_for(lambda: (s := remotes.states()) and s[0], what="kube1 read by the remote watcher")
            assert st.cluster == Cluster("kube1", 3)
            assert sorted(n.name for n in st.nodes) == ["a1", "a2", "b1"]
            local = Topology(Cluster("other", 9), MeshSettings(subnet=net("10.5.0.0/16", "")))
            admitted, rejected = remotes.admit(local)
            assert not rejected and admitted[0].admitted == {"a1", "a2", "b1"}
            assert remotes.status()["ready"] == 1

            # a Node deleted in Kubernetes leaves the other cluster's view; a changed one follows
            kclient.delete(KNode, "a2")
            kclient.patch(KNode, "b1", {"metadata": {"annotations": {A.ENDPOINT: "198.51.100.33:51820"}}},
                          patch_type=PatchType.MERGE)
            wait_for(lambda: snap_all() or sorted(n.name for n in remotes.states()[0].nodes) == ["a1", "b1"],
                     what="a2 gone from the remote view")
            wait_for(lambda: snap_all() or str(next(n for n in remotes.states()[0].nodes if n.name == "b1").endpoint)
                     == "198.51.100.33:51820", what="b1's new endpoint in the remote view")

            # the writer stops (its agent is restarted or its node drained): the other takes over
            (run_a1 if first == "a1" else run_b1).__exit__(None, None, None)
            other = "b1" if first == "a1" else "a1"
            wait_for(lambda: snap_all() or writer() == other, timeout=10, what=f"{other} takes over")
            kclient.patch(KNode, "a1", {"metadata": {"annotations": {A.PREFIX + "location": "z"}}},
                          patch_type=PatchType.MERGE)
            wait_for(lambda: backends[other].snapshot() and next(
                n for n in remotes.states()[0].nodes if n.name == "a1").location == "z",
                what="written by the new writer")
            assert backends[other].mirror.stats["takeovers"] == 1
        finally:
            remotes.stop()
    # the records outlive the writers (a remote cluster keeps its routes); the writer key does not
    recs = etcd.records()
    assert writer_key("kube1") not in recs and node_key("kube1", "a1") in recs


def test_a_remote_cluster_reads_the_reports_and_moves_the_leader_as_the_cluster_does(api, kclient, etcd, tmp_path):
    """The reports of a Kubernetes cluster reach another cluster through the mirror, and the other
    cluster's agents choose the same leader as the cluster's own (mesh.leaders)."""
    kclient.create(ConfigMap.from_dict({"metadata": {"name": "meshctl", "namespace": "meshctl"},
                                        "data": {"cluster_name": "kube1", "cluster_id": "3",
                                                 "granularity": "location"}}))
    for i in (1, 2, 3):
        create_node(kclient, node_obj(f"a{i}", f"10.42.{i}.0/24", key=i, internal=f"192.168.1.{i}/24",
                                      endpoint=f"198.51.100.{i}:51820", ann={A.PREFIX + "location": "a"}))
    backends = {n: backend_from_options(api.kubeconfig, n) for n in ("a2", "a3")}
    backends["a2"].mirror = KvstoreMirror(etcd.client(), "a2", lease_ttl=2, full_sync_seconds=30)
    cm_dir = etcd.clustermesh_dir(tmp_path)
    remotes = RemoteClusters(cm_dir, Cluster("other", 9), changed=lambda: None, poll=0.2)

    def remote_leaders() -> tuple[str, ...]:
        backends["a2"].snapshot()  # the agent's reconcile pass offers the view to the mirror
        states = remotes.states()
        if not states:
            return ()
        st = states[0]
        loc = choose_leaders(st.topology(), st.forwarding).locations.get("location:a")
        return loc.leaders if loc is not None else ()

    with Running(backends["a2"]), Running(backends["a3"]):
        remotes.start()
        try:
            wait_for(lambda: remote_leaders() == ("a1",), what="kube1 read by the other cluster, a1 leading")
            now = time.time()
            for n in ("a2", "a3"):
                other = "a3" if n == "a2" else "a2"
                backends[n].publish_forwarding(ForwardingReport(n, "kube1", now, {
                    "a1": Judged("bad", now), other: Judged("ok", now - 60)}))
            wait_for(lambda: remote_leaders() == ("a2",), what="a2 leading kube1's location a in the other cluster")
            local = backends["a2"].snapshot()
            assert choose_leaders(local.topology(), local.forwarding).locations["location:a"].leaders == ("a2",)
            assert {k for k in etcd.records() if "/forwarding/" in k} == {forwarding_key("kube1", "a2"),
                                                                         forwarding_key("kube1", "a3")}
        finally:
            remotes.stop()


def test_a_writer_whose_kubernetes_view_is_not_ready_resigns(etcd):
    mirror = KvstoreMirror(etcd.client(), "a1", lease_ttl=2)
    other = KvstoreMirror(etcd.client(), "b1", lease_ttl=2)
    good = state_of(node("a1", "10.42.1.0/24", 1, "a"))
    mirror.offer(good)
    mirror.step()
    assert mirror.writing and etcd.records()[writer_key("kube1")] == b"a1"
    other.offer(good)
    other.step()
    assert not other.writing and other.writer == "a1"
    mirror.offer(replace(good, ready=False, reason="watching nodes: 503"))
    mirror.step()
    assert not mirror.writing and writer_key("kube1") not in etcd.records()
    assert node_key("kube1", "a1") in etcd.records()  # the last good records stay
    other._check_due = 0  # look again now rather than in a lease TTL
    other.step()
    assert other.writing
    other.release()
    mirror.client.close()
    other.client.close()


def test_the_mirrors_identity_writes_only_its_cluster(etcd):
    from meshctl.etcd import PermissionDenied

    c = etcd.client()
    c.put(node_key("kube1", "x"), "{}")
    with pytest.raises(PermissionDenied):
        c.put(node_key("kube2", "x"), "{}")
    reader = etcd._client(identity.remote_user("other"))
    assert reader.get(node_key("kube1", "x")) is not None
    with pytest.raises(PermissionDenied):
        reader.delete(node_key("kube1", "x"))
