# SPDX-License-Identifier: Apache-2.0
"""`--cni flannel`'s decision (node/flannel.py) and its admission (backends/kube/flannel.py): which
nodes flannel carries for a node under each granularity, what the handed-over plan routes itself,
which of flannel's routes the route applier takes over and which it writes back; a flannel
annotation that does not parse rejects its Node alone; an unknown `--cni` is one line, exit 2."""

from __future__ import annotations

import ipaddress
import time
from dataclasses import replace
from typing import Any

import pytest
from click.testing import CliRunner

from meshctl.backends.kube import nodes as A
from meshctl.backends.kube.backend import state_from_objects
from meshctl.backends.kube.flannel import BACKEND_DATA, BACKEND_TYPE, PUBLIC_IP, parse_flannel
from meshctl.cli import main
from meshctl.errors import InputError
from meshctl.mesh import records
from meshctl.mesh.flannel import FlannelLease, carried
from meshctl.mesh.model import Cluster, MeshSettings, Topology
from meshctl.mesh.plan import plan_node
from meshctl.node.flannel import FLANNEL_DEV, FlannelRoute, plan_flannel

from ..plan.fixtures import key

net = ipaddress.ip_network
ip = ipaddress.ip_address

# Four nodes in two locations, each location one private subnet (the flannel lab's shape).
SPEC = [("a1", "a", 1), ("a2", "a", 2), ("b1", "b", 3), ("b2", "b", 4)]


def node(name: str, loc: str, i: int):
    sub = 10 if loc == "a" else 20
    return records.parse_node({"name": name, "pod_cidr": f"10.42.{i}.0/24", "public_key": key(i), "location": loc,
                               "internal_ip": f"192.168.{sub}.{i}/24", "endpoint": f"203.0.113.{i}:51820"},
                              name, default_port=51820)


def topo(granularity: str, intra: str = "auto") -> Topology:
    mesh = MeshSettings(granularity=granularity, intra_subnet=intra)  # type: ignore[arg-type]
    return Topology(Cluster(), mesh, tuple(node(*s) for s in SPEC), ())


LEASES = {n: FlannelLease("vxlan", ip(f"192.168.{10 if loc == 'a' else 20}.{i}"), 1, f"02:00:00:00:00:0{i}")
          for n, loc, i in SPEC}

# (case, granularity, node, the nodes flannel carries for it)
CARRIED: list[tuple[str, str, str, set[str]]] = [
    ("cross: own location", "cross", "a1", {"a2"}),
    ("cross: other location's view", "cross", "b2", {"b1"}),
    ("location: own location", "location", "a2", {"a1"}),
    ("full: every node its own location", "full", "a1", set()),
]


@pytest.mark.parametrize("case,gran,me,want", CARRIED, ids=[c[0] for c in CARRIED])
def test_carried_follows_granularity(case: str, gran: str, me: str, want: set[str]) -> None:
    assert carried(topo(gran), me, gran) == want


@pytest.mark.parametrize("gran", ["cross", "location", "full"])
def test_handed_over_plan_leaves_own_location_to_flannel(gran: str) -> None:
    t = topo(gran)
    plan = plan_node(t, "a1", flannel=True)
    dsts = {r.dst for r in plan.routes}
    fp = plan_flannel(plan, t, LEASES)
    if gran == "full":
        # every node is its own location: meshctl routes a2 too and replaces flannel's route to it
        assert net("10.42.2.0/24") in dsts and plan.paths["a2"] != "flannel"
        assert fp.own == () and net("10.42.2.0/24") in fp.takeover
    else:
        assert net("10.42.2.0/24") not in dsts and plan.paths["a2"] == "flannel"
        assert fp.own == (FlannelRoute(net("10.42.2.0/24"), ip("10.42.2.0"), FLANNEL_DEV, True),)
        assert net("10.42.2.0/24") not in fp.takeover
    # the other location is meshctl's whatever the granularity, and flannel's routes to it replaced
    assert {net("10.42.3.0/24"), net("10.42.4.0/24")} <= dsts <= {r.dst for r in plan_node(t, "a1").routes}
    assert {net("10.42.3.0/24"), net("10.42.4.0/24")} <= fp.takeover
    assert net("10.42.1.0/24") not in fp.takeover  # never its own pod CIDR


def test_cross_routes_match_the_issue() -> None:
    """cross: other location through kilo0 (WireGuard), own location flannel's form, fast path
    entry of the same-subnet pair kept (intra_subnet auto: direct between private neighbours)."""
    t = topo("cross")
    plan = plan_node(t, "a1", flannel=True)
    by_dst = {r.dst: r for r in plan.routes}
    assert by_dst[net("10.42.3.0/24")].dev == "wireguard" and by_dst[net("10.42.4.0/24")].dev == "wireguard"
    fast = {e.prefix: e.rung for e in plan.fastpath}
    assert fast[net("10.42.2.0/24")] == "direct"


def test_encapsulated_entries_of_flannel_nodes_are_dropped() -> None:
    """intra_subnet vxlan: flannel.1 encapsulates already, so no second VXLAN for its nodes."""
    t = topo("cross", "vxlan")
    raw = plan_node(t, "a1")
    assert any(e.prefix == net("10.42.2.0/24") and e.encap is not None for e in raw.fastpath)
    plan = plan_node(t, "a1", flannel=True)
    assert not any(e.prefix == net("10.42.2.0/24") for e in plan.fastpath)
    # the probes' memory of the pair is of rungs: the rung flannel's node would take without it
    assert plan.paths["a2"] == "flannel" and plan.rung_paths["a2"] == raw.paths["a2"] == "direct+vxlan"


def test_host_gw_form() -> None:
    t = topo("cross")
    leases = dict(LEASES, a2=FlannelLease("host-gw", ip("192.168.10.2")))
    fp = plan_flannel(plan_node(t, "a1", flannel=True), t, leases)
    assert fp.own == (FlannelRoute(net("10.42.2.0/24"), ip("192.168.10.2"), None, False),)
    assert fp.own[0].argv() == ["10.42.2.0/24", "via", "192.168.10.2"]


def test_dual_stack_nodes_hand_over_both_families_and_restore_the_lease_family() -> None:
    """Nodes with an IPv4 and an IPv6 pod CIDR: flannel carries both of an own-location node's
    CIDRs (meshctl routes neither), meshctl takes over both of the other location's, and flannel's
    route is written back only for the family its lease annotations describe (IPv4 here)."""
    dual = tuple(replace(n, pod_cidrs=(*n.pod_cidrs, net(f"fd00:42:{i}::/64")))
                 for n, (_, _, i) in zip(topo("cross").nodes, SPEC, strict=True))
    t = Topology(Cluster(), MeshSettings(granularity="cross"), dual, ())
    raw = plan_node(t, "a1")
    assert {net("10.42.2.0/24"), net("fd00:42:2::/64")} <= {r.dst for r in raw.routes}
    plan = plan_node(t, "a1", flannel=True)
    dsts = {r.dst for r in plan.routes}
    assert not dsts & {net("10.42.2.0/24"), net("fd00:42:2::/64")}
    assert {net("10.42.3.0/24"), net("fd00:42:3::/64"), net("10.42.4.0/24"), net("fd00:42:4::/64")} <= dsts
    fp = plan_flannel(plan, t, LEASES)
    assert fp.own == (FlannelRoute(net("10.42.2.0/24"), ip("10.42.2.0"), FLANNEL_DEV, True),)
    assert {net("10.42.3.0/24"), net("fd00:42:3::/64")} <= fp.takeover


def _ann(**kw: str) -> dict[str, str]:
    base = {BACKEND_TYPE: "vxlan", PUBLIC_IP: "192.168.10.1", BACKEND_DATA: '{"VNI":1,"VtepMAC":"0A:00:00:00:00:01"}'}
    base.update({k.replace("_", "-"): v for k, v in kw.items()})
    return base


def test_lease_parses() -> None:
    assert parse_flannel("a1", _ann()) == FlannelLease("vxlan", ip("192.168.10.1"), 1, "0a:00:00:00:00:01")
    assert parse_flannel("a1", {}) is None  # flannel has not annotated it yet
    assert parse_flannel("a1", {BACKEND_TYPE: "host-gw", PUBLIC_IP: "10.0.0.1"}) == \
        FlannelLease("host-gw", ip("10.0.0.1"))


F = "flannel.alpha.coreos.com/"
# (case, annotation changed, value, words of the error)
BAD: list[tuple[str, str, str, str]] = [
    ("backend-data not JSON", BACKEND_DATA, "{VNI:1", F + "backend-data: '{VNI:1' is not JSON"),
    ("VNI not a number", BACKEND_DATA, '{"VNI":"x","VtepMAC":"0a:00:00:00:00:01"}', F + "backend-data.VNI: 'x'"),
    ("VtepMAC malformed", BACKEND_DATA, '{"VNI":1,"VtepMAC":"zz"}', F + "backend-data.VtepMAC: 'zz' is not a MAC"),
    ("public-ip malformed", PUBLIC_IP, "10.0.0.300", F + "public-ip: '10.0.0.300' is not an IP address"),
    ("backend-type malformed", BACKEND_TYPE, "VX LAN", F + "backend-type: 'VX LAN' is not a flannel backend"),
]


@pytest.mark.parametrize("case,ann,value,words", BAD, ids=[c[0] for c in BAD])
def test_bad_annotation_rejects_its_node_alone(case: str, ann: str, value: str, words: str) -> None:
    with pytest.raises(InputError) as e:
        parse_flannel("b1", {**_ann(), ann: value})
    assert f"node b1: {words}" in str(e.value)
    objs = []
    for name, loc, i in SPEC:
        a: dict[str, Any] = {A.PUBLIC_KEY: key(i), A.LAST_SEEN: str(int(time.time())), A.PREFIX + A.LOCATION: loc,
                             **_ann()}
        if name == "b1":
            a[ann] = value
        objs.append({"metadata": {"name": name, "annotations": a}, "spec": {"podCIDR": f"10.42.{i}.0/24"}})
    st = state_from_objects(objs, [], Cluster(), MeshSettings(), now=time.time(), max_age=60, flannel=True)
    assert [n.name for n in st.nodes] == ["a1", "a2", "b2"]
    assert [r.name for r in st.rejections] == ["b1"] and words in st.rejections[0].reason
    assert sorted(st.flannel) == ["a1", "a2", "b2"]
    # without --cni flannel, flannel's annotations are not meshctl's business
    plain = state_from_objects(objs, [], Cluster(), MeshSettings(), now=time.time(), max_age=60)
    assert len(plain.nodes) == 4 and not plain.rejections


FILE = ["--backend", "file", "--file", "/dev/null", "--pod-cidr", "10.42.0.0/24"]


@pytest.mark.parametrize("argv,words", [
    (["--cni", "calico-ish", *FILE], "--cni: 'calico-ish' is not one of keep, install, flannel"),
    (["--cni", "flannel", *FILE],
     "--cni: 'flannel' needs --backend kubernetes"),
], ids=["unknown mode", "flannel without kubernetes"])
def test_bad_cni_is_one_line(argv: list[str], words: str) -> None:
    r = CliRunner().invoke(main, ["agent", "--node", "x", *argv])
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1
