# SPDX-License-Identifier: Apache-2.0
"""Dual stack in the pure core (docs/mesh.md, "Dual stack"): a node's internal addresses,
endpoints and WireGuard addresses in either family or both, the WireGuard subnet per family, and
the plan decided per family: each pod family's rung on that family's private network, WireGuard
endpoints in a family both ends speak, a relay for pairs that share none, allowed IPs, routes and
fast-path entries for both families. Bad input is one line naming the field: exit 2 from
`meshctl plan -f`, the record rejected alone from a backend."""

from __future__ import annotations

import copy
import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest

from meshctl.backends.etcd import EtcdBackend, node_key
from meshctl.backends.kube.backend import state_from_objects
from meshctl.backends.kube.nodes import ENDPOINT, INTERNAL_IP, WIREGUARD_IP, own_annotations
from meshctl.mesh.checks import topology_warnings
from meshctl.mesh.model import Cluster, MeshSettings
from meshctl.mesh.plan import NodePlan, plan_node
from meshctl.mesh.records import node_to_record, parse_node, parse_topology
from meshctl.mesh.render import conf_text, node_conf, node_rows, node_rows_table, plan_to_json, plan_to_table

from .fixtures import key
from .test_cli_plan import run, write
from .test_pod_cidrs import ListedEtcd, etcd_line, etcd_records

# --- a small dual-stack mesh, written as a user would ------------------------------------------

V4_SUBNET, V6_SUBNET = "10.4.0.0/16", "fd04::/64"


def node(name: str, i: int, *, v4: str | None = None, v6: str | None = None, ep4: bool = True, ep6: bool = True,
         **extra: Any) -> dict[str, Any]:
    """Node `name` (number i): pod CIDRs in both families, internal addresses `v4`/`v6` (with
    their prefix; None: none of that family), public endpoints in the families asked for."""
    rec: dict[str, Any] = {"name": name, "pod_cidrs": [f"10.42.{i}.0/24", f"fd42:0:0:{i}::/64"],
                           "public_key": key(i + 1)}
    ips = [a for a in (v4, v6) if a]
    if ips:
        rec["internal_ips"] = ips
    eps = ([f"198.51.100.{i + 1}:51820"] if ep4 else []) + ([f"[2001:db8::{i + 1}]:51820"] if ep6 else [])
    if eps:
        rec["endpoints"] = eps
    rec.update(extra)
    return rec


def mesh_doc(*nodes: dict[str, Any], intra: str = "auto", subnet6: bool = True, **mesh: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"granularity": "full", "intra_subnet": intra, "subnet": V4_SUBNET, **mesh}
    if subnet6:
        m["subnet6"] = V6_SUBNET
    return {"cluster": {"name": "dual", "id": 1}, "mesh": m, "nodes": list(nodes)}


def plan(doc: dict[str, Any], me: str) -> NodePlan:
    return plan_node(parse_topology(copy.deepcopy(doc)), me)


def rung_of(p: NodePlan, other: str) -> dict[int, str]:
    """Each pod family's rung from p's node to `other`."""
    split = dict(p.family_paths.get(other, ()))
    return {4: split.get(4, p.paths[other]), 6: split.get(6, p.paths[other])}


def entries(p: NodePlan, i: int) -> dict[int, tuple[str, str | None, str | None]]:
    """p's fast-path entries for node i's pod CIDRs: family -> (rung, next hop, outer destination)."""
    out: dict[int, tuple[str, str | None, str | None]] = {}
    mine = {ipaddress.ip_network(f"10.42.{i}.0/24"), ipaddress.ip_network(f"fd42:0:0:{i}::/64")}
    for e in p.fastpath:
        if e.prefix in mine:
            out[e.prefix.version] = (e.rung, str(e.nexthop) if e.nexthop else None,
                                     str(e.encap.remote) if e.encap else None)
    return out


def peer(p: NodePlan, name: str) -> Any:
    return next(x for x in p.peers if x.name == name)


# --- the plan per family: (case, doc, the pair, each family's rung, the fast-path entries,
#     the endpoint a's WireGuard peer b is called at; None: no peer) --------------------------

SAME_SUBNET = (node("a", 0, v4="10.0.0.1/24", v6="fd10::1/64"), node("b", 1, v4="10.0.0.2/24", v6="fd10::2/64"))
V6_SHARED = (node("a", 0, v4="10.0.1.1/24", v6="fd10::1/64"), node("b", 1, v4="10.0.2.1/24", v6="fd10::2/64"))
V6_NETWORK = (node("a", 0, v4="10.0.1.1/32", v6="fd20:0:0:1::1/128"),
              node("b", 1, v4="10.0.2.1/32", v6="fd20:0:0:2::1/128"))

PAIRS = [
    pytest.param(mesh_doc(*SAME_SUBNET), {4: "direct", 6: "direct"},
                 {4: ("direct", "10.0.0.2", None), 6: ("direct", "fd10::2", None)}, "10.0.0.2:51820",
                 id="dual-stack pair on one subnet in both families: direct in both (auto)"),
    pytest.param(mesh_doc(*SAME_SUBNET, intra="direct"), {4: "direct", 6: "direct"},
                 {4: ("direct", "10.0.0.2", None), 6: ("direct", "fd10::2", None)}, None,
                 id="dual-stack pair on one subnet in both families: direct in both, no peer (direct)"),
    pytest.param(mesh_doc(*V6_SHARED), {4: "wireguard-private", 6: "direct"},
                 {4: ("tunnel", None, None), 6: ("direct", "fd10::2", None)}, "[fd10::2]:51820",
                 id="only the v6 subnet shared: v6 direct, v4 WireGuard to the private v6 address (auto)"),
    pytest.param(mesh_doc(*V6_SHARED, intra="direct"), {4: "tunnel", 6: "direct"},
                 {4: ("tunnel", None, None), 6: ("direct", "fd10::2", None)}, "198.51.100.2:51820",
                 id="only the v6 subnet shared: v6 direct, v4 tunnelled (direct)"),
    pytest.param(mesh_doc(*V6_NETWORK, intra="ipip", private_networks=["fd20::/48"]),
                 {4: "tunnel", 6: "direct+ipip"},
                 {4: ("tunnel", None, None), 6: ("direct+ipip", None, "fd20:0:0:2::1")}, "198.51.100.2:51820",
                 id="only the v6 private network shared: v6 IP-in-IP with v6 outer addresses, v4 tunnelled (ipip)"),
    pytest.param(mesh_doc(node("a", 0, v4="10.0.1.1/24"), node("b", 1, v4="10.0.2.1/24", v6="fd10::2/64")),
                 {4: "tunnel", 6: "tunnel"}, {4: ("tunnel", None, None), 6: ("tunnel", None, None)},
                 "198.51.100.2:51820", id="no private network shared: tunnel in both"),
]


@pytest.mark.parametrize("doc, rungs, fastpath, endpoint", PAIRS)
def test_each_family_takes_the_rung_of_its_own_private_network(doc: dict[str, Any], rungs: dict[int, str],
                                                               fastpath: dict[int, Any], endpoint: str | None) -> None:
    for me, other, i in (("a", "b", 1), ("b", "a", 0)):
        p = plan(doc, me)
        assert rung_of(p, other) == rungs, me
        want = {f: (e[0], e[1].replace("::2", "::1").replace("10.0.0.2", "10.0.0.1") if e[1] else None,
                    e[2].replace("2::1", "1::1") if e[2] else None) for f, e in fastpath.items()}
        assert entries(p, i) == (fastpath if me == "a" else want), me
        # The fast path and the routes say the same thing: a direct entry has its route on the
        # private NIC (raw) or none (encapsulated), a tunnel entry its route into WireGuard.
        routes = {r.dst: r for r in p.routes}
        for e in p.fastpath:
            if e.action == "tunnel":
                assert routes[e.prefix].dev == "wireguard"
            elif e.action == "direct" and e.encap is None:
                assert routes[e.prefix].dev == "private" and routes[e.prefix].via == e.nexthop
    a = plan(doc, "a")
    assert (peer(a, "b").endpoint if any(x.name == "b" for x in a.peers) else None) == endpoint


def test_a_split_pair_names_each_familys_rung_in_plan_node_list_and_graph(tmp_path: Path) -> None:
    doc = mesh_doc(*V6_SHARED)
    p = plan(doc, "a")
    assert p.paths["b"] == "direct"  # the cheapest: what the prober keeps probing
    assert ["b", "IPv4 wireguard-private, IPv6 direct"] in [ln.split(None, 1) for ln in plan_to_table(p).splitlines()]
    rows = node_rows(parse_topology(copy.deepcopy(doc)), [], p)
    b = next(r for r in rows if r["name"] == "b")
    assert b["family_paths"] == {"IPv4": "wireguard-private", "IPv6": "direct"}
    assert b["internal_ips"] == ["10.0.2.1/24", "fd10::2/64"] and b["internal_ip"] == "10.0.2.1/24"
    assert b["wireguard_ips"] == ["10.4.0.2/16", "fd04::2/64"] and b["wireguard_ip"] == "10.4.0.2/16"
    assert "10.0.2.1/24,fd10::2/64" in node_rows_table(rows)
    r = run("graph", "-f", write(tmp_path, doc), "-o", "text")
    assert r.exit_code == 0 and "a -- b: 1 direct (IPv4 wireguard-private, IPv6 direct)" in r.stdout


# --- WireGuard addresses, allowed IPs and routes in both families ------------------------------

def test_every_node_gets_a_wireguard_address_per_family_and_both_are_allowed_and_routed() -> None:
    doc = mesh_doc(node("a", 0), node("b", 1))
    a = plan(doc, "a")
    assert [str(x) for x in a.wireguard_ips] == ["10.4.0.1/16", "fd04::1/64"]
    assert plan_to_json(a)["wireguard_ips"] == ["10.4.0.1/16", "fd04::1/64"]
    b = peer(a, "b")
    assert [str(x) for x in b.allowed_ips] == ["10.4.0.2/32", "10.42.1.0/24", "fd04::2/128", "fd42:0:0:1::/64"]
    assert {str(r.dst): str(r.via) for r in a.routes} == {"10.42.1.0/24": "10.4.0.2", "fd42:0:0:1::/64": "fd04::2"}
    conf = conf_text(node_conf(parse_topology(copy.deepcopy(doc)), a), "wg-quick")
    assert "\nAddress = 10.4.0.1/16, fd04::1/64\n" in conf
    assert "\nAllowedIPs = 10.4.0.2/32, 10.42.1.0/24, fd04::2/128, fd42:0:0:1::/64\n" in conf


def test_without_subnet6_ipv6_is_routed_into_the_device_and_a_v6_wireguard_address_is_a_warning() -> None:
    """Decided (docs/mesh.md): IPv6 pod CIDRs, internal addresses and endpoints are admitted in a
    mesh without `mesh.subnet6` (WireGuard carries IPv6 inside a tunnel addressed in IPv4): their
    routes name the device and no gateway. A published IPv6 WireGuard address there is never
    rejected (changing the subnets must not reject every record until agents republish): the
    plan does not use it, and says so."""
    doc = mesh_doc(node("a", 0), node("b", 1, wireguard_ips=["10.4.0.2/16", "fd04::2/64"]), subnet6=False)
    a = plan(doc, "a")
    assert a.wireguard_ips == () and str(a.wireguard_ip) == "10.4.0.1/16"
    routes = {str(r.dst): (str(r.via) if r.via else None, r.dev) for r in a.routes}
    assert routes == {"10.42.1.0/24": ("10.4.0.2", "wireguard"), "fd42:0:0:1::/64": (None, "wireguard")}
    assert "nodes[1].wireguard_ips[1]: 'fd04::2/64' is not used: WireGuard addresses follow the segments " \
           "(the mesh has no IPv6 WireGuard subnet (mesh.subnet6))" in topology_warnings(parse_topology(doc))


# --- endpoints in the family both ends speak, and a relay where they share none -----------------

def test_ipv6_only_node_and_dual_stack_node_call_each_other_over_ipv6() -> None:
    doc = mesh_doc(node("dual", 0), node("six", 1, ep4=False))
    assert peer(plan(doc, "dual"), "six").endpoint == "[2001:db8::2]:51820"
    assert peer(plan(doc, "six"), "dual").endpoint == "[2001:db8::1]:51820"  # its v4 endpoint is listed first
    assert topology_warnings(parse_topology(copy.deepcopy(doc))) == []


@pytest.mark.parametrize("relay, path, warning", [
    pytest.param(True, "relay", "nodes four (IPv4) and six (IPv6) share no IP family: relayed through dual "
                 "(path relay)", id="v4-only and v6-only with a dual-stack public node: relayed, warned"),
    pytest.param(False, "tunnel", "nodes four (IPv4) and six (IPv6) share no IP family: no node with a public "
                 "endpoint in both families can relay for them, so they can never reach each other (give one an "
                 "endpoint in the other's family)", id="v4-only and v6-only alone: no relay, warned"),
])
def test_v4_only_and_v6_only_nodes_are_relayed_and_warned(relay: bool, path: str, warning: str) -> None:
    nodes = [node("four", 1, ep6=False), node("six", 2, ep4=False)] + ([node("dual", 0)] if relay else [])
    doc = mesh_doc(*nodes)
    assert topology_warnings(parse_topology(copy.deepcopy(doc))) == [warning]
    for me, other in (("four", "six"), ("six", "four")):
        p = plan(doc, me)
        assert p.paths[other] == path, me
        assert peer(p, other).endpoint is None, me  # never an endpoint the node cannot call
        if relay:
            assert p.relays[other][0] == "dual" and "share no IP family" in p.relays[other][1]
            assert f"fd42:0:0:{2 if me == 'four' else 1}::/64" in map(str, peer(p, "dual").allowed_ips)
    if relay:  # the relay calls each in its own family
        d = plan(doc, "dual")
        assert (peer(d, "four").endpoint, peer(d, "six").endpoint) == ("198.51.100.2:51820", "[2001:db8::3]:51820")


# --- records ------------------------------------------------------------------------------------

@pytest.mark.parametrize("rec", [
    pytest.param({"internal_ips": ["10.0.0.4/24", "fd10::4/64"], "endpoints": ["198.51.100.4:51820",
                  "[2001:db8::4]:51820"], "wireguard_ips": ["10.4.0.4/16", "fd04::4/64"]}, id="both families"),
    pytest.param({"internal_ip": "fd10::4/64", "endpoint": "[2001:db8::4]:51820"}, id="IPv6 only, one-element form"),
    pytest.param({"internal_ip": "10.0.0.4/24", "endpoint": "198.51.100.4:51820", "wireguard_ip": "10.4.0.4/16"},
                 id="IPv4 only, as before dual stack"),
])
def test_records_round_trip_and_the_one_address_keys_are_the_first(rec: dict[str, Any]) -> None:
    full = {"name": "d", "pod_cidr": "10.42.4.0/24", "public_key": key(4), **rec}
    n = parse_node(full, "nodes[0]")
    assert node_to_record(n) == full
    assert str(n.internal_ip) == (rec.get("internal_ip") or rec["internal_ips"][0])
    assert str(n.endpoint) == (rec.get("endpoint") or rec["endpoints"][0])
    if "internal_ip" in rec:  # the one-element list is the same record
        listed = {k: v for k, v in full.items() if k != "internal_ip"} | {"internal_ips": [rec["internal_ip"]]}
        assert parse_node(listed, "nodes[0]") == n


def test_one_address_form_and_replace_keep_node_internal_ip_working() -> None:
    from dataclasses import replace
    n = parse_node({"name": "d", "pod_cidr": "10.42.4.0/24", "public_key": key(4),
                    "internal_ips": ["10.0.0.4/24", "fd10::4/64"]}, "n")
    moved = replace(n, internal_ip=ipaddress.ip_interface("10.0.9.4/24"))
    assert [str(i) for i in moved.internal_ips] == ["10.0.9.4/24", "fd10::4/64"]
    assert replace(n, internal_ip=None).internal_ips == ()
    assert replace(n, location="x").internal_ips == n.internal_ips


# --- bad input: one line naming the field; exit 2 from a file, the record alone from a backend ---

D = {"name": "d", "pod_cidrs": ["10.42.4.0/24", "fd42:0:0:4::/64"], "public_key": key(4)}

BAD = [
    pytest.param({"internal_ip": "10.0.0.4/24", "internal_ips": ["10.0.0.4/24", "fd10::4/64"]}, True,
                 "nodes[3].internal_ip: '10.0.0.4/24' is given with internal_ips: write one of them",
                 id="both internal_ip and internal_ips"),
    pytest.param({"internal_ips": ["10.0.0.4/24", "10.0.9.4/24"]}, True,
                 "nodes[3].internal_ips[1]: '10.0.9.4/24' is a second IPv4 internal address (after 10.0.0.4/24): one "
                 "per family", id="two internal addresses of one family"),
    pytest.param({"internal_ips": ["10.0.0.4/24", "fd10::4/129"]}, True,
                 "nodes[3].internal_ips[1]: 'fd10::4/129' is not an address with a prefix (like 10.10.0.4/24)",
                 id="a /129 internal address"),
    pytest.param({"internal_ips": ["10.0.0.4/24", "fe80::1%eth0/64"]}, True,
                 "nodes[3].internal_ips[1]: 'fe80::1%eth0/64' has a zone index (%...): write the address without it",
                 id="a zone index in an internal address"),
    pytest.param({"endpoints": ["198.51.100.4:51820", "[fe80::1%eth0]:51820"]}, True,
                 "nodes[3].endpoints[1]: '[fe80::1%eth0]:51820' has a zone index (%...): write the address without it",
                 id="a zone index in an endpoint"),
    pytest.param({"endpoint": "198.51.100.4:51820", "endpoints": ["198.51.100.4:51820"]}, True,
                 "nodes[3].endpoint: '198.51.100.4:51820' is given with endpoints: write one of them",
                 id="both endpoint and endpoints"),
    pytest.param({"endpoints": ["[2001:db8::4]:51820", "[2001:db8::5]:51820"]}, True,
                 "nodes[3].endpoints[1]: '[2001:db8::5]:51820' is a second IPv6 endpoint (after [2001:db8::4]:51820): "
                 "one per family", id="two endpoints of one family"),
    pytest.param({"wireguard_ip": "10.4.0.4/16", "wireguard_ips": ["10.4.0.4/16"]}, True,
                 "nodes[3].wireguard_ip: '10.4.0.4/16' is given with wireguard_ips: write one of them",
                 id="both wireguard_ip and wireguard_ips"),
    pytest.param({"internal_ips": ["10.0.0.4/24", "fd04::4/64"]}, True,
                 "nodes[3].internal_ips[1]: 'fd04::4/64' overlaps the WireGuard subnet fd04::/64",
                 id="an IPv6 internal subnet over mesh.subnet6"),
    pytest.param({"endpoints": ["198.51.100.4:51820", "[fd04::9]:51820"]}, True,
                 "nodes[3].endpoints[1]: '[fd04::9]:51820' is an address of the WireGuard subnet fd04::/64",
                 id="an IPv6 endpoint inside mesh.subnet6"),
    pytest.param({"pod_cidrs": ["10.42.4.0/24", "fd04::/96"]}, True,
                 "nodes[3].pod_cidrs[1]: 'fd04::/96' overlaps the WireGuard subnet fd04::/64",
                 id="an IPv6 pod CIDR over mesh.subnet6"),
    pytest.param({"internal_ips": ["10.0.0.4/24", "fd10::1/64"]}, True,
                 "nodes[3].internal_ips[1]: 'fd10::1/64' is already used by a", id="an IPv6 internal address taken"),
    pytest.param({"subnet6": "10.5.0.0/16"}, False,
                 "mesh.subnet6: '10.5.0.0/16' is not an IPv6 network (mesh.subnet6 is the IPv6 WireGuard subnet)",
                 id="an IPv4 network as mesh.subnet6"),
    pytest.param({"subnet": "fd05::/64"}, False,
                 "mesh.subnet6: 'fd04::/64' is given with the IPv6 mesh.subnet fd05::/64: write the IPv4 WireGuard "
                 "subnet in subnet, the IPv6 one in subnet6", id="subnet6 beside an IPv6 mesh.subnet"),
    pytest.param({"subnet6": "fd04::/129"}, False, "mesh.subnet6: 'fd04::/129' is not a CIDR",
                 id="a /129 as mesh.subnet6"),
]


def bad_doc(fields: dict[str, Any], in_node: bool) -> dict[str, Any]:
    doc = mesh_doc(node("a", 0, v4="10.0.0.1/24", v6="fd10::1/64"), node("b", 1), node("c", 2),
                   {**D, **fields} if in_node else {**D})
    if not in_node:
        doc["mesh"].update(fields)
    return doc


@pytest.mark.parametrize("fields, in_node, line", BAD)
def test_file_bad_dual_stack_input_is_one_line_exit_2(tmp_path: Path, fields: dict[str, Any], in_node: bool,
                                                      line: str) -> None:
    r = run("plan", "-f", write(tmp_path, bad_doc(fields, in_node)), "--node", "a")
    assert r.exit_code == 2, r.output
    assert r.stderr == f"error: topo.yaml: {line}\n"
    assert "Traceback" not in r.output


# The file's cases that KILO_CLASSIC's etcd records can hold too: no mesh.subnet6 there, and the
# address the taken case repeats is a node's of the file only.
ETCD_BAD = [p for p in BAD if p.values[1] and "subnet" not in str(p.id) and "taken" not in str(p.id)]


@pytest.mark.parametrize("fields, in_node, line", ETCD_BAD)
def test_etcd_bad_dual_stack_record_is_rejected_alone(fields: dict[str, Any], in_node: bool, line: str) -> None:
    """The same record from etcd (KILO_CLASSIC's mesh: no subnet6, so the cases that need it are
    the file's only): rejected alone, the rest of the mesh goes on."""
    st = etcd_d(fields)
    assert [(r.name, r.reason) for r in st.rejections] == [("d", etcd_line(line))]
    assert [n.name for n in st.nodes] == ["a", "b", "c"]


def etcd_d(fields: dict[str, Any]) -> Any:
    """KILO_CLASSIC's records in etcd with node d's addresses (and pod CIDRs, if given) replaced
    by `fields`: its own endpoint is left out."""
    extra = {"pod_cidr": "10.2.4.0/24", **fields}
    if "pod_cidrs" in extra:
        del extra["pod_cidr"]
    records = etcd_records(extra)
    d = records[node_key("cluster1", "d")]
    if "endpoint" not in fields:
        d.pop("endpoint")
    be = EtcdBackend(ListedEtcd(records), Cluster("cluster1", 1))  # type: ignore[arg-type]
    return be.load_once()


def test_etcd_dual_stack_record_is_admitted_with_both_families() -> None:
    st = etcd_d({"internal_ips": ["10.9.0.4/24", "fd10::4/64"],
                 "endpoints": ["198.51.100.4:51820", "[2001:db8::4]:51820"]})
    assert st.rejections == ()
    d = next(n for n in st.nodes if n.name == "d")
    assert [str(i) for i in d.internal_ips] == ["10.9.0.4/24", "fd10::4/64"] and len(d.endpoints) == 2


# --- the Kubernetes backend: comma-separated annotations, one per family ------------------------

def kube_node(name: str, i: int, ann: dict[str, str]) -> dict[str, Any]:
    from tests.kube.helpers import node_obj
    return node_obj(name, f"10.42.{i}.0/24", key=i, ann=ann)


def test_kube_dual_stack_annotations_round_trip_and_a_bad_one_rejects_the_node_alone() -> None:
    good = {INTERNAL_IP: "10.0.0.2/24,fd10::2/64", ENDPOINT: "198.51.100.2:51820,[2001:db8::2]:51820",
            WIREGUARD_IP: "10.4.0.2/16,fd04::2/64"}
    bad = {INTERNAL_IP: "10.0.0.3/24,10.0.9.3/24"}
    objs = [kube_node("a1", 1, {}), kube_node("a2", 2, good), kube_node("a3", 3, bad)]
    st = state_from_objects(objs, [], Cluster(), MeshSettings(), now=0, max_age=1e12)
    assert [(r.name, r.reason) for r in st.rejections] == [
        ("a3", "node a3: meshctl.io/internal-ip[1]: '10.0.9.3/24' is a second IPv4 address (after 10.0.0.3/24): "
               "one per family")]
    a2 = next(n for n in st.nodes if n.name == "a2")
    assert [str(i) for i in a2.internal_ips] == ["10.0.0.2/24", "fd10::2/64"]
    assert {k: v for k, v in own_annotations(a2, "location", now=0).items() if k in good} == good


def test_cli_plan_json_of_a_dual_stack_file(tmp_path: Path) -> None:
    r = run("plan", "-f", write(tmp_path, mesh_doc(*SAME_SUBNET)), "--node", "a", "-o", "json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["wireguard_ip"] == "10.4.0.1/16" and out["wireguard_ips"] == ["10.4.0.1/16", "fd04::1/64"]
    assert {e["prefix"]: e["nexthop"] for e in out["fastpath"] if e["action"] == "direct"} == {
        "10.42.1.0/24": "10.0.0.2", "fd42:0:0:1::/64": "fd10::2"}


def test_a_host_address_is_warned_about_in_its_own_family_only() -> None:
    """A Hetzner-like node: an IPv4 /32 nothing joins, an IPv6 subnet shared with its neighbour.
    The IPv4 address is warned about (every IPv4 pod path is WireGuard); the IPv6 one is not, and
    the IPv6 pods go direct."""
    doc = mesh_doc(node("a", 0, v4="10.0.1.1/32", v6="fd10::1/64"), node("b", 1, v4="10.0.2.1/32", v6="fd10::2/64"))
    warned = topology_warnings(parse_topology(copy.deepcopy(doc)))
    assert [w.split(":", 1)[0] for w in warned] == ["nodes[0].internal_ips[0]", "nodes[1].internal_ips[0]"]
    assert all("no private network of IPv4 joins" in w and "so every IPv4 path to it is WireGuard" in w for w in warned)
    assert rung_of(plan(doc, "a"), "b") == {4: "wireguard-private", 6: "direct"}


def test_status_rows_carry_both_families_through_json() -> None:
    """`meshctl status` and `node list` from an agent read the rows back from its JSON: the
    dual-stack keys survive, and a single-family row has none of them (its JSON is unchanged)."""
    from meshctl.mesh.render import NodeRow

    doc = mesh_doc(*V6_SHARED, node("c", 2, ep6=False), subnet6=True)
    topo = parse_topology(copy.deepcopy(doc))
    rows = {r["name"]: r for r in node_rows(topo, [], plan(doc, "a"))}
    for name in ("b", "c"):
        assert NodeRow.from_json(rows[name]).to_json() == {**rows[name]}
    assert rows["b"]["endpoints"] == ["198.51.100.2:51820", "[2001:db8::2]:51820"]
    assert "endpoints" not in rows["c"] and "internal_ips" not in rows["c"] and "family_paths" not in rows["c"]
    assert rows["c"]["wireguard_ips"] == ["10.4.0.3/16", "fd04::3/64"]  # the mesh gives it both
