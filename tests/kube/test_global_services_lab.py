# SPDX-License-Identifier: Apache-2.0
"""Global services on the namespace lab: two clusters with the Kubernetes backend in a cluster mesh
(each cluster's nodes mirrored into its etcd with --kvstore, each agent watching the other's etcd),
real agents, real WireGuard. Each cluster is a real control plane whose EndpointSlice
controller makes the local slices from Pods (the lab's pods, reported Running and Ready at their
addresses by the kubelet reproduction). The other cluster's elected agent writes slices carrying
them beside the controller's, follows readiness changes, drops them when the Service is no longer
global, rejects an endpoint outside the cluster's pod CIDRs alone; the controller never touches
meshctl's slices; and a pod reaches a remote endpoint's address."""

from __future__ import annotations

import re
import statistics
import time
import urllib.error
import urllib.request
from functools import partial
from importlib.resources import files
from typing import Any

import pytest

from meshctl.agent.status import AgentStatus
from meshctl.backends.file import load_yaml
from meshctl.cli.agent import format_status
from meshctl.errors import MeshError
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces import kube_api, kube_cluster
from meshctl.lab.namespaces.state import ClusterState, LabState
from meshctl.lab.rigs import kubelets
from meshctl.mesh.services import MANAGED_BY, MANAGED_BY_LABEL, SERVICE_NAME_LABEL
from tests.kube.helpers import lab_fixture
from tests.waiting import wait_until

# Polled often: the waits time how fast the slices follow.
wait = partial(wait_until, step=0.02)

pytestmark = [pytest.mark.root, pytest.mark.slow]

# The two Kubernetes clusters of the global-services lab file.
LAB = load_yaml(str(files("meshctl") / "lab" / "labs" / "global-services.yaml"))

lab = lab_fixture(LAB, wait=180)

SLICES = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"


def api(c: ClusterState, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One request to a lab cluster's API server as its admin, from its namespace."""
    assert c.kube is not None
    try:
        return 200, kube_api.request(c.kube, method, path, body)
    except MeshError as e:
        code = re.match(r"\S+ \S+: (\d+)", str(e))
        return (int(code.group(1)) if code else 0), str(e)


def run_pod(lab: LabState, c: ClusterState, node: str, service: str, *, ready: bool = True) -> None:
    """The Pod of `node`'s lab pod behind `service`, (re)made with its readiness: what a kubelet
    would report for it, so the EndpointSlice controller lists it."""
    pod = lab.lookup(node)[1].pods[0]
    name = f"{service}-{node}"
    obj = kube_cluster.pod_object(name, "default", node, pod.ip, {"app": service}, ready=ready)
    code, _ = api(c, "GET", f"/api/v1/namespaces/default/pods/{name}")
    if code == 200:
        assert c.kube is not None
        ann = {kubelets.READY_ANNOTATION: None, **obj["metadata"]["annotations"]}  # null: merge-patch removes it
        kube_api.request(c.kube, "PATCH", f"/api/v1/namespaces/default/pods/{name}", {"metadata": {"annotations": ann}},
                         content_type="application/merge-patch+json")
    else:
        wait(lambda: api(c, "POST", "/api/v1/namespaces/default/pods", obj)[0] == 200, 30, f"pod {name} created")


def service(c: ClusterState, name: str, annotations: dict[str, str]) -> None:
    code, err = api(c, "POST", "/api/v1/namespaces/default/services",
                    {"apiVersion": "v1", "kind": "Service",
                     "metadata": {"name": name, "namespace": "default", "annotations": annotations},
                     "spec": {"selector": {"app": name}, "ports": [{"name": "echo", "port": 7}]}})
    assert code == 200, err


def controller_slices(c: ClusterState, service: str) -> dict[str, list[str]]:
    """The EndpointSlice controller's slices of `service`: ready addresses by slice."""
    sel = f"{MANAGED_BY_LABEL}=endpointslice-controller.k8s.io,{SERVICE_NAME_LABEL}={service}"
    code, doc = api(c, "GET", f"{SLICES}?labelSelector={urllib.request.quote(sel)}")
    assert code == 200, doc
    return {s["metadata"]["name"]: sorted(a for e in s.get("endpoints") or ()
                                          if (e.get("conditions") or {}).get("ready") for a in e["addresses"])
            for s in doc.get("items") or ()}


def meshctl_slices(c: ClusterState, service: str) -> dict[str, list[str]]:
    sel = f"{MANAGED_BY_LABEL}={MANAGED_BY},{SERVICE_NAME_LABEL}={service}"
    code, doc = api(c, "GET", f"{SLICES}?labelSelector={urllib.request.quote(sel)}")
    assert code == 200, doc
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
    # cluster1: web global by Cilium's annotation; cluster2: by meshctl's alias.
    service(c1, "web", {"service.cilium.io/global": "true"})
    service(c2, "web", {"meshctl.io/global": "true"})
    for node in ("a1", "a2", "g1"):
        run_pod(lab, c1 if node.startswith("a") else c2, node, "web")
    run_pod(lab, c2, "g2", "web", ready=False)
    wait(lambda: sorted(a for x in controller_slices(c1, "web").values() for a in x)
         == sorted([pods["a1"], pods["a2"]]), 60, "cluster1's controller listing a1's and a2's pods")
    wait(lambda: meshctl_slices(c1, "web") == {"web-cluster2-v4-0": [pods["g1"]]}, 30, "cluster1 serves g1's pod")
    wait(lambda: meshctl_slices(c2, "web") == {"web-cluster1-v4-0": sorted([pods["a1"], pods["a2"]])}, 30,
         "cluster2 serves cluster1's pods")
    # A pod of cluster1 reaches the remote endpoint's address.
    addr = meshctl_slices(c1, "web")["web-cluster2-v4-0"][0]
    a1 = lab.lookup("a1")[1]
    sent, recv, rtt = wait(lambda: (p := labcheck.ping(a1.pods[0].netns, addr, count=3))[0] == p[1] and p, 30,
                           f"a1's pod reaching {addr}")
    print(f"a1 pod -> remote endpoint {addr}: rtt {rtt} ms")
    # Slices follow changes: g2's pod ready and not, alternately.
    lat = []
    for i in range(6):
        ready = i % 2 == 0
        t0 = time.monotonic()
        run_pod(lab, c2, "g2", "web", ready=ready)
        want = sorted([pods["g1"], pods["g2"]]) if ready else [pods["g1"]]
        wait(lambda want=want: meshctl_slices(c1, "web") == {"web-cluster2-v4-0": want}, 30, f"change {i}")
        lat.append(time.monotonic() - t0)
    print(f"lab slice follow latency: median {statistics.median(lat) * 1000:.0f} ms, "
          f"max {max(lat) * 1000:.0f} ms over {len(lat)} changes: {[round(x * 1000) for x in lat]}")
    # The readiness goes through the kubelet, the EndpointSlice controller, cluster2's elected agent
    # (woken by its informers' events), its etcd, and cluster1's elected agent (woken by that
    # watch): within a second, not a listing period later (bench/ has the figures).
    assert statistics.median(lat) < 1.0, lat
    # The EndpointSlice controller never wrote meshctl's slice: every write to it was meshctl's.
    code, mine = api(c1, "GET", f"{SLICES}/web-cluster2-v4-0")
    assert code == 200 and {m["manager"] for m in mine["metadata"]["managedFields"]} == {"meshctl"}, mine
    # Status: one global service on every cluster1 agent, listed with --verbose.
    for n in c1.nodes:
        doc = labcheck.agent_status(n)
        assert doc is not None
        text = format_status(AgentStatus.from_json(doc), verbose=True)
        assert "ClusterMesh: 1/1 remote clusters ready, 1 global-services" in text, text
        assert any(line.strip().startswith("default/web  local 2  remote cluster2 ") for line in text.splitlines())
    # An endpoint outside cluster2's pod CIDRs (a host address: a hostNetwork pod) is rejected
    # alone, and named.
    host = kube_cluster.pod_object("web-host", "default", "g1", "10.10.1.21", {"app": "web"})
    assert api(c2, "POST", "/api/v1/namespaces/default/pods", host)[0] == 200
    wait(lambda: any(r["name"] == "cluster2/services/default/web/10.10.1.21"
                     for r in clustermesh_of(lab, "a1").get("service_rejections") or ()), 10, "rejection named")
    assert meshctl_slices(c1, "web") == {"web-cluster2-v4-0": [pods["g1"]]}
    # No longer global in cluster2: cluster1's slice goes.
    t0 = time.monotonic()
    assert c2.kube is not None
    kube_api.request(c2.kube, "PATCH", "/api/v1/namespaces/default/services/web",
                     {"metadata": {"annotations": {"meshctl.io/global": "false"}}},
                     content_type="application/merge-patch+json")
    wait(lambda: meshctl_slices(c1, "web") == {}, 10, "slice removed")
    print(f"lab slice removal after the Service stopped being global: {(time.monotonic() - t0) * 1000:.0f} ms")
    # cluster1's own slices are the controller's, untouched by meshctl.
    assert sorted(a for x in controller_slices(c1, "web").values() for a in x) == sorted([pods["a1"], pods["a2"]])


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
            assert re.search(r"ClusterMesh: 1/1 remote clusters ready, \d+ global-services, \d+ exports, "
                             r"\d+ imports, via cache", text), text
        a1 = lab.lookup("a1")[1]
        for g in c2.nodes:
            wait(lambda g=g: labcheck.ping(a1.pods[0].netns, g.pods[0].ip, count=2)[1] > 0, 30,
                 f"a1's pod reaching {g.name}'s pod through routes read from the cache")
    finally:
        build.stop_cache(lab, c1.name)
