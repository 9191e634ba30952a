# SPDX-License-Identifier: Apache-2.0
"""`showconf -o wireguard|wg-quick|json|yaml`, `--as-peer`, `--allowed-ips`, and `graph`'s leader
edges, legend and subnet label (the `wg setconf` run is tests/node/test_showconf_wg.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from meshctl.backends.kube.peers import parse_peer_object
from meshctl.cli import main

from .fixtures import KILO_CLASSIC, key


def run(tmp_path: Path, *args: str, doc=KILO_CLASSIC):
    f = tmp_path / "topo.yaml"
    f.write_text(yaml.safe_dump(doc))
    cmd, *rest = args
    return CliRunner().invoke(main, [cmd, "-f", str(f), *rest])


def test_default_is_wireguard_with_addresses_as_comments(tmp_path: Path) -> None:
    out = run(tmp_path, "showconf", "node", "a").stdout
    assert out == run(tmp_path, "showconf", "node", "a", "-o", "wireguard").stdout
    assert "\n# Address = 10.4.0.1/16\n" in out and "\nAddress" not in out
    quick = run(tmp_path, "showconf", "node", "a", "-o", "wg-quick").stdout
    assert "\nAddress = 10.4.0.1/16\n" in quick


def test_non_leader_says_through_whom(tmp_path: Path) -> None:
    out = run(tmp_path, "showconf", "node", "b").stdout
    assert "# Note: b is not a segment leader: it reaches the mesh through a" in out
    assert "[Peer]" not in out


def test_json_and_yaml_are_the_same_document(tmp_path: Path) -> None:
    j = json.loads(run(tmp_path, "showconf", "node", "a", "-o", "json").stdout)
    y = yaml.safe_load(run(tmp_path, "showconf", "node", "a", "-o", "yaml").stdout)
    assert j == y
    assert j["interface"] == {"listen_port": 51820, "addresses": ["10.4.0.1/16"]}
    assert [p["name"] for p in j["peers"]] == ["c", "d", "p1", "p2"]
    assert j["peers"][0] == {"name": "c", "public_key": key(3), "endpoint": "198.51.100.3:51820",
                             "allowed_ips": ["10.1.0.1/32", "10.2.3.0/24", "10.4.0.2/32"], "persistent_keepalive": 0}


def test_as_peer_yaml_is_a_peer_resource_the_other_cluster_accepts(tmp_path: Path) -> None:
    r = run(tmp_path, "showconf", "node", "b", "--as-peer", "-o", "yaml", "--allowed-ips", "10.43.0.0/16")
    assert r.exit_code == 0, r.output
    obj = yaml.safe_load(r.stdout)
    # b does not lead aws: the Peer is aws's segment, named after the cluster and its leader a.
    assert obj == {"apiVersion": "meshctl.io/v1alpha1", "kind": "Peer", "metadata": {"name": "cluster1-a"},
                   "spec": {"allowedIPs": ["10.0.1.1/32", "10.0.1.2/32", "10.2.1.0/24", "10.2.2.0/24", "10.4.0.1/32",
                                           "10.43.0.0/16"],
                            "publicKey": key(1), "endpoint": {"dnsOrIP": {"ip": "203.0.113.1"}, "port": 51820}}}
    peer = parse_peer_object(obj)
    assert peer.name == "cluster1-a" and str(peer.endpoint) == "203.0.113.1:51820"
    j = json.loads(run(tmp_path, "showconf", "node", "b", "--as-peer", "-o", "json", "--allowed-ips", "10.43.0.0/16",
                       "--api-version", "kilo.squat.ai/v1alpha1").stdout)
    assert j["apiVersion"] == "kilo.squat.ai/v1alpha1" and j["spec"] == obj["spec"]


def test_as_peer_of_a_peer_round_trips(tmp_path: Path) -> None:
    obj = yaml.safe_load(run(tmp_path, "showconf", "peer", "p1", "--as-peer", "-o", "yaml").stdout)
    assert obj["metadata"]["name"] == "p1"
    p = parse_peer_object(obj)
    assert p.public_key == key(101) and [str(a) for a in p.allowed_ips] == ["10.5.0.1/32"]
    text = run(tmp_path, "showconf", "peer", "p1", "--as-peer").stdout
    assert text == (f"[Peer]\n# p1\nPublicKey = {key(101)}\nEndpoint = 192.0.2.1:51820\n"
                    "AllowedIPs = 10.5.0.1/32\n")


def test_flag_errors_are_one_line(tmp_path: Path) -> None:
    r = run(tmp_path, "showconf", "node", "a", "--allowed-ips", "10.43.0.0/16")
    assert r.exit_code == 2 and r.stderr.strip() == "error: --allowed-ips: '10.43.0.0/16' needs --as-peer"
    r = run(tmp_path, "showconf", "node", "a", "--as-peer", "--allowed-ips", "10.43.0.1/16")
    assert r.exit_code == 2 and "--allowed-ips[0]: '10.43.0.1/16' has host bits set" in r.stderr
    r = CliRunner().invoke(main, ["plan", "--node", "a"])
    assert r.exit_code == 2 and r.stderr.strip() == "error: -f: is required (or --backend etcd|kubernetes)"
    r = run(tmp_path, "plan", "--node", "a", "--backend", "etcd")
    assert r.exit_code == 2 and r.stderr.strip() == "error: --backend: 'etcd' reads the live cluster: leave out -f"


def test_graph_has_leader_edges_legend_and_subnet(tmp_path: Path) -> None:
    dot = run(tmp_path, "graph").stdout
    assert 'label="cluster cluster1 (location): WireGuard subnet 10.4.0.0/16; every node"' in dot
    assert '"a" -> "b" [style=dashed, dir=forward];' in dot      # aws's leader to its member
    assert '"legend:"' in dot and ">leader to member<" in dot
    full = {**KILO_CLASSIC, "mesh": {"granularity": "full"}}
    drawn = run(tmp_path, "graph", doc=full).stdout
    assert "style=dashed, dir=forward];" not in drawn and "leader to member" not in drawn
