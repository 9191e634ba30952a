# SPDX-License-Identifier: Apache-2.0
"""`meshctl graph`'s legend lists the kinds of edge the picture draws and nothing else (two kinds
drawn, two rows; a live picture's no path and fall-back only when some pair has them), and,
rendered, takes a small part of the picture: under a tenth of its area for every example (1.5-7%
here; the seven-edge legend it replaced took 13-30% by its edges alone)."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from meshctl.backends.file import load_topology
from meshctl.mesh.graph import EDGE_ATTRS, graph_model, legend_rows, model_dot
from meshctl.mesh.records import parse_topology

from .big_topologies import sized

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def legend_labels(dot: str) -> list[str]:
    """The labels of the legend's rows, read back from the DOT."""
    line = next((x for x in dot.splitlines() if x.lstrip().startswith('"legend:"')), "")
    return re.findall(r'<TD ALIGN="LEFT">([^<]*)</TD></TR>', line)


def test_the_legend_lists_only_what_is_drawn() -> None:
    cross = graph_model(load_topology(EXAMPLES / "cross-mesh.yaml"))
    assert {p.rung for p in cross.pairs} == {"direct", "tunnel"}
    assert legend_labels(model_dot(cross)) == ["direct (raw, private network)", "WireGuard (tunnel)"]
    hetzner = graph_model(load_topology(EXAMPLES / "hetzner-private-network.yaml"))
    assert legend_labels(model_dot(hetzner)) == ["direct+ipip (IP-in-IP, private network)", "WireGuard (tunnel)"]
    # location granularity draws the leaders' arrows to their members; its legend says so
    by_loc = graph_model(parse_topology(sized(50, "location")))
    labels = legend_labels(model_dot(by_loc, "node", location="loc3"))
    assert labels[-1] == "leader to member"
    # a node's view draws only that node's pairs
    assert legend_labels(model_dot(cross, node="rack-1")) == ["direct (raw, private network)", "WireGuard (tunnel)"]


def test_a_live_legend_adds_no_path_and_fall_back_only_when_drawn() -> None:
    cross = graph_model(load_topology(EXAMPLES / "cross-mesh.yaml"))
    live = replace(cross, live=True)
    assert "no path" not in legend_labels(model_dot(live))
    broken = replace(live, pairs=tuple(replace(p, rung=None, seen=True) if p.rung == "direct" else p
                                       for p in live.pairs))
    fell = replace(live, pairs=tuple(replace(p, fell_back=True, seen=True) if p.rung == "tunnel" else p
                                     for p in live.pairs))
    assert legend_labels(model_dot(broken)) == ["WireGuard (tunnel)", "no path"]
    assert legend_labels(model_dot(fell)) == ["direct (raw, private network)", "WireGuard (tunnel)",
                                              "fell back from its first rung"]


def test_legend_rows_follow_the_edge_attributes() -> None:
    assert legend_rows([]) == []
    rows = legend_rows(graph_model(load_topology(EXAMPLES / "cross-mesh.yaml")).pairs)
    assert [a for a, _ in rows] == [EDGE_ATTRS["direct"], EDGE_ATTRS["tunnel"]]


def plain_boxes(dot: str) -> tuple[float, float, dict[str, float]]:
    """`dot -Tplain`: the picture's width and height and each node's area (inches)."""
    out = subprocess.run(["dot", "-Tplain"], input=dot, capture_output=True, text=True, check=True).stdout
    width = height = 0.0
    areas: dict[str, float] = {}
    for line in out.splitlines():
        words = line.split()
        if words[:1] == ["graph"]:
            width, height = float(words[2]), float(words[3])
        elif words[:1] == ["node"]:
            name = words[1].strip('"')
            areas[name] = float(words[4]) * float(words[5])
    return width, height, areas


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot")
@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_the_legend_takes_a_small_part_of_the_picture(example: str) -> None:
    width, height, areas = plain_boxes(model_dot(graph_model(load_topology(EXAMPLES / example))))
    assert "legend:" in areas
    assert areas["legend:"] < 0.1 * width * height, (areas["legend:"], width * height)
