# SPDX-License-Identifier: Apache-2.0
"""`meshctl ui` without a browser: bad input is one line and exit 2 (a --listen that is not
HOST:PORT, a port in use, a lab that is not up), and the API the page polls answers from a topology
file (the map, a node's peers and paths, the search box, conditional and compressed answers, a
request through a foreign Host refused). The page's assets name nothing off this machine."""

from __future__ import annotations

import gzip
import json
import re
import socket
from pathlib import Path

import pytest
import yaml

from meshctl.ui.server import ASSETS, CSP, asset
from tests.plan.big_topologies import sized

from .helpers import free_port, meshctl, served


@pytest.fixture(scope="module")
def fifty(tmp_path_factory: pytest.TempPathFactory) -> Path:
    f = tmp_path_factory.mktemp("ui") / "big-50-cross.yaml"
    f.write_text(yaml.safe_dump(sized(50)))
    return f


def one_line_exit_2(r) -> str:
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr.strip()


@pytest.mark.parametrize("listen", ["8470", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", ":8470", "localhost:x"])
def test_a_listen_that_is_not_host_port_is_one_line(listen: str, fifty: Path) -> None:
    line = one_line_exit_2(meshctl("ui", "-f", str(fifty), "--listen", listen))
    assert line == f"error: --listen: {listen!r} is not HOST:PORT (e.g. 127.0.0.1:8470; a port from 1 to 65535)"


def test_a_port_in_use_is_one_line(fifty: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        line = one_line_exit_2(meshctl("ui", "-f", str(fifty), "--listen", f"127.0.0.1:{port}"))
    assert line.startswith(f"error: --listen: '127.0.0.1:{port}' is in use"), line


def test_an_address_of_no_interface_here_is_one_line(fifty: Path) -> None:
    line = one_line_exit_2(meshctl("ui", "-f", str(fifty), "--listen", f"192.0.2.1:{free_port()}"))
    assert line.startswith("error: --listen: '192.0.2.1:") and "cannot be bound" in line, line


def test_a_lab_that_is_not_up_is_one_line() -> None:
    line = one_line_exit_2(meshctl("ui", "--lab", "uinosuchlab", "--listen", f"127.0.0.1:{free_port()}"))
    assert line.startswith("error: --lab: 'uinosuchlab' is not up"), line


def test_a_missing_file_is_one_line() -> None:
    r = meshctl("ui", "-f", "/nonexistent/topo.yaml", "--listen", f"127.0.0.1:{free_port()}")
    assert r.returncode != 0 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_api_answers_from_a_topology_file(fifty: Path) -> None:
    with served("-f", str(fifty)) as ui:
        meta = ui.json("/api/meta")
        assert (meta["source"], meta["backend"], meta["live"]) == ("big-50-cross.yaml", "file", False)
        assert "topology file has none" in meta["explain"]
        doc = ui.json("/api/graph")
        model = doc["model"]
        assert len(model["nodes"]) == 50 and len(model["locations"]) == 5 and doc["error"] is None
        # cross granularity: a location's members reach each other directly, the others by WireGuard
        rungs = {(p["a"], p["b"]): p["rung"] for p in model["pairs"]}
        assert len(rungs) == 50 * 49 // 2
        assert rungs[("n0-00", "n0-01")] == "direct" and rungs[("n0-00", "n1-00")] == "tunnel"
        # a node: its record, and every other node with the plan's path to it
        node = ui.json("/api/node?name=n1-03")
        assert node["record"]["internal_ip"] == "10.101.0.4/24" and node["location"] == "big50/loc1"
        planned = {p["peer"]: p["planned"] for p in node["peers"]}
        assert len(planned) == 49 and planned["n1-04"] == "direct" and planned["n4-09"] == "tunnel"
        assert all(p["here"] is None for p in node["peers"]), "a file has no summaries"
        # the search box: a pod address finds the node whose pod CIDR holds it; a name finds names
        hits = ui.json("/api/search?q=10.200.13.77")["hits"]
        assert [(h["node"], h["matched"]) for h in hits] == [("n1-03", "pod")]
        assert [h["node"] for h in ui.json("/api/search?q=N4-0")["hits"]] == [f"n4-0{i}" for i in range(10)]
        assert ui.json("/api/search?q=10.99.0.1")["hits"] == []
        # bad input: a 400 with one line naming the field
        status, _, body = ui.get("/api/node?name=zz")
        assert (status, json.loads(body)) == (400, {"error": "node: 'zz' is not a node of the mesh"})
        status, _, body = ui.get("/api/explain?src=n0-00&dst=n1-00")
        assert status == 400 and "topology file has none" in json.loads(body)["error"]
        assert ui.get("/api/search")[0] == 400 and ui.get("/nothing")[0] == 404


def test_the_map_is_sent_once_compressed_then_not_again_while_it_stands(fifty: Path) -> None:
    with served("-f", str(fifty)) as ui:
        status, headers, body = ui.get("/api/graph", {"Accept-Encoding": "gzip"})
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        assert len(json.loads(gzip.decompress(body))["model"]["nodes"]) == 50
        assert len(body) < len(gzip.decompress(body)) / 5
        status, _, body = ui.get("/api/graph", {"If-None-Match": headers["ETag"]})
        assert (status, body) == (304, b"")
        assert ui.get("/api/graph", {"If-None-Match": '"0"'})[0] == 200


def test_a_foreign_host_is_refused_and_every_answer_names_its_policy(fifty: Path) -> None:
    with served("-f", str(fifty)) as ui:
        status, headers, body = ui.get("/")
        assert status == 200 and headers["Content-Security-Policy"] == CSP and b"/app.js" in body
        assert ui.get("/api/meta", {"Host": "localhost"})[0] == 200
        # a DNS name that points at 127.0.0.1 (rebinding) does not reach the mesh
        status, _, body = ui.get("/api/graph", {"Host": "attacker.example:80"})
        assert status == 421 and b"loopback" in body


def test_every_asset_ships_in_the_package_and_names_nothing_off_this_machine() -> None:
    for path, (name, _) in ASSETS.items():
        text = asset(name).decode()
        assert text, path
        # the SVG namespace is a name, not a fetch; nothing else may name another host
        assert re.findall(r"https?://(?!www\.w3\.org/2000/svg)[^\s\"'<>]+", text) == [], name
    html = asset("index.html").decode()
    assert set(re.findall(r'(?:src|href)="([^"]+)"', html)) == {"/favicon.svg", "/app.css", "/app.js"}
