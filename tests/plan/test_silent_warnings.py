# SPDX-License-Identifier: Apache-2.0
"""What the plan leaves out of, or overrides in, what the user wrote: each case one line on stderr
naming the field, the value and why (a warning, exit 0), or an error when it cannot be planned
safely (exit 2; a record from a store is rejected alone). The table in docs/mesh.md lists them."""

from __future__ import annotations

import copy
import ipaddress
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.mesh.admit import admit_local, admit_remotes
from meshctl.mesh.records import parse_topology

from .fixtures import KILO_CLASSIC, key
from .test_silent_cases import one_error, run_plan, warnings_of


def kilo(**mesh: Any) -> dict[str, Any]:
    d = copy.deepcopy(KILO_CLASSIC)
    d["mesh"].update(mesh)
    return d


@pytest.mark.parametrize(("net", "endpoint"), [
    pytest.param("192.168.178.0/24", "192.168.178.5:51820", id="a private location network"),
    pytest.param("203.0.113.128/25", "203.0.113.200:51820", id="a public one: the endpoint is left out as well"),
])
def test_peer_endpoint_inside_a_location_ip_is_left_out_with_a_warning(tmp_path: Path, net: str,
                                                                       endpoint: str) -> None:
    d = kilo()
    d["nodes"][2]["allowed_location_ips"] = [net]
    d["peers"][0]["endpoint"] = endpoint
    r = run_plan(tmp_path, d, "-o", "json")
    assert warnings_of(r) == [
        f"peers[0].endpoint: {endpoint!r} is left out of a's WireGuard peer p1: a routes {net} "
        "(c's allowed location IP) into WireGuard, so p1 is reached only after it calls a (persistent_keepalive)"]
    assert f'"endpoint": "{endpoint}"' not in r.stdout
    assert warnings_of(run_plan(tmp_path, d, node="c")) == []  # c routes its own location IPs natively
    r = CliRunner().invoke(main, ["showconf", "node", "a", "-f", str(tmp_path / "topo.yaml")])
    assert warnings_of(r)[0].startswith("peers[0].endpoint: ") and "Endpoint = " + endpoint not in r.stdout


def test_node_endpoint_routed_into_wireguard_is_left_out_with_a_warning(tmp_path: Path) -> None:
    """A node behind NAT whose endpoint is its inside address, which the plan carries to it."""
    d = kilo(granularity="full")
    d["nodes"][2]["endpoint"] = "10.1.0.1:51820"
    w = warnings_of(run_plan(tmp_path, d))
    assert w == ["nodes[2].endpoint: '10.1.0.1:51820' is left out of a's WireGuard peer c: a routes 10.1.0.1/32 "
                 "(c's internal address) into WireGuard, so c is reached only after it calls a (persistent_keepalive)"]


def test_location_ips_of_a_peerless_private_pair_are_not_routed_with_a_warning(tmp_path: Path) -> None:
    d = kilo(granularity="full", intra_subnet="direct")
    d["nodes"][1]["allowed_location_ips"] = ["192.168.178.0/24"]
    w = warnings_of(run_plan(tmp_path, d))
    assert w == ["nodes[1].allowed_location_ips[0]: '192.168.178.0/24' is not routed on a: intra_subnet direct "
                 "carries a and b on rung direct without WireGuard, which takes only the pod CIDR"]


def test_a_leader_hint_another_node_wins_over_is_a_warning(tmp_path: Path) -> None:
    d = kilo()
    d["nodes"][0]["leader"] = True
    d["nodes"][1]["leader"] = True
    assert warnings_of(run_plan(tmp_path, d)) == [
        "nodes[1].leader: true is not used: a leads location aws (the first by name with leader and a public "
        "endpoint)"]


def test_a_location_without_an_internal_address_is_a_warning(tmp_path: Path) -> None:
    d = kilo()
    d["nodes"][3]["location"] = "aws"
    assert warnings_of(run_plan(tmp_path, d)) == [
        "nodes[3].location: 'aws' is not used: d has no internal_ip, so it is a segment of its own (location "
        "granularity groups nodes by their private network)"]
    d["nodes"][3]["internal_ip"] = "10.0.1.4/16"
    assert warnings_of(run_plan(tmp_path, d)) == []


def test_a_wireguard_ip_other_than_the_segments_is_a_warning(tmp_path: Path) -> None:
    d = kilo()
    d["nodes"][0]["wireguard_ip"] = "10.4.0.1/16"  # what a gets: nothing to say
    d["nodes"][1]["wireguard_ip"] = "10.4.0.9/16"
    d["nodes"][2]["wireguard_ip"] = "10.4.0.7/16"
    assert warnings_of(run_plan(tmp_path, d)) == [
        "nodes[1].wireguard_ip: '10.4.0.9/16' is not used: WireGuard addresses follow the segments (b does not "
        "lead location:aws and gets none)",
        "nodes[2].wireguard_ip: '10.4.0.7/16' is not used: WireGuard addresses follow the segments (c gets "
        "10.4.0.2/16)"]


def test_reports_about_no_node_are_a_warning(tmp_path: Path) -> None:
    d = kilo()
    d["nodes"][0]["unreached_peers"] = ["zz"]
    d["nodes"][1]["discovered_endpoints"] = {"yy": "203.0.113.50:4000", "c": "203.0.113.51:4000"}
    assert warnings_of(run_plan(tmp_path, d)) == [
        "nodes[0].unreached_peers: 'zz' is not a node, so the report is ignored",
        "nodes[1].discovered_endpoints.yy: '203.0.113.50:4000' is not about a node, so the report is ignored"]


# --- errors and rejections ----------------------------------------------------------------------


def test_internal_subnet_overlapping_the_wireguard_subnet_is_an_error(tmp_path: Path) -> None:
    d = kilo(subnet="10.4.0.0/16")
    d["nodes"][2]["internal_ip"] = "10.4.0.2/24"
    assert one_error(run_plan(tmp_path, d)) == \
        "nodes[2].internal_ip: '10.4.0.2/24' overlaps the WireGuard subnet 10.4.0.0/16"


def test_location_ips_overlapping_the_wireguard_subnet_are_an_error(tmp_path: Path) -> None:
    d = kilo()
    d["nodes"][2]["allowed_location_ips"] = ["10.4.128.0/17"]
    assert one_error(run_plan(tmp_path, d)) == \
        "nodes[2].allowed_location_ips[0]: '10.4.128.0/17' overlaps the WireGuard subnet 10.4.0.0/16"


@pytest.mark.parametrize(("kind", "i", "field"), [("nodes", 3, "endpoint"), ("peers", 0, "endpoint")])
def test_a_private_endpoint_equal_to_a_wireguard_address_is_an_error(tmp_path: Path, kind: str, i: int,
                                                                     field: str) -> None:
    d = kilo()
    d[kind][i][field] = "10.4.0.11:51820"
    assert one_error(run_plan(tmp_path, d)) == \
        f"{kind}[{i}].endpoint: '10.4.0.11:51820' is an address of the WireGuard subnet 10.4.0.0/16"


def test_a_record_overlapping_the_wireguard_subnet_is_rejected_alone() -> None:
    t = parse_topology(KILO_CLASSIC)
    bad = replace(t.nodes[2], internal_ip=ipaddress.ip_interface("10.4.0.2/24"))
    admitted, rejected = admit_local(replace(t, nodes=(t.nodes[0], t.nodes[1], bad, t.nodes[3])))
    assert [n.name for n in admitted.nodes] == ["a", "b", "d"]
    assert [r.reason for r in rejected] == [
        "nodes[2].internal_ip: '10.4.0.2/24' overlaps the WireGuard subnet 10.4.0.0/16"]


def test_a_remote_wireguard_address_equal_to_a_local_internal_address_is_rejected() -> None:
    d = kilo()
    d["nodes"][2]["internal_ip"] = "10.14.0.1/24"
    local = parse_topology(d)
    remote = parse_topology({"cluster": {"name": "cluster2", "id": 2}, "mesh": {"subnet": "10.14.0.0/16"},
                             "nodes": [{"name": "g1", "pod_cidr": "10.12.1.0/24", "public_key": key(201),
                                        "endpoint": "192.0.2.50:51820"}]})
    _, rejected = admit_remotes(local, [remote])
    assert [r.reason for r in rejected] == [
        "cluster2.nodes.g1.wireguard_ip: '10.14.0.1' is the internal address of local node c"]


def test_a_remote_internal_address_inside_the_local_wireguard_subnet_is_rejected() -> None:
    local = parse_topology(KILO_CLASSIC)
    remote = parse_topology({"cluster": {"name": "cluster2", "id": 2}, "mesh": {"subnet": "10.14.0.0/16"},
                             "nodes": [{"name": "g1", "pod_cidr": "10.12.1.0/24", "public_key": key(201),
                                        "internal_ip": "10.4.0.3/24", "endpoint": "192.0.2.50:51820"},
                                       {"name": "g2", "pod_cidr": "10.12.2.0/24", "public_key": key(202),
                                        "endpoint": "192.0.2.51:51820"}]})
    remotes, rejected = admit_remotes(local, [remote])
    assert [r.reason for r in rejected] == [
        "cluster2.nodes.g1.internal_ip: '10.4.0.3/24' is an address of the local WireGuard subnet 10.4.0.0/16"]
    assert sorted(remotes[0].admitted) == ["g2"]


def test_location_ips_of_a_remote_private_neighbour_are_not_routed_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / "topo.yaml").write_text(yaml.safe_dump(KILO_CLASSIC))
    (tmp_path / "c2.yaml").write_text(yaml.safe_dump({
        "cluster": {"name": "cluster2", "id": 2}, "mesh": {"subnet": "10.14.0.0/16"},
        "nodes": [{"name": "g1", "pod_cidr": "10.12.1.0/24", "public_key": key(201), "internal_ip": "10.0.9.1/16",
                   "endpoint": "192.0.2.50:51820", "allowed_location_ips": ["192.168.50.0/24"]},
                  {"name": "g2", "pod_cidr": "10.12.2.0/24", "public_key": key(202), "endpoint": "192.0.2.51:51820",
                   "allowed_location_ips": ["192.168.51.0/24"]}]}))
    r = CliRunner().invoke(main, ["plan", "-f", str(tmp_path / "topo.yaml"), "--node", "a",
                                  "--remote", str(tmp_path / "c2.yaml")])
    assert warnings_of(r) == [  # g2 is reached over WireGuard: its location IPs are routed
        "cluster2.nodes[0].allowed_location_ips[0]: '192.168.50.0/24' is not routed on a: a reaches cluster2/g1 "
        "over the private network, which takes only the pod CIDR"]
