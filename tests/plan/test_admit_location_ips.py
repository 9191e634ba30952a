# SPDX-License-Identifier: Apache-2.0
"""Admission of allowed_location_ips, locally and from remote clusters: every case is a table row
naming what a record claims and what must become of it (admitted, or rejected with which words)."""

from __future__ import annotations

from typing import Any

import pytest

from meshctl.errors import InputError
from meshctl.mesh import admit, fields, records
from meshctl.mesh.admit import admit_remotes
from meshctl.mesh.model import Cluster, MeshSettings, Topology

from .fixtures import key, record

node = record


# The cluster every local case starts from: a1 and b1 with pod CIDRs, internal addresses, endpoints.
A1 = node("a1", 1, "10.42.1.0/24", internal="10.10.0.1/24", endpoint="203.0.113.1:51820")
B1 = node("b1", 2, "10.42.2.0/24", internal="10.20.0.1/24", endpoint="203.0.113.2:51820")
SUBNET = MeshSettings().subnet

# (case, location IPs of a new node x (its pod CIDR 10.42.9.0/24), allow default route,
#  None if admitted else words the rejection must contain)
LOCAL_CASES: list[tuple[str, list[str], bool, str | None]] = [
    ("plain LAN", ["192.168.178.0/24"], False, None),
    ("two LANs", ["192.168.178.0/24", "192.168.179.0/24"], False, None),
    ("a1's pod CIDR", ["10.42.1.0/24"], False, "allowed_location_ips[0]: '10.42.1.0/24' overlaps a1's pod CIDR"),
    ("inside a1's pod CIDR", ["10.42.1.128/25"], False, "overlaps a1's pod CIDR 10.42.1.0/24"),
    ("all pod CIDRs", ["10.42.0.0/16"], False, "'10.42.0.0/16' overlaps"),
    ("its own pod CIDR", ["10.42.9.0/24"], False, "overlaps x's pod CIDR"),
    ("the WireGuard subnet", ["10.4.3.0/24"], False, "overlaps the WireGuard subnet 10.4.0.0/16"),
    ("a node's internal address", ["10.10.0.0/24"], False, "covers a1's internal address 10.10.0.1"),
    ("a node's endpoint", ["203.0.113.0/24"], False, "covers a1's endpoint 203.0.113.1"),
    ("the second of two", ["192.168.178.0/24", "10.42.2.0/24"], False, "allowed_location_ips[1]: '10.42.2.0/24'"),
    ("its own two overlapping", ["192.168.0.0/16", "192.168.1.0/24"], False, "overlaps another of its own"),
    ("IPv4 default route", ["0.0.0.0/0"], False, "is a default route (allowed only with mesh.allow_default_route"),
    ("IPv6 default route", ["::/0"], False, "'::/0' is a default route"),
    ("default route, allowed", ["0.0.0.0/0"], True, None),
    ("half the internet", ["0.0.0.0/1"], True, "overlaps"),
]


@pytest.mark.parametrize("case,ali,allow,words", LOCAL_CASES, ids=[c[0] for c in LOCAL_CASES])
def test_local_location_ips(case: str, ali: list[str], allow: bool, words: str | None) -> None:
    x = node("x", 9, "10.42.9.0/24", ali=ali)
    for order in ([A1, B1, x], [x, A1, B1]):  # a hijacker older than its victim gains nothing either
        admitted, rejected = admit.admit_nodes(order, SUBNET, allow_default_route=allow)
        names = [n.name for n in admitted]
        assert "a1" in names and "b1" in names, case
        if words is None:
            assert "x" in names and not rejected, (case, rejected)
        else:
            assert "x" not in names, case
            assert len(rejected) == 1 and rejected[0].name == "x", (case, rejected)
            assert words in rejected[0].reason, (case, rejected[0].reason)
            assert rejected[0].reason.startswith(f"nodes[{order.index(x)}].allowed_location_ips["), rejected


def test_location_ips_of_two_nodes_may_not_overlap_and_the_older_keeps_them() -> None:
    x = node("x", 9, "10.42.9.0/24", ali=["192.168.0.0/16"])
    y = node("y", 10, "10.42.10.0/24", ali=["192.168.5.0/24"])
    admitted, rejected = admit.admit_nodes([A1, x, y], SUBNET)
    assert [n.name for n in admitted] == ["a1", "x"]
    assert rejected[0].name == "y" and "overlaps x's allowed location IP 192.168.0.0/16" in rejected[0].reason


def test_only_one_default_route_even_when_allowed() -> None:
    x = node("x", 9, "10.42.9.0/24", ali=["0.0.0.0/0"])
    y = node("y", 10, "10.42.10.0/24", ali=["0.0.0.0/0"])
    admitted, rejected = admit.admit_nodes([A1, x, y], SUBNET, allow_default_route=True)
    assert [n.name for n in admitted] == ["a1", "x"]
    assert "overlaps x's allowed location IP 0.0.0.0/0" in rejected[0].reason


def test_an_extra_peer_may_not_take_a_location_ip() -> None:
    x = node("x", 9, "10.42.9.0/24", ali=["192.168.178.0/24"])
    claims = admit.Claims()
    admit.admit_nodes([A1, x], SUBNET, claims=claims)
    peer = records.parse_peer({"name": "p", "public_key": key(50), "allowed_ips": ["192.168.178.7/32"]}, "peers[0]")
    admitted, rejected = admit.admit_peers([peer], claims)
    assert not admitted and "overlaps x's allowed location IP 192.168.178.0/24" in rejected[0].reason


def test_a_rejected_node_holds_nothing() -> None:
    """The hijacker's own pod CIDR and internal address are free again once it is rejected."""
    x = node("x", 9, "10.42.9.0/24", internal="10.10.0.9/24", ali=["10.42.1.0/24"])
    claims = admit.Claims()
    internal: dict[Any, str] = {}
    admit.admit_nodes([A1, x], SUBNET, claims=claims, internal_ips=internal)
    assert claims.conflict(x.pod_cidrs[0]) is None
    assert x.internal_ip is not None and x.internal_ip.ip not in internal


def test_mesh_setting_is_parsed_and_written_only_when_set() -> None:
    assert records.parse_mesh({"allow_default_route": True}, "mesh").allow_default_route is True
    assert "allow_default_route" not in records.mesh_to_record(MeshSettings())
    assert records.mesh_to_record(MeshSettings(allow_default_route=True))["allow_default_route"] is True
    with pytest.raises(InputError, match=r"mesh.allow_default_route: 'maybe' is not true or false"):
        records.parse_mesh({"allow_default_route": "maybe"}, "mesh")


# --- remote clusters -------------------------------------------------------------------------

LOCAL = Topology(cluster=Cluster("cluster1", 1), mesh=MeshSettings(),
                 nodes=(A1, B1, node("c1", 3, "10.42.3.0/24", ali=["192.168.50.0/24"])))

# (case, location IPs of cluster2's g1, local mesh allows a default route, None or words)
REMOTE_CASES: list[tuple[str, list[str], bool, str | None]] = [
    ("its own LAN", ["192.168.60.0/24"], False, None),
    ("a local pod CIDR", ["10.42.1.0/24"], False, "overlaps local node a1's pod CIDR 10.42.1.0/24"),
    ("all local pod CIDRs", ["10.42.0.0/16"], False, "overlaps local node"),
    ("the local WireGuard subnet", ["10.4.0.0/24"], False, "overlaps the local WireGuard subnet"),
    ("a local node's internal address", ["10.20.0.1/32"], False, "covers b1's internal address 10.20.0.1"),
    ("a local node's endpoint", ["203.0.113.2/32"], False, "covers b1's endpoint 203.0.113.2"),
    ("a local location IP", ["192.168.50.0/25"], False, "overlaps local node c1's allowed location IP"),
    ("a default route", ["0.0.0.0/0"], False, "is a default route"),
    ("a default route the local mesh allows", ["0.0.0.0/0"], True, None),
]


@pytest.mark.parametrize("case,ali,allow,words", REMOTE_CASES, ids=[c[0] for c in REMOTE_CASES])
def test_remote_location_ips(case: str, ali: list[str], allow: bool, words: str | None) -> None:
    g1 = node("g1", 20, "10.52.1.0/24", internal="10.60.0.1/24", ali=ali, cluster="cluster2")
    g2 = node("g2", 21, "10.52.2.0/24", internal="10.60.0.2/24", cluster="cluster2")
    remote = Topology(cluster=Cluster("cluster2", 2), mesh=MeshSettings(subnet=fields.network("10.5.0.0/16", "s")),
                      nodes=(g1, g2))
    local = Topology(cluster=LOCAL.cluster, mesh=MeshSettings(allow_default_route=allow), nodes=LOCAL.nodes)
    remotes, rejected = admit_remotes(local, [remote])
    assert "g2" in remotes[0].admitted, case
    if words is None:
        assert "g1" in remotes[0].admitted and not rejected, (case, rejected)
    else:
        assert "g1" not in remotes[0].admitted, case
        assert [r.name for r in rejected] == ["cluster2/g1"], rejected
        assert words in rejected[0].reason, (case, rejected[0].reason)
        assert rejected[0].reason.startswith("cluster2.nodes[0].allowed_location_ips[0]"), rejected[0].reason


def test_a_remote_cluster_may_not_take_another_remotes_location_ips() -> None:
    g1 = node("g1", 20, "10.52.1.0/24", ali=["172.20.0.0/16"], cluster="cluster2")
    h1 = node("h1", 30, "10.62.1.0/24", ali=["172.20.1.0/24"], cluster="cluster3")
    r2 = Topology(cluster=Cluster("cluster2", 2), mesh=MeshSettings(subnet=fields.network("10.5.0.0/16", "s")),
                  nodes=(g1,))
    r3 = Topology(cluster=Cluster("cluster3", 3), mesh=MeshSettings(subnet=fields.network("10.6.0.0/16", "s")),
                  nodes=(h1,))
    remotes, rejected = admit_remotes(LOCAL, [r3, r2])
    assert [r.name for r in rejected] == ["cluster3/h1"]
    assert "overlaps cluster2/g1's allowed location IP 172.20.0.0/16" in rejected[0].reason
