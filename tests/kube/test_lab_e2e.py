# SPDX-License-Identifier: Apache-2.0
"""End to end: the shipped namespace lab with `backend: kubernetes`, on a real control plane
(kube-apiserver, kube-controller-manager) in its own namespace on the lab's public segment, with
manifests/ applied by `kubectl apply -k` and each agent holding the token of the `meshctl`
ServiceAccount bound to its node's DaemonSet Pod. The agents run the way the DaemonSet runs them
(pod CIDR, location and leader from their Node, not flags), publish their annotations by patch,
watch each other, and carry the same pod-to-pod matrix as the etcd lab; nothing they do is
refused (no 403 in any log); a leader annotation moved at run time reaches every plan without a
restart; records that would capture other nodes' traffic are rejected while every pair keeps
working; a Node whose kubelet stops turns NotReady and stays in the mesh while its agent lives."""

from __future__ import annotations

import base64
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from meshctl.agent.server import fetch_status
from meshctl.backends.kube import nodes as A
from meshctl.lab.namespaces import build, kube_api, state
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces.spec import load_lab
from meshctl.lab.namespaces.state import KubeAccess
from meshctl.lab.rigs import netns
from tests.names import unique

from .helpers import MANIFESTS, wait_for
from .kubectl import lab_kubectl, table

LAB = Path(__file__).resolve().parents[2] / "ctl" / "meshctl" / "lab" / "labs" / "default.yaml"

pytestmark = [pytest.mark.root, pytest.mark.slow]


def api_get(kube: KubeAccess, path: str) -> dict:
    """GET from the lab's API server as its admin, from inside its namespace."""
    return kube_api.request(kube, "GET", path)


@pytest.fixture(scope="module")
def kube_lab():
    if os.geteuid() != 0:
        pytest.fail("needs root for network namespaces")
    prefix = unique("k") + "-"
    spec = load_lab(LAB)
    spec = replace(spec, options=replace(spec.options, backend="kubernetes", prefix=prefix))
    try:
        yield build.up(spec, prefix=prefix, wait=120)
    finally:
        problems = build.down(state.lab_name(prefix))
        assert not problems
        assert not netns.list_prefixed(prefix)


def test_kubernetes_backend_lab_passes_the_pod_matrix(kube_lab, tmp_path):
    st = kube_lab
    k = lab_kubectl(st.name, tmp_path)
    (cluster,) = st.clusters
    kube = cluster.kube
    assert kube is not None
    # The agents really use the API: each Node carries the annotations its agent patched in.
    nodes = {n["metadata"]["name"]: n for n in api_get(kube, "/api/v1/nodes")["items"]}
    assert sorted(nodes) == sorted(n.name for n in cluster.nodes)
    for lab_node in cluster.nodes:
        ann = nodes[lab_node.name]["metadata"]["annotations"]
        assert len(ann[A.PUBLIC_KEY]) == 44
        assert ann[A.ENDPOINT] == f"{lab_node.public_ip}:51820"
        assert ann[A.INTERNAL_IP] == lab_node.internal_ip
        assert ann[A.GRANULARITY] == "location"
        assert ann[A.PREFIX + A.LOCATION] == lab_node.location  # the seeded user annotation is untouched
    # The host's kubectl sees the same cluster: the Nodes, and what the lab applied with kubectl
    # (the mesh ConfigMap, with its last-applied annotation).
    rows = table(k("get", "nodes", "-o", "wide"))
    assert sorted(r["NAME"] for r in rows) == sorted(n.name for n in cluster.nodes)
    assert "INTERNAL-IP" in rows[0]
    cm = k.json("get", "configmap", "meshctl", "-n", "meshctl")
    assert "kubectl.kubernetes.io/last-applied-configuration" in cm["metadata"]["annotations"]
    assert cm["data"]["granularity"] == "location"
    results = labcheck.check(st, count=3)
    n = len(cluster.nodes)
    assert len(results) == n * (n - 1)
    bad = [r for r in results if not r.ok or r.path != r.expected]
    assert not bad, labcheck.format_matrix(results)
    paths = {r.path for r in results}
    assert {"direct", "tunnel", "via-leader"} <= paths  # the lab exercises every kind of path
    # The pod CIDRs came from the Nodes' spec.podCIDR (the agents had no --pod-cidr); the agent's
    # full API is on loopback only, and the DaemonSet's TLS port answers probes to anyone and
    # /metrics only to a token the cluster authorises: from a pod, 9736 is closed.
    by_name = {n.name: n for n in cluster.nodes}
    for lab_node in cluster.nodes:
        st_node = fetch_status(lab_node.metrics_addr, lab_node.netns)
        assert st_node["ready"] and st_node["node"] == lab_node.name
    a2 = by_name["a2"]
    pod = a2.pods[0].netns
    node_ip = a2.internal_ip.split("/")[0]
    probe = ("import socket, ssl, sys, urllib.request\n"
             "ctx = ssl._create_unverified_context()\n"
             "def get(p):\n"
             "    try: return urllib.request.urlopen(f'https://{sys.argv[1]}:9737{p}', context=ctx, timeout=5).status\n"
             "    except urllib.error.HTTPError as e: return e.code\n"
             "try:\n"
             "    socket.create_connection((sys.argv[1], 9736), timeout=3); plain = 'open'\n"
             "except OSError: plain = 'closed'\n"
             "print(plain, get('/healthz'), get('/metrics'), get('/status'))")
    out = netns.run(pod, [sys.executable, "-c", probe, node_ip]).stdout.split()
    assert out == ["closed", "200", "401", "404"], out
    assert k("version", "-o", "json").count('"gitVersion": "v1.32.6"') == 1
    # Every agent did what it needed with the DaemonSet's own rights: no request refused.
    for lab_node in cluster.nodes:
        log = Path(lab_node.dir, "agent.log").read_text()
        assert " 403 " not in log and "Forbidden" not in log and "forbidden" not in log, lab_node.name



def pairs_ok(st) -> list:
    results = labcheck.check(state.resolve(st.name), count=3)
    bad = [r for r in results if not r.ok or r.path != r.expected]
    assert not bad, labcheck.format_matrix(results)
    return results


def test_records_that_would_capture_traffic_are_rejected_and_every_pair_keeps_working(kube_lab):
    """Nodes an attacker's admin access (or a mistake) adds, published as an agent would: one whose
    pod CIDR covers a1's endpoint, one whose pod CIDR is loc-b's private subnet, one with a
    loopback endpoint. Every agent rejects and counts them; no pair loses its path."""
    st = kube_lab
    (cluster,) = st.clusters
    kube = cluster.kube
    by_name = {n.name: n for n in cluster.nodes}
    a1_endpoint = by_name["a1"].public_ip
    evil = {"grab-endpoint": (f"{a1_endpoint.rsplit('.', 1)[0]}.0/24", "203.0.113.50:51820"),
            "grab-subnet": ("10.10.2.0/24", "203.0.113.51:51820"),
            "loopback": ("10.42.77.0/24", "127.0.0.1:51820")}
    for i, (name, (pod_cidr, endpoint)) in enumerate(evil.items()):
        kube_api.request(kube, "POST", "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node", "spec": {"podCIDR": pod_cidr},
            "metadata": {"name": name, "annotations": {
                A.PUBLIC_KEY: base64.b64encode(bytes([200 + i]) * 32).decode(),
                A.LAST_SEEN: str(int(time.time()) + 3600), A.ENDPOINT: endpoint}}})

    def rejected(node) -> set[str]:
        return {r["name"] for r in fetch_status(node.metrics_addr, node.netns).get("rejections") or []}

    for node in cluster.nodes:
        wait_for(lambda n=node: set(evil) <= rejected(n), timeout=30, what=f"{node.name} rejecting them")
    pairs_ok(st)
    for name in evil:
        kube_api.request(kube, "DELETE", f"/api/v1/nodes/{name}")


def test_a_node_whose_kubelet_stops_stays_in_the_mesh_while_its_agent_publishes(kube_lab):
    """meshctl follows its own agents' heartbeats (meshctl.io/last-seen), not the kubelet's: a
    NotReady Node (a kubelet that died, a full disk) still routes its pods."""
    st = kube_lab
    (cluster,) = st.clusters
    kube = cluster.kube
    cp = kube_api.control_plane(kube)
    cp.pause_kubelet("c1")
    try:
        def ready(node: str) -> str:
            conds = api_get(kube, f"/api/v1/nodes/{node}")["status"]["conditions"]
            return next(c["status"] for c in conds if c["type"] == "Ready")

        wait_for(lambda: ready("c1") == "Unknown", timeout=120, what="c1 NotReady (its heartbeats gone)")
        # the node lifecycle controller taints it once it has seen the condition (a moment later)
        wait_for(lambda: any(t["key"] == "node.kubernetes.io/unreachable"
                             for t in api_get(kube, "/api/v1/nodes/c1")["spec"].get("taints") or []),
                 timeout=30, what="c1 tainted unreachable")
        for node in cluster.nodes:
            assert "c1" in fetch_status(node.metrics_addr, node.netns)["paths"], node.name
        pairs_ok(st)
    finally:
        cp.pause_kubelet("c1", False)
    wait_for(lambda: ready("c1") == "True", timeout=60, what="c1 Ready again")


def test_a_leader_moved_by_annotation_reaches_every_plan(kube_lab, tmp_path):
    st = kube_lab
    k = lab_kubectl(st.name, tmp_path)
    (cluster,) = st.clusters
    by_name = {n.name: n for n in cluster.nodes}
    # Move loc-a's leadership from a1 to a2 by annotation, as a person would: every agent's plan
    # follows (a2's own record included), with no restart, and traffic takes the new leader.
    pids = {n.name: n.pid for n in cluster.nodes}
    k("annotate", "--overwrite", "node", "a1", f"{A.PREFIX}{A.LEADER}=false")
    k("annotate", "--overwrite", "node", "a2", f"{A.PREFIX}{A.LEADER}=true")

    def leaders() -> dict[str, str]:
        return {n: fetch_status(by_name[n].metrics_addr, by_name[n].netns).get("leader") for n in ("a1", "a2")}

    wait_for(lambda: leaders() == {"a1": "a2", "a2": "a2"}, timeout=20, poll=0.2,
             what="a2 leading loc-a in both plans")
    assert fetch_status(by_name["a2"].metrics_addr, by_name["a2"].netns)["is_leader"]
    assert {n.name: n.pid for _, n in state.resolve(st.name).nodes()} == pids  # no restart
    results = wait_for(lambda: (r := labcheck.check(state.resolve(st.name), count=3,
                                                    pairs=[("a1", "b1"), ("a2", "b1")]))
                       and all(x.ok and x.path == x.expected for x in r) and r, timeout=20, poll=0.2,
                       what="traffic over the new leader")
    assert {(r.src, r.path) for r in results} == {("a1", "via-leader"), ("a2", "tunnel")}
    # The lab installed exactly what a user applies: applying manifests/ again creates nothing.
    out = k("apply", "-k", str(MANIFESTS))
    assert out.strip() and not [line for line in out.splitlines() if not line.endswith((" unchanged", " configured"))]
    assert "configmap/meshctl configured" in out  # the lab set the mesh's settings after the install
    assert k.run("get", "peers").rc == 0
