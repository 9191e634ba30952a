# SPDX-License-Identifier: Apache-2.0
"""Global services between two clusters, in process: each cluster has a real etcd (TLS) with its
node records and a real kube-apiserver and kube-controller-manager (tests/kubernetes.py: cluster1
is the session's control plane, cluster2 one of this module's own), the MCS ServiceExport CRD
applied through the API; each cluster runs the global-services step (agent.global_services) beside
a real cluster-mesh watcher of the other's etcd. A cluster's own endpoints are Pods, reported
Running and Ready by the kubelet reproduction (lab.rigs.kubelets) and turned into EndpointSlices by
the real EndpointSlice controller; the tests watch the other cluster's slices follow."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from ipaddress import ip_address
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Node as KNode
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from meshctl.agent.global_services import GlobalServices, MeshWithServices
from meshctl.backends.clustermesh import RemoteClusters
from meshctl.backends.etcd import service_key, services_status_key
from meshctl.backends.kube.informer import as_dict
from meshctl.backends.kube.services import ENDPOINT_SLICES, SERVICES, KubeServiceApi, LeaseElector, ServiceCache
from meshctl.lab.namespaces.kube_cluster import wait_established
from meshctl.lab.rigs.etcd_process import stop_pid
from meshctl.lab.rigs.kube_control_plane import ControlPlane
from meshctl.lab.rigs.kubelets import POD_IP_ANNOTATION
from meshctl.mesh.model import Cluster
from meshctl.mesh.records import parse_topology
from meshctl.mesh.services import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    SERVICE_NAME_LABEL,
    GlobalService,
    ObjectChanges,
    ServiceEndpoint,
    desired_slices,
    local_services,
)
from tests.kubernetes import Api, running_control_plane
from tests.waiting import wait_until

from .fixtures import CLUSTER1, CLUSTER2, SERVICE_EXPORT_CRD
from .test_watch import Remote

pytestmark = pytest.mark.slow

# Polled often: the waits time how fast the slices follow.
wait = partial(wait_until, step=0.02)
# Nodes whose kubelet does not run (a Pod there is reported by the test: not ready).
NO_KUBELET = frozenset({"c2"})
# Another controller's slices (neither the EndpointSlice controller's nor meshctl's).
OTHER_MANAGER = "kt-hand.example"


@pytest.fixture(scope="module")
def second_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """cluster2's control plane, reset before each test like the session's."""
    yield from running_control_plane(tmp_path_factory.mktemp("kt-cluster2"))


@dataclass
class Side:
    """One cluster: its etcd, API server, client, watcher of the other, and the step."""

    name: str
    doc: dict[str, Any]
    etcd: Remote
    api: Api
    kube: Client
    mesh: MeshWithServices | None = None
    pods: list[str] = field(default_factory=list)

    def step(self) -> GlobalServices:
        assert self.mesh is not None
        return self.mesh.services

    def service(self, name: str, **ann: str) -> None:
        """Service `name` selecting the Pods labelled app=`name`, with these annotations."""
        obj = SERVICES.from_dict({"apiVersion": "v1", "kind": "Service",
                                  "metadata": {"name": name, "namespace": "default", "annotations": ann},
                                  "spec": {"selector": {"app": name},
                                           "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
        try:
            self.kube.create(obj, namespace="default")
        except Exception:  # noqa: BLE001 - exists: replace its annotations
            cur = self.kube.get(SERVICES, name, namespace="default")
            cur["metadata"]["annotations"] = ann
            self.kube.replace(cur)

    def pod(self, name: str, app: str, node: str, ip: str) -> None:
        """A Pod of `app` on `node` with address `ip`: Running and Ready by the node's kubelet, or,
        on a node without one, Running and not Ready (as a kubelet reports a failing probe)."""
        self.kube.create(Pod.from_dict({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"app": app},
                         "annotations": {POD_IP_ANNOTATION: ip}},
            "spec": {"nodeName": node, "containers": [{"name": "app", "image": "kt.invalid/app",
                                                        "ports": [{"name": "http", "containerPort": 8080}]}]}}))
        self.pods.append(name)
        if node in NO_KUBELET:
            conds = [{"type": t, "status": "False" if t in ("Ready", "ContainersReady") else "True"}
                     for t in ("Initialized", "Ready", "ContainersReady", "PodScheduled")]
            self.kube.patch(Pod.Status, name, {"status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                                                          "conditions": conds}},
                            namespace="default", patch_type=PatchType.MERGE)

    def delete_pod(self, name: str) -> None:
        self.kube.delete(Pod, name, namespace="default", grace_period=0)
        self.pods.remove(name)

    def local_endpoints(self, service: str) -> list[tuple[str, bool]]:
        """The endpoints of the EndpointSlice controller's slices of `service` (address, ready)."""
        return sorted((a, bool((e.get("conditions") or {}).get("ready")))
                      for s in self.kube.list(ENDPOINT_SLICES, namespace="default",
                                              labels={SERVICE_NAME_LABEL: service,
                                                      MANAGED_BY_LABEL: "endpointslice-controller.k8s.io"})
                      for e in s.get("endpoints") or () for a in e["addresses"])

    def other_slice(self, name: str, service: str, addrs: list[str]) -> None:
        """A slice of `service` written by another controller than Kubernetes' or meshctl's."""
        obj = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": name, "namespace": "default",
                            "labels": {SERVICE_NAME_LABEL: service, MANAGED_BY_LABEL: OTHER_MANAGER}},
               "addressType": "IPv4", "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
               "endpoints": [{"addresses": [a], "conditions": {"ready": True}, "zone": f"{self.name}-z"}
                             for a in addrs]}
        self.kube.create(ENDPOINT_SLICES.from_dict(obj), namespace="default")

    def meshctl_slices(self, service: str) -> dict[str, list[str]]:
        out = {}
        for s in self.kube.list(ENDPOINT_SLICES, namespace="*", labels={MANAGED_BY_LABEL: MANAGED_BY,
                                                                        SERVICE_NAME_LABEL: service}):
            out[s["metadata"]["name"]] = sorted(a for e in s.get("endpoints") or () for a in e["addresses"])
        return out


def prepare(api: Api, doc: dict[str, Any], exports: bool) -> None:
    """The cluster's Nodes (each with its pod CIDR) and kubelets, and the MCS CRD if `exports`;
    Pods are admitted once the service-account controller has made `default`'s account."""
    wait(lambda: api.kubectl("get", "serviceaccount", "default", "-n", "default", check=False).returncode == 0,
         timeout=30, step=0.2, what="the default ServiceAccount")
    c = api.client()
    try:
        for n in doc["nodes"]:
            c.create(KNode.from_dict({"metadata": {"name": n["name"]}, "spec": {"podCIDR": n["pod_cidr"]}}))
    finally:
        c._client._client.close()
    api.cp.start_kubelets({n["name"]: (n.get("internal_ip") or "192.0.2.1/32").split("/")[0]
                           for n in doc["nodes"] if n["name"] not in NO_KUBELET})
    if exports:
        api.apply(SERVICE_EXPORT_CRD)
        wait_established(lambda args: api.kubectl(*args), SERVICE_EXPORT_CRD["metadata"]["name"])


def stop_kubelets(cp: ControlPlane) -> None:
    pid = cp.pids.pop("kubelets", None)
    if pid is not None:
        stop_pid(pid, 5.0)


def wire(side: Side, other: Side, tmp: Path, node: str) -> MeshWithServices:
    """The other cluster's watcher and this cluster's step, as one agent of `side` runs them."""
    d = tmp / f"cm-{side.name}-{node}"
    d.mkdir()
    (d / other.name).write_text(json.dumps(other.etcd.config()))
    kicks: list[Any] = []
    rc = RemoteClusters(d, Cluster(side.name, side.doc["cluster"]["id"]), lambda: [k() for k in kicks], poll=0.1)
    api = KubeServiceApi(side.api.client())
    elector = LeaseElector(api, node, "meshctl", duration=3, renew_deadline=2, retry=0.5)
    step = GlobalServices(lambda: side.name, api, elector, side.etcd.kv, rc,
                          ServiceCache(KubeConfig.from_file(side.api.kubeconfig)))
    kicks.append(step.kick)
    return MeshWithServices(rc, step)


class Passes:
    """The reconcile passes' part: admission of the remote records, every 0.1 s."""

    def __init__(self, sides: list[tuple[MeshWithServices, dict[str, Any]]]) -> None:
        self.sides = sides
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            for mesh, doc in self.sides:
                mesh.admit(parse_topology(doc))


def clusters(tmp_path: Path, apis: tuple[Api, Api], stepping: tuple[str, ...],
             exports: bool = True) -> Iterator[tuple[Side, Side]]:
    """Both clusters; the global-services step runs in the clusters named in `stepping` (a cluster
    without it stands for one whose etcd holds whatever a test writes there)."""
    sides = []
    try:
        for doc, api in zip((CLUSTER1, CLUSTER2), apis, strict=True):
            name = doc["cluster"]["name"]
            etcd = Remote(tmp_path, name)
            sides.append(Side(name, doc, etcd, api, api.client()))
            etcd.publish(doc)
            prepare(api, doc, exports)
        a, b = sides
        a.mesh, b.mesh = wire(a, b, tmp_path, "c1"), wire(b, a, tmp_path, "g1")
        running = [s for s in sides if s.name in stepping]
        passes = Passes([(s.mesh, s.doc) for s in running if s.mesh is not None])
        for s in running:
            assert s.mesh is not None
            s.mesh.start()
        passes.thread.start()
        try:
            yield a, b
        finally:
            passes.stop.set()
            passes.thread.join(5)
            for s in running:
                if s.mesh is not None:
                    s.mesh.stop()
    finally:
        for s in sides:
            stop_kubelets(s.api.cp)
            s.kube._client._client.close()
            s.etcd.stop()


@pytest.fixture
def cluster2(second_kube: ControlPlane) -> Api:
    a = Api(second_kube)
    a.reset()
    return a


@pytest.fixture
def two(tmp_path: Path, api: Api, cluster2: Api) -> Iterator[tuple[Side, Side]]:
    yield from clusters(tmp_path, (api, cluster2), ("cluster1", "cluster2"))


@pytest.fixture
def only_cluster1(tmp_path: Path, api: Api, cluster2: Api) -> Iterator[tuple[Side, Side]]:
    yield from clusters(tmp_path, (api, cluster2), ("cluster1",))


GLOBAL = {"service.cilium.io/global": "true"}


def test_each_cluster_serves_the_others_ready_endpoints_and_follows_changes(two: tuple[Side, Side]) -> None:
    c1, c2 = two
    c1.service("web", **GLOBAL)
    c2.service("web", **GLOBAL)
    c1.pod("web-1", "web", "c1", "10.42.1.5")
    c1.pod("web-2", "web", "c2", "10.42.2.5")  # not ready
    c2.pod("web-1", "web", "g1", "10.43.1.5")
    c2.pod("web-3", "web", "g3", "10.43.3.7")
    # A second slice of cluster1's own (another controller's): published, never touched.
    c1.other_slice("web-other", "web", ["10.42.3.3"])
    wait(lambda: c1.local_endpoints("web") == [("10.42.1.5", True), ("10.42.2.5", False)], timeout=30,
         what="cluster1's EndpointSlice controller")
    wait(lambda: c1.meshctl_slices("web") == {"web-cluster2-v4-0": ["10.43.1.5", "10.43.3.7"]}, timeout=30,
         what="c1 imports")
    wait(lambda: c2.meshctl_slices("web") == {"web-cluster1-v4-0": ["10.42.1.5", "10.42.3.3"]}, timeout=30,
         what="c2 imports (ready only)")
    rec = json.loads(c2.etcd.kv.get(service_key("cluster2", "default", "web")).value)
    assert rec["ports"] == [{"name": "http", "port": 8080, "protocol": "TCP"}]
    # Pods coming and going in cluster2 reach cluster1's slices (through cluster2's EndpointSlice
    # controller, its elected agent, its etcd, cluster1's watch and elected agent): timed from the
    # Pod's creation to the slice.
    lat = []
    for i in range(6):
        name = f"web-2-{i}"
        t0 = time.monotonic()
        c2.pod(name, "web", "g2", f"10.43.2.{10 + i}")
        if i:
            c2.delete_pod(f"web-2-{i - 1}")
        want = ["10.43.1.5", f"10.43.2.{10 + i}", "10.43.3.7"]
        wait(lambda want=want: c1.meshctl_slices("web") == {"web-cluster2-v4-0": want}, timeout=30,
             what=f"change {i}")
        lat.append(time.monotonic() - t0)
    print(f"slice follow latency (a Pod to the other cluster's slice): median {statistics.median(lat) * 1000:.0f} "
          f"ms, max {max(lat) * 1000:.0f} ms over {len(lat)} changes")
    # Every change came by watch: each elected agent listed Services and EndpointSlices once.
    for side in (c1, c2):
        cache = side.step().cache
        assert (cache.services.stats["relists"], cache.slices.stats["relists"]) == (1, 1), side.name
    # The foreign slice is as it was written.
    other = c1.kube.get(ENDPOINT_SLICES, "web-other", namespace="default")
    assert [e["addresses"] for e in other["endpoints"]] == [["10.42.3.3"]]
    assert other["metadata"]["labels"][MANAGED_BY_LABEL] == OTHER_MANAGER
    # ... and so are the EndpointSlice controller's own slices beside meshctl's: neither fights the other.
    assert c1.local_endpoints("web") == [("10.42.1.5", True), ("10.42.2.5", False)]
    # (The controller drops a deleted Pod's endpoint on its own time: a terminating one first.)
    wait(lambda: c2.local_endpoints("web") == [("10.43.1.5", True), ("10.43.2.15", True), ("10.43.3.7", True)],
         timeout=30, what="cluster2's EndpointSlice controller")
    # Status: one global service, cluster2's 3 endpoints here.
    st = c1.step().status()
    assert st["services"] == [{"namespace": "default", "name": "web", "shared": True, "affinity": "none",
                               "local_endpoints": 2, "remote_endpoints": {"cluster2": 3}}]
    assert st["services_leader"] == "c1"
    # cluster2's Service no longer global: its record goes, and cluster1's slice with it.
    t0 = time.monotonic()
    c2.service("web")
    wait(lambda: c1.meshctl_slices("web") == {}, timeout=30, what="slice removed")
    print(f"slice removal after un-global: {(time.monotonic() - t0) * 1000:.0f} ms")
    assert c2.etcd.kv.get(service_key("cluster2", "default", "web")) is None
    # ... and cluster2, whose web is not global any more, imports nothing either.
    wait(lambda: c2.meshctl_slices("web") == {}, timeout=30, what="cluster2's import removed")


@pytest.fixture
def two_without_mcs(tmp_path: Path, api: Api, cluster2: Api) -> Iterator[tuple[Side, Side]]:
    yield from clusters(tmp_path, (api, cluster2), ("cluster1", "cluster2"), exports=False)


def test_clusters_without_the_mcs_crd_share_global_services(two_without_mcs: tuple[Side, Side]) -> None:
    """Most clusters have no ServiceExport CRD: the API server answers its group with a plain-text
    404, which is "no exports", not a failure of the step."""
    c1, c2 = two_without_mcs
    c1.service("web", **GLOBAL)
    c2.service("web", **GLOBAL)
    c2.pod("web-1", "web", "g1", "10.43.1.5")
    wait(lambda: c1.meshctl_slices("web") == {"web-cluster2-v4-0": ["10.43.1.5"]}, timeout=30, what="c1 imports")
    st = c1.step().status()
    assert [(g["name"], g["remote_endpoints"]) for g in st["services"]] == [("web", {"cluster2": 1})]


def test_an_endpoint_outside_the_pod_cidrs_is_rejected_alone_and_named(only_cluster1: tuple[Side, Side]) -> None:
    c1, c2 = only_cluster1
    c1.service("web", **GLOBAL)
    c1.service("api", **{"meshctl.io/global": "true"})
    c1.service("db", **GLOBAL)
    # What cluster2's etcd holds (its elected agent would never write these two, but its etcd
    # holds whatever its writers put there).
    rec = {"cluster": "cluster2", "namespace": "default", "name": "web", "ports": [{"port": 80}],
           "endpoints": [{"addresses": ["10.43.1.5"]}, {"addresses": ["10.99.0.5"]}]}
    c2.etcd.kv.put(service_key("cluster2", "default", "web"), json.dumps(rec))
    c2.etcd.kv.put(service_key("cluster2", "default", "api"), json.dumps({**rec, "name": "api", "cluster": "cluster3"}))
    c2.etcd.kv.put(service_key("cluster2", "default", "db"), json.dumps(
        {**rec, "name": "db", "endpoints": [{"addresses": ["10.43.2.9"]}]}))
    wait(lambda: len(c1.step().status()["service_rejections"]) == 2, what="two rejections")
    reasons = {r["name"]: r["reason"] for r in c1.step().status()["service_rejections"]}
    assert reasons == {
        "cluster2/services/default/web/10.99.0.5": "/meshctl/cluster2/services/default/web.endpoints[1]: "
                                                   "'10.99.0.5' is in no pod CIDR of cluster cluster2's admitted nodes",
        "cluster2/services/default/api": "/meshctl/cluster2/services/default/api.cluster: 'cluster3' is not its "
                                         "key's 'cluster2'",
    }
    # Rejected alone: the good endpoint of web, and all of db, are served.
    wait(lambda: c1.meshctl_slices("web") == {"web-cluster2-v4-0": ["10.43.1.5"]}, what="web's good endpoint")
    wait(lambda: c1.meshctl_slices("db") == {"db-cluster2-v4-0": ["10.43.2.9"]}, what="db")
    assert c1.meshctl_slices("api") == {}


def test_one_elected_writer_per_cluster_and_a_takeover_when_it_leaves(two: tuple[Side, Side], tmp_path: Path) -> None:
    c1, c2 = two
    second = wire(c1, c2, tmp_path, "c2")  # a second agent of cluster1
    second.start()
    try:
        c1.service("web", **GLOBAL)
        c2.service("web", **GLOBAL)
        c2.pod("web-1", "web", "g1", "10.43.1.5")
        passes = Passes([(second, c1.doc)])
        passes.thread.start()
        wait(lambda: c1.meshctl_slices("web") == {"web-cluster2-v4-0": ["10.43.1.5"]}, timeout=30, what="import")
        assert c1.step().elector.leading and not second.services.elector.leading
        assert second.services.status()["services_leader"] == "c1"
        assert second.services.stats["slice_writes"] == 0
        # The follower watches nothing of Kubernetes (only the elected agent runs informers): it
        # shows what the elected agent published in the cluster's etcd.
        assert c1.step().cache.running and not second.services.cache.running
        assert second.services.stats["passes"] == 0
        wait(lambda: second.services.status()["services"] == c1.step().status()["services"]
             and c1.step().status()["services"][0]["remote_endpoints"] == {"cluster2": 1}, what="the follower's view")
        record = json.loads(c1.etcd.kv.get(services_status_key("cluster1")).value)
        assert record["leader"] == "c1" and [s["name"] for s in record["services"]] == ["web"]
        assert c1.mesh is not None
        t0 = time.monotonic()
        c1.mesh.stop()  # releases the Lease
        wait(lambda: second.services.elector.leading, what="takeover")
        print(f"takeover after release: {(time.monotonic() - t0) * 1000:.0f} ms")
        assert not c1.step().cache.running  # stopped with its agent
        wait(lambda: second.services.cache.running and second.services.stats["passes"] >= 1,
             what="the new writer lists")
        c2.pod("web-6", "web", "g1", "10.43.1.6")
        c2.delete_pod("web-1")
        wait(lambda: c1.meshctl_slices("web") == {"web-cluster2-v4-0": ["10.43.1.6"]}, timeout=30,
             what="the new writer writes")
        c1.mesh = None  # stopped: the fixture leaves it
        passes.stop.set()
    finally:
        second.stop()


def test_slices_go_when_the_remote_cluster_goes(two: tuple[Side, Side], tmp_path: Path) -> None:
    c1, c2 = two
    c1.service("web", **GLOBAL)
    c2.service("web", **GLOBAL)
    c2.pod("web-1", "web", "g1", "10.43.1.5")
    wait(lambda: c1.meshctl_slices("web") == {"web-cluster2-v4-0": ["10.43.1.5"]}, timeout=30, what="import")
    # cluster2's clustermesh file removed from cluster1's agent: its nodes drain, and its endpoints
    # with them (they are admitted against its admitted nodes).
    (tmp_path / "cm-cluster1-c1" / "cluster2").unlink()
    t0 = time.monotonic()
    wait(lambda: c1.meshctl_slices("web") == {}, what="slices gone with the cluster")
    print(f"slices gone {(time.monotonic() - t0) * 1000:.0f} ms after the cluster's file went")
    assert c1.step().status()["services"][0]["remote_endpoints"] == {}


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Away(KubeServiceApi):
    """An agent's API client that can lose the API server (a partition)."""

    away = False

    def get_lease(self, ns: str, name: str) -> dict[str, Any] | None:
        if self.away:
            raise ConnectionError("API server unreachable")
        return super().get_lease(ns, name)


def test_a_lease_not_renewed_is_taken_over_after_its_duration_and_the_old_holder_steps_down_first(
        api: Api) -> None:
    ca, cb = api.client(), api.client()
    try:
        clock = Clock()
        a_api = Away(ca)
        a = LeaseElector(a_api, "a1", "meshctl", duration=15, renew_deadline=10, retry=2, clock=clock)
        b = LeaseElector(KubeServiceApi(cb), "a2", "meshctl", duration=15, renew_deadline=10, retry=2,
                         clock=clock)
        assert a.tick() and not b.tick() and b.holder == "a1"
        for _ in range(5):  # a1 renews every retry: a2 never takes over
            clock.t += 2
            assert a.tick() and not b.tick()
        renewed = clock.t
        a_api.away = True  # a1 cannot renew any more
        stepped_down = took_over = None
        while took_over is None:
            clock.t += 0.5
            a_leads, b_leads = a.tick(), b.tick()
            assert not (a_leads and b_leads), f"two leaders at +{clock.t - renewed} s"
            if not a_leads and stepped_down is None:
                stepped_down = clock.t - renewed
            if b_leads:
                took_over = clock.t - renewed
        assert stepped_down is not None and 10 < stepped_down <= 12, stepped_down  # its renew deadline (+ a retry)
        assert 15 <= took_over <= 17.5, took_over  # the whole lease unrenewed, by a2's clock (+ a retry)
        assert b.holder == "a2" and b.transitions == 1
        a_api.away = False
        clock.t += 2
        assert not a.tick() and a.holder == "a2"
    finally:
        for c in (ca, cb):
            c._client._client.close()


def test_an_agent_restarted_while_the_remote_etcd_is_away_keeps_the_slices(two: tuple[Side, Side],
                                                                            tmp_path: Path) -> None:
    c1, c2 = two
    c1.service("web", **GLOBAL)
    c2.service("web", **GLOBAL)
    c2.pod("web-1", "web", "g1", "10.43.1.5")
    wait(lambda: c1.meshctl_slices("web") == {"web-cluster2-v4-0": ["10.43.1.5"]}, timeout=30, what="import")
    assert c1.mesh is not None
    c1.mesh.stop()
    c2.etcd.etcd.stop()  # cluster2's etcd away
    restarted = wire(c1, c2, tmp_path, "c1-again")
    c1.mesh = restarted  # the fixture stops it
    passes = Passes([(restarted, c1.doc)])
    restarted.start()
    passes.thread.start()
    try:
        wait(lambda: restarted.services.elector.leading, what="the restarted agent leads")
        # Its passes that knew the admitted clusters (cluster2 configured, its view not arrived)
        # kept the slice: one when it came to lead, one more when something woke it.
        wait(lambda: restarted.services.stats["decided"] >= 1, what="a pass that decides")
        restarted.services.kick()
        wait(lambda: restarted.services.stats["decided"] >= 2, what="another pass")
        assert c1.meshctl_slices("web") == {"web-cluster2-v4-0": ["10.43.1.5"]}
        assert restarted.services.stats["slice_writes"] == 0
    finally:
        passes.stop.set()


def test_one_refused_slice_write_is_named_and_the_others_go_on(api: Api) -> None:
    c = api.client()
    try:
        k = KubeServiceApi(c)

        def slices() -> list[dict[str, Any]]:
            return [as_dict(o) for o in c.list(ENDPOINT_SLICES, namespace="*")]

        written: list[tuple[str, str, bool]] = []  # what a cache is handed: each write's answer
        web = remote_service("default", "web", "10.43.1.5")
        gone = remote_service("gone", "api", "10.43.2.9")  # its namespace does not exist (any more)
        n, failed = k.apply(ObjectChanges(creates=(gone, web)),
                            lambda o, deleted: written.append((o["metadata"]["name"], o["metadata"]["resourceVersion"],
                                                               deleted)))
        assert n == 1 and len(failed) == 1
        assert failed[0].startswith("endpointslice gone/api-cluster2-v4-0: create: ") and "gone" in failed[0][40:]
        assert [s["metadata"]["name"] for s in slices()] == ["web-cluster2-v4-0"]
        assert written == [("web-cluster2-v4-0", slices()[0]["metadata"]["resourceVersion"], False)]
        # A delete of a slice someone else now labels is skipped; of a missing one, no failure.
        theirs = {**web, "metadata": {**web["metadata"], "labels": {SERVICE_NAME_LABEL: "web"}}}
        k.client.replace(ENDPOINT_SLICES.from_dict({**theirs, "metadata": {
            **theirs["metadata"], "resourceVersion": slices()[0]["metadata"]["resourceVersion"]}}))
        assert k.apply(ObjectChanges(deletes=(("default", "web-cluster2-v4-0"), ("default", "nope")))) == (0, [])
        assert [s["metadata"]["name"] for s in slices()] == ["web-cluster2-v4-0"]
    finally:
        c._client._client.close()


def remote_service(ns: str, name: str, addr: str) -> dict[str, Any]:
    """The slice desired_slices gives for cluster2's one endpoint of ns/name, global here."""
    local = local_services("cluster1", [{"metadata": {"name": name, "namespace": ns, "annotations": GLOBAL}}], [])
    [obj] = desired_slices(local, [GlobalService("cluster2", ns, name, (), (ServiceEndpoint(ip_address(addr)),))]
                           ).values()
    return obj
