# SPDX-License-Identifier: Apache-2.0
"""Global ranges (mesh.global_cidrs) in the pure core: the setting's own rules, admission of a
remote cluster by its global images, the refusals (one line naming both clusters and the ranges),
the plan's translated entries, and `plan`/`mesh set` on the command line."""

from __future__ import annotations

import copy
import ipaddress
import json
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.errors import InputError
from meshctl.mesh import global_ranges
from meshctl.mesh.admit import admit_remotes
from meshctl.mesh.admit_memo import RemoteAdmission
from meshctl.mesh.plan import plan_node
from meshctl.mesh.records import mesh_to_record, parse_mesh, parse_topology
from tests.plan.fixtures import key

from .fixtures import CLUSTER1, CLUSTER2

net = ipaddress.ip_network
ip = ipaddress.ip_address


def overlapping(global1: Any = "10.142.0.0/16", global2: Any = "10.143.0.0/16") -> tuple[dict, dict]:
    """cluster1 and cluster2 of the fixtures, both with pods in 10.42.0.0/16 (g1 on 10.42.1.0/24,
    as c1), each with the global range given (None: none)."""
    c1, c2 = copy.deepcopy(CLUSTER1), copy.deepcopy(CLUSTER2)
    for i, n in enumerate(c2["nodes"]):
        n["pod_cidr"] = f"10.42.{i + 1}.0/24"
    if global1:
        c1["mesh"]["global_cidrs"] = {"10.42.0.0/16": global1}
    if global2:
        c2["mesh"]["global_cidrs"] = {"10.42.0.0/16": global2}
    return c1, c2


def admitted(local: dict, remote: dict):
    return admit_remotes(parse_topology(local), [parse_topology(remote)])


# --- the setting --------------------------------------------------------------------------------


@pytest.mark.parametrize("value,line", [
    ({"10.42.0.0/16": "10.142.0.0/17"},
     "mesh.global_cidrs[10.42.0.0/16]: '10.142.0.0/17' is not the size of the pod range 10.42.0.0/16 (a /16: each "
     "pod keeps its host bits in its global image)"),
    ({"10.42.0.0/16": "10.42.128.0/16"}, "mesh.global_cidrs[10.42.0.0/16]: '10.42.128.0/16' has host bits set "
     "(the network is 10.42.0.0/16)"),
    ({"10.42.0.0/16": "10.42.0.0/16"}, "mesh.global_cidrs[10.42.0.0/16]: '10.42.0.0/16' overlaps the pod range "
     "10.42.0.0/16"),
    ({"10.42.0.0/16": "fd00:142::/112"}, "mesh.global_cidrs[10.42.0.0/16]: 'fd00:142::/112' is not an IPv4 range "
     "like the pod range 10.42.0.0/16"),
    ({"10.42.0.0/16": "10.142.0.0/16", "10.44.0.0/16": "10.144.0.0/16"},
     "mesh.global_cidrs key: '10.44.0.0/16' is a second IPv4 pod range (after 10.42.0.0/16): one per family"),
    ({"10.42.0.0/16": "10.4.0.0/16"}, "mesh.global_cidrs[10.42.0.0/16]: '10.4.0.0/16' overlaps the WireGuard subnet "
     "10.4.0.0/16"),
    ("10.42.0.0/16", "mesh.global_cidrs: '10.42.0.0/16' is not POD=GLOBAL (a pod range, '=', its global range)"),
])
def test_a_bad_setting_is_one_line_naming_the_field_and_the_value(value, line) -> None:
    with pytest.raises(InputError) as e:
        parse_mesh({"subnet": "10.4.0.0/16", "global_cidrs": value}, "mesh")
    assert str(e.value) == line


def test_a_global_range_over_a_service_or_private_network_is_refused() -> None:
    with pytest.raises(InputError, match=r"^mesh.global_cidrs\[10.42.0.0/16\]: '10.43.0.0/16' overlaps the Service "
                                         r"range 10.43.0.0/16$"):
        parse_mesh({"global_cidrs": {"10.42.0.0/16": "10.43.0.0/16"}, "service_cidrs": ["10.43.0.0/16"]}, "mesh")
    with pytest.raises(InputError, match="overlaps the private network 10.0.0.0/8"):
        parse_mesh({"global_cidrs": {"10.42.0.0/16": "10.142.0.0/16"}, "private_networks": ["10.0.0.0/8"]}, "mesh")


def test_the_setting_reads_back_as_written_in_a_record_and_as_mesh_set_writes_it() -> None:
    m = parse_mesh({"global_cidrs": "10.42.0.0/16=10.142.0.0/16, fd42:42::/48=fd42:142::/48"}, "mesh")
    assert m.global_cidrs == ((net("10.42.0.0/16"), net("10.142.0.0/16")), (net("fd42:42::/48"), net("fd42:142::/48")))
    assert mesh_to_record(m)["global_cidrs"] == {"10.42.0.0/16": "10.142.0.0/16", "fd42:42::/48": "fd42:142::/48"}
    assert parse_mesh(mesh_to_record(m), "mesh") == m
    assert "global_cidrs" not in mesh_to_record(parse_mesh({}, "mesh"))  # older agents read the record as before


def test_a_local_node_inside_a_global_range_is_refused() -> None:
    c1, _ = overlapping()
    c1["nodes"][1]["pod_cidr"] = "10.142.9.0/24"
    with pytest.raises(InputError, match=r"^nodes\[1\].pod_cidr: '10.142.9.0/24' overlaps the global range "
                                         r"10.142.0.0/16 of 10.42.0.0/16 \(mesh.global_cidrs\)$"):
        parse_topology(c1)


# --- admission ----------------------------------------------------------------------------------


def test_overlapping_clusters_with_global_ranges_join_by_their_images() -> None:
    c1, c2 = overlapping()
    remotes, rejected = admitted(c1, c2)
    assert rejected == []
    (r,) = remotes
    assert {n.name: [str(c) for c in n.pod_cidrs] for n in r.nodes} == {
        "g1": ["10.143.1.0/24"], "g2": ["10.143.2.0/24"], "g3": ["10.143.3.0/24"], "g4": ["10.143.4.0/24"]}
    # and the other way round
    remotes, rejected = admitted(c2, c1)
    assert rejected == [] and [str(c) for n in remotes[0].nodes for c in n.pod_cidrs] == \
        ["10.142.1.0/24", "10.142.2.0/24", "10.142.3.0/24"]


@pytest.mark.parametrize("g1,g2,line", [
    (None, "10.143.0.0/16",
     "cluster cluster2's pod range 10.42.0.0/16 overlaps cluster cluster1's node c1's pod CIDR 10.42.1.0/24: clusters "
     "whose pod ranges overlap join only when both have mesh.global_cidrs (cluster1 has no IPv4 global range; "
     "docs/clustermesh.md, 'Clusters whose pod ranges overlap')"),
    ("10.142.0.0/16", None,
     "cluster cluster2's node g1's pod CIDR 10.42.1.0/24 overlaps cluster cluster1's pod range 10.42.0.0/16: clusters "
     "whose pod ranges overlap join only when both have mesh.global_cidrs (cluster2 has no IPv4 global range; "
     "docs/clustermesh.md, 'Clusters whose pod ranges overlap')"),
    ("10.142.0.0/16", "10.142.0.0/16",
     "cluster cluster2: mesh.global_cidrs[10.42.0.0/16]: '10.142.0.0/16' overlaps cluster cluster1's global range of "
     "10.42.0.0/16 10.142.0.0/16"),
    ("10.142.0.0/16", "10.30.0.0/16",  # e1's private subnet, below
     "cluster cluster2: mesh.global_cidrs[10.42.0.0/16]: '10.30.0.0/16' overlaps cluster cluster1's node e1's "
     "internal subnet 10.30.0.0/24"),
])
def test_a_remote_cluster_is_refused_whole_in_one_line_naming_both(g1, g2, line) -> None:
    c1, c2 = overlapping(g1, g2)
    c1["nodes"][2]["internal_ip"] = "10.30.0.3/24"
    remotes, rejected = admitted(c1, c2)
    assert remotes == []
    assert [(r.name, r.reason) for r in rejected] == [("cluster2", line)]


def test_a_remote_global_range_inside_a_local_pod_range_is_refused() -> None:
    c1, c2 = overlapping()
    c2["mesh"]["global_cidrs"] = {"10.42.0.0/16": "10.44.0.0/16"}
    c1["nodes"][2]["pod_cidr"] = "10.44.3.0/24"  # e1: outside cluster1's mapped range
    c1["mesh"]["global_cidrs"] = {}
    c2["nodes"] = [dict(n, pod_cidr=f"10.45.{i}.0/24") for i, n in enumerate(c2["nodes"])]
    c2["mesh"]["global_cidrs"] = {"10.45.0.0/16": "10.44.0.0/16"}
    _, rejected = admitted(c1, c2)
    assert [r.reason for r in rejected] == [
        "cluster cluster2: mesh.global_cidrs[10.45.0.0/16]: '10.44.0.0/16' overlaps cluster cluster1's node e1's pod "
        "CIDR 10.44.3.0/24"]


def test_two_remote_clusters_whose_global_ranges_overlap_are_both_refused() -> None:
    c1, c2 = overlapping()
    c3 = copy.deepcopy(c2)
    c3["cluster"] = {"name": "cluster3", "id": 3}
    c3["mesh"]["subnet"] = "10.6.0.0/16"
    c3["mesh"]["global_cidrs"] = {"10.42.0.0/16": "10.143.0.0/16"}
    for i, n in enumerate(c3["nodes"]):
        n["public_key"] = key(30 + i)
        n["internal_ip"] = f"10.31.0.{i + 1}/24"
        n.pop("endpoint", None)
    remotes, rejected = admit_remotes(parse_topology(c1), [parse_topology(c2), parse_topology(c3)])
    assert remotes == []
    assert {r.name: r.reason.split(":")[0] for r in rejected} == {"cluster2": "cluster cluster2",
                                                                  "cluster3": "cluster cluster3"}
    assert all("none of the two is admitted until one changes it" in r.reason for r in rejected)


def test_a_remote_record_outside_its_mapped_range_is_rejected_alone() -> None:
    c1, c2 = overlapping()
    c2["nodes"][3]["pod_cidr"] = "10.50.4.0/24"
    remotes, rejected = admitted(c1, c2)
    assert [r.name for r in remotes[0].nodes] == ["g1", "g2", "g3"]
    assert [(r.name, r.reason) for r in rejected] == [
        ("cluster2/g4", "cluster2.nodes[3].pod_cidr: '10.50.4.0/24' is outside cluster cluster2's pod range "
                        "10.42.0.0/16 (mesh.global_cidrs): it has no global image")]


def test_without_global_ranges_overlapping_records_are_rejected_one_by_one_as_before() -> None:
    c1, c2 = overlapping(None, None)
    remotes, rejected = admitted(c1, c2)
    assert [n.name for n in remotes[0].nodes] == ["g4"]  # 10.42.4.0/24: nobody's
    assert [r.name for r in rejected] == ["cluster2/g1", "cluster2/g2", "cluster2/g3"]
    assert "overlaps local node c1's pod CIDR 10.42.1.0/24" in rejected[0].reason


def test_the_memoised_admission_decides_alike() -> None:
    c1, c2 = overlapping()
    local, remote = parse_topology(c1), parse_topology(c2)
    memo = RemoteAdmission()
    assert [str(c) for n in memo.admit(local, [remote])[0][0].nodes for c in n.pod_cidrs] == \
        [str(c) for n in admit_remotes(local, [remote])[0][0].nodes for c in n.pod_cidrs]
    bad = parse_topology(overlapping(None, "10.143.0.0/16")[1])
    assert memo.admit(local, [bad]) == admit_remotes(local, [bad])


# --- the plan -----------------------------------------------------------------------------------


def test_the_plan_routes_the_images_and_flags_where_a_packet_leaves_the_cluster() -> None:
    c1, c2 = overlapping()
    local = parse_topology(c1)
    remotes, _ = admit_remotes(local, [parse_topology(c2)])
    leader = plan_node(local, "c1", remotes)
    fp = {str(e.prefix): (e.action, str(e.nexthop), e.translate) for e in leader.fastpath}
    assert fp["10.143.1.0/24"] == ("direct", "10.10.0.11", True)   # to g1 itself: leaves here
    assert fp["10.143.3.0/24"] == ("tunnel", "None", True)         # into WireGuard: leaves here
    assert fp["10.42.2.0/24"][2] is False                          # inside the cluster: never
    assert leader.global_cidrs == ((net("10.42.0.0/16"), net("10.142.0.0/16")),)
    member = plan_node(local, "c2", remotes)
    fp = {str(e.prefix): (e.action, str(e.nexthop), e.translate) for e in member.fastpath}
    assert fp["10.143.1.0/24"] == ("direct", "10.10.0.11", True)   # a private neighbour: direct, leaves here
    assert fp["10.143.3.0/24"] == ("direct", "10.10.0.1", False)   # through its leader c1, which translates
    # Without a global range of its own a cluster never translates (the other side does both ways).
    c1_plain = parse_topology(overlapping(None)[0])
    remotes, _ = admit_remotes(c1_plain, [parse_topology(overlapping(None)[1])])
    assert not any(e.translate for e in plan_node(c1_plain, "c1", remotes).fastpath)


def test_plan_on_the_command_line_shows_the_images_and_the_global_ranges(tmp_path) -> None:
    c1, c2 = overlapping()
    f1, f2 = tmp_path / "c1.yaml", tmp_path / "c2.yaml"
    f1.write_text(yaml.safe_dump(c1))
    f2.write_text(yaml.safe_dump(c2))
    r = CliRunner().invoke(main, ["plan", "-f", str(f1), "--remote", str(f2), "--node", "c1", "-o", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["global_cidrs"] == {"10.42.0.0/16": "10.142.0.0/16"}
    assert {"prefix": "10.143.3.0/24", "action": "tunnel", "nexthop": None, "translate": True} in doc["fastpath"]
    r = CliRunner().invoke(main, ["plan", "-f", str(f1), "--remote", str(f2), "--node", "c1"])
    assert "GLOBAL RANGES" in r.stdout and "10.142.0.0/16" in r.stdout
    f2.write_text(yaml.safe_dump(overlapping(global2=None)[1]))
    r = CliRunner().invoke(main, ["plan", "-f", str(f1), "--remote", str(f2), "--node", "c1"])
    assert "cluster2 has no IPv4 global range" in r.stderr


def test_dial_and_local_addresses_are_each_others_inverse() -> None:
    mapping = ((net("10.42.0.0/16"), net("10.142.0.0/16")), (net("fd42:42::/48"), net("fd42:142::/48")))
    for a, image in (("10.42.3.7", "10.142.3.7"), ("fd42:42:0:3::7", "fd42:142:0:3::7"), ("10.9.9.9", "10.9.9.9")):
        assert str(global_ranges.dial_address(ip(a), mapping)) == image
        assert str(global_ranges.local_address(ip(image), mapping)) == a


# --- global services ----------------------------------------------------------------------------


def test_the_slices_for_a_remote_clusters_endpoints_carry_their_global_addresses() -> None:
    """cluster2 publishes its pods' own addresses (10.42.x); cluster1, which sees cluster2's nodes at
    their images in 10.143.0.0/16, serves the Service's endpoints there; an address outside
    cluster2's nodes is refused naming both forms."""
    from meshctl.mesh.services import RecordIn, admit_services, desired_slices, local_services

    c1, c2 = overlapping()
    local = parse_topology(c1)
    remotes, _ = admit_remotes(local, [parse_topology(c2)])
    record = {"cluster": "cluster2", "namespace": "default", "name": "web",
              "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
              "endpoints": [{"addresses": ["10.42.1.7"], "zone": "gpu-a"}, {"addresses": ["10.42.3.9"]},
                            {"addresses": ["10.42.9.9"]}]}
    rec = RecordIn("cluster2", "cluster2", "default", "web", "/meshctl/cluster2/services/default/web", record)
    served, rejected = admit_services([rec], {"cluster2": remotes[0].nodes},
                                      {"cluster2": remotes[0].topology.mesh.global_cidrs})
    assert [str(e.address) for e in served[0].endpoints] == ["10.143.1.7", "10.143.3.9"]
    assert [r.reason for r in rejected] == [
        "/meshctl/cluster2/services/default/web.endpoints[2]: '10.42.9.9' (global 10.143.9.9) is in no pod CIDR "
        "of cluster cluster2's admitted nodes"]
    here = local_services("cluster1", [{"metadata": {"name": "web", "namespace": "default",
                                                     "annotations": {"service.cilium.io/global": "true"}}}], [])
    slices = desired_slices(here, served)
    (only,) = slices.values()
    assert [e["addresses"] for e in only["endpoints"]] == [["10.143.1.7"], ["10.143.3.9"]]
    # Without global ranges (clusters apart) the addresses are served as published.
    c2_plain = copy.deepcopy(CLUSTER2)
    topo2 = parse_topology(c2_plain)
    remotes, _ = admit_remotes(parse_topology(CLUSTER1), [topo2])
    record["endpoints"] = [{"addresses": ["10.43.1.7"]}]
    served, _ = admit_services([RecordIn("cluster2", "cluster2", "default", "web", rec.key, record)],
                               {"cluster2": remotes[0].nodes}, {"cluster2": topo2.mesh.global_cidrs})
    assert [str(e.address) for e in served[0].endpoints] == ["10.43.1.7"]
