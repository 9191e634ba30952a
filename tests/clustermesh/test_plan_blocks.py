# SPDX-License-Identifier: Apache-2.0
"""The plan merges each remote cluster's shares once and keeps the result while they do not
change (mesh.plan's blocks): the plan must be the one the merge over all shares gives, for
every node, after any change, and whether or not two clusters claim one destination."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from meshctl.mesh import plan as plan_mod
from meshctl.mesh.admit import admit_remotes
from meshctl.mesh.admit_memo import RemoteAdmission
from meshctl.mesh.model import Topology
from meshctl.mesh.plan import NodePlan, PlanCache, plan_node
from meshctl.mesh.segments import Remote
from tests.clustermesh.test_admit_memo import local_topo, node, random_node, remote


def whole(p: NodePlan) -> tuple[object, ...]:
    return (p, p.paths, p.relays)


def same_as_one_merge(monkeypatch: pytest.MonkeyPatch, local: Topology, remotes: list[Remote],
                      caches: dict[str, PlanCache] | None = None) -> None:
    """Each node's plan (with what its earlier plans left in `caches`, as an agent keeps it) is the
    plan of one merge over all shares, computed cold."""
    for n in local.nodes:
        got = plan_node(local, n.name, remotes, cache=(caches or {}).get(n.name))
        with monkeypatch.context() as m:
            m.setattr(plan_mod, "_merge_blocks", lambda *a: None)  # the merge over all shares
            want = plan_node(local, n.name, remotes)
        assert whole(got) == whole(want), n.name


@pytest.mark.parametrize("seed", range(6), ids=[f"sequence {i}" for i in range(6)])
def test_plan_with_blocks_equals_one_merge(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    local = local_topo(node("l1", "10.42.1.0/24", 90, location="a", internal="10.10.0.3/24"),
                       node("l2", "10.42.2.0/24", 91, location="a", internal="10.10.0.4/24"),
                       node("l3", "10.42.3.0/24", 92, endpoint="203.0.113.9"))
    clusters = {f"cluster{k}": [random_node(rng, f"n{k}{i}") for i in range(4)] for k in (2, 3, 4)}
    caches = {n.name: PlanCache() for n in local.nodes}
    for n in range(8):
        views = [remote(c, int(c[7:]), *nodes) for c, nodes in clusters.items()]
        admitted, _ = admit_remotes(local, views)
        same_as_one_merge(monkeypatch, local, admitted, caches)
        c = rng.choice(sorted(clusters))
        clusters[c].append(random_node(rng, f"j{n}"))


def test_two_clusters_claiming_one_destination_plan_as_one_merge(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not admitted (admission would reject one): the plan still takes the first claim."""
    local = local_topo(node("l1", "10.42.1.0/24", 90, location="a", internal="10.10.0.3/24"))
    a = remote("cluster2", 2, node("g1", "10.44.0.0/24", 11, location="x", internal="10.20.0.1/24"))
    b = remote("cluster3", 3, node("h1", "10.44.0.0/24", 21, location="y", internal="10.30.0.1/24"))
    remotes = [Remote(a, frozenset({"g1"})), Remote(b, frozenset({"h1"}))]
    seat = plan_mod._seat(local, "l1", {}, PlanCache())
    assert plan_mod._merge_blocks(seat.me, local, [], plan_mod._remote_blocks(seat, remotes, PlanCache())) is None
    same_as_one_merge(monkeypatch, local, remotes)


def test_a_remote_change_remerges_only_its_cluster() -> None:
    """With admission memoised as the agent runs it, an unchanged cluster's Remote is the same
    object, and its block is reused."""
    local = local_topo(node("l1", "10.42.1.0/24", 90, location="a", internal="10.10.0.3/24"))
    views = [remote("cluster2", 2, node("g1", "10.43.1.0/24", 11, location="x", internal="10.20.0.1/24")),
             remote("cluster3", 3, node("h1", "10.45.1.0/24", 21, location="y", internal="10.30.0.1/24"))]
    memo = RemoteAdmission()
    cache = PlanCache()
    plan_node(local, "l1", memo.admit(local, views)[0], cache=cache)
    plan_node(local, "l1", memo.admit(local, views)[0], cache=cache)  # both blocks reused: their segments stay
    before = (cache.blocks.hits, cache.blocks.misses)
    segments_before = cache.segments.misses
    views[1] = replace(views[1], nodes=(*views[1].nodes, *remote("cluster3", 3, node("h2", "10.45.2.0/24", 22)).nodes))
    plan = plan_node(local, "l1", memo.admit(local, views)[0], cache=cache)
    after = (cache.blocks.hits, cache.blocks.misses)
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
    # cluster3's block is built again, but only h2's new segment is: h1's share is reused
    assert cache.segments.misses - segments_before == 1
    assert plan.paths["cluster3/h2"] == "tunnel"
