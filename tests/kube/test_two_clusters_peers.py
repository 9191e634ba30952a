# SPDX-License-Identifier: Apache-2.0
"""Kilo's multi-cluster recipe on the namespace lab: two clusters with the kubernetes backend and no
cluster mesh; each cluster's nodes, printed by `meshctl showconf --backend kubernetes node X
--as-peer -o yaml --allowed-ips ...`, are applied as Peers in the other cluster's API with this
machine's kubectl (`meshctl lab kubeconfig --cluster-name C`), and pods of the two clusters reach each
other through WireGuard."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces.state import KubeAccess
from meshctl.lab.rigs import netns
from tests.kube.helpers import lab_fixture
from tests.kube.kubectl import lab_kubeconfig, lab_kubectl, table
from tests.pinging import LATE_REPLY_S
from tests.waiting import wait_until

pytestmark = [pytest.mark.root, pytest.mark.slow]

LAB = {
    "clusters": [
        {"cluster": {"name": "east", "id": 1}, "mesh": {"granularity": "location", "subnet": "10.4.0.0/16"},
         "nodes": [{"name": "a1", "location": "loc-a", "internal_ip": "10.10.1.11/24", "pod_cidr": "10.42.1.0/24"},
                   {"name": "a2", "location": "loc-a", "internal_ip": "10.10.1.12/24", "pod_cidr": "10.42.2.0/24"}]},
        {"cluster": {"name": "west", "id": 2}, "mesh": {"granularity": "location", "subnet": "10.5.0.0/16"},
         "nodes": [{"name": "g1", "location": "loc-g", "internal_ip": "10.20.1.21/24", "pod_cidr": "10.43.1.0/24"}]},
    ],
    "lab": {"backend": "kubernetes", "clustermesh": False, "lease_ttl": 3, "fastpath": False},
}


lab = lab_fixture(LAB, prefix="kt")


def as_peer(kube: KubeAccess, node: str, service_cidr: str) -> dict:
    p = netns.run(kube.netns, [sys.executable, "-m", "meshctl.cli", "showconf", "--backend", "kubernetes",
                                  "--kubeconfig", kube.kubeconfig, "node", node, "--as-peer", "-o", "yaml",
                                  "--allowed-ips", service_cidr], timeout=60)
    return yaml.safe_load(p.stdout)


def test_as_peer_yaml_applied_in_the_other_cluster_connects_them(lab, tmp_path) -> None:
    st = lab
    east, west = st.clusters
    r = lab_kubeconfig(st.name)  # two clusters: which one is for the caller to say
    assert r.returncode == 2 and "pass --cluster-name" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    created = {}
    for src, dst, svc in ((east, west, "10.96.0.0/16"), (west, east, "10.97.0.0/16")):
        assert src.kube is not None and dst.kube is not None
        k = lab_kubectl(st.name, tmp_path / dst.name, "--cluster-name", dst.name)
        for n in src.nodes:
            obj = as_peer(src.kube, n.name, svc)
            out = k("apply", "-f", "-", stdin=yaml.safe_dump(obj)).strip()
            # a segment's other member gives the same Peer: applied again, it changes nothing
            assert out in (f"peer.meshctl.io/{obj['metadata']['name']} created",
                           f"peer.meshctl.io/{obj['metadata']['name']} unchanged"), out
            created.setdefault(dst.name, set()).add(obj["metadata"]["name"])
        assert sorted(row["NAME"] for row in table(k("get", "peers"))) == sorted(created[dst.name])
    # a2 does not lead loc-a: both east nodes give the one Peer of their segment, led by a1.
    assert created == {"west": {"east-a1"}, "east": {"west-g1"}}
    g1 = next(n for n in west.nodes if n.name == "g1")
    a1, a2 = east.nodes
    wait_until(lambda: (p := labcheck.ping(g1.pods[0].netns, a2.pods[0].ip, count=3))[0] == p[1], 40,
               "west's pod reaching east's a2 pod through the Peer")
    sent, recv, _ = labcheck.ping(a1.pods[0].netns, g1.pods[0].ip, count=3, deadline=LATE_REPLY_S)
    assert recv == sent
    st_g1 = labcheck.agent_status(g1)
    assert st_g1 is not None and any(p.get("name") == "east-a1" for p in st_g1["peers"])
    print(json.dumps({p["name"]: p.get("last_handshake") for p in st_g1["peers"]}))
