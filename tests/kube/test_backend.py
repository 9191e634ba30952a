# SPDX-License-Identifier: Apache-2.0
"""The Kubernetes backend against a real kube-apiserver (tests/kubernetes.py): list, watch, patch,
410 Gone after a compaction, broken watches after a restart."""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from lightkube import Client, KubeConfig
from lightkube.generic_resource import create_global_resource
from lightkube.resources.core_v1 import ConfigMap
from lightkube.resources.core_v1 import Node as KNode
from lightkube.types import PatchType
from prometheus_client import CollectorRegistry

from meshctl.backends.kube import nodes as A
from meshctl.backends.kube.backend import KubeBackend, backend_from_options, state_from_objects
from meshctl.lab.namespaces.kube_cluster import wait_established
from meshctl.lab.rigs.tcp_forward import pipe
from meshctl.mesh import admit
from meshctl.mesh.model import Cluster, Endpoint, MeshSettings, Node, Topology
from meshctl.mesh.plan import plan_node

from .helpers import Running, create_node, node_obj, wait_for, wg_key

pytestmark = pytest.mark.slow

Peer = create_global_resource("meshctl.io", "v1alpha1", "Peer", "peers")
# Kilo's Peer CRD as a Kilo cluster has it: no pattern on the key, so the agent's own check meets it.
KILO_CRD = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "peers.kilo.squat.ai"},
            "spec": {"group": "kilo.squat.ai", "scope": "Cluster", "names": {"plural": "peers", "kind": "Peer"},
                     "versions": [{"name": "v1alpha1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                         "type": "object", "properties": {"spec": {"type": "object",
                                                                   "x-kubernetes-preserve-unknown-fields": True}}}}}]}}
net = ipaddress.ip_network


def backend(api, name="a1", **kw) -> KubeBackend:
    kw.setdefault("resync_seconds", 30.0)
    return backend_from_options(api.kubeconfig, name, **kw)


def plan_of(state, me: str):
    nodes, rejected = admit.admit_nodes(state.nodes, state.mesh.subnet)
    return plan_node(Topology(state.cluster, state.mesh, tuple(nodes), state.peers), me)


def loc(name: str) -> dict[str, str]:
    return {A.PREFIX + A.LOCATION: name}


def test_node_add_update_delete_reach_the_plan(api, kclient):
    create_node(kclient, node_obj("a1", "10.42.1.0/24", key=1, internal="192.168.10.1/24",
                                  endpoint="198.51.100.1:51820", ann=loc("a")))
    be = backend(api)
    with Running(be) as r:
        wait_for(lambda: [n.name for n in be.snapshot().nodes] == ["a1"], what="a1 listed")
        wait_for(lambda: all(k.listed for k in be._kinds), what="every kind listed")
        relists = be.stats["relists"]
        create_node(kclient, node_obj("a2", "10.42.2.0/24", key=2, internal="192.168.10.2/24", ann=loc("a")))
        create_node(kclient, node_obj("b1", "10.42.3.0/24", key=3, internal="192.168.20.1/24",
                                      endpoint="203.0.113.7:51820", ann=loc("b")))
        wait_for(lambda: len(be.snapshot().nodes) == 3, what="a2 and b1 added")
        assert r.changes >= 3
        # The cache keeps what readers read: no managed fields, no Node status (listed or watched).
        kclient.patch(KNode.Status, "b1", {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
                      patch_type=PatchType.MERGE)
        wait_for(lambda: kclient.get(KNode, "b1").status is not None, what="b1 has a status")
        cached = list(be._kinds[0].objects.values())
        assert cached and all("status" not in o and "managedFields" not in o["metadata"] for o in cached)
        plan = plan_of(be.snapshot(), "a1")
        assert plan.paths == {"a1": "local", "a2": "direct", "b1": "tunnel"}
        assert [p.endpoint for p in plan.peers] == ["203.0.113.7:51820"]

        # update: b1 moves its endpoint
        kclient.patch(KNode, "b1", {"metadata": {"annotations": {A.ENDPOINT: "203.0.113.9:51821"}}},
                      patch_type=PatchType.MERGE)
        wait_for(lambda: plan_of(be.snapshot(), "a1").peers[0].endpoint == "203.0.113.9:51821",
                 what="b1's new endpoint in a1's plan")
        # delete: a2 leaves
        kclient.delete(KNode, "a2")
        wait_for(lambda: "a2" not in plan_of(be.snapshot(), "a1").paths, what="a2 gone from the plan")
        assert net("10.42.2.0/24") not in {rt.dst for rt in plan_of(be.snapshot(), "a1").routes}
        assert be.stats["relists"] == relists  # after the first lists, everything came by watch


def test_a_node_change_nothing_reads_is_cached_without_waking_the_agent(api, kclient):
    """Node status reports, taints and other components' annotations (the TTL controller's) move a
    Node many times a minute in a large cluster; only a change of what meshctl reads wakes it."""
    create_node(kclient, node_obj("a1", "10.42.1.0/24", key=1, internal="192.168.10.1/24", ann=loc("a")))
    be = backend(api, resync_seconds=3600)  # no periodic wake in the test's time
    with Running(be) as r:
        wait_for(lambda: [n.name for n in be.snapshot().nodes] == ["a1"] and all(k.listed for k in be._kinds)
                 and r.changes > 0, what="a1 listed")

        def cached_version() -> int:
            return int(be._kinds[0].objects[("", "a1")]["metadata"]["resourceVersion"])

        unread = [
            (KNode.Status, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}),
            (KNode, {"spec": {"taints": [{"key": "example.com/maintenance", "effect": "NoSchedule"}]}}),
            (KNode, {"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "0"}}}),
        ]
        for res, patch in unread:
            woke = r.changes
            obj = kclient.patch(res, "a1", patch, patch_type=PatchType.MERGE)
            # The cache may already hold a later version: the real controller-manager writes the Node
            # too (its node-lifecycle controller taints a Node without a kubelet, its TTL controller
            # annotates it). resourceVersion is opaque to clients in general; here it is etcd's
            # revision, so "this write or a later one" is a comparison.
            wait_for(lambda obj=obj: cached_version() >= int(obj.metadata.resourceVersion), what=f"{patch} cached")
            assert r.changes == woke, patch
        # What it reads wakes it: a location annotation, a label, the pod CIDR's annotation.
        woke = r.changes
        kclient.patch(KNode, "a1", {"metadata": {"annotations": loc("b")}}, patch_type=PatchType.MERGE)
        wait_for(lambda: r.changes > woke and be.snapshot().nodes[0].location == "b", what="the move woke it")
        woke = r.changes
        kclient.patch(KNode, "a1", {"metadata": {"labels": {"topology.kubernetes.io/zone": "z1"}}},
                      patch_type=PatchType.MERGE)
        wait_for(lambda: r.changes > woke, what="a label woke it")


def test_nodes_are_in_creation_order_then_name():
    objs = []
    for name, created in (("c", "2024-01-01T00:00:02Z"), ("b", "2024-01-01T00:00:01Z"), ("a", "2024-01-01T00:00:02Z")):
        o = node_obj(name, f"10.42.{ord(name)}.0/24", key=ord(name))
        o["metadata"]["creationTimestamp"] = created
        objs.append(o)
    st = state_from_objects(objs, [], Cluster(), MeshSettings(), now=time.time(), max_age=60)
    assert [n.name for n in st.nodes] == ["b", "a", "c"]


def test_publish_patches_own_annotations_only(api, kclient):
    create_node(kclient, node_obj("a1", "10.42.1.0/24", ann={"someone.else/x": "keep", A.PREFIX + "location": "a"},
                                  labels={"topology.kubernetes.io/region": "r1"}))
    be = backend(api, clock=lambda: 1_700_000_000)
    me = Node("a1", (net("10.42.1.0/24"),), wg_key(7), internal_ip=ipaddress.ip_interface("192.168.10.1/24"),
              endpoint=Endpoint("198.51.100.1", 51820), wireguard_ip=ipaddress.ip_interface("10.4.0.1/16"))
    be.publish(me)
    got = kclient.get(KNode, "a1").metadata
    # One merge patch of annotations: the server records meshctl as the manager of exactly those.
    mine = [m for m in got.managedFields if m.manager == "meshctl"]
    assert [(m.operation, m.subresource) for m in mine] == [("Update", None)]
    owned = mine[0].fieldsV1["f:metadata"]
    assert set(owned) == {"f:annotations"}
    assert {k.removeprefix("f:") for k in owned["f:annotations"]} == {
        A.PUBLIC_KEY, A.ENDPOINT, A.INTERNAL_IP, A.WIREGUARD_IP, A.LAST_SEEN, A.GRANULARITY}
    assert got.annotations["someone.else/x"] == "keep"
    assert got.annotations[A.PREFIX + "location"] == "a"
    assert got.labels == {"topology.kubernetes.io/region": "r1"}
    assert got.annotations[A.PUBLIC_KEY] == wg_key(7)
    assert got.annotations[A.ENDPOINT] == "198.51.100.1:51820"
    assert got.annotations[A.INTERNAL_IP] == "192.168.10.1/24"
    assert got.annotations[A.WIREGUARD_IP] == "10.4.0.1/16"
    assert got.annotations[A.LAST_SEEN] == "1700000000"
    assert got.annotations[A.GRANULARITY] == "location"
    # The snapshot sees it at once (the patch answer updates the cache) with the user-set location.
    snap = be.snapshot()
    assert snap.nodes[0].location == "a" and snap.nodes[0].endpoint == Endpoint("198.51.100.1", 51820)
    # A field the node no longer has is removed, not left behind.
    from dataclasses import replace

    be.publish(replace(me, endpoint=None))
    assert A.ENDPOINT not in kclient.get(KNode, "a1").metadata.annotations
    with pytest.raises(Exception, match="not this agent's node"):
        be.publish(replace(me, name="a2"))
    be.close()


def test_publish_for_a_missing_node_is_one_line_error(api):
    from meshctl.errors import MeshError

    be = backend(api, name="ghost")
    with pytest.raises(MeshError, match="node 'ghost' does not exist"):
        be.publish(Node("ghost", (net("10.42.9.0/24"),), wg_key(9)))


def watch_requests(api, resource: str) -> int:
    """How many WATCH requests of `resource` the API server has finished (its own metrics)."""
    text = api.cp.request_text("GET", "/metrics")
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("apiserver_request_total{") and 'verb="WATCH"' in line
               and f'resource="{resource}"' in line)


def test_a_watch_the_server_ends_resumes_without_relisting(api, kclient):
    create_node(kclient, node_obj("a1", "10.42.1.0/24", key=1, ann=loc("a")))
    be = backend(api, watch_timeout=1)  # the server ends each watch after 1 s
    with Running(be):
        wait_for(lambda: len(be.snapshot().nodes) == 1, what="listed")
        relists = be.stats["relists"]
        ended = watch_requests(api, "nodes")
        wait_for(lambda: watch_requests(api, "nodes") >= ended + 2, timeout=30, what="two watches ended by the server")
        create_node(kclient, node_obj("a2", "10.42.2.0/24", key=2, ann=loc("a")))
        wait_for(lambda: len(be.snapshot().nodes) == 2, timeout=30, what="a2 after the resumed watch")
        assert be.stats["relists"] == relists and be.stats["gone"] == 0


def test_a_stale_watch_relists(own_kube):
    """An HA control plane: the backend watches through one API server; it goes down while the
    other one takes writes and etcd is compacted. Back, its new watch cache answers the backend's
    old resourceVersion with 410 Gone, and only a relist is correct."""
    api = own_kube
    kclient = api.client()
    create_node(kclient, node_obj("a1", "10.42.1.0/24", key=1, ann=loc("a")))
    create_node(kclient, node_obj("a2", "10.42.2.0/24", key=2, ann=loc("a")))
    be = backend(api)
    other = api.cp.kubeconfig(api.cp.dir / "other.kubeconfig", server=api.cp.second_apiserver(),
                              identity=api.cp.admin_identity(), user="admin")
    oclient = Client(KubeConfig.from_file(str(other)), trust_env=False)
    with Running(be):
        wait_for(lambda: len(be.snapshot().nodes) == 2, what="listed")
        wait_for(lambda: all(k.rv for k in be._kinds if not k.missing), what="every kind watched")
        relists = be.stats["relists"]
        api.cp.stop_apiserver()
        oclient.delete(KNode, "a2")
        create_node(oclient, node_obj("a3", "10.42.3.0/24", key=3, ann=loc("a")))
        wait_for(lambda: not be.snapshot().ready, timeout=30, what="the backend to lose its API server")
        assert sorted(n.name for n in be.snapshot().nodes) == ["a1", "a2"]  # it missed them
        api.cp.compact()
        api.cp.start_apiserver()
        wait_for(lambda: be.stats["gone"] >= 1, timeout=60, what="410 Gone seen")
        wait_for(lambda: sorted(n.name for n in be.snapshot().nodes) == ["a1", "a3"], timeout=30, what="relisted")
        assert be.stats["relists"] > relists
        # and the watch runs again after the relist
        kclient.delete(KNode, "a3")
        wait_for(lambda: sorted(n.name for n in be.snapshot().nodes) == ["a1"], what="watch after relist")


class Blip:
    """A TCP relay in front of the API server that a test can cut, as a network blip between an
    agent and its server would: `cut` closes every connection and refuses new ones until `mend`.
    The server itself runs on, so every watch resumes from its version (no 410, no relist)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"https://127.0.0.1:{self.listener.getsockname()[1]}"
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        self.down = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            if self.down:
                client.close()
                continue
            server = socket.create_connection(self.target)
            with self.lock:
                self.open += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=pipe, args=(a, b), daemon=True).start()

    def cut(self) -> None:
        self.down = True
        with self.lock:
            for s in self.open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            self.open.clear()

    def mend(self) -> None:
        self.down = False

    def close(self) -> None:
        self.cut()
        self.listener.close()


def test_a_kind_with_no_objects_is_readable_again_once_its_watch_is_accepted(api, kclient, tmp_path):
    """A blip between the backend and its API server breaks every watch. A kind with no objects
    (no Peer exists) has no event to say it is readable again: the server's acceptance of the
    resumed watch says it, and the backend is ready at once, not after the server ends that watch
    (WATCH_TIMEOUT_S, 5 min)."""
    create_node(kclient, node_obj("a1", "10.42.1.0/24", key=1, ann=loc("a")))
    url = urlsplit(api.cp.url)
    blip = Blip((url.hostname or "", url.port or 443))
    kubeconfig = api.cp.kubeconfig(tmp_path / "blip.kubeconfig", server=blip.url,
                                   identity=api.cp.admin_identity(), user="admin")
    be = backend_from_options(str(kubeconfig), "a1", resync_seconds=30.0)
    peers = next(k for k in be._kinds if k.name == "peers.meshctl.io")
    try:
        with Running(be):
            wait_for(lambda: be.snapshot().ready and all(k.rv for k in be._kinds if not k.missing),
                     what="every kind watched")
            assert not peers.objects and not peers.missing
            relists = be.stats["relists"]
            blip.cut()
            wait_for(lambda: peers.error is not None and not be.snapshot().ready, timeout=30,
                     what="the Peer watch broken")
            blip.mend()
            wait_for(lambda: be.snapshot().ready, timeout=30, what="ready again without a Peer event")
            assert peers.error is None and be.stats["relists"] == relists
    finally:
        blip.close()


def test_malformed_annotation_rejects_only_its_node(api, kclient):
    create_node(kclient, node_obj("a1", "10.42.1.0/24", key=1, ann=loc("a")))
    create_node(kclient, node_obj("a2", "10.42.2.0/24", key=2, ann={**loc("a"), A.ENDPOINT: "not an endpoint"}))
    create_node(kclient, node_obj("a3", "10.42.3.0/24", key=3, ann={"kilo.squat.ai/persistent-keepalive": "-5"}))
    create_node(kclient, node_obj("a4", "10.42.4.0/24", key=4, ann=loc("a")))
    reg = CollectorRegistry()
    be = backend(api, registry=reg)
    st = be.snapshot()
    assert st.ready
    assert [n.name for n in st.nodes] == ["a1", "a4"]
    reasons = {r.name: r.reason for r in st.rejections}
    assert reasons["a2"] == "node a2: meshctl.io/endpoint: 'not an endpoint' is not an endpoint: bad host"
    assert reasons["a3"].startswith("node a3: kilo.squat.ai/persistent-keepalive: '-5' ")
    assert reg.get_sample_value("meshctl_kube_rejected_records") == 2
    # Fixing the annotation brings the node back.
    kclient.patch(KNode, "a2", {"metadata": {"annotations": {A.ENDPOINT: "198.51.100.2:51820"}}},
                  patch_type=PatchType.MERGE)
    be._kinds[0].listed = False  # not running: make snapshot list again
    assert [n.name for n in be.snapshot().nodes] == ["a1", "a2", "a4"]
    assert reg.get_sample_value("meshctl_kube_rejected_records") == 1


def test_nodes_that_have_not_joined_are_pending_not_rejected(api, kclient):
    create_node(kclient, node_obj("a1", "10.42.1.0/24", key=1))
    create_node(kclient, node_obj("a2", None, key=2))  # no pod CIDR yet
    create_node(kclient, node_obj("a3", "10.42.3.0/24"))  # agent not started
    st = backend(api).snapshot()
    assert [n.name for n in st.nodes] == ["a1"] and not st.rejections
    assert st.pending == {
        "a2": "it has no pod CIDR yet (spec.podCIDR: the controller manager's --allocate-node-cidrs)",
        "a3": "its agent has not published yet (no meshctl.io/public-key or meshctl.io/last-seen annotation)"}


def test_peer_resources_become_peers(api, kclient):
    # Kilo's CRD too: a Kilo cluster's Peers are read as they are.
    api.apply(KILO_CRD)
    wait_established(lambda args: api.kubectl(*args), "peers.kilo.squat.ai")
    KiloPeer = create_global_resource("kilo.squat.ai", "v1alpha1", "Peer", "peers")
    create_node(kclient, node_obj("a1", "10.42.1.0/24", key=1))
    be = backend(api)
    with Running(be):
        wait_for(lambda: be.snapshot().nodes, what="listed")
        kclient.create(Peer.from_dict({"metadata": {"name": "laptop"}, "spec": {
            "allowedIPs": ["10.5.0.1/32"], "publicKey": wg_key(50), "persistentKeepalive": 10}}))
        kclient.create(Peer.from_dict({"metadata": {"name": "gateway"}, "spec": {
            "allowedIPs": ["10.6.0.0/24", "10.7.0.0/24"], "publicKey": wg_key(51),
            "endpoint": {"dnsOrIP": {"dns": "vpn.example.com"}, "port": 51820}}}))
        # Our CRD's schema makes the API server refuse a bad key (tests/kube/test_peer_psk.py); a
        # Kilo cluster's CRD has no pattern, so the agent's own check meets it.
        kclient.create(KiloPeer.from_dict({"metadata": {"name": "badkey"}, "spec": {
            "allowedIPs": ["10.8.0.1/32"], "publicKey": "AAAA"}}))
        kclient.create(KiloPeer.from_dict({"metadata": {"name": "kilo-phone"}, "spec": {
            "allowedIPs": ["10.9.0.1/32"], "publicKey": wg_key(52),
            "endpoint": {"dnsOrIP": {"ip": "203.0.113.20"}, "port": 51000}}}))
        kclient.create(KiloPeer.from_dict({"metadata": {"name": "kilo-neg"}, "spec": {
            "allowedIPs": ["10.9.0.2/32"], "publicKey": wg_key(53), "persistentKeepalive": -1}}))
        st = wait_for(lambda: (s := be.snapshot()) and len(s.peers) == 3 and len(s.rejections) == 2 and s,
                      what="peers")
        peers = {p.name: p for p in st.peers}
        assert peers["laptop"].allowed_ips == (net("10.5.0.1/32"),) and peers["laptop"].persistent_keepalive == 10
        assert peers["gateway"].endpoint == Endpoint("vpn.example.com", 51820)
        assert peers["kilo-phone"].endpoint == Endpoint("203.0.113.20", 51000)
        reasons = {r.name: r.reason for r in st.rejections}
        assert reasons["badkey"].startswith("peer badkey: spec.publicKey: 'AAAA' is not a WireGuard key")
        assert reasons["kilo-neg"] == "peer kilo-neg: spec.persistentKeepalive: -1 must be >= 0"
        plan = plan_of(st, "a1")
        assert {p.name for p in plan.peers} == {"laptop", "gateway", "kilo-phone"}
        kclient.delete(Peer, "gateway")
        wait_for(lambda: {p.name for p in be.snapshot().peers} == {"laptop", "kilo-phone"}, what="peer deleted")


def test_readiness_by_last_seen(api, kclient):
    now = [1_700_000_000.0]
    create_node(kclient, node_obj("a1", "10.42.1.0/24", key=1, last_seen=now[0] - 500))  # our own: never stale
    create_node(kclient, node_obj("a2", "10.42.2.0/24", key=2, last_seen=now[0] - 59))
    create_node(kclient, node_obj("a3", "10.42.3.0/24", key=3, last_seen=now[0] - 61))
    be = backend(api, resync_seconds=30.0, clock=lambda: now[0])
    st = be.snapshot()
    assert [n.name for n in st.nodes] == ["a1", "a2"] and st.stale == ("a3",)
    now[0] += 2  # a2 now 61 s old too
    assert [n.name for n in be.snapshot().nodes] == ["a1"]
    # a3's agent comes back: its refreshed last-seen makes it ready again
    kclient.patch(KNode, "a3", {"metadata": {"annotations": {A.LAST_SEEN: str(int(now[0]))}}},
                  patch_type=PatchType.MERGE)
    be._kinds[0].listed = False
    assert [n.name for n in be.snapshot().nodes] == ["a1", "a3"]


def test_run_refreshes_last_seen(api, kclient):
    create_node(kclient, node_obj("a1", "10.42.1.0/24"))
    be = backend(api, resync_seconds=0.5)
    be.publish(Node("a1", (net("10.42.1.0/24"),), wg_key(1)))
    first = int(kclient.get(KNode, "a1").metadata.annotations[A.LAST_SEEN])
    with Running(be):
        wait_for(lambda: int(kclient.get(KNode, "a1").metadata.annotations[A.LAST_SEEN]) > first, timeout=30,
                 what="last-seen refreshed")


def test_kilo_annotations_are_read_and_ours_win(api, kclient):
    K = A.KILO_PREFIX
    create_node(kclient, node_obj("k1", "10.42.1.0/24", key=1, internal="192.168.1.1/24", endpoint="10.0.0.1:51820",
                                  ann={K + "location": "gcp", K + "force-endpoint": "198.51.100.9:51999",
                                       K + "leader": "", K + "persistent-keepalive": "25",
                                       K + "allowed-location-ips": "172.16.0.0/24,172.16.1.0/24"},
                                  labels={"topology.kubernetes.io/region": "ignored"}))
    create_node(kclient, node_obj("k2", "10.42.2.0/24", key=2, internal="192.168.1.2/24",
                                  ann={K + "force-internal-ip": "-", K + "location": "gcp",
                                       A.PREFIX + "location": "aws", A.PREFIX + "leader": "false",
                                       K + "leader": ""},
                                  labels={"topology.kubernetes.io/region": "ignored"}))
    create_node(kclient, node_obj("k3", "10.42.3.0/24", key=3, labels={"topology.kubernetes.io/region": "eu-west",
                                                                      "custom/zone": "z9"}))
    st = backend(api).snapshot()
    n = {x.name: x for x in st.nodes}
    assert n["k1"].location == "gcp" and n["k1"].endpoint == Endpoint("198.51.100.9", 51999)
    assert n["k1"].leader and n["k1"].persistent_keepalive == 25
    assert n["k1"].allowed_location_ips == (net("172.16.0.0/24"), net("172.16.1.0/24"))
    assert n["k2"].location == "aws" and n["k2"].internal_ip is None and not n["k2"].leader
    assert n["k3"].location == "eu-west"
    # --location-label picks another label
    assert {x.name: x.location for x in backend(api, location_label="custom/zone").snapshot().nodes}["k3"] == "z9"


def test_mesh_settings_from_configmap_and_flags(api, kclient):
    create_node(kclient, node_obj("a1", "10.42.1.0/24", key=1))
    be = backend(api)
    with Running(be):
        wait_for(lambda: be.snapshot().nodes, what="listed")
        assert be.snapshot().mesh == MeshSettings()
        kclient.create(ConfigMap.from_dict({"metadata": {"name": "meshctl", "namespace": "meshctl"},
                                            "data": {"granularity": "full", "subnet": "10.9.0.0/16", "port": "51999",
                                                     "cluster_name": "east", "cluster_id": "7"}}))
        st = wait_for(lambda: (s := be.snapshot()).mesh.granularity == "full" and s, what="configmap read")
        assert st.mesh.subnet == net("10.9.0.0/16") and st.mesh.port == 51999
        assert st.cluster == Cluster("east", 7)
        kclient.patch(ConfigMap, "meshctl", {"data": {"granularity": "sideways"}}, namespace="meshctl",
                      patch_type=PatchType.MERGE)
        st = wait_for(lambda: (s := be.snapshot()) and not s.ready and s, what="bad configmap seen")
        assert st.reason == ("configmap meshctl/meshctl.granularity: 'sideways' is not one of location, full, cross")
        assert [n.name for n in st.nodes] == ["a1"]  # the last good view stays
    # Flags win over the ConfigMap.
    be2 = backend(api, mesh=MeshSettings(granularity="cross"), cluster=Cluster("west", 2))
    assert be2.snapshot().mesh.granularity == "cross" and be2.snapshot().cluster == Cluster("west", 2)


def test_unreachable_api_keeps_last_view_not_ready(own_kube):
    api = own_kube
    create_node(api.client(), node_obj("a1", "10.42.1.0/24", key=1))
    be = backend(api)
    with Running(be) as r:
        wait_for(lambda: be.snapshot().nodes, what="listed")
        before = r.changes
        api.cp.stop_apiserver()
        # Each kind's watch first meets the connection closed mid-answer, then refused: one cause at the end.
        kinds = "configmap, forwarding reports, nodes, peers.meshctl.io"
        st = wait_for(lambda: (s := be.snapshot()) and s.reason.startswith(f"watching {kinds}: cannot connect") and s,
                      timeout=30, what="every kind's watch refused, said once")
        assert not st.ready and [n.name for n in st.nodes] == ["a1"]
        assert st.reason.count("connection refused") == 1 and api.url in st.reason  # one cause, said once
        assert r.changes > before


def test_bad_options_are_one_line_errors():
    from meshctl.errors import InputError

    kc = str(Path(__file__).with_name("unreachable.kubeconfig"))
    with pytest.raises(InputError, match="--node: 'Not_A_Name' is not a DNS-1123 name"):
        backend_from_options(kc, "Not_A_Name")
    with pytest.raises(InputError, match="--resync: 0 must be > 0"):
        backend_from_options(kc, "a1", resync_seconds=0)
    with pytest.raises(InputError, match="--kubeconfig: '/nonexistent' is not a file"):
        backend_from_options("/nonexistent", "a1")


def test_make_backend_fills_the_node_settings_from_its_node(api, kclient, monkeypatch):
    from meshctl.agent.config import AgentConfig
    from meshctl.agent.kube_backend import make_backend

    K = A.KILO_PREFIX
    create_node(kclient, node_obj("a1", "10.42.7.0/24", ann={K + "location": "gcp", K + "leader": "",
                                                             K + "force-endpoint": "198.51.100.3:51820",
                                                             A.PREFIX + "persistent-keepalive": "15"}))
    monkeypatch.setenv("KUBECONFIG", api.kubeconfig)
    cfg = AgentConfig(node_name="a1", backend="kubernetes", resync_interval=5.0)
    wiring = make_backend(cfg)
    be, own = wiring.backend, wiring.own.current()
    assert isinstance(be, KubeBackend) and be.resync_seconds == 5.0
    assert own.pod_cidrs == (net("10.42.7.0/24"),) and own.location == "gcp" and own.leader
    assert own.endpoint == "198.51.100.3:51820" and own.persistent_keepalive == 15
    assert cfg.pod_cidrs == () and cfg.location == ""  # the config stays the flags'
    cfg2 = AgentConfig(node_name="a1", pod_cidrs=(net("10.42.7.0/24"),), location="flag-wins", backend="kubernetes")
    assert make_backend(cfg2).own.current().location == "flag-wins"


def test_own_annotations_changed_at_run_time_reach_the_node_settings(api, kclient, monkeypatch):
    """The agent builds its own record from its node settings each reconcile, right after
    `snapshot`: an annotation changed while it runs updates those settings there (flags still win)."""
    import threading

    from meshctl.agent.config import AgentConfig
    from meshctl.agent.kube_backend import make_backend

    create_node(kclient, node_obj("a1", None, ann={A.PREFIX + "location": "a", A.PREFIX + "leader": ""}))
    # The Node gets its pod CIDR a moment after the agent starts: the agent waits for it.
    threading.Timer(0.3, lambda: kclient.patch(KNode, "a1", {"spec": {"podCIDR": "10.42.1.0/24"}},
                                               patch_type=PatchType.MERGE)).start()
    monkeypatch.setenv("KUBECONFIG", api.kubeconfig)
    cfg = AgentConfig(node_name="a1", backend="kubernetes", persistent_keepalive=9)  # keepalive set by flag
    wiring = make_backend(cfg)
    be, own = wiring.backend, wiring.own
    assert own.current().pod_cidrs == (net("10.42.1.0/24"),) and own.current().location == "a" and own.current().leader

    def annotate(ann: dict) -> None:
        kclient.patch(KNode, "a1", {"metadata": {"annotations": ann}}, patch_type=PatchType.MERGE)

    with Running(be):
        annotate({A.PREFIX + "location": "b", A.PREFIX + "leader": None, A.PREFIX + "persistent-keepalive": "25",
                  A.KILO_PREFIX + "force-endpoint": "203.0.113.5:51000",
                  A.PREFIX + "allowed-location-ips": "172.16.0.0/24"})
        wait_for(lambda: be.snapshot() and own.current().location == "b", what="new location in the settings")
        assert not own.current().leader and own.current().endpoint == "203.0.113.5:51000"
        assert own.current().allowed_location_ips == (net("172.16.0.0/24"),)
        assert own.current().persistent_keepalive == 9  # the flag wins over the annotation
        # a malformed annotation keeps the last good settings (the others reject the node meanwhile)
        annotate({A.PREFIX + "location": "not a location!"})
        wait_for(lambda: be._kinds[0].objects[("", "a1")]["metadata"]["annotations"].get(A.PREFIX + "location")
                 == "not a location!", what="the bad annotation watched")
        st = be.snapshot()
        assert own.current().location == "b" and st.ready
        # the label takes over once the annotation is removed
        kclient.patch(KNode, "a1", {"metadata": {"labels": {"topology.kubernetes.io/region": "eu-1"},
                                                 "annotations": {A.PREFIX + "location": None}}},
                      patch_type=PatchType.MERGE)
        wait_for(lambda: be.snapshot() and own.current().location == "eu-1", what="location from the label")


def test_a_stopped_etcd_fails_writes_in_one_line_and_the_view_stands(own_kube):
    """etcd stopped (SIGSTOP) under the API server: the agent's publish times out with one line
    naming the server, its last view stays, and once etcd runs again writes and watches go on."""
    from meshctl.errors import MeshError

    api = own_kube
    kclient = api.client()
    # a1's heartbeat a minute old: the publish changes it (a patch that changes nothing is
    # answered without a write to etcd, and would succeed)
    create_node(kclient, node_obj("a1", "10.42.1.0/24", key=1, ann=loc("a"), last_seen=time.time() - 60))
    create_node(kclient, node_obj("a2", "10.42.2.0/24", key=2, ann=loc("a")))
    be = backend(api)
    me = Node("a1", (net("10.42.1.0/24"),), wg_key(1), location="a")
    with Running(be):
        wait_for(lambda: len(be.snapshot().nodes) == 2, what="listed")
        api.cp.pause_etcd()
        try:
            with pytest.raises(MeshError) as e:
                be.publish(me)
            assert api.url in str(e.value) and "\n" not in str(e.value), e.value
            assert [n.name for n in be.snapshot().nodes] == ["a1", "a2"]
        finally:
            api.cp.resume_etcd()
        wait_for(lambda: _published(be, me), timeout=60, what="publish works again")
        kclient.delete(KNode, "a2")
        wait_for(lambda: [n.name for n in be.snapshot().nodes] == ["a1"], timeout=60, what="the watch goes on")


def _published(be: KubeBackend, me: Node) -> bool:
    from meshctl.errors import MeshError

    try:
        be.publish(me)
    except MeshError:
        return False
    return True
