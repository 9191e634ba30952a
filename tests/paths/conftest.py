# SPDX-License-Identifier: Apache-2.0
"""Labs with every fabric kind for the path tests (the lab suite's `make_lab`: unique prefixes, removed on exit)."""

from __future__ import annotations

from typing import Any

from tests.lab.conftest import make_lab, node_of  # noqa: F401 - the lab suite's fixtures serve here too

# One pair of nodes on each fabric kind (and a third vpc node on the second subnet of network rack).
FABRICS_DOC: dict[str, Any] = {
    "cluster": {"name": "default", "id": 1},
    "mesh": {"granularity": "full", "intra_subnet": "auto"},
    "nodes": [
        {"name": "l1", "location": "l", "internal_ip": "10.30.1.11/24", "pod_cidr": "10.42.1.0/24"},
        {"name": "l2", "location": "l", "internal_ip": "10.30.1.12/24", "pod_cidr": "10.42.2.0/24"},
        {"name": "v1", "location": "v", "internal_ip": "10.30.2.11/24", "pod_cidr": "10.42.3.0/24"},
        {"name": "v2", "location": "v", "internal_ip": "10.30.2.12/24", "pod_cidr": "10.42.4.0/24"},
        {"name": "v3", "location": "v", "internal_ip": "10.30.3.11/24", "pod_cidr": "10.42.5.0/24"},
        {"name": "u1", "location": "u", "internal_ip": "10.30.4.11/24", "pod_cidr": "10.42.6.0/24"},
        {"name": "u2", "location": "u", "internal_ip": "10.30.4.12/24", "pod_cidr": "10.42.7.0/24"},
        {"name": "h1", "location": "h", "internal_ip": "10.0.0.11/16", "pod_cidr": "10.42.8.0/24"},
        {"name": "h2", "location": "h", "internal_ip": "10.0.1.12/16", "pod_cidr": "10.42.9.0/24"},
        {"name": "k1", "location": "k", "internal_ip": "10.50.0.11/24", "pod_cidr": "10.42.10.0/24"},
        {"name": "k2", "location": "k", "internal_ip": "10.50.0.12/24", "pod_cidr": "10.42.11.0/24"},
    ],
    "lab": {
        "lease_ttl": 3,
        "fabrics": {
            "10.30.1.0/24": "l2",
            "10.30.2.0/24": {"kind": "vpc", "network": "rack"},
            "10.30.3.0/24": {"kind": "vpc", "network": "rack"},
            "10.30.4.0/24": {"kind": "vpc-udp", "network": "az"},
            "10.0.0.0/16": {"kind": "hetzner", "network": "hz"},
            "10.50.0.0/24": "blackhole",
        },
    },
}
