# SPDX-License-Identifier: Apache-2.0
"""PureMemos.mesh_cidrs: plan.mesh_cidrs of the same inputs, with each remote cluster's part kept
while admission hands out the same Remote."""

from __future__ import annotations

import copy
from dataclasses import replace

from meshctl.agent.memos import PureMemos
from meshctl.mesh.plan import mesh_cidrs
from meshctl.mesh.segments import Remote
from tests.plan.fixtures import CROSS_TWO_SUBNETS, KILO_CLASSIC, key, topo


def _remote(doc: dict, name: str, subnet: str, drop: str = "") -> Remote:
    d = copy.deepcopy(doc)
    d["cluster"] = {"name": name, "id": int(name[-1])}
    d["nodes"] = [n for n in d["nodes"] if n["name"] != drop]
    for i, n in enumerate(d["nodes"]):
        n["pod_cidr"] = n["pod_cidr"].replace("10.2.", f"10.{60 + int(name[-1])}.").replace(
            "10.42.", f"10.{70 + int(name[-1])}.")
        n["allowed_location_ips"] = [f"172.{int(name[-1])}.{i}.0/24"]
    t = topo(d, subnet=subnet)
    return Remote(t, frozenset(n.name for n in t.nodes))


def test_mesh_cidrs_are_the_plans_and_a_changed_remote_alone_is_recomputed() -> None:
    local = topo(KILO_CLASSIC)
    r3, r4 = _remote(KILO_CLASSIC, "cluster3", "10.13.0.0/16"), _remote(CROSS_TWO_SUBNETS, "cluster4", "10.14.0.0/16")
    memos = PureMemos()
    assert memos.mesh_cidrs(local, [r3, r4]) == mesh_cidrs(local, [r3, r4])
    kept = memos._remote_cidrs[id(r3)][1]
    r4_less = _remote(CROSS_TWO_SUBNETS, "cluster4", "10.14.0.0/16", drop="x2")  # a node of cluster4 left
    got = memos.mesh_cidrs(local, [r3, r4_less])
    assert got == mesh_cidrs(local, [r3, r4_less]) and got != mesh_cidrs(local, [r3, r4])
    assert memos._remote_cidrs[id(r3)][1] is kept and set(memos._remote_cidrs) == {id(r3), id(r4_less)}
    grown = replace(local, nodes=(*local.nodes, replace(local.nodes[0], name="e", public_key=key(5))))
    assert memos.mesh_cidrs(grown, [r4_less]) == mesh_cidrs(grown, [r4_less])  # cluster3 went
    assert memos.mesh_cidrs(grown, []) == mesh_cidrs(grown, [])
