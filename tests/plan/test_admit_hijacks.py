# SPDX-License-Identifier: Apache-2.0
"""Records whose claims would capture other nodes' traffic are rejected, named and counted: a pod
CIDR covering a node's internal address or endpoint (its private subnet, its public address), and
endpoints or internal addresses no peer could reach. Every case is a table row: the records in age
order and what must become of each (admitted, or rejected with which words); the rest stand."""

from __future__ import annotations

import ipaddress

import pytest

from meshctl.mesh import admit
from meshctl.mesh.model import Cluster, MeshSettings, Topology

from .fixtures import record

node = record


A1 = node("a1", 1, "10.42.1.0/24", internal="10.10.1.11/24", endpoint="198.51.100.1:51820")
A2 = node("a2", 2, "10.42.2.0/24", internal="10.10.1.12/24")
B1 = node("b1", 3, "10.42.3.0/24", internal="10.20.0.1/24", endpoint="[2001:db8::1]:51820")

# (case, records in age order, {name: words of its rejection}; every other record is admitted)
CASES: list[tuple[str, list, dict[str, str]]] = [
    ("a newcomer's pod CIDR on a node's endpoint", [A1, A2, node("x", 9, "198.51.100.0/24")],
     {"x": "nodes[2].pod_cidr: '198.51.100.0/24' covers a1's endpoint 198.51.100.1"}),
    ("a newcomer's pod CIDR is a location's private subnet", [A1, A2, node("x", 9, "10.10.1.0/24")],
     {"x": "nodes[2].pod_cidr: '10.10.1.0/24' covers a1's internal address 10.10.1.11"}),
    ("a newcomer's pod CIDR holds one internal address", [A1, A2, node("x", 9, "10.10.1.12/32")],
     {"x": "covers a2's internal address 10.10.1.12"}),
    ("an IPv6 endpoint covered", [A1, B1, node("x", 9, "2001:db8::/64")],
     {"x": "covers b1's endpoint 2001:db8::1"}),
    ("a pod CIDR over its own internal address", [A1, node("x", 9, "10.50.0.0/24", internal="10.50.0.5/24")],
     {"x": "covers its own internal address 10.50.0.5"}),
    ("a pod CIDR over its own endpoint", [A1, node("x", 9, "203.0.113.0/24", endpoint="203.0.113.9:51820")],
     {"x": "covers its own endpoint 203.0.113.9"}),
    ("a newcomer's endpoint inside an older pod CIDR", [A1, node("x", 9, "10.42.9.0/24", endpoint="10.42.1.7:51820")],
     {"x": "its endpoint 10.42.1.7 is inside a1's pod CIDR 10.42.1.0/24"}),
    ("a newcomer's address inside an older pod CIDR", [A1, node("x", 9, "10.42.9.0/24", internal="10.42.1.9/24")],
     {"x": "its internal address 10.42.1.9 is inside a1's pod CIDR"}),
    ("a loopback endpoint", [A1, node("x", 9, "10.42.9.0/24", endpoint="127.0.0.1:51820")],
     {"x": "endpoint: '127.0.0.1:51820' is a loopback address"}),
    ("an unspecified endpoint", [A1, node("x", 9, "10.42.9.0/24", endpoint="0.0.0.0:51820")],
     {"x": "is an unspecified address"}),
    ("a multicast endpoint", [A1, node("x", 9, "10.42.9.0/24", endpoint="224.0.0.5:51820")],
     {"x": "is a multicast address"}),
    ("a link-local endpoint", [A1, node("x", 9, "10.42.9.0/24", endpoint="169.254.1.1:51820")],
     {"x": "is a link-local address"}),
    ("a link-local IPv6 endpoint", [A1, node("x", 9, "10.42.9.0/24", endpoint="[fe80::1]:51820")],
     {"x": "is a link-local address"}),
    ("a loopback internal address", [A1, node("x", 9, "10.42.9.0/24", internal="127.0.0.2/8")],
     {"x": "internal_ip: '127.0.0.2/8' is a loopback address"}),
    ("a pod CIDR inside a private subnet that covers no node", [A1, node("x", 9, "10.10.1.128/25")], {}),
    ("the clean cluster", [A1, A2, B1], {}),
]


@pytest.mark.parametrize(("case", "nodes", "rejected"), CASES, ids=[c[0] for c in CASES])
def test_hijacking_claims(case: str, nodes: list, rejected: dict[str, str]) -> None:
    ok, rej = admit.admit_nodes(nodes, MeshSettings().subnet)
    got = {r.name: r.reason for r in rej}
    assert set(got) == set(rejected), got
    for name, words in rejected.items():
        assert words in got[name], got[name]
    assert [n.name for n in ok] == [n.name for n in nodes if n.name not in rejected]


def test_a_remote_cluster_cannot_cover_a_local_endpoint() -> None:
    local = Topology(Cluster("east", 1), MeshSettings(), (A1, A2))
    remote_nodes = (node("r1", 20, "198.51.100.0/25", internal="10.30.0.1/24", cluster="west"),
                    node("r2", 21, "10.43.2.0/24", internal="10.30.0.2/24", cluster="west"))
    remote = Topology(Cluster("west", 2), MeshSettings(subnet=ipaddress.ip_network("10.5.0.0/16")), remote_nodes)
    admitted, rej = admit.admit_remotes(local, [remote])
    assert [r.name for r in rej] == ["west/r1"], rej
    assert "covers a1's endpoint 198.51.100.1" in rej[0].reason, rej[0].reason
    assert [n.name for n in admitted[0].nodes] == ["r2"]
