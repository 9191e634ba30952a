# SPDX-License-Identifier: Apache-2.0
"""A cluster's records admitted all at once (mesh.admit._all_clear, when none of them has a
problem) against the same records judged one by one: the same remotes and rejections, over
random clusters of clean records with now and then a record drawn to collide."""

from __future__ import annotations

import random

import pytest

from meshctl.mesh import admit
from meshctl.mesh.admit import admit_remotes
from tests.clustermesh.test_admit_memo import local_topo, node, random_node, remote


@pytest.mark.parametrize("seed", range(16), ids=[f"clusters {i}" for i in range(16)])
def test_a_cluster_admitted_at_once_equals_one_by_one(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    local = local_topo(node("l1", "10.44.1.0/24", 3, location="a", internal="10.10.0.3/24"),
                       node("l2", "10.42.0.0/24", 30, endpoint="203.0.113.2", location_ips=("192.168.1.0/24",)))
    remotes = []
    for c in range(2, 6):
        nodes = [node(f"c{c}n{i}", f"10.{50 + c}.{i}.0/24", 100 * c + i, location=rng.choice("ab"),
                      internal=f"10.{20 + c}.0.{i + 1}/24", endpoint=f"198.51.100.{i + 1}")
                 for i in range(rng.randrange(1, 6))]
        if c > 2 and rng.random() < 0.7:  # cluster2 stays clean: admitted at once
            for j in range(rng.randrange(1, 3)):
                nodes.insert(rng.randrange(len(nodes) + 1), random_node(rng, f"x{c}.{j}"))
            if rng.random() < 0.5:  # a block over a clean record's pod CIDR, before or after it
                nodes.insert(rng.randrange(len(nodes) + 1), node(f"d{c}", f"10.{50 + c}.0.0/23", 90 + c))
        remotes.append(remote(f"cluster{c}", c, *nodes))
    verdicts: list[bool] = []
    at_once = admit._all_clear

    def spy(*args):  # type: ignore[no-untyped-def]
        held = at_once(*args)
        verdicts.append(held is not None)
        return held

    monkeypatch.setattr(admit, "_all_clear", spy)
    got = admit_remotes(local, remotes)
    monkeypatch.setattr(admit, "_all_clear", lambda *args: None)
    want = admit_remotes(local, remotes)
    assert got[1] == want[1]
    assert [(r.topology, r.admitted, r.segments) for r in got[0]] == \
        [(r.topology, r.admitted, r.segments) for r in want[0]]
    assert verdicts[0], "cluster2's clean records were judged one by one"
