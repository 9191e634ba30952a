# SPDX-License-Identifier: Apache-2.0
"""The cluster-mesh part of the plan: remote nodes, their segments, and what is refused."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.mesh.admit import admit_remotes
from meshctl.mesh.plan import plan_node
from meshctl.mesh.records import parse_topology
from meshctl.mesh.render import plan_to_json
from tests.plan.fixtures import key

from .fixtures import CLUSTER1, CLUSTER2


def plan_of(local: dict, remote: dict, node: str) -> dict:
    lt, rt = parse_topology(local), parse_topology(remote)
    remotes, rejected = admit_remotes(lt, [rt])
    assert rejected == []
    return plan_to_json(plan_node(lt, node, remotes))


def routes(p: dict) -> dict[str, tuple]:
    return {r["dst"]: (r["via"], r["dev"]) for r in p["routes"]}


def test_leader_goes_direct_to_shared_segment_and_tunnels_to_the_other() -> None:
    p = plan_of(CLUSTER1, CLUSTER2, "c1")
    rt = routes(p)
    # g1, g2 share 10.10.0.0/24 with c1: direct, whatever the granularities
    assert rt["10.43.1.0/24"] == ("10.10.0.11", "private")
    assert rt["10.43.2.0/24"] == ("10.10.0.12", "private")
    # gpu-b is one WireGuard peer reached at its leader g3; its WireGuard IP (cluster2's plan:
    # location:gpu-a -> 10.5.0.1, location:gpu-b -> 10.5.0.2) is routed onto kilo0
    assert rt["10.5.0.2/32"] == (None, "wireguard")
    assert rt["10.43.3.0/24"] == ("10.5.0.2", "wireguard")
    assert rt["10.43.4.0/24"] == ("10.5.0.2", "wireguard")
    assert rt["10.20.0.14/32"] == ("10.5.0.2", "wireguard")
    peer = next(x for x in p["peers"] if x["name"] == "cluster2/g3")
    assert peer["kind"] == "segment" and peer["endpoint"] == "203.0.113.13:51820"
    assert peer["public_key"] == key(13)
    assert peer["allowed_ips"] == ["10.5.0.2/32", "10.20.0.13/32", "10.20.0.14/32", "10.43.3.0/24", "10.43.4.0/24"]
    assert not any(x["name"] == "cluster2/g1" for x in p["peers"])  # all of gpu-a is direct
    fp = {e["prefix"]: (e["action"], e["nexthop"]) for e in p["fastpath"]}
    assert fp["10.43.1.0/24"] == ("direct", "10.10.0.11")
    assert fp["10.43.3.0/24"] == ("tunnel", None)


def test_non_leader_sends_remote_traffic_through_its_leader() -> None:
    p = plan_of(CLUSTER1, CLUSTER2, "c2")
    rt = routes(p)
    assert p["peers"] == []
    assert rt["10.43.1.0/24"] == ("10.10.0.11", "private")       # still direct
    assert rt["10.43.3.0/24"] == ("10.10.0.1", "private")        # via leader c1
    assert rt["10.5.0.2/32"] == ("10.10.0.1", "private")


def test_node_without_private_network_tunnels_to_every_remote_segment() -> None:
    p = plan_of(CLUSTER1, CLUSTER2, "e1")
    names = [x["name"] for x in p["peers"] if x["name"].startswith("cluster2/")]
    assert names == ["cluster2/g1", "cluster2/g3"]
    assert routes(p)["10.43.2.0/24"] == ("10.5.0.1", "wireguard")


def test_the_other_side_is_symmetric() -> None:
    p = plan_of(CLUSTER2, CLUSTER1, "g1")
    rt = routes(p)
    assert rt["10.42.1.0/24"] == ("10.10.0.1", "private")
    assert rt["10.42.2.0/24"] == ("10.10.0.2", "private")
    peer = next(x for x in p["peers"] if x["name"] == "cluster1/e1")
    assert "10.42.3.0/24" in peer["allowed_ips"]
    p3 = plan_of(CLUSTER2, CLUSTER1, "g3")
    peer = next(x for x in p3["peers"] if x["name"] == "cluster1/c1")
    # cluster1's segments: location:cpu -> 10.4.0.1, location:edge is node:e1 -> 10.4.0.2
    assert peer["allowed_ips"] == ["10.4.0.1/32", "10.10.0.1/32", "10.10.0.2/32", "10.42.1.0/24", "10.42.2.0/24"]


def with_node(doc: dict, **fields) -> dict:
    d = copy.deepcopy(doc)
    d["nodes"].append({"name": "bad", "location": "gpu-a", "public_key": key(99), **fields})
    return d


@pytest.mark.parametrize("fields, reason", [
    ({"pod_cidr": "10.42.1.128/25"}, "overlaps local node c1's pod CIDR 10.42.1.0/24"),
    ({"pod_cidr": "10.4.7.0/24"}, "overlaps the local WireGuard subnet 10.4.0.0/16"),
    ({"pod_cidr": "10.43.9.0/24", "internal_ip": "10.10.0.2/24"}, "is already used by local node c2"),
])
def test_unsafe_remote_records_are_rejected_and_the_rest_kept(fields, reason) -> None:
    lt = parse_topology(CLUSTER1)
    rt = parse_topology(with_node(CLUSTER2, **fields))
    remotes, rejected = admit_remotes(lt, [rt])
    assert [r.name for r in rejected] == ["cluster2/bad"]
    assert reason in rejected[0].reason
    assert remotes[0].admitted == {"g1", "g2", "g3", "g4"}
    p = plan_node(lt, "c1", remotes)
    # no route of the local cluster changed, and nothing of "bad" installed
    local_only = plan_node(lt, "c1")
    for r in local_only.routes:
        assert r in p.routes
    assert all(str(r.dst) != fields["pod_cidr"] for r in p.routes)


def test_remote_wireguard_subnet_overlapping_ours_is_rejected() -> None:
    d = copy.deepcopy(CLUSTER2)
    d["mesh"]["subnet"] = "10.4.0.0/16"
    remotes, rejected = admit_remotes(parse_topology(CLUSTER1), [parse_topology(d)])
    assert len(rejected) == 4 and all("overlaps the local WireGuard subnet" in r.reason for r in rejected)
    assert remotes[0].admitted == frozenset()


def test_duplicate_cluster_id_is_refused() -> None:
    d = copy.deepcopy(CLUSTER2)
    d["cluster"]["id"] = 1
    remotes, rejected = admit_remotes(parse_topology(CLUSTER1), [parse_topology(d)])
    assert remotes == [] and rejected[0].reason == "cluster.id: 1 is already used by cluster cluster1"


def test_two_remotes_cannot_claim_the_same_pod_cidr() -> None:
    d3 = copy.deepcopy(CLUSTER2)
    d3["cluster"] = {"name": "cluster3", "id": 3}
    d3["mesh"]["subnet"] = "10.6.0.0/16"
    for i, n in enumerate(d3["nodes"]):
        n["internal_ip"] = f"10.30.0.{i + 1}/24"
    remotes, rejected = admit_remotes(parse_topology(CLUSTER1), [parse_topology(CLUSTER2), parse_topology(d3)])
    assert {r.name for r in rejected} == {"cluster3/g1", "cluster3/g2", "cluster3/g3", "cluster3/g4"}
    assert "overlaps cluster2/g1's pod CIDR" in next(r.reason for r in rejected if r.name == "cluster3/g1")


def test_plan_command_with_remote(tmp_path: Path) -> None:
    (tmp_path / "c1.yaml").write_text(yaml.safe_dump(CLUSTER1))
    (tmp_path / "c2.yaml").write_text(yaml.safe_dump(CLUSTER2))
    r = CliRunner().invoke(main, ["plan", "-f", str(tmp_path / "c1.yaml"), "--remote", str(tmp_path / "c2.yaml"),
                                  "--node", "c1", "-o", "json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout) == plan_of(CLUSTER1, CLUSTER2, "c1")
