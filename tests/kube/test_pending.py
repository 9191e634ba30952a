# SPDX-License-Identifier: Apache-2.0
"""Nodes that have not joined yet, on a real API server with no Kilo CRD: `plan`, `graph`,
`showconf`, `mesh get` and `node list` read the cluster (`--kubeconfig` alone selects the
Kubernetes backend), and name each pending Node with what it still lacks."""

from __future__ import annotations

import json
import subprocess
import sys

from .helpers import create_node, node_obj


def meshctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshctl.cli", *args], capture_output=True, text=True, timeout=60)


def test_pending_nodes_are_named_with_what_they_lack(api, kclient) -> None:
    create_node(kclient, node_obj("k3s-1", "10.42.1.0/24", key=1, internal="192.168.1.1/24",
                                  endpoint="198.51.100.1:51820"))
    create_node(kclient, node_obj("k3s-2", "10.42.2.0/24"))  # its agent has not started
    create_node(kclient, node_obj("k3s-3", None))  # no pod CIDR yet
    kc = api.kubeconfig
    assert not any(c["metadata"]["name"] == "peers.kilo.squat.ai" for c in api.cp.request(
        "GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"])

    r = meshctl("plan", "--kubeconfig", kc, "--node", "k3s-1", "-o", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["node"] == "k3s-1"
    assert "warning: kubernetes: node k3s-2 is pending: its agent has not published yet " \
           "(no meshctl.io/public-key or meshctl.io/last-seen annotation)" in r.stderr
    assert "warning: kubernetes: node k3s-3 is pending: it has no pod CIDR yet" in r.stderr

    r = meshctl("plan", "--kubeconfig", kc, "--node", "k3s-2")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "error: --node: 'k3s-2' has not joined kubernetes yet: its agent has not published yet "
        "(no meshctl.io/public-key or meshctl.io/last-seen annotation)")

    for args in (("graph", "-o", "text"), ("showconf", "node", "k3s-1"), ("mesh", "get")):
        r = meshctl(*args, "--kubeconfig", kc)
        assert r.returncode == 0 and "Traceback" not in r.stderr, (args, r.stderr)

    r = meshctl("node", "list", "--kubeconfig", kc, "-o", "json")
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["k3s-1"]["status"] == "admitted"
    assert rows["k3s-2"] == {"name": "k3s-2", "status": "pending", "reason": "its agent has not published yet "
                             "(no meshctl.io/public-key or meshctl.io/last-seen annotation)"}
    assert rows["k3s-3"]["status"] == "pending" and "no pod CIDR" in rows["k3s-3"]["reason"]
    table = meshctl("node", "list", "--kubeconfig", kc).stdout
    assert any(line.split()[:2] == ["k3s-2", "pending"] for line in table.splitlines())
