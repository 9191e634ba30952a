"""End to end: the shipped namespace lab with `backend: kubernetes`. Real agents in network
namespaces run `--backend kubernetes` against the in-process API server (in its own namespace on
the lab's public segment), publish their annotations by patch, watch each other, and carry the
same pod-to-pod matrix as the etcd lab: every pair reachable, each over the path its plan says."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from meshctl import netns
from meshctl.kube import nodes as A
from meshctl.lab import build, probe, state
from meshctl.lab.spec import load_lab

LAB = Path(__file__).resolve().parents[2] / "ctl" / "meshctl" / "labs" / "default.yaml"

pytestmark = [pytest.mark.root, pytest.mark.slow]


def api_get(kube: dict, path: str) -> dict:
    """GET from the lab's API server, from inside its namespace."""
    code = (f"import json, urllib.request; print(urllib.request.urlopen({kube['url'] + path!r}, timeout=5)"
            ".read().decode())")
    return json.loads(netns.run(kube["netns"], [sys.executable, "-c", code]).stdout)


@pytest.fixture
def kube_lab():
    if os.geteuid() != 0:
        pytest.fail("needs root for network namespaces")
    prefix = f"k{os.getpid() % 10000}-"
    spec = load_lab(LAB)
    spec = replace(spec, options=replace(spec.options, backend="kubernetes", prefix=prefix))
    try:
        yield build.up(spec, prefix=prefix, wait=120)
    finally:
        problems = build.down(state.lab_name(prefix))
        assert not problems
        assert not netns.list_prefixed(prefix)


def test_kubernetes_backend_lab_passes_the_pod_matrix(kube_lab):
    st = kube_lab
    (cluster,) = st["clusters"]
    kube = cluster["kube"]
    # The agents really use the API: each Node carries the annotations its agent patched in.
    nodes = {n["metadata"]["name"]: n for n in api_get(kube, "/api/v1/nodes")["items"]}
    assert sorted(nodes) == sorted(n["name"] for n in cluster["nodes"])
    for lab_node in cluster["nodes"]:
        ann = nodes[lab_node["name"]]["metadata"]["annotations"]
        assert len(ann[A.PUBLIC_KEY]) == 44
        assert ann[A.ENDPOINT] == f"{lab_node['public_ip']}:51820"
        assert ann[A.INTERNAL_IP] == lab_node["internal_ip"]
        assert ann[A.GRANULARITY] == "location"
        assert ann[A.PREFIX + A.LOCATION] == lab_node["location"]  # the seeded user annotation is untouched
    results = probe.check(st, count=3)
    n = len(cluster["nodes"])
    assert len(results) == n * (n - 1)
    bad = [r for r in results if not r.ok or r.path != r.expected]
    assert not bad, probe.format_matrix(results)
    paths = {r.path for r in results}
    assert {"direct", "tunnel", "via-leader"} <= paths  # the lab exercises every kind of path
