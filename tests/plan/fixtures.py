# SPDX-License-Identifier: Apache-2.0
"""Worked topologies for the plan tests, written as a user would write the YAML."""

from __future__ import annotations

import base64
import copy
from typing import Any

from meshctl.mesh.model import Node
from meshctl.mesh.records import parse_node, parse_topology


def key(i: int) -> str:
    """A distinct valid WireGuard public key per integer."""
    return base64.b64encode(i.to_bytes(32, "big")).decode()


def record(name: str, i: int, pod: str, *, internal: str | None = None, endpoint: str | None = None,
           ali: list[str] | None = None, cluster: str = "") -> Node:
    """One node record as a user (or its agent) writes it: its key from `i`, the fields given."""
    d: dict[str, Any] = {"name": name, "pod_cidr": pod, "public_key": key(i)}
    if internal:
        d["internal_ip"] = internal
    if endpoint:
        d["endpoint"] = endpoint
    if ali:
        d["allowed_location_ips"] = ali
    return parse_node(d, name, cluster=cluster, default_port=51820)


# Kilo's classic case: two locations, one of them with two nodes, a node without an internal
# address, and two external peers.
KILO_CLASSIC: dict[str, Any] = {
    "cluster": {"name": "cluster1", "id": 1},
    "mesh": {"granularity": "location"},
    "nodes": [
        {"name": "a", "location": "aws", "internal_ip": "10.0.1.1/16", "endpoint": "203.0.113.1:51820",
         "pod_cidr": "10.2.1.0/24", "public_key": key(1)},
        {"name": "b", "location": "aws", "internal_ip": "10.0.1.2/16", "endpoint": "203.0.113.2:51820",
         "pod_cidr": "10.2.2.0/24", "public_key": key(2)},
        {"name": "c", "location": "gcp", "internal_ip": "10.1.0.1/16", "endpoint": "198.51.100.3:51820",
         "pod_cidr": "10.2.3.0/24", "public_key": key(3)},
        {"name": "d", "endpoint": "198.51.100.4:51820", "pod_cidr": "10.2.4.0/24", "public_key": key(4)},
    ],
    "peers": [
        {"name": "p1", "public_key": key(101), "allowed_ips": ["10.5.0.1/32"], "endpoint": "192.0.2.1:51820"},
        {"name": "p2", "public_key": key(102), "allowed_ips": ["10.5.0.2/32"]},
    ],
}

# A cross mesh where location hel spans two private subnets, and a node of location fsn shares
# hel's first subnet.
CROSS_TWO_SUBNETS: dict[str, Any] = {
    "cluster": {"name": "c2", "id": 2},
    "mesh": {"granularity": "cross", "intra_subnet": "direct"},
    "nodes": [
        {"name": "x1", "location": "hel", "internal_ip": "10.30.0.1/24", "endpoint": "203.0.113.11:51820",
         "pod_cidr": "10.42.1.0/24", "public_key": key(11)},
        {"name": "x2", "location": "hel", "internal_ip": "10.30.0.2/24", "endpoint": "203.0.113.12:51820",
         "pod_cidr": "10.42.2.0/24", "public_key": key(12)},
        {"name": "x3", "location": "hel", "internal_ip": "10.31.0.3/24", "endpoint": "203.0.113.13:51820",
         "pod_cidr": "10.42.3.0/24", "public_key": key(13)},
        {"name": "y1", "location": "fsn", "internal_ip": "10.30.0.9/24", "endpoint": "203.0.113.21:51820",
         "pod_cidr": "10.42.4.0/24", "public_key": key(21), "persistent_keepalive": 25},
    ],
}


def topo(doc: dict[str, Any], **mesh: Any):
    d = copy.deepcopy(doc)
    d.setdefault("mesh", {}).update(mesh)
    return parse_topology(d)
