# SPDX-License-Identifier: Apache-2.0
"""What the page's panels say (ui/view.py) and how the page's data follows its source (cli/ui.py
`Live`): a node's peers with the plan's path, what it sees and what each peer sees of it; the
search box's answers; a topology that changes is drawn again, a source that fails keeps the last
map with the error beside it, and a read serves every request for FRESH_S."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshctl.cli.plan import Source
from meshctl.cli.ui import FRESH_S, Live
from meshctl.errors import InputError
from meshctl.mesh.observed import NodeSeen, PeerSeen
from meshctl.mesh.records import parse_topology
from meshctl.ui.view import MAX_HITS, node_detail, search
from tests.plan.big_topologies import sized
from tests.plan.fixtures import KILO_CLASSIC, key


def test_a_node_lists_every_peer_with_the_planned_path_and_what_each_end_sees() -> None:
    topo = parse_topology(KILO_CLASSIC)
    seen = {"a": NodeSeen("a", "cluster1", 100.0, {"b": PeerSeen("direct", "direct", 0.4, 0.0),
                                                    "c": PeerSeen("tunnel", "tunnel", handshake_age_s=12.0)}),
            "c": NodeSeen("c", "cluster1", 100.0, {"a": PeerSeen(None, "tunnel")})}
    d = node_detail(topo, "a", seen, True)
    assert d["record"]["internal_ip"] == "10.0.1.1/16" and d["location"] == "cluster1/aws"
    rows = {p["peer"]: p for p in d["peers"]}
    assert set(rows) == {"b", "c", "d"}
    assert rows["b"]["here"] == {"rung": "direct", "first": "direct", "rtt_ms": 0.4, "loss": 0.0, "fell_back": False}
    assert rows["c"]["here"]["handshake_age_s"] == 12.0
    assert rows["c"]["there"] == {"rung": None, "first": "tunnel", "fell_back": False}, "c sees no path to a"
    assert rows["d"]["here"] is None and rows["d"]["there"] is None, "nothing reported"
    assert rows["c"]["planned"] == "tunnel" and rows["c"]["wireguard"]
    assert d["summary_at"] == 100.0
    assert [p["peer"] for p in d["extra_peers"]] == ["p1", "p2"]
    # a member of a location: the plan reaches the others through its leader
    b = {p["peer"]: p["planned"] for p in node_detail(topo, "b", {}, False)["peers"]}
    assert b == {"a": "direct", "c": "via-leader", "d": "via-leader"}
    with pytest.raises(InputError, match="'zz' is not a node of the mesh"):
        node_detail(topo, "zz", {}, False)


def test_the_search_finds_a_pod_address_an_address_or_a_name() -> None:
    topo = parse_topology(KILO_CLASSIC)
    assert [(h.node, h.matched) for h in search(topo, "10.2.3.200")] == [("c", "pod")]
    assert [(h.node, h.matched) for h in search(topo, "10.0.1.2")] == [("b", "address")]
    assert search(topo, "10.9.9.9") == [] and search(topo, "zz") == []
    big = parse_topology(sized(500))
    # an exact name first, then the names that contain the text, at most MAX_HITS
    assert [h.node for h in search(big, "N3-1")][:2] == ["n3-10", "n3-11"]
    assert len(search(big, "n")) == MAX_HITS
    assert [h.node for h in search(big, "n0-07")] == ["n0-07"]
    for bad in ("", "   ", "x" * 300):
        with pytest.raises(InputError, match="is not a node name or an address"):
            search(big, bad)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def doc(live: Live) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(live.graph().body)
    return out


def test_the_page_data_follows_its_file_and_keeps_the_last_map_while_it_fails(tmp_path: Path) -> None:
    f = tmp_path / "topo.yaml"
    d = yaml.safe_load(yaml.safe_dump(KILO_CLASSIC))
    f.write_text(yaml.safe_dump(d))
    clock = Clock()
    live = Live(Source(str(f), None, None, None, "", None, None, None, "default"), None, clock=clock)
    live.start()
    first = live.graph()
    assert {n["name"] for n in doc(live)["model"]["nodes"]} == {"a", "b", "c", "d"}
    # a new node in the file: drawn again once the last read is older than FRESH_S
    d["nodes"].append({"name": "e", "location": "gcp", "internal_ip": "10.1.0.2/16", "pod_cidr": "10.2.5.0/24",
                       "endpoint": "198.51.100.5:51820", "public_key": key(5)})
    f.write_text(yaml.safe_dump(d))
    clock.t += FRESH_S / 2
    assert live.graph() is first, "a read this recent answers again"
    clock.t += FRESH_S
    second = live.graph()
    assert second.etag != first.etag and "e" in {n["name"] for n in doc(live)["model"]["nodes"]}
    clock.t += FRESH_S
    assert live.graph() is second, "nothing changed: the same answer, the same tag"
    # the file breaks: the last map stays, with the error
    f.write_text("nodes: [")
    clock.t += FRESH_S
    broken = doc(live)
    assert broken["error"] and "topo.yaml" in broken["error"], broken["error"]
    assert len(broken["model"]["nodes"]) == 5
    f.write_text(yaml.safe_dump(d))
    clock.t += FRESH_S
    assert doc(live)["error"] is None
    assert live.search("10.2.5.9")["hits"][0]["node"] == "e"
