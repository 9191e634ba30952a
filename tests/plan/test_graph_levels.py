# SPDX-License-Identifier: Apache-2.0
"""`meshctl graph` levels (issue 20): the location level counts pairs per pair of locations, every
view stays within MAX_EDGES edges and, rendered, within 4,000 px at 50 and 500 nodes with no font
below the default; the DOT of each view of the plan fixtures is byte-identical to its golden file
(MESHCTL_REGEN_GOLDEN=1 rewrites them); bad --level/--node/--location give one line and exit 2."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.mesh.admit import admit_remotes, as_remote
from meshctl.mesh.graph import MAX_EDGES, GraphModel, counts, graph_model, model_dot, model_text, view, with_seen
from meshctl.mesh.records import parse_topology
from tests.clustermesh.fixtures import CLUSTER1, CLUSTER2

from .big_topologies import sized
from .fixtures import CROSS_TWO_SUBNETS, KILO_CLASSIC

GOLDEN = Path(__file__).parent / "golden" / "graph"
REGEN = os.environ.get("MESHCTL_REGEN_GOLDEN") == "1"
PX = 4000


def _clustermesh() -> GraphModel:
    local = parse_topology(CLUSTER1)
    remotes, rejected = admit_remotes(local, [as_remote(parse_topology(CLUSTER2))])
    assert not rejected
    return graph_model(local, remotes)


# fixture name -> (model maker, the views drawn: (name, level, node, location))
FIXTURES: dict[str, Any] = {
    "kilo-classic": (lambda: graph_model(parse_topology(KILO_CLASSIC)),
                     [("location", "location", None, None), ("node", "node", None, None),
                      ("node-b", None, "b", None), ("location-aws", None, None, "aws")]),
    "cross-two-subnets": (lambda: graph_model(parse_topology(CROSS_TWO_SUBNETS)),
                          [("location", "location", None, None), ("node", "node", None, None),
                           ("node-x3", None, "x3", None), ("location-hel", None, None, "hel")]),
    "clustermesh": (_clustermesh,
                    [("location", "location", None, None), ("node", "node", None, None),
                     ("node-c2", None, "c2", None), ("location-gpu-a", None, None, "gpu-a")]),
    "big-50-cross": (lambda: graph_model(parse_topology(sized(50))),
                     [("location", None, None, None), ("node", "node", None, None),
                      ("node-n3-07", None, "n3-07", None), ("location-loc3", None, None, "loc3")]),
}
CASES = [(f, *v) for f, (_, views) in FIXTURES.items() for v in views]


@pytest.mark.parametrize(("fixture", "name", "level", "node", "location"), CASES,
                         ids=[f"{c[0]}.{c[1]}" for c in CASES])
def test_view_dot_is_golden(fixture: str, name: str, level: str | None, node: str | None,
                            location: str | None) -> None:
    dot = model_dot(FIXTURES[fixture][0](), level, node, location)
    path = GOLDEN / f"{fixture}.{name}.dot"
    if REGEN:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(dot)
    assert dot == path.read_text()


def test_location_level_counts_what_joins_each_pair_of_locations() -> None:
    cross = graph_model(parse_topology(sized(50, "cross")))
    v = view(cross, "location")
    assert len(v.edges) == 10  # 5 locations: every pair once
    text = model_text(cross, "location")
    assert "location loc0 -- location loc1: 100 wireguard" in text
    assert "location loc2: 10 nodes, subnets 10.102.0.0/24; members: 45 direct" in text
    by_loc = graph_model(parse_topology(sized(50, "location")))
    text = model_text(by_loc, "location")
    assert "location loc0 -- location loc1: 1 wireguard (leaders)" in text
    assert "location loc0: 10 nodes, leader n0-00, subnets 10.100.0.0/24; members: 45 direct; others through n0-00" \
        in text
    assert model_text(by_loc, node="n0-03").splitlines()[0].endswith("n0-03 and its peers; 40 more through its leader")


def test_default_level_is_node_up_to_twenty_nodes() -> None:
    small = graph_model(parse_topology(KILO_CLASSIC))
    assert view(small).title == "every node"
    assert view(graph_model(parse_topology(sized(50)))).title == "locations"


def test_clusters_are_outer_boxes() -> None:
    dot = model_dot(_clustermesh(), "location")
    assert 'subgraph cluster_c0 {\n    label="cluster cluster1"' in dot
    assert 'subgraph cluster_c1 {\n    label="cluster cluster2"' in dot
    assert "circo" not in dot and "layout=" not in dot  # drawn by dot, which draws clusters


def test_json_is_the_whole_model(tmp_path: Path) -> None:
    f = tmp_path / "t.yaml"
    f.write_text(yaml.safe_dump(CROSS_TWO_SUBNETS))
    r = CliRunner().invoke(main, ["graph", "-f", str(f), "-o", "json"])
    assert r.exit_code == 0, r.stderr
    j = json.loads(r.stdout)
    model = graph_model(parse_topology(CROSS_TWO_SUBNETS))
    assert j == json.loads(json.dumps(model.to_json()))
    assert {(p["a"], p["b"]): p["rung"] for p in j["pairs"]}[("x1", "y1")] == "tunnel"
    assert [loc["name"] for loc in j["locations"]] == ["fsn", "hel"]


# --- the size bound ------------------------------------------------------------------------------

BIG = [(total, gran) for total in (50, 500) for gran in ("cross", "location")]
VIEWS = [("location", None, None), ("node", None, None), (None, "n3-00", None), (None, "n3-07", None),
         (None, None, "loc3")]


@pytest.fixture(scope="module", params=BIG, ids=[f"{t}-{g}" for t, g in BIG])
def big(request: pytest.FixtureRequest) -> GraphModel:
    total, gran = request.param
    return graph_model(parse_topology(sized(total, gran)))


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    return w, h


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz not installed")
@pytest.mark.parametrize(("level", "node", "location"), VIEWS, ids=["location", "node", "leader", "member", "loc3"])
def test_every_view_renders_within_4000_px_in_the_default_font(big: GraphModel, level: str | None, node: str | None,
                                                               location: str | None) -> None:
    v = view(big, level, node, location)
    assert len(v.edges) <= MAX_EDGES
    dot = model_dot(big, level, node, location)
    assert all(int(s) >= 14 for s in re.findall(r"fontsize=(\d+)", dot))
    assert "fontsize" not in dot.lower().replace("fontsize=14", "")
    p = subprocess.run(["dot", "-Tpng"], input=dot.encode(), capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    w, h = png_size(p.stdout)
    assert w <= PX and h <= PX, (w, h)


def test_the_big_topologies_are_what_they_say() -> None:
    t = parse_topology(sized(500, "cross"))
    assert len(t.nodes) == 500 and len({n.location for n in t.nodes}) == 10
    assert len({c for n in t.nodes for c in n.pod_cidrs}) == 500


# --- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "line"), [
    (["--level", "cluster"], "error: --level: 'cluster' is not a level: location, node"),
    (["--node", "zz"], "error: --node: 'zz' is not a node of the mesh"),
    (["--location", "mars"], "error: --location: 'mars' is not a location of the mesh (locations: (none), aws, gcp)"),
    (["--node", "a", "--location", "aws"], "error: --location: 'aws' cannot be combined with --node"),
    (["-o", "text", "--render", "x.png"], "error: --render: 'x.png' draws DOT: leave out -o text"),
    (["--live"], "error: --live: 't.yaml' needs the summaries the agents publish: use --backend etcd|kubernetes "
                 "or --lab NAME"),
])
def test_bad_view_is_one_line_and_exit_2(tmp_path: Path, args: list[str], line: str) -> None:
    f = tmp_path / "t.yaml"
    f.write_text(yaml.safe_dump(KILO_CLASSIC))
    r = CliRunner().invoke(main, ["graph", "-f", str(f), *args])
    assert r.exit_code == 2
    assert r.stderr == line + "\n"
    assert r.stdout == ""


def test_remote_clusters_come_from_remote_and_a_shared_location_name_needs_its_cluster(tmp_path: Path) -> None:
    import copy

    c2 = copy.deepcopy(CLUSTER2)
    for n in c2["nodes"]:
        if n["location"] == "gpu-a":
            n["location"] = "cpu"
    (tmp_path / "c1.yaml").write_text(yaml.safe_dump(CLUSTER1))
    (tmp_path / "c2.yaml").write_text(yaml.safe_dump(c2))
    base = ["graph", "-f", str(tmp_path / "c1.yaml"), "--remote", str(tmp_path / "c2.yaml")]
    r = CliRunner().invoke(main, [*base, "-o", "text", "--level", "location"])
    assert r.exit_code == 0, r.stderr
    assert "location cluster2/cpu: 2 nodes, leader cluster2/g1, subnets 10.10.0.0/24" in r.stdout
    assert "location cluster1/cpu -- location cluster2/gpu-b: 1 wireguard (leaders)" in r.stdout
    r = CliRunner().invoke(main, [*base, "--location", "cpu"])
    assert r.exit_code == 2
    assert r.stderr == ("error: --location: 'cpu' is a location of several clusters: name one of cluster1/cpu, "
                        "cluster2/cpu\n")
    r = CliRunner().invoke(main, [*base, "--location", "cluster2/cpu", "-o", "text"])
    assert r.exit_code == 0 and "location cluster2/cpu expanded" in r.stdout.splitlines()[0]


@pytest.fixture(scope="module")
def many_locations() -> GraphModel:
    """100 locations of 5: 4,950 pairs of locations, too many edges for any picture."""
    from .big_topologies import big_topology

    return graph_model(parse_topology(big_topology(100, 5, "location")))


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz not installed")
@pytest.mark.parametrize(("level", "location"), [("location", None), ("node", None), (None, "loc3")])
def test_a_mesh_of_100_locations_leaves_its_common_edges_out_and_fits(many_locations: GraphModel, level: str | None,
                                                                      location: str | None) -> None:
    v = view(many_locations, level, location=location)
    assert v.edges == () and len(v.hidden) == 4950
    assert v.title.endswith("; not drawn: 4950 edges (4950 wireguard (leaders))")
    p = subprocess.run(["dot", "-Tpng"], input=model_dot(many_locations, level, location=location).encode(),
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    w, h = png_size(p.stdout)
    assert w <= PX and h <= PX, (w, h)
    assert len(model_text(many_locations, level, location=location).splitlines()) == 1 + 100 + 4950


def test_what_differs_from_the_common_edges_stays_drawn(many_locations: GraphModel) -> None:
    from meshctl.mesh.observed import NodeSeen, PeerSeen

    seen = {"n3-00": NodeSeen("n3-00", "big500", 1.0, {"n7-00": PeerSeen("relay", first="tunnel")}),
            "n5-00": NodeSeen("n5-00", "big500", 1.0, {"n6-00": PeerSeen(None, first="tunnel")})}
    v = view(with_seen(many_locations, seen), "location")
    assert [(e.a, e.b, counts(e.pairs)) for e in v.edges] == [
        ("location:big500/loc3", "location:big500/loc7", "1 relay (leaders) fell back"),
        ("location:big500/loc5", "location:big500/loc6", "1 no path (leaders)"),
    ]
    assert len(v.hidden) == 4948
