# SPDX-License-Identifier: Apache-2.0
"""Labs for the integration tests: each test builds its own, named `mt<pid><n>-`, and removes it on
success and failure."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from meshctl.lab.namespaces import build
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.namespaces.state import LabState, NodeState
from tests.names import unique
from tests.waiting import wait_for  # noqa: F401 - re-exported for the tests here

BASE: dict[str, Any] = {
    "cluster": {"name": "default", "id": 1},
    "mesh": {"granularity": "location"},
    "nodes": [
        {"name": "a1", "location": "loc-a", "internal_ip": "10.10.1.11/24", "pod_cidr": "10.42.1.0/24", "leader": True},
        {"name": "a2", "location": "loc-a", "internal_ip": "10.10.1.12/24", "pod_cidr": "10.42.2.0/24"},
        {"name": "b1", "location": "loc-b", "internal_ip": "10.10.2.11/24", "pod_cidr": "10.42.3.0/24"},
    ],
    "lab": {"lease_ttl": 3},
}


def topo(granularity: str = "location", intra: str = "direct", nodes: list[dict] | None = None,
         **lab: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    doc["mesh"] = {"granularity": granularity, "intra_subnet": intra}
    if nodes is not None:
        doc["nodes"] = nodes
    doc["lab"].update(lab)
    return doc


@pytest.fixture
def make_lab() -> Iterator[Callable[..., LabState]]:
    names: list[str] = []

    def make(doc: dict[str, Any], **kw: Any) -> LabState:
        prefix = unique("mt") + "-"
        names.append(labstate.lab_name(prefix))
        return build.up(parse_lab(doc), prefix=prefix, **kw)

    try:
        yield make
    finally:
        for n in names:
            build.down(n)


def node_of(st: LabState, name: str) -> NodeState:
    return next(n for _, n in st.nodes() if n.name == name)


def status(st: LabState, name: str) -> dict[str, Any]:
    s = labcheck.agent_status(node_of(st, name))
    assert s is not None, f"no status from {name}"
    return s


def pair(st: LabState, src: str, dst: str, count: int = 5) -> labcheck.PairResult:
    return labcheck.check(st, count=count, pairs=[(src, dst)])[0]
