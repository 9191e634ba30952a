# SPDX-License-Identifier: Apache-2.0
"""`NodePlan.paths` holds `Path` members, built inside the plan's shares, in every role a plan
has (a location's members and leader, full/cross pairs, relays, remote segments, flannel, split
families); and every output that carries a path (the node list's JSON and table, the status
document, the plan's table, the graph's JSON) writes the same strings operators' scripts read."""

from __future__ import annotations

import copy
import json

import pytest

from meshctl.agent.status import PassSummary
from meshctl.errors import MeshError
from meshctl.mesh.admit import admit_remotes
from meshctl.mesh.graph import graph_model
from meshctl.mesh.model import RUNGS, Path, path_of
from meshctl.mesh.observed import NodeSeen
from meshctl.mesh.plan import NodePlan, plan_node
from meshctl.mesh.records import parse_topology
from meshctl.mesh.render import NodeRow, node_rows, plan_to_table
from tests.clustermesh.fixtures import CLUSTER1, CLUSTER2
from tests.cni.test_flannel_plan import topo as flannel_topo

from .fixtures import KILO_CLASSIC, topo
from .test_dual_stack import V6_SHARED, mesh_doc
from .test_nat import SETTLED
from .test_nat import mesh as nat_mesh

# The strings scripts read: each Path member's value, exactly as before the type existed.
WORDS = {"direct", "direct+ipip", "direct+vxlan", "wireguard-private", "tunnel", "local", "via-leader", "relay",
         "flannel", "none"}


def _plans() -> dict[str, NodePlan]:
    """One plan per role a path comes from, by what it exercises."""
    local, remote = parse_topology(copy.deepcopy(CLUSTER1)), parse_topology(copy.deepcopy(CLUSTER2))
    remotes, rejected = admit_remotes(local, [remote])
    assert rejected == []
    nat = nat_mesh(SETTLED, granularity="full")
    return {
        "location member": plan_node(topo(KILO_CLASSIC), "b"),
        "location leader": plan_node(topo(KILO_CLASSIC), "a"),
        "full pairs": plan_node(topo(KILO_CLASSIC, granularity="full"), "a"),
        "relay": plan_node(nat, "sa"),
        "remote, leader": plan_node(local, local.nodes[0].name, remotes),
        "remote, member": plan_node(local, local.nodes[-1].name, remotes),
        "flannel": plan_node(flannel_topo("cross"), "a1", flannel=True),
        "split families": plan_node(parse_topology(mesh_doc(*V6_SHARED)), "a"),
    }


PLANS = _plans()


def test_the_members_are_the_words_scripts_read() -> None:
    assert {p.value for p in Path} == WORDS
    assert set(RUNGS) < set(Path) and all(type(r) is Path for r in RUNGS)


@pytest.mark.parametrize("role", sorted(PLANS))
def test_every_path_of_a_plan_is_a_path_member(role: str) -> None:
    p = PLANS[role]
    assert p.paths
    bad = {k: v for k, v in {**p.paths, **p.handed_over}.items() if type(v) is not Path}
    assert not bad, f"{role}: {bad}"
    assert all(type(r) is Path and r in RUNGS for fams in p.family_paths.values() for _, r in fams)
    assert p.paths[p.node] is Path.LOCAL


def test_the_plans_cover_every_kind_of_path() -> None:
    seen = {v for p in PLANS.values() for v in p.paths.values()}
    assert {Path.LOCAL, Path.DIRECT, Path.TUNNEL, Path.VIA_LEADER, Path.RELAY, Path.FLANNEL} <= seen
    assert any(p.family_paths for p in PLANS.values())
    assert all(type(v) is Path for p in PLANS.values() for v in p.rung_paths.values())


@pytest.mark.parametrize("me,want", [("a", {"a": "local", "b": "direct", "c": "tunnel", "d": "tunnel"}),
                                     ("b", {"a": "direct", "b": "local", "c": "via-leader", "d": "via-leader"})])
def test_the_node_list_json_keeps_the_strings(me: str, want: dict[str, str]) -> None:
    t = topo(KILO_CLASSIC)
    rows = json.loads(json.dumps(node_rows(t, [], plan_node(t, me))))
    assert {r["name"]: r["path"] for r in rows} == want
    # Read back (as `meshctl node list` and `explain` read an agent's rows): members again.
    back = [NodeRow.from_json(r) for r in rows]
    assert all(type(r.path) is Path for r in back) and [r.to_json() for r in back] == rows


def test_the_status_document_keeps_the_strings() -> None:
    p = PLANS["relay"]
    doc = {"paths": dict(p.paths)}
    text = json.dumps(doc)
    assert '"sb": "relay"' in text and '"sa": "local"' in text and '"ca": "tunnel"' in text
    summary = PassSummary.from_json(json.loads(text) | {"mesh": {}})
    assert summary.paths == p.paths and all(type(v) is Path for v in summary.paths.values())
    assert json.loads(json.dumps(summary.to_json()))["paths"] == json.loads(text)["paths"]


def test_the_plan_table_and_the_graph_json_keep_the_strings() -> None:
    table = plan_to_table(PLANS["location member"])
    assert [ln.split() for ln in table.split("PATHS", 1)[1].splitlines()[2:]] == [
        ["a", "direct"], ["b", "local"], ["c", "via-leader"], ["d", "via-leader"]]
    model = json.loads(json.dumps(graph_model(topo(KILO_CLASSIC)).to_json()))
    assert {p["rung"] for p in model["pairs"]} == {"direct", "tunnel"}


def test_a_word_that_is_no_path_is_refused_with_where_it_was() -> None:
    assert path_of("via-leader", "paths.b") is Path.VIA_LEADER
    with pytest.raises(MeshError, match=r"^paths\.b: 'carrier-pigeon' is not a path \(one of direct, "):
        path_of("carrier-pigeon", "paths.b")
    with pytest.raises(MeshError, match=r"^paths\.b: None is not a path"):
        path_of(None, "paths.b")
    with pytest.raises(MeshError, match="peer b: rung: 'x' is not a path"):
        NodeSeen.from_json({"node": "a", "cluster": "c", "at": 1.0, "peers": {"b": {"rung": "x"}}})
