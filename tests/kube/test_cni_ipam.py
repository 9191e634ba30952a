# SPDX-License-Identifier: Apache-2.0
"""The CNI IPAM readers (backends.kube.cni_ipam): Calico's block affinities and IPAM blocks, and
Cilium's CiliumNodes, turned into each node's pod CIDRs and the records refused."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from meshctl.backends.kube import cni_ipam as C
from meshctl.backends.kube.backend import state_from_objects
from meshctl.mesh.model import Cluster, MeshSettings
from meshctl.node.cni import CNI_MODES

from .helpers import node_obj


def aff(node: str, cidr: str, state: str = "confirmed", deleted: str = "false") -> dict[str, Any]:
    return {"apiVersion": "crd.projectcalico.org/v1", "kind": "BlockAffinity",
            "metadata": {"name": f"{node}-{cidr.replace('.', '-').replace('/', '-')}"},
            "spec": {"node": node, "cidr": cidr, "state": state, "deleted": deleted}}


def blk(cidr: str, affinity: str | None, deleted: bool = False) -> dict[str, Any]:
    return {"apiVersion": "crd.projectcalico.org/v1", "kind": "IPAMBlock",
            "metadata": {"name": cidr.replace(".", "-").replace("/", "-")},
            "spec": {"cidr": cidr, "affinity": affinity, "deleted": deleted, "allocations": [], "unallocated": []}}


def cnode(name: str, cidrs: Any, created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    return {"apiVersion": "cilium.io/v2", "kind": "CiliumNode",
            "metadata": {"name": name, "creationTimestamp": created},
            "spec": {"ipam": {"podCIDRs": cidrs}}}


def nets(*texts: str) -> tuple[Any, ...]:
    return tuple(ipaddress.ip_network(t) for t in texts)


CALICO_CASES = [
    pytest.param([aff("a", "10.42.0.0/26"), aff("a", "10.42.0.64/26"), aff("b", "10.42.1.0/26")],
                 [blk("10.42.0.0/26", "host:a"), blk("10.42.0.64/26", "host:a"), blk("10.42.1.0/26", "host:b")],
                 {"a": nets("10.42.0.0/26", "10.42.0.64/26"), "b": nets("10.42.1.0/26")}, [],
                 id="several-blocks-per-node"),
    pytest.param([aff("a", "10.42.0.0/26", state="pending")], [], {}, [], id="pending-affinity-not-counted"),
    pytest.param([aff("a", "10.42.0.0/26", state="pendingDeletion")], [blk("10.42.0.0/26", None)], {}, [],
                 id="released-block-belongs-to-none"),
    pytest.param([aff("a", "10.42.0.0/26", deleted="true")], [], {}, [], id="deleted-affinity-not-counted"),
    pytest.param([], [blk("10.42.0.0/26", "host:b")], {"b": nets("10.42.0.0/26")}, [],
                 id="block-affinity-alone-counts"),
    pytest.param([aff("a", "10.42.0.0/26"), aff("b", "10.42.0.64/26")],
                 [blk("10.42.0.0/26", "host:b"), blk("10.42.0.64/26", "host:b")],
                 {"b": nets("10.42.0.64/26")}, ["block 10.42.0.0/26"], id="block-claimed-by-two-nodes"),
    pytest.param([aff("a", "10.42.0.0/26"), aff("b", "10.42.0.0/26"), aff("c", "10.42.2.0/26")], [],
                 {"c": nets("10.42.2.0/26")}, ["block 10.42.0.0/26"], id="two-affinities-one-block"),
    pytest.param([aff("a", "10.42.0.0/24"), aff("b", "10.42.0.64/26")], [], {},
                 ["block 10.42.0.0/24, 10.42.0.64/26"], id="overlapping-blocks-of-two-nodes"),
    pytest.param([aff("a", "10.42.0.0/26"), aff("a", "10.42.0.0/24")], [], {"a": nets("10.42.0.0/24")}, [],
                 id="nested-blocks-of-one-node-kept-once"),
    pytest.param([aff("a", "10.42.0.0/33"), aff("b", "10.42.1.0/26")], [blk("10.42.2.0/26", "node:x")],
                 {"b": nets("10.42.1.0/26")}, ["a-10-42-0-0-33", "10-42-2-0-26"], id="malformed-records-alone"),
    pytest.param([aff("a", "fd00:42::/122"), aff("a", "10.42.0.0/26")], [],
                 {"a": nets("10.42.0.0/26", "fd00:42::/122")}, [], id="dual-stack"),
]


@pytest.mark.parametrize(("affinities", "blocks", "want", "rejected"), CALICO_CASES)
def test_calico_pod_cidrs(affinities: list[Any], blocks: list[Any], want: dict[str, Any], rejected: list[str]) -> None:
    got = C.calico_pod_cidrs(affinities, blocks)
    assert dict(got.by_node) == want
    assert [r.name for r in got.rejections] == rejected


def test_calico_double_claim_names_both_nodes_and_sources() -> None:
    got = C.calico_pod_cidrs([aff("a", "10.42.0.0/26")], [blk("10.42.0.0/26", "host:b")])
    (r,) = got.rejections
    assert "claimed by nodes a, b" in r.reason
    assert "blockaffinity a-10-42-0-0-26 says a" in r.reason and "ipamblock 10-42-0-0-26 says b" in r.reason


CILIUM_CASES = [
    pytest.param([cnode("a", ["10.0.0.0/24"]), cnode("b", ["10.0.1.0/24", "10.0.9.0/24"])],
                 {"a": nets("10.0.0.0/24"), "b": nets("10.0.1.0/24", "10.0.9.0/24")}, [], id="cluster-pool"),
    pytest.param([cnode("b", ["10.0.0.0/25"], created="2026-01-02T00:00:00Z"), cnode("a", ["10.0.0.0/24"])],
                 {"a": nets("10.0.0.0/24")}, ["b"], id="overlap-rejects-the-younger-alone"),
    pytest.param([cnode("b", ["10.0.0.0/24"]), cnode("a", ["10.0.0.0/24"])],
                 {"a": nets("10.0.0.0/24")}, ["b"], id="same-age-by-name"),
    pytest.param([cnode("a", []), cnode("b", ["10.0.1.0/24"])], {"b": nets("10.0.1.0/24")}, [],
                 id="no-cidrs-yet"),
    pytest.param([cnode("a", "10.0.0.0/24"), cnode("b", ["10.0.1.1/24"]), cnode("c", ["10.0.2.0/24"])],
                 {"c": nets("10.0.2.0/24")}, ["a", "b"], id="malformed-alone"),
]


@pytest.mark.parametrize(("objs", "want", "rejected"), CILIUM_CASES)
def test_cilium_pod_cidrs(objs: list[Any], want: dict[str, Any], rejected: list[str]) -> None:
    got = C.cilium_pod_cidrs(objs)
    assert dict(got.by_node) == want
    assert [r.name for r in got.rejections] == rejected


def test_cilium_overlap_line_names_field_value_and_owner() -> None:
    got = C.cilium_pod_cidrs([cnode("a", ["10.0.0.0/24"]), cnode("b", ["10.0.0.128/25"])])
    assert got.rejections[0].reason == ("ciliumnode b: spec.ipam.podCIDRs '10.0.0.128/25' overlaps node a's pod "
                                        "CIDR; this CiliumNode is left out")


def test_every_ipam_mode_is_a_cni_mode() -> None:
    assert set(C.CNI_KINDS) <= set(CNI_MODES)
    assert C.pod_cidrs_for("keep", {}) is None


def test_state_takes_pod_cidrs_from_the_ipam_and_counts_its_rejections() -> None:
    objs = [node_obj("a", None, key=1), node_obj("b", "10.99.0.0/24", key=2), node_obj("c", None, key=3)]
    cidrs = C.calico_pod_cidrs([aff("a", "10.42.0.0/26"), aff("c", "10.42.2.0/26")],
                               [blk("10.42.2.0/26", "host:a")])
    st = state_from_objects(objs, [], Cluster(), MeshSettings(), now=0, max_age=1e12, pod_cidrs=cidrs)
    assert {n.name: [str(c) for c in n.pod_cidrs] for n in st.nodes} == {"a": ["10.42.0.0/26"]}
    # b's spec.podCIDR is not Calico's; c's one block is disputed
    assert st.pending == {n: "its CNI's IPAM has given it no pod CIDR yet" for n in ("b", "c")}
    assert [r.name for r in st.rejections] == ["block 10.42.2.0/26"]
