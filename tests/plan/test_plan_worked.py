# SPDX-License-Identifier: Apache-2.0
"""Worked examples of the plan contract (docs/mesh.md), one table row per case. The expected
values were worked out by hand from the contract, not printed by the code."""

from __future__ import annotations

import pytest

from meshctl.mesh.plan import plan_node
from meshctl.mesh.render import plan_to_json

from .fixtures import CROSS_TWO_SUBNETS, KILO_CLASSIC, key, topo


def R(dst: str, via: str | None, dev: str) -> dict:
    return {"dst": dst, "via": via, "dev": dev}


def F(prefix: str, action: str, nexthop: str | None = None) -> dict:
    return {"prefix": prefix, "action": action, "nexthop": nexthop}


def P(name: str, kind: str, k: int, endpoint: str | None, allowed: list[str], keepalive: int = 0) -> dict:
    return {"name": name, "kind": kind, "public_key": key(k), "endpoint": endpoint, "allowed_ips": allowed,
            "persistent_keepalive": keepalive}


PEERS_P = [P("p1", "peer", 101, "192.0.2.1:51820", ["10.5.0.1/32"]), P("p2", "peer", 102, None, ["10.5.0.2/32"])]

CASES = {
    # location: segments location:aws (a, b) -> 10.4.0.1, location:gcp (c) -> .2, node:d -> .3
    "location/leader": (KILO_CLASSIC, {}, "a", {
        "node": "a", "granularity": "location", "leader": "a", "wireguard_ip": "10.4.0.1/16",
        "peers": [
            P("c", "segment", 3, "198.51.100.3:51820", ["10.1.0.1/32", "10.2.3.0/24", "10.4.0.2/32"]),
            P("d", "segment", 4, "198.51.100.4:51820", ["10.2.4.0/24", "10.4.0.3/32"]),
            *PEERS_P,
        ],
        "routes": [
            R("10.1.0.1/32", "10.4.0.2", "wireguard"), R("10.2.2.0/24", "10.0.1.2", "private"),
            R("10.2.3.0/24", "10.4.0.2", "wireguard"), R("10.2.4.0/24", "10.4.0.3", "wireguard"),
            R("10.5.0.1/32", None, "wireguard"), R("10.5.0.2/32", None, "wireguard"),
        ],
        "fastpath": [F("10.2.1.0/24", "local"), F("10.2.2.0/24", "direct", "10.0.1.2"),
                     F("10.2.3.0/24", "tunnel"), F("10.2.4.0/24", "tunnel")],
    }),
    "location/non-leader": (KILO_CLASSIC, {}, "b", {
        "node": "b", "granularity": "location", "leader": "a", "wireguard_ip": None, "peers": [],
        "routes": [
            R("10.1.0.1/32", "10.0.1.1", "private"), R("10.2.1.0/24", "10.0.1.1", "private"),
            R("10.2.3.0/24", "10.0.1.1", "private"), R("10.2.4.0/24", "10.0.1.1", "private"),
            R("10.4.0.1/32", "10.0.1.1", "private"), R("10.4.0.2/32", "10.0.1.1", "private"),
            R("10.4.0.3/32", "10.0.1.1", "private"),
            R("10.5.0.1/32", "10.0.1.1", "private"), R("10.5.0.2/32", "10.0.1.1", "private"),
        ],
        "fastpath": [F("10.2.1.0/24", "direct", "10.0.1.1"), F("10.2.2.0/24", "local"),
                     F("10.2.3.0/24", "direct", "10.0.1.1"), F("10.2.4.0/24", "direct", "10.0.1.1")],
    }),
    "location/no-internal-ip": (KILO_CLASSIC, {}, "d", {
        "node": "d", "granularity": "location", "leader": "d", "wireguard_ip": "10.4.0.3/16",
        "peers": [
            P("a", "segment", 1, "203.0.113.1:51820",
              ["10.0.1.1/32", "10.0.1.2/32", "10.2.1.0/24", "10.2.2.0/24", "10.4.0.1/32"]),
            P("c", "segment", 3, "198.51.100.3:51820", ["10.1.0.1/32", "10.2.3.0/24", "10.4.0.2/32"]),
            *PEERS_P,
        ],
        "routes": [
            R("10.0.1.1/32", "10.4.0.1", "wireguard"), R("10.0.1.2/32", "10.4.0.1", "wireguard"),
            R("10.1.0.1/32", "10.4.0.2", "wireguard"), R("10.2.1.0/24", "10.4.0.1", "wireguard"),
            R("10.2.2.0/24", "10.4.0.1", "wireguard"), R("10.2.3.0/24", "10.4.0.2", "wireguard"),
            R("10.5.0.1/32", None, "wireguard"), R("10.5.0.2/32", None, "wireguard"),
        ],
        "fastpath": [F("10.2.1.0/24", "tunnel"), F("10.2.2.0/24", "tunnel"), F("10.2.3.0/24", "tunnel"),
                     F("10.2.4.0/24", "local")],
    }),
    # full: every node its own segment: node:a .1, node:b .2, node:c .3, node:d .4
    "full/direct": (KILO_CLASSIC, {"granularity": "full", "intra_subnet": "direct"}, "a", {
        "node": "a", "granularity": "full", "leader": "a", "wireguard_ip": "10.4.0.1/16",
        "peers": [
            P("c", "node", 3, "198.51.100.3:51820", ["10.1.0.1/32", "10.2.3.0/24", "10.4.0.3/32"]),
            P("d", "node", 4, "198.51.100.4:51820", ["10.2.4.0/24", "10.4.0.4/32"]),
            *PEERS_P,
        ],
        "routes": [
            R("10.1.0.1/32", "10.4.0.3", "wireguard"), R("10.2.2.0/24", "10.0.1.2", "private"),
            R("10.2.3.0/24", "10.4.0.3", "wireguard"), R("10.2.4.0/24", "10.4.0.4", "wireguard"),
            R("10.5.0.1/32", None, "wireguard"), R("10.5.0.2/32", None, "wireguard"),
        ],
        "fastpath": [F("10.2.1.0/24", "local"), F("10.2.2.0/24", "direct", "10.0.1.2"),
                     F("10.2.3.0/24", "tunnel"), F("10.2.4.0/24", "tunnel")],
    }),
    "full/wireguard-private": (KILO_CLASSIC, {"granularity": "full", "intra_subnet": "wireguard-private"}, "a", {
        "node": "a", "granularity": "full", "leader": "a", "wireguard_ip": "10.4.0.1/16",
        "peers": [
            P("b", "node", 2, "10.0.1.2:51820", ["10.2.2.0/24", "10.4.0.2/32"]),
            P("c", "node", 3, "198.51.100.3:51820", ["10.1.0.1/32", "10.2.3.0/24", "10.4.0.3/32"]),
            P("d", "node", 4, "198.51.100.4:51820", ["10.2.4.0/24", "10.4.0.4/32"]),
            *PEERS_P,
        ],
        "routes": [
            R("10.1.0.1/32", "10.4.0.3", "wireguard"), R("10.2.2.0/24", "10.4.0.2", "wireguard"),
            R("10.2.3.0/24", "10.4.0.3", "wireguard"), R("10.2.4.0/24", "10.4.0.4", "wireguard"),
            R("10.5.0.1/32", None, "wireguard"), R("10.5.0.2/32", None, "wireguard"),
        ],
        "fastpath": [F("10.2.1.0/24", "local"), F("10.2.2.0/24", "tunnel"), F("10.2.3.0/24", "tunnel"),
                     F("10.2.4.0/24", "tunnel")],
    }),
    # cross: x1-x2 direct (same location and subnet); x3 same location, other subnet; y1 same
    # subnet but another location: WireGuard, without its internal /32 (on-link anyway).
    "cross/two-subnets": (CROSS_TWO_SUBNETS, {}, "x1", {
        "node": "x1", "granularity": "cross", "leader": "x1", "wireguard_ip": "10.4.0.1/16",
        "peers": [
            P("x3", "node", 13, "203.0.113.13:51820", ["10.4.0.3/32", "10.31.0.3/32", "10.42.3.0/24"]),
            P("y1", "node", 21, "203.0.113.21:51820", ["10.4.0.4/32", "10.42.4.0/24"]),
        ],
        "routes": [
            R("10.31.0.3/32", "10.4.0.3", "wireguard"), R("10.42.2.0/24", "10.30.0.2", "private"),
            R("10.42.3.0/24", "10.4.0.3", "wireguard"), R("10.42.4.0/24", "10.4.0.4", "wireguard"),
        ],
        "fastpath": [F("10.42.1.0/24", "local"), F("10.42.2.0/24", "direct", "10.30.0.2"),
                     F("10.42.3.0/24", "tunnel"), F("10.42.4.0/24", "tunnel")],
    }),
    "cross/keepalive-is-own": (CROSS_TWO_SUBNETS, {"intra_subnet": "wireguard"}, "y1", {
        "node": "y1", "granularity": "cross", "leader": "y1", "wireguard_ip": "10.4.0.4/16",
        "peers": [
            P("x1", "node", 11, "203.0.113.11:51820", ["10.4.0.1/32", "10.42.1.0/24"], 25),
            P("x2", "node", 12, "203.0.113.12:51820", ["10.4.0.2/32", "10.42.2.0/24"], 25),
            P("x3", "node", 13, "203.0.113.13:51820", ["10.4.0.3/32", "10.31.0.3/32", "10.42.3.0/24"], 25),
        ],
        "routes": [
            R("10.31.0.3/32", "10.4.0.3", "wireguard"), R("10.42.1.0/24", "10.4.0.1", "wireguard"),
            R("10.42.2.0/24", "10.4.0.2", "wireguard"), R("10.42.3.0/24", "10.4.0.3", "wireguard"),
        ],
        "fastpath": [F("10.42.1.0/24", "tunnel"), F("10.42.2.0/24", "tunnel"), F("10.42.3.0/24", "tunnel"),
                     F("10.42.4.0/24", "local")],
    }),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_worked_plan(case: str) -> None:
    doc, mesh, node, expected = CASES[case]
    got = plan_to_json(plan_node(topo(doc, **mesh), node))
    assert got == expected


def test_cross_wireguard_private_uses_internal_endpoint_only_within_location() -> None:
    got = plan_to_json(plan_node(topo(CROSS_TWO_SUBNETS, intra_subnet="wireguard-private"), "x1"))
    eps = {p["name"]: p["endpoint"] for p in got["peers"]}
    assert eps == {"x2": "10.30.0.2:51820", "x3": "203.0.113.13:51820", "y1": "203.0.113.21:51820"}


def test_private_endpoint_uses_mesh_port_when_peer_has_no_endpoint() -> None:
    doc = {"mesh": {"granularity": "full", "intra_subnet": "wireguard-private", "port": 51999}, "nodes": [
        {"name": "a", "internal_ip": "10.9.0.1/24", "pod_cidr": "10.42.1.0/24", "public_key": key(1)},
        {"name": "b", "internal_ip": "10.9.0.2/24", "pod_cidr": "10.42.2.0/24", "public_key": key(2)},
    ]}
    got = plan_to_json(plan_node(topo(doc), "a"))
    assert got["peers"][0]["endpoint"] == "10.9.0.2:51999"


def test_granularity_override_changes_plan() -> None:
    t = topo(KILO_CLASSIC)
    assert plan_node(t, "b").wireguard_ip is None
    assert str(plan_node(t, "b", granularity="full").wireguard_ip) == "10.4.0.2/16"


@pytest.mark.parametrize("members, expected", [
    # (name, leader flag, endpoint) -> chosen leader
    ([("n1", False, None), ("n2", False, "10.0.0.2:1"), ("n3", False, "198.51.100.3:1")], "n3"),
    ([("n1", False, "198.51.100.1:1"), ("n2", True, "10.0.0.2:1"), ("n3", False, None)], "n2"),
    ([("n1", True, "10.0.0.1:1"), ("n2", True, "198.51.100.2:1")], "n2"),
    ([("n1", False, None), ("n2", False, "192.168.1.1:1")], "n1"),
    ([("n2", False, "example.com:1"), ("n1", False, "100.64.0.1:1")], "n2"),
    ([("n2", False, "[2001:db8::1]:1"), ("n1", False, "[fd00::1]:1")], "n2"),
])
def test_leader_choice(members: list, expected: str) -> None:
    nodes = []
    for i, (name, leader, ep) in enumerate(members):
        n = {"name": name, "location": "l", "internal_ip": f"10.0.0.{i + 1}/24", "pod_cidr": f"10.42.{i}.0/24",
             "public_key": key(i + 1), "leader": leader}
        if ep:
            n["endpoint"] = ep
        nodes.append(n)
    assert plan_node(topo({"nodes": nodes}), members[0][0]).leader == expected


def test_allowed_location_ips_ride_with_their_segment() -> None:
    doc = {"nodes": [
        {"name": "a", "location": "l1", "internal_ip": "10.0.0.1/24", "pod_cidr": "10.42.1.0/24",
         "public_key": key(1), "endpoint": "198.51.100.1:51820"},
        {"name": "b", "location": "l2", "internal_ip": "10.1.0.1/24", "pod_cidr": "10.42.2.0/24",
         "public_key": key(2), "endpoint": "198.51.100.2:51820", "allowed_location_ips": ["192.168.178.0/24"]},
    ]}
    p = plan_to_json(plan_node(topo(doc), "a"))
    assert "192.168.178.0/24" in p["peers"][0]["allowed_ips"]
    assert R("192.168.178.0/24", "10.4.0.2", "wireguard") in p["routes"]


def test_ipv6_pod_cidrs_sort_after_ipv4() -> None:
    doc = {"mesh": {"granularity": "full"}, "nodes": [
        {"name": "a", "pod_cidr": "fd42::/64", "public_key": key(1), "endpoint": "198.51.100.1:51820"},
        {"name": "b", "pod_cidr": "10.42.2.0/24", "public_key": key(2), "endpoint": "198.51.100.2:51820"},
        {"name": "c", "pod_cidr": "fd42:0:0:1::/64", "public_key": key(3), "endpoint": "[2001:db8::3]:51820"},
    ]}
    p = plan_to_json(plan_node(topo(doc), "b"))
    assert [e["prefix"] for e in p["fastpath"]] == ["10.42.2.0/24", "fd42::/64", "fd42:0:0:1::/64"]


@pytest.mark.parametrize("intra, endpoint, b_path", [
    ("direct", None, "direct"),                               # no peer: direct pair
    ("wireguard-private", "10.0.1.2:51820", "wireguard-private"),  # encrypted, private endpoint
    ("wireguard", "203.0.113.2:51820", "tunnel"),             # encrypted, public endpoint
])
def test_full_mesh_intra_subnet_modes(intra: str, endpoint: str | None, b_path: str) -> None:
    p = plan_node(topo(KILO_CLASSIC, granularity="full", intra_subnet=intra), "a")
    peer = next((x for x in p.peers if x.name == "b"), None)
    assert (peer.endpoint if peer else None) == endpoint
    assert p.paths["b"] == b_path
