# SPDX-License-Identifier: Apache-2.0
"""`meshctl graph` draws each pair on the rung its plan gives it (docs/mesh.md, "graph"): raw
`direct` dotted, the encapsulated rungs dotted and labelled with their kind, WireGuard solid
(to the private address: labelled), a relayed pair labelled with its relay; the legend shows
every kind it draws."""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest

from meshctl.mesh.graph import EDGE_ATTRS, Pair, graph_dot, legend_dot, legend_rows
from meshctl.mesh.model import ENCAP_RUNGS
from meshctl.mesh.plan import plan_node
from meshctl.mesh.records import parse_topology

from .fixtures import CROSS_TWO_SUBNETS, KILO_CLASSIC
from .test_nat import SETTLED, mesh

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EDGE = re.compile(r'^  "([^"]+)" -> "([^"]+)" \[(.+)\];$', re.M)


def edges(dot: str) -> dict[tuple[str, str], str]:
    """The pair edges of a graph (leader-to-member arrows left out): (a, b) -> attributes."""
    return {(a, b): attrs for a, b, attrs in EDGE.findall(dot) if "dir=forward" not in attrs}


def planned(topo) -> dict[tuple[str, str], str]:
    """Every pair of local nodes on a rung the graph draws, by its plan (both ends agree offline)."""
    out = {}
    for n in topo.nodes:
        for other, rung in plan_node(topo, n.name).paths.items():
            if rung not in ("local", "via-leader"):
                out[(min(n.name, other), max(n.name, other))] = rung
    return out


def _with_mesh(doc: dict, **mesh: object) -> dict:
    d = copy.deepcopy(doc)
    d["mesh"] = {**d.get("mesh", {}), **mesh}
    return d


def test_hetzner_example_draws_its_encapsulated_pairs_as_the_plan_says() -> None:
    import yaml

    topo = parse_topology(yaml.safe_load((EXAMPLES / "hetzner-private-network.yaml").read_text()))
    drawn = edges(graph_dot(topo))
    assert drawn[("fsn1-1", "nbg1-1")] == 'style=dotted, color=blue, label="ipip"'
    assert drawn[("home1", "nbg1-1")] == "style=solid"
    assert {pair: EDGE_ATTRS[rung] for pair, rung in planned(topo).items()} == drawn


@pytest.mark.parametrize(("doc", "mesh_"), [
    (CROSS_TWO_SUBNETS, {"granularity": "full", "intra_subnet": "vxlan"}),
    (CROSS_TWO_SUBNETS, {"granularity": "full", "intra_subnet": "ipip"}),
    (CROSS_TWO_SUBNETS, {"granularity": "cross", "intra_subnet": "wireguard-private"}),
    (CROSS_TWO_SUBNETS, {"granularity": "full", "intra_subnet": "auto"}),
    (KILO_CLASSIC, {"granularity": "full", "intra_subnet": "direct"}),
    (KILO_CLASSIC, {"granularity": "full", "intra_subnet": "wireguard"}),
])
def test_every_pair_is_drawn_on_its_planned_rung(doc: dict, mesh_: dict) -> None:
    topo = parse_topology(_with_mesh(doc, **mesh_))
    want = planned(topo)
    drawn = edges(graph_dot(topo))
    nodes = {n.name for n in topo.nodes}
    assert {p: a for p, a in drawn.items() if set(p) <= nodes} == {p: EDGE_ATTRS[r] for p, r in want.items()}
    rungs = set(want.values())
    intra = mesh_["intra_subnet"]
    if intra in ("vxlan", "ipip"):
        assert f"direct+{intra}" in rungs  # the case draws the encapsulation it is about
    if intra == "wireguard-private":
        assert "wireguard-private" in rungs


def test_encapsulated_rungs_are_distinct_from_raw_and_from_each_other() -> None:
    attrs = [EDGE_ATTRS["direct"], *(EDGE_ATTRS[r] for r in ENCAP_RUNGS)]
    assert len(set(attrs)) == len(attrs)
    assert all(a.startswith("style=dotted") for a in attrs)
    assert EDGE_ATTRS["tunnel"] == "style=solid"


def test_a_relayed_pair_names_its_relay() -> None:
    topo = mesh(SETTLED)
    assert plan_node(topo, "sa").paths["sb"] == "relay"
    assert edges(graph_dot(topo))[("sa", "sb")] == EDGE_ATTRS["relay"] + ', label="relay via pa"'


def test_the_legend_names_each_rung_in_its_colour() -> None:
    """Every rung has a legend row in the colour its edges are drawn in (legend_rows, when drawn)."""
    for rung, attrs in EDGE_ATTRS.items():
        [(row_attrs, label)] = legend_rows([Pair("a", "b", rung)])
        assert row_attrs == attrs and label, rung
        colour = dict(a.split("=", 1) for a in attrs.split(", ")).get("color", "black")
        line = legend_dot(legend_rows([Pair("a", "b", rung)]))[0]
        assert f'<FONT COLOR="{colour}">' in line and label in line, rung
