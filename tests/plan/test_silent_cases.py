# SPDX-License-Identifier: Apache-2.0
"""Every input that used to pass silently now gives one line: an error (exit 2) when it cannot be
planned safely, a warning (exit 0, on stderr) when the plan is safe but part of it cannot work.
The table in docs/mesh.md lists the same cases with the same messages."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.mesh.admit import Claims, admit_nodes, admit_peers, admit_remotes
from meshctl.mesh.records import parse_node, parse_topology

from .fixtures import KILO_CLASSIC, key


def run_plan(tmp_path: Path, doc, *extra: str, node: str = "a"):
    f = tmp_path / "topo.yaml"
    if isinstance(doc, bytes):
        f.write_bytes(doc)
    else:
        f.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return CliRunner().invoke(main, ["plan", "-f", str(f), "--node", node, *extra])


def doc_with(**changes) -> dict:
    d = copy.deepcopy(KILO_CLASSIC)
    for path, value in changes.items():
        kind, i, field = path.split("__")
        d[kind][int(i)][field] = value
    return d


def one_error(r) -> str:
    assert r.exit_code == 2, r.output
    err = r.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: topo.yaml: "), err
    return err.removeprefix("error: topo.yaml: ")


def warnings_of(r) -> list[str]:
    assert r.exit_code == 0, r.output
    lines = r.stderr.strip().splitlines()
    assert all(x.startswith("warning: topo.yaml: ") for x in lines), lines
    return [x.removeprefix("warning: topo.yaml: ") for x in lines]


# --- errors ------------------------------------------------------------------------------------


def test_two_nodes_with_one_public_key_is_an_error(tmp_path: Path) -> None:
    r = run_plan(tmp_path, doc_with(nodes__2__public_key=key(1)))
    assert one_error(r) == f"nodes[2].public_key: {key(1)!r} is already the key of node a"


def test_peer_with_a_nodes_key_is_an_error(tmp_path: Path) -> None:
    r = run_plan(tmp_path, doc_with(peers__0__public_key=key(3)))
    assert one_error(r) == f"peers[0].public_key: {key(3)!r} is already the key of node c"


def test_peer_named_like_a_node_is_an_error(tmp_path: Path) -> None:
    r = run_plan(tmp_path, doc_with(peers__1__name="c"))
    assert one_error(r) == "peers[1].name: 'c' is the name of a node"


def test_peers_sharing_allowed_ips_is_an_error(tmp_path: Path) -> None:
    r = run_plan(tmp_path, doc_with(peers__1__allowed_ips=["10.5.0.0/30"]))
    assert one_error(r) == "peers[1].allowed_ips[0]: '10.5.0.0/30' overlaps peer p1's allowed IPs 10.5.0.1/32"


def test_one_peer_may_list_nested_networks(tmp_path: Path) -> None:
    r = run_plan(tmp_path, doc_with(peers__1__allowed_ips=["10.5.0.2/32", "10.5.0.0/30"]))
    assert one_error(r) == "peers[1].allowed_ips[1]: '10.5.0.0/30' overlaps peer p1's allowed IPs 10.5.0.1/32"
    r = run_plan(tmp_path, doc_with(peers__1__allowed_ips=["10.6.0.2/32", "10.6.0.0/24"]))
    assert r.exit_code == 0, r.output


def test_binary_file_is_one_line(tmp_path: Path) -> None:
    r = run_plan(tmp_path, b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.stderr.strip().endswith("is not a text file (not UTF-8 at byte 0)")
    r = run_plan(tmp_path, b"nodes: [\x00\x01]\n")
    assert r.exit_code == 2 and "not valid YAML: " in r.stderr


def test_missing_field_says_required_not_none(tmp_path: Path) -> None:
    d = copy.deepcopy(KILO_CLASSIC)
    del d["nodes"][1]["pod_cidr"]
    assert one_error(run_plan(tmp_path, d)) == "nodes[1].pod_cidrs: is required"
    d = copy.deepcopy(KILO_CLASSIC)
    del d["peers"][0]["public_key"]
    assert one_error(run_plan(tmp_path, d)) == "peers[0].public_key: is required"


def test_empty_field_says_null(tmp_path: Path) -> None:
    r = run_plan(tmp_path, doc_with(nodes__1__pod_cidr=None))
    assert one_error(r) == "nodes[1].pod_cidr: null is not a CIDR"
    r = run_plan(tmp_path, doc_with(nodes__1__leader="maybe"))
    assert one_error(r) == "nodes[1].leader: 'maybe' is not true or false"


# --- warnings ----------------------------------------------------------------------------------


def test_endpoint_without_port_is_a_warning_and_uses_the_mesh_port(tmp_path: Path) -> None:
    r = run_plan(tmp_path, doc_with(nodes__2__endpoint="198.51.100.3"), "-o", "json")
    assert warnings_of(r) == ["nodes[2].endpoint: '198.51.100.3' has no port: the mesh port 51820 is used"]
    assert '"endpoint": "198.51.100.3:51820"' in r.stdout


def test_host_prefix_internal_ip_is_a_warning(tmp_path: Path) -> None:
    r = run_plan(tmp_path, doc_with(nodes__2__internal_ip="10.1.0.1/32"))
    assert warnings_of(r) == [
        "nodes[2].internal_ip: '10.1.0.1/32' is a host address: no private network joins c to another node, so "
        "every path to it is WireGuard (list the routed network in mesh.private_networks, or write the subnet's "
        "prefix if the nodes share one L2 subnet)"]


def _host_addressed(granularity: str, intra_subnet: str, private_networks: list[str]) -> dict:
    """Three /32 nodes in three locations (Hetzner), a private network named or not."""
    d = doc_with(nodes__0__internal_ip="10.0.0.2/32", nodes__1__internal_ip="10.0.0.3/32",
                 nodes__2__internal_ip="10.0.0.4/32", nodes__1__location="fsn")
    d["mesh"] = {"granularity": granularity, "intra_subnet": intra_subnet, "private_networks": private_networks}
    d["peers"] = d["peers"][:1]
    return d


def _paths(r) -> dict[str, str]:
    section = r.stdout.split("\nPATHS\n", 1)[1].splitlines()[1:]
    return dict(line.split()[:2] for line in section if line.strip())


@pytest.mark.parametrize("intra", ["auto", "ipip", "vxlan"])
def test_host_prefix_inside_private_networks_is_encapsulated_and_not_warned(tmp_path: Path, intra: str) -> None:
    r = run_plan(tmp_path, _host_addressed("full", intra, ["10.0.0.0/16"]))
    assert warnings_of(r) == []  # the plan uses the private network: nothing for the operator to do
    rung = {"auto": "direct+ipip", "ipip": "direct+ipip", "vxlan": "direct+vxlan"}[intra]
    assert _paths(r) == {"a": "local", "b": rung, "c": rung, "d": "tunnel"}


def test_host_prefix_outside_private_networks_says_wireguard_as_the_plan_does(tmp_path: Path) -> None:
    r = run_plan(tmp_path, _host_addressed("full", "auto", ["10.9.0.0/16"]))
    assert _paths(r) == {"a": "local", "b": "tunnel", "c": "tunnel", "d": "tunnel"}
    w = warnings_of(r)
    assert len(w) == 3 and all("every path to it is WireGuard" in x for x in w)
    assert w[0].startswith("nodes[0].internal_ip: '10.0.0.2/32' is a host address: no private network joins a ")


def test_host_prefix_under_a_fixed_wireguard_mode_says_the_private_network_is_unused(tmp_path: Path) -> None:
    r = run_plan(tmp_path, _host_addressed("full", "direct", ["10.0.0.0/16"]))
    assert _paths(r)["b"] == "tunnel"
    w = warnings_of(r)
    assert w[0] == ("nodes[0].internal_ip: '10.0.0.2/32' is a host address: intra_subnet direct uses the private "
                    "network only between private neighbours, so every path to a is WireGuard although a private "
                    "network joins it to b (set intra_subnet: auto to use the private network)")
    # `wireguard` asks for WireGuard everywhere: the plan does what was asked
    assert warnings_of(run_plan(tmp_path, _host_addressed("full", "wireguard", ["10.0.0.0/16"]))) == []


def test_host_prefix_location_members_raw_is_warned_and_encapsulated_is_not(tmp_path: Path) -> None:
    d = _host_addressed("location", "direct", [])
    d["nodes"][1]["location"] = "aws"  # a and b: one location of /32s
    r = run_plan(tmp_path, d)
    assert _paths(r)["b"] == "direct"
    assert warnings_of(r)[:2] == [
        f"nodes[{i}].internal_ip: '10.0.0.{i + 2}/32' is a host address: intra_subnet direct sends the pod packets "
        f"between {n} and its location's members raw (rung direct), which a network handing out host addresses "
        f"usually drops (set intra_subnet: auto, ipip or vxlan)" for i, n in enumerate("ab")]
    d["mesh"]["intra_subnet"] = "auto"
    r = run_plan(tmp_path, d)
    assert _paths(r)["b"] == "direct+ipip"
    assert [x for x in warnings_of(r) if x.startswith(("nodes[0]", "nodes[1]"))] == []


def test_host_prefix_warning_of_one_node_is_that_nodes_only() -> None:
    """An agent reports its own host-address warning (mesh.checks, `only`)."""
    from meshctl.mesh.checks import host_prefix_warnings

    topo = parse_topology(_host_addressed("full", "auto", ["10.9.0.0/16"]))
    assert [w.split(":", 1)[0] for w in host_prefix_warnings(topo, only="b")] == ["nodes[1].internal_ip"]
    assert host_prefix_warnings(parse_topology(_host_addressed("full", "auto", ["10.0.0.0/16"])), only="b") == []


def test_full_mesh_pair_without_endpoints_is_a_warning(tmp_path: Path) -> None:
    d = doc_with(nodes__2__endpoint=None, nodes__3__endpoint=None)
    d["mesh"]["granularity"] = "full"
    w = warnings_of(run_plan(tmp_path, d))
    why = "neither has an endpoint, so the WireGuard tunnel between them can never start (give one an endpoint)"
    assert w == [f"nodes c and d: {why}", f"node c and peer p2: {why}", f"node d and peer p2: {why}"]
    # A private pair without endpoints goes direct: nothing to warn about.
    d = doc_with(nodes__0__endpoint=None, nodes__1__endpoint=None)
    d["mesh"]["granularity"] = "full"
    d["peers"] = d["peers"][:1]
    assert warnings_of(run_plan(tmp_path, d)) == []


def test_clean_file_has_no_warnings(tmp_path: Path) -> None:
    assert warnings_of(run_plan(tmp_path, KILO_CLASSIC)) == []


# --- records and remote clusters ----------------------------------------------------------------


def test_record_with_a_taken_key_is_rejected_alone() -> None:
    nodes = [parse_node(n, f"nodes[{i}]") for i, n in enumerate(KILO_CLASSIC["nodes"])]
    thief = parse_node({**KILO_CLASSIC["nodes"][0], "name": "e", "pod_cidr": "10.2.9.0/24",
                        "internal_ip": "10.0.1.9/16"}, "e")
    admitted, rejected = admit_nodes([*nodes, thief], None)
    assert [n.name for n in admitted] == ["a", "b", "c", "d"]
    assert [r.reason for r in rejected] == [f"nodes[4].public_key: {key(1)!r} is already the key of node a"]


def test_peer_record_named_like_a_node_is_rejected_alone() -> None:
    topo = parse_topology(KILO_CLASSIC)
    claims = Claims()
    admit_nodes(list(topo.nodes), topo.mesh.subnet, claims=claims)
    from dataclasses import replace

    peers, rejected = admit_peers([replace(topo.peers[0], name="d"), topo.peers[1]], claims)
    assert [p.name for p in peers] == ["p2"]
    assert [r.reason for r in rejected] == ["peers[0].name: 'd' is the name of a node"]


@pytest.mark.parametrize("clash, message", [
    ({"pod_cidr": "10.5.0.0/24"}, "cluster2.nodes[0].pod_cidr: '10.5.0.0/24' overlaps local peer p1's allowed IPs "
                                  "10.5.0.1/32"),
    ({"public_key": key(102)}, f"cluster2.nodes[0].public_key: {key(102)!r} is already the key of local peer p2"),
    ({"public_key": key(3)}, f"cluster2.nodes[0].public_key: {key(3)!r} is already the key of local node c"),
])
def test_remote_node_cannot_take_a_local_peers_addresses_or_keys(clash, message) -> None:
    local = parse_topology(KILO_CLASSIC)
    remote = parse_topology({"cluster": {"name": "cluster2", "id": 2}, "mesh": {"subnet": "10.14.0.0/16"},
                             "nodes": [{"name": "g1", "pod_cidr": "10.12.1.0/24", "public_key": key(201),
                                        "endpoint": "192.0.2.50:51820", **clash},
                                       {"name": "g2", "pod_cidr": "10.12.2.0/24", "public_key": key(202),
                                        "endpoint": "192.0.2.51:51820"}]})
    remotes, rejected = admit_remotes(local, [remote])
    assert [r.reason for r in rejected] == [message]
    assert sorted(remotes[0].admitted) == ["g2"]


def test_remote_clash_is_reported_by_plan(tmp_path: Path) -> None:
    local = tmp_path / "topo.yaml"
    local.write_text(yaml.safe_dump(KILO_CLASSIC))
    remote = tmp_path / "c2.yaml"
    remote.write_text(yaml.safe_dump({"cluster": {"name": "cluster2", "id": 2}, "mesh": {"subnet": "10.14.0.0/16"},
                                      "nodes": [{"name": "g1", "pod_cidr": "10.5.0.0/24", "public_key": key(201),
                                                 "endpoint": "192.0.2.50:51820"}]}))
    r = CliRunner().invoke(main, ["plan", "-f", str(local), "--node", "a", "--remote", str(remote)])
    assert r.exit_code == 0
    assert r.stderr.strip() == ("warning: rejected cluster2/g1: cluster2.nodes[0].pod_cidr: '10.5.0.0/24' overlaps "
                                "local peer p1's allowed IPs 10.5.0.1/32")


def test_unicode_digits_are_not_numbers(tmp_path: Path) -> None:
    """'²' passes str.isdigit but not int(): it must be an error line, not a traceback."""
    assert one_error(run_plan(tmp_path, doc_with(nodes__0__persistent_keepalive="²"))) == \
        "nodes[0].persistent_keepalive: '²' is not a keepalive in seconds (0..65535)"
    d = copy.deepcopy(KILO_CLASSIC)
    d["mesh"]["port"] = "٣"
    assert one_error(run_plan(tmp_path, d)) == "mesh.port: '٣' is not a port in 1..65535"


def test_control_characters_in_a_field_name_stay_on_one_line(tmp_path: Path) -> None:
    d = copy.deepcopy(KILO_CLASSIC)
    d["nodes"][0]["bad\nname"] = 1
    assert one_error(run_plan(tmp_path, d)) == "nodes[0].bad\\nname: is not a known field (did you mean name?)"


def test_an_agent_sees_only_its_own_dead_tunnels() -> None:
    from meshctl.mesh.checks import dead_tunnels

    d = doc_with(nodes__2__endpoint=None, nodes__3__endpoint=None)
    d["mesh"]["granularity"] = "full"
    topo = parse_topology(d)
    why = "neither has an endpoint, so the WireGuard tunnel between them can never start (give one an endpoint)"
    assert dead_tunnels(topo, only="d") == [f"nodes c and d: {why}", f"node d and peer p2: {why}"]
    assert dead_tunnels(topo, only="a") == []


def test_a_record_rejected_for_its_location_ips_frees_its_key() -> None:
    """A node rejected late (its allowed location IPs) keeps no claim: a peer with the same key,
    admitted after the nodes, is judged on its own fields, not refused as a duplicate of a record
    that is not in."""
    from meshctl.mesh.admit import Claims, admit_nodes, admit_peers
    from meshctl.mesh.fields import network
    from meshctl.mesh.model import Node, Peer

    k = "ZmFrZWtleWZha2VrZXlmYWtla2V5ZmFrZWtleWZha2U="
    a1 = Node(name="a1", pod_cidrs=(network("10.42.1.0/24", "p"),), public_key="A" * 43 + "=")
    bad = Node(name="evil1", pod_cidrs=(network("10.42.99.0/24", "p"),), public_key=k,
               allowed_location_ips=(network("10.42.1.0/24", "p"),))
    claims = Claims()
    admitted, rejected = admit_nodes([a1, bad], network("10.4.0.0/16", "s"), claims=claims)
    assert [n.name for n in admitted] == ["a1"]
    assert [r.name for r in rejected] == ["evil1"] and "overlaps a1's pod CIDR" in rejected[0].reason
    peers, refused = admit_peers([Peer(name="laptop", public_key=k, allowed_ips=(network("10.5.0.1/32", "p"),))],
                                 claims)
    assert [p.name for p in peers] == ["laptop"] and not refused
