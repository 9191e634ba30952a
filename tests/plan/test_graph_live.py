# SPDX-License-Identifier: Apache-2.0
"""`graph --live` (issue 20 item 2, the pure part): with_seen puts each pair on the rung its ends
report now (mesh.observed), the costlier where they disagree, marks a pair that fell back (drawn
dashed) and one without a path (drawn red), and keeps the plan's rung where no end reports."""

from __future__ import annotations

from meshctl.mesh.graph import EDGE_ATTRS, NO_PATH_ATTRS, Pair, graph_model, model_dot, pair_attrs, with_seen
from meshctl.mesh.observed import NodeSeen, PeerSeen
from meshctl.mesh.records import parse_topology

from .fixtures import CROSS_TWO_SUBNETS
from .test_graph_rungs import edges


def seen(node: str, **peers: PeerSeen) -> NodeSeen:
    return NodeSeen(node, "c2", 1000.0, peers)


def rungs(model) -> dict[tuple[str, str], Pair]:
    return {(p.a, p.b): p for p in model.pairs}


PLANNED = graph_model(parse_topology(CROSS_TWO_SUBNETS))


def test_the_plan_is_what_the_live_overlay_starts_from() -> None:
    r = rungs(PLANNED)
    assert r[("x1", "x2")].rung == "direct" and r[("x1", "y1")].rung == "tunnel"
    assert not PLANNED.live


def test_each_pair_takes_the_rung_its_ends_report_and_the_costlier_where_they_disagree() -> None:
    live = with_seen(PLANNED, {
        "x1": seen("x1", x2=PeerSeen("direct+vxlan", first="direct"), y1=PeerSeen("tunnel", first="tunnel")),
        "x2": seen("x2", x1=PeerSeen("direct", first="direct")),
        "y1": seen("y1", x1=PeerSeen("relay", first="tunnel")),
    })
    r = rungs(live)
    assert live.live
    assert r[("x1", "x2")] == Pair("x1", "x2", "direct+vxlan", seen=True, fell_back=True)
    assert r[("x1", "y1")].rung == "relay" and r[("x1", "y1")].fell_back
    assert r[("x2", "x3")].rung == PLANNED.pairs[[(p.a, p.b) for p in PLANNED.pairs].index(("x2", "x3"))].rung
    assert not r[("x2", "x3")].seen  # no end reported it: the plan's rung


def test_no_path_at_either_end_is_red_and_costs_most() -> None:
    live = with_seen(PLANNED, {"x1": seen("x1", y1=PeerSeen(None, first="tunnel")),
                               "y1": seen("y1", x1=PeerSeen("tunnel", first="tunnel"))})
    pair = rungs(live)[("x1", "y1")]
    assert pair.rung is None and pair.seen and not pair.fell_back
    assert pair_attrs(pair) == NO_PATH_ATTRS and "color=red" in NO_PATH_ATTRS
    drawn = edges(model_dot(live, "node"))
    assert drawn[("x1", "y1")] == NO_PATH_ATTRS
    assert "no path" in model_dot(live, "node").split('"legend:"', 1)[1]


def test_a_pair_that_fell_back_is_dashed_in_its_rungs_colour() -> None:
    live = with_seen(PLANNED, {"x1": seen("x1", x2=PeerSeen("direct+vxlan", first="direct"))})
    attrs = edges(model_dot(live, "node"))[("x1", "x2")]
    assert attrs.startswith("style=dashed") and "color=darkgreen" in attrs
    assert "style=dotted" not in attrs
    same = with_seen(PLANNED, {"x1": seen("x1", x2=PeerSeen("direct+vxlan", first="direct+vxlan"))})
    assert edges(model_dot(same, "node"))[("x1", "x2")] == EDGE_ATTRS["direct+vxlan"]


def test_an_unknown_rung_is_no_report() -> None:
    live = with_seen(PLANNED, {"x1": seen("x1", y1=PeerSeen("carrier-pigeon"))})
    assert rungs(live)[("x1", "y1")] == rungs(PLANNED)[("x1", "y1")]


def test_a_location_edge_counts_the_live_rungs() -> None:
    live = with_seen(PLANNED, {"y1": seen("y1", x1=PeerSeen(None), x2=PeerSeen("relay", first="tunnel"))})
    dot = model_dot(live, "location")
    edge = next(ln for ln in dot.splitlines() if '"location:c2/fsn" -> "location:c2/hel"' in ln and "invis" not in ln)
    assert 'label="1 wireguard, 1 relay fell back, 1 no path"' in edge and "color=red" in edge
