"""Labs with every fabric kind for the path tests (prefix `pb<pid><n>-`), removed on exit."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from meshctl.lab import build
from meshctl.lab import state as labstate
from meshctl.lab.spec import parse_lab

_counter = itertools.count()

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


@pytest.fixture
def make_lab() -> Iterator[Callable[..., dict[str, Any]]]:
    names: list[str] = []

    def make(doc: dict[str, Any], **kw: Any) -> dict[str, Any]:
        prefix = f"pb{os.getpid() % 10000}{next(_counter)}-"
        names.append(labstate.lab_name(prefix))
        return build.up(parse_lab(doc), prefix=prefix, **kw)

    try:
        yield make
    finally:
        for n in names:
            build.down(n)


def node_of(st: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for c in st["clusters"] for n in c["nodes"] if n["name"] == name)
