# SPDX-License-Identifier: Apache-2.0
"""`meshctl plan`, `graph`, `showconf` through the CLI: output and every rejection."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from meshctl.cli import main

from .fixtures import KILO_CLASSIC, key


def write(tmp_path: Path, doc, name: str = "topo.yaml") -> str:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return str(p)


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_plan_json_is_the_contract(tmp_path: Path) -> None:
    f = write(tmp_path, KILO_CLASSIC)
    r = run("plan", "-f", f, "--node", "a", "-o", "json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert list(out) == ["node", "granularity", "leader", "wireguard_ip", "peers", "routes", "fastpath"]
    assert [p["name"] for p in out["peers"]] == ["c", "d", "p1", "p2"]


def test_plan_table_has_one_line_per_item(tmp_path: Path) -> None:
    r = run("plan", "-f", write(tmp_path, KILO_CLASSIC), "--node", "b")
    assert r.exit_code == 0
    assert "PEERS (0)" in r.stdout and "ROUTES (9)" in r.stdout and "FAST PATH (4)" in r.stdout
    assert "10.2.1.0/24  direct  10.0.1.1" in r.stdout


def mutate(path: str, value):
    doc = copy.deepcopy(KILO_CLASSIC)
    target = doc
    parts = path.split(".")
    for p in parts[:-1]:
        target = target[int(p)] if p.isdigit() else target.setdefault(p, {})
    last = parts[-1]
    if last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value
    return doc


BAD = [
    (mutate("mesh.granularity", "mesh"), "mesh.granularity: 'mesh' is not one of location, full, cross"),
    (mutate("mesh.intra_subnet", "tunnel"), "mesh.intra_subnet: 'tunnel' is not one of"),
    (mutate("nodes.1.name", "B_2"), "nodes[1].name: 'B_2' is not a DNS-1123 name"),
    (mutate("nodes.1.name", "a"), "nodes[1].name: 'a' is a duplicate node name"),
    (mutate("nodes.3.pod_cidr", "10.42.1.0/33"), "nodes[3].pod_cidr: '10.42.1.0/33' is not a CIDR"),
    (mutate("nodes.3.pod_cidr", "10.2.4.1/24"), "nodes[3].pod_cidr: '10.2.4.1/24' has host bits set"),
    (mutate("nodes.2.pod_cidr", "10.2.0.0/16"), "nodes[2].pod_cidr: '10.2.0.0/16' overlaps a's pod CIDR"),
    (mutate("nodes.2.pod_cidr", "10.4.128.0/24"), "nodes[2].pod_cidr: '10.4.128.0/24' overlaps the WireGuard subnet"),
    (mutate("nodes.1.internal_ip", "10.0.1.1/16"), "nodes[1].internal_ip: '10.0.1.1/16' is already used by a"),
    (mutate("nodes.1.internal_ip", "10.0.1.1"), "nodes[1].internal_ip: '10.0.1.1' is not an address with a prefix"),
    (mutate("nodes.0.endpoint", "203.0.113.1:70000"), "nodes[0].endpoint: '203.0.113.1:70000' is not an endpoint"),
    (mutate("nodes.0.endpoint", "2001:db8::1:51820"), "nodes[0].endpoint: '2001:db8::1:51820' is not an endpoint"),
    (mutate("nodes.0.endpoint", "bad host!:1"), "nodes[0].endpoint: 'bad host!:1' is not an endpoint"),
    (mutate("mesh.port", 0), "mesh.port: 0 is not a port in 1..65535"),
    (mutate("nodes.0.public_key", "abc"), "nodes[0].public_key: 'abc' is not a WireGuard key"),
    (mutate("nodes.0.public_key", "A" * 43 + "="), None),  # 32 bytes: valid
    (mutate("nodes.0.public_key", "A" * 42 + "=="), "nodes[0].public_key:"),
    (mutate("cluster.id", 256), "cluster.id: 256 is not a cluster id in 1..255"),
    (mutate("cluster.id", 0), "cluster.id: 0 is not a cluster id in 1..255"),
    (mutate("cluster.name", "-c1"), "cluster.name: '-c1' is not a cluster name"),
    (mutate("cluster.name", "c" * 33), "cluster.name: 'ccccccccccccccccccccccccccccccccc' is not a cluster name"),
    (mutate("peers.0.allowed_ips", ["10.2.1.128/25"]),
     "peers[0].allowed_ips[0]: '10.2.1.128/25' overlaps a's pod CIDR"),
    (mutate("peers.1.name", "p1"), "peers[1].name: 'p1' is a duplicate peer name"),
    (mutate("nodes.0.persistent_keepalive", -1), "nodes[0].persistent_keepalive: -1 is not a keepalive"),
    (mutate("nodes.0.colour", "red"), "nodes[0].colour: is not a known field"),
    ("nodes: [\n  - {name: a", "topo.yaml:2:3: not valid YAML: "),
    ("- just\n- a list\n", "is not a topology"),
]


@pytest.mark.parametrize("doc, message", BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_input_is_one_line_and_nonzero(tmp_path: Path, doc, message: str | None) -> None:
    f = write(tmp_path, doc)
    r = run("plan", "-f", f, "--node", "a")
    if message is None:
        assert r.exit_code == 0, r.output
        return
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    assert message in err, err
    assert "Traceback" not in r.output


def test_error_names_the_file(tmp_path: Path) -> None:
    r = run("plan", "-f", write(tmp_path, mutate("nodes.3.pod_cidr", "10.42.1.0/33")), "--node", "a")
    assert r.stderr.strip() == "error: topo.yaml: nodes[3].pod_cidr: '10.42.1.0/33' is not a CIDR"


def test_unknown_node(tmp_path: Path) -> None:
    r = run("plan", "-f", write(tmp_path, KILO_CLASSIC), "--node", "zz")
    assert r.exit_code == 2 and r.stderr.strip() == "error: --node: 'zz' is not a node in topo.yaml"


def test_missing_file(tmp_path: Path) -> None:
    r = run("plan", "-f", str(tmp_path / "nope.yaml"), "--node", "a")
    assert r.exit_code == 2 and "cannot be read" in r.stderr


def test_real_process_prints_no_traceback(tmp_path: Path) -> None:
    f = write(tmp_path, mutate("nodes.3.pod_cidr", "10.42.1.0/33"))
    exe = Path(sys.executable).parent / "meshctl"
    p = subprocess.run([str(exe), "plan", "-f", f, "--node", "a"], capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr == "error: topo.yaml: nodes[3].pod_cidr: '10.42.1.0/33' is not a CIDR\n"


def test_graph_dot(tmp_path: Path) -> None:
    r = run("graph", "-f", write(tmp_path, KILO_CLASSIC))
    assert r.exit_code == 0
    dot = r.stdout
    assert dot.startswith('digraph "cluster1" {')
    assert dot.count("subgraph cluster_") == 3  # aws, gcp, (none); the legend is one box
    assert '"a" -> "b" [style=dotted]' in dot       # direct private pair inside aws
    assert '"a" -> "c" [style=solid]' in dot        # leaders over WireGuard
    assert '"b" -> "c"' not in dot                  # b is not a leader
    assert "pod: 10.2.4.0/24" in dot and "wireguard: 10.4.0.3/16" in dot


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz not installed")
def test_graph_render_svg(tmp_path: Path) -> None:
    out = tmp_path / "mesh.svg"
    r = run("graph", "-f", write(tmp_path, KILO_CLASSIC), "--render", str(out))
    assert r.exit_code == 0, r.output
    assert out.read_text().lstrip().startswith(("<?xml", "<svg"))


def test_showconf_node_has_no_private_key(tmp_path: Path) -> None:
    r = run("showconf", "-f", write(tmp_path, KILO_CLASSIC), "node", "a")
    assert r.exit_code == 0
    conf = r.stdout
    assert "\nPrivateKey" not in conf and "# PrivateKey = <kept on the node" in conf
    assert "Address = 10.4.0.1/16" in conf and "ListenPort = 51820" in conf
    assert f"PublicKey = {key(3)}\nEndpoint = 198.51.100.3:51820\nAllowedIPs = 10.1.0.1/32, 10.2.3.0/24, 10.4.0.2/32" \
        in conf


def test_showconf_peer(tmp_path: Path) -> None:
    r = run("showconf", "-f", write(tmp_path, KILO_CLASSIC), "peer", "p2")
    assert r.exit_code == 0
    conf = r.stdout
    assert "Address = 10.5.0.2/32" in conf
    # one [Peer] per segment leader: a (aws), c (gcp), d
    assert conf.count("[Peer]") == 3
    assert "AllowedIPs = 10.0.1.1/32, 10.0.1.2/32, 10.2.1.0/24, 10.2.2.0/24, 10.4.0.1/32" in conf
    r = run("showconf", "-f", write(tmp_path, KILO_CLASSIC), "peer", "nobody")
    assert r.exit_code == 2 and r.stderr.strip() == "error: peer: 'nobody' is not a peer of the topology"
