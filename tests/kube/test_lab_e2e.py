# SPDX-License-Identifier: Apache-2.0
"""End to end: the shipped namespace lab with `backend: kubernetes`. Real agents in network
namespaces run `--backend kubernetes` against the in-process API server (in its own namespace on
the lab's public segment) the way the DaemonSet runs them (pod CIDR, location and leader from
their Node, not flags), publish their annotations by patch, watch each other, and carry the
same pod-to-pod matrix as the etcd lab: every pair reachable, each over the path its plan says.
A leader annotation moved at run time reaches every agent's plan without a restart."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from meshctl.agent.server import fetch_status
from meshctl.backends.kube import nodes as A
from meshctl.lab.namespaces import build, state
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
    """GET from the lab's API server, from inside its namespace."""
    code = (f"import json, urllib.request; print(urllib.request.urlopen({kube.url + path!r}, timeout=5)"
            ".read().decode())")
    return json.loads(netns.run(kube.netns, [sys.executable, "-c", code]).stdout)


@pytest.fixture
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
    # The pod CIDRs came from the Nodes' spec.podCIDR (the agents had no --pod-cidr) and /healthz
    # answers on the metrics port the liveness probe uses.
    by_name = {n.name: n for n in cluster.nodes}
    for lab_node in cluster.nodes:
        st_node = fetch_status(lab_node.metrics_addr, lab_node.netns)
        assert st_node["ready"] and st_node["node"] == lab_node.name
    code = f"import urllib.request; print(urllib.request.urlopen('http://{by_name['a2'].metrics_addr}/healthz').status)"
    assert netns.run(by_name["a2"].netns, [sys.executable, "-c", code]).stdout.strip() == "200"

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
    # Last (it replaces the lab's mesh ConfigMap with manifests/' own): the whole install applies
    # to the lab's API server with the host's kubectl, every kind of it, and Peers list.
    out = k("apply", "-k", str(MANIFESTS))
    assert "daemonset.apps/meshctl created" in out
    assert "customresourcedefinition.apiextensions.k8s.io/peers.meshctl.io unchanged" in out  # the lab applied it
    assert k.run("get", "peers").rc == 0
