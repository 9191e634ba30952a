# SPDX-License-Identifier: Apache-2.0
"""Global services on the namespace lab: two clusters with the Kubernetes backend in a cluster mesh
(each cluster's nodes mirrored into its etcd with --kvstore, each agent watching the other's etcd),
real agents, real WireGuard. The lab has no EndpointSlice controller: the test writes each
cluster's own slices as that controller would (its pods' addresses), and checks that the other
cluster's agents write slices carrying them, follow changes within a second, drop them when the
Service is no longer exported, reject an endpoint outside the cluster's pod CIDRs alone, and that
a pod reaches a remote endpoint's address."""

from __future__ import annotations

import json
import re
import statistics
import time
import urllib.error
import urllib.request
from functools import partial
from typing import Any

import pytest

from meshctl.agent.status import AgentStatus
from meshctl.cli.agent import format_status
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces.state import ClusterState, LabState
from meshctl.mesh.services import MANAGED_BY, MANAGED_BY_LABEL, SERVICE_NAME_LABEL
from meshctl.setns import in_netns
from tests.clustermesh.fixtures import SERVICE_EXPORT_CRD
from tests.kube.helpers import lab_fixture
from tests.waiting import wait_until

# Polled often: the waits time how fast the slices follow.
wait = partial(wait_until, step=0.02)

pytestmark = [pytest.mark.root, pytest.mark.slow]

LAB = {
    "clusters": [
        {"cluster": {"name": "cluster1", "id": 1}, "mesh": {"granularity": "location", "subnet": "10.4.0.0/16"},
         "nodes": [{"name": "a1", "location": "loc-a", "internal_ip": "10.10.1.11/24", "pod_cidr": "10.42.1.0/24"},
                   {"name": "a2", "location": "loc-b", "internal_ip": "10.10.2.11/24", "pod_cidr": "10.42.2.0/24"}]},
        {"cluster": {"name": "cluster2", "id": 2}, "mesh": {"granularity": "location", "subnet": "10.5.0.0/16"},
         "nodes": [{"name": "g1", "location": "gpu-a", "internal_ip": "10.10.1.21/24", "pod_cidr": "10.43.1.0/24"},
                   {"name": "g2", "location": "gpu-b", "internal_ip": "10.10.5.21/24", "pod_cidr": "10.43.2.0/24"}]},
    ],
    "lab": {"backend": "kubernetes", "clustermesh": True, "lease_ttl": 3, "fastpath": False},
}

lab = lab_fixture(LAB, wait=180)

SLICES = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"


def api(c: ClusterState, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One request to a lab cluster's API server, from its namespace (as kubectl would)."""
    assert c.kube is not None
    url = c.kube.url + path

    def call() -> tuple[int, Any]:
        req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    return in_netns(c.kube.netns, call)


def put_slice(c: ClusterState, name: str, service: str, eps: list[tuple[str, bool]]) -> None:
    """What the EndpointSlice controller would write for the cluster's own pods."""
    obj: dict[str, Any] = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "default",
                     "labels": {SERVICE_NAME_LABEL: service, MANAGED_BY_LABEL: "endpointslice-controller.k8s.io"}},
        "addressType": "IPv4", "ports": [{"name": "echo", "port": 7, "protocol": "TCP"}],
        "endpoints": [{"addresses": [a], "conditions": {"ready": r}} for a, r in eps]}
    code, cur = api(c, "GET", f"{SLICES}/{name}")
    if code == 200:
        obj["metadata"]["resourceVersion"] = cur["metadata"]["resourceVersion"]
        code, _ = api(c, "PUT", f"{SLICES}/{name}", obj)
        assert code == 200, code
    else:
        code, _ = api(c, "POST", SLICES, obj)
        assert code == 201, code


def service(c: ClusterState, name: str, annotations: dict[str, str]) -> None:
    code, _ = api(c, "POST", "/api/v1/namespaces/default/services",
                  {"apiVersion": "v1", "kind": "Service",
                   "metadata": {"name": name, "namespace": "default", "annotations": annotations},
                   "spec": {"ports": [{"name": "echo", "port": 7}]}})
    assert code == 201, code


def meshctl_slices(c: ClusterState, service: str) -> dict[str, list[str]]:
    sel = f"{MANAGED_BY_LABEL}={MANAGED_BY},{SERVICE_NAME_LABEL}={service}"
    code, doc = api(c, "GET", f"{SLICES}?labelSelector={urllib.request.quote(sel)}")
    assert code == 200, code
    return {s["metadata"]["name"]: sorted(a for e in s.get("endpoints") or () for a in e["addresses"])
            for s in doc.get("items") or ()}


def clustermesh_of(st: LabState, node: str) -> dict[str, Any]:
    s = labcheck.agent_status(st.lookup(node)[1]) or {}
    return s.get("remotes") or {}


def test_global_services_across_two_kubernetes_clusters(lab: LabState) -> None:
    c1, c2 = lab.clusters
    pods = {n.name: n.pods[0].ip for _, n in lab.nodes()}
    for c in (c1, c2):
        # Both clusters' watchers see the other's nodes through its etcd (the kvstore mirror).
        wait(lambda c=c: all(x.get("ready") and x.get("nodes") == 2 for x in
                             (clustermesh_of(lab, c.nodes[0].name).get("clusters") or [{}])), 120,
             f"{c.name}'s cluster mesh ready")
        code, _ = api(c, "POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", SERVICE_EXPORT_CRD)
        assert code == 201, code
    if api(c1, "GET", "/api/v1/namespaces/default/services")[0] == 404:
        pytest.skip("this lab's API server does not serve Services yet (the kube_apiserver package adds them)")
    # cluster1: web global by annotation; cluster2: web exported by an MCS ServiceExport.
    service(c1, "web", {"service.cilium.io/global": "true"})
    service(c2, "web", {})
    code, _ = api(c2, "POST", "/apis/multicluster.x-k8s.io/v1alpha1/namespaces/default/serviceexports",
                  {"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
                   "metadata": {"name": "web", "namespace": "default"}})
    assert code == 201, code
    put_slice(c1, "web-own", "web", [(pods["a1"], True), (pods["a2"], True)])
    put_slice(c2, "web-own", "web", [(pods["g1"], True), (pods["g2"], False)])
    wait(lambda: meshctl_slices(c1, "web") == {"web-cluster2-v4-0": [pods["g1"]]}, 30, "cluster1 serves g1's pod")
    wait(lambda: meshctl_slices(c2, "web") == {"web-cluster1-v4-0": sorted([pods["a1"], pods["a2"]])}, 30,
         "cluster2 serves cluster1's pods")
    # A pod of cluster1 reaches the remote endpoint's address.
    addr = meshctl_slices(c1, "web")["web-cluster2-v4-0"][0]
    a1 = lab.lookup("a1")[1]
    deadline = time.monotonic() + 30
    while True:
        sent, recv, rtt = labcheck.ping(a1.pods[0].netns, addr, count=3)
        if recv == sent or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert recv == sent, f"a1's pod does not reach {addr}"
    print(f"a1 pod -> remote endpoint {addr}: rtt {rtt} ms")
    # Slices follow changes: g2's pod ready and not, alternately.
    lat = []
    for i in range(6):
        ready = i % 2 == 0
        t0 = time.monotonic()
        put_slice(c2, "web-own", "web", [(pods["g1"], True), (pods["g2"], ready)])
        want = sorted([pods["g1"], pods["g2"]]) if ready else [pods["g1"]]
        wait(lambda want=want: meshctl_slices(c1, "web") == {"web-cluster2-v4-0": want}, 10, f"change {i}")
        lat.append(time.monotonic() - t0)
    print(f"lab slice follow latency: median {statistics.median(lat) * 1000:.0f} ms, "
          f"max {max(lat) * 1000:.0f} ms over {len(lat)} changes: {[round(x * 1000) for x in lat]}")
    assert max(lat) < 1.0, lat
    # Status: one global service on every cluster1 agent, listed with --verbose.
    for n in c1.nodes:
        doc = labcheck.agent_status(n)
        assert doc is not None
        text = format_status(AgentStatus.from_json(doc), verbose=True)
        assert "ClusterMesh: 1/1 remote clusters ready, 1 global-services" in text, text
        assert any(line.strip().startswith("default/web  local 2  remote cluster2 ") for line in text.splitlines())
    # An endpoint outside cluster2's pod CIDRs (a host address) is rejected alone, and named.
    put_slice(c2, "web-own", "web", [(pods["g1"], True), ("10.10.1.21", True)])
    wait(lambda: any(r["name"] == "cluster2/services/default/web/10.10.1.21"
                     for r in clustermesh_of(lab, "a1").get("service_rejections") or ()), 10, "rejection named")
    assert meshctl_slices(c1, "web") == {"web-cluster2-v4-0": [pods["g1"]]}
    # No longer exported: cluster1's slice goes.
    t0 = time.monotonic()
    code, _ = api(c2, "DELETE", "/apis/multicluster.x-k8s.io/v1alpha1/namespaces/default/serviceexports/web")
    assert code == 200, code
    wait(lambda: meshctl_slices(c1, "web") == {}, 10, "slice removed")
    print(f"lab slice removal after the export went: {(time.monotonic() - t0) * 1000:.0f} ms")
    # cluster1's own slices were never touched.
    code, own = api(c1, "GET", f"{SLICES}/web-own")
    assert code == 200 and sorted(e["addresses"][0] for e in own["endpoints"]) == sorted([pods["a1"], pods["a2"]])


def test_kubernetes_agents_follow_the_other_cluster_through_the_cache(lab: LabState) -> None:
    """cluster1's cache mirrors cluster2 into cluster1's kvstore etcd; cluster1's Kubernetes agents,
    restarted with --clustermesh-cache, read cluster2 there (status `via cache`, the global service
    still counted) and route to cluster2's pods again."""
    from meshctl.lab.namespaces import build

    c1, c2 = lab.clusters
    build.start_cache(lab, c1.name)
    try:
        for n in c1.nodes:
            build.stop_agent(lab, n.name)
            build.start_agent(lab, n.name, extra_args=("--clustermesh-cache",))
        for n in c1.nodes:
            wait(lambda n=n: clustermesh_of(lab, n.name).get("via") == "via cache"
                 and all(x.get("ready") for x in clustermesh_of(lab, n.name).get("clusters") or [{}]),
                 60, f"{n.name} via the cache")
            doc = labcheck.agent_status(n)
            assert doc is not None
            text = format_status(AgentStatus.from_json(doc))
            assert re.search(r"ClusterMesh: 1/1 remote clusters ready, \d+ global-services, via cache", text), text
        a1 = lab.lookup("a1")[1]
        for g in c2.nodes:
            deadline = time.monotonic() + 30
            while (ok := labcheck.ping(a1.pods[0].netns, g.pods[0].ip, count=2)[1] > 0) is False \
                    and time.monotonic() < deadline:
                time.sleep(0.5)
            assert ok, f"a1's pod does not reach {g.name}'s pod through routes read from the cache"
    finally:
        build.stop_cache(lab, c1.name)
