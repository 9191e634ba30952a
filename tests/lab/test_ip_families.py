# SPDX-License-Identifier: Apache-2.0
"""`lab.ip_families` (issue 22): parsing, bad values, the IPv6 addresses the lab derives, and the
shipped dual-stack and IPv6-underlay lab files. Fast: no root, nothing brought up."""

from __future__ import annotations

import copy
import ipaddress
from importlib.resources import files
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.errors import InputError
from meshctl.lab.namespaces import fabric
from meshctl.lab.namespaces.families import pod_cidr6, private6, public6, subnet6
from meshctl.lab.namespaces.spec import load_lab, parse_lab
from meshctl.lab.namespaces.state import ClusterState, EtcdAccess, FabricState, LabState, NodeState, PodState

from .conftest import BASE

LABS = files("meshctl.lab") / "labs"


# BASE's nodes on an IPv6 underlay: each in a /64 of its own.
V6_NODES = [{**n, "internal_ip": f"fd10:0:1:{i + 1}::1/48"} for i, n in enumerate(BASE["nodes"])]


def doc(families: Any = None, nodes: list[dict[str, Any]] | None = None, **lab: Any) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    if families is not None:
        d["lab"]["ip_families"] = families
    if nodes is not None or families == [6]:
        d["nodes"] = copy.deepcopy(nodes if nodes is not None else V6_NODES)
    d["lab"].update(lab)
    return d


@pytest.mark.parametrize(("name", "value", "want"), [
    ("absent: IPv4", None, (4,)),
    ("IPv4", [4], (4,)),
    ("dual stack", [4, 6], (4, 6)),
    ("dual stack written 6 first", [6, 4], (4, 6)),
    ("IPv6 underlay", [6], (6,)),
])
def test_ip_families_parse(name: str, value: Any, want: tuple[int, ...]) -> None:
    assert parse_lab(doc(value)).options.ip_families == want, name


@pytest.mark.parametrize(("name", "value"), [
    ("no such family", [5]),
    ("empty", []),
    ("twice", [6, 6]),
    ("not a list", 4),
    ("a string", "4,6"),
    ("a float", [4.0]),
    ("a boolean", [True]),
    ("three", [4, 6, 4]),
])
def test_bad_ip_families_name_the_field_and_the_value(name: str, value: Any) -> None:
    with pytest.raises(InputError) as e:
        parse_lab(doc(value))
    assert str(e.value) == f"lab.ip_families: {value!r} is not a list of IP families: [4], [6] or [4, 6]", name


def test_bad_ip_families_is_one_line_and_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(doc([5])))
    r = CliRunner().invoke(main, ["lab", "up", "-f", str(f)])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip() == "error: bad.yaml: lab.ip_families: [5] is not a list of IP families: [4], [6] or [4, 6]"


def test_dual_stack_derives_each_nodes_ipv6_pod_cidr_from_its_ipv4_one() -> None:
    spec = parse_lab(doc([4, 6]))
    got = {n.name: [str(c) for c in n.pod_cidrs] for n in spec.clusters[0].nodes}
    assert got == {"a1": ["10.42.1.0/24", "fd42:1:a2a:100::/64"], "a2": ["10.42.2.0/24", "fd42:1:a2a:200::/64"],
                   "b1": ["10.42.3.0/24", "fd42:1:a2a:300::/64"]}
    a1 = spec.clusters[0].nodes[0]
    assert str(spec.private_address6(a1, "default")) == "fd10:a0a:100:b::1/48"


def test_an_ipv6_pod_cidr_the_file_gives_is_kept_and_admitted() -> None:
    nodes = copy.deepcopy(BASE["nodes"])
    nodes[0] = {k: v for k, v in nodes[0].items() if k != "pod_cidr"}
    nodes[0]["pod_cidrs"] = ["10.42.1.0/24", "fd00:99::/64"]
    spec = parse_lab(doc([4, 6], nodes))
    assert [str(c) for c in spec.clusters[0].nodes[0].pod_cidrs] == ["10.42.1.0/24", "fd00:99::/64"]
    nodes[1] = {k: v for k, v in nodes[1].items() if k != "pod_cidr"}
    nodes[1]["pod_cidrs"] = ["10.42.2.0/24", "fd00:99::/64"]  # the same IPv6 CIDR as a1's
    with pytest.raises(InputError, match="fd00:99::/64"):
        parse_lab(doc([4, 6], nodes))


def test_an_ipv4_lab_keeps_its_pods_ipv4_only() -> None:
    assert all(len(n.pod_cidrs) == 1 for n in parse_lab(doc()).clusters[0].nodes)


@pytest.mark.parametrize(("name", "families", "internal_ip", "message"), [
    ("IPv6 address in an IPv4 lab", None, "fd10::11/64",
     "default.nodes.a1.internal_ip: 'fd10::11/64' is IPv6; with lab.ip_families [4] the lab builds its private "
     "networks from IPv4 internal addresses"),
    ("IPv6 address in a dual-stack lab", [4, 6], "fd10::11/64",
     "default.nodes.a1.internal_ip: 'fd10::11/64' is IPv6; with lab.ip_families [4, 6] the lab builds its private "
     "networks from IPv4 internal addresses (and derives the IPv6 ones)"),
    ("IPv4 address in an IPv6 underlay", [6], "10.10.1.11/24",
     "default.nodes.a1.internal_ip: '10.10.1.11/24' is IPv4; with lab.ip_families [6] the lab builds its private "
     "networks from IPv6 internal addresses"),
    ("too many host bits to number /64s", [4, 6], "172.17.1.11/12",
     "nodes.a1.internal_ip: '172.17.1.11/12' has more host bits than an IPv6 /48 numbers by /64 (16): write the "
     "node's IPv6 address, or use a /16 or longer"),
])
def test_internal_address_of_the_wrong_family_is_refused(name: str, families: Any, internal_ip: str,
                                                         message: str) -> None:
    nodes = [{**BASE["nodes"][0], "internal_ip": internal_ip}]
    with pytest.raises(InputError) as e:
        parse_lab(doc(families, nodes))
    assert str(e.value) == message, name


@pytest.mark.parametrize(("name", "lab", "message"), [
    ("kubernetes in an IPv6 underlay", {"backend": "kubernetes"},
     "lab.backend: 'kubernetes' is not available with lab.ip_families [6] (the lab's API server listens on IPv4)"),
    ("an IPv4 NAT", {"nat": {"a1": "cone"}},
     "lab.nat.a1: 'cone' is for IPv4-only and dual-stack nodes and a1 speaks [6] (lab.ip_families [6] has no IPv4)"),
])
def test_lab_features_without_ipv6_are_refused(name: str, lab: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError) as e:
        parse_lab(doc([6], **lab))
    assert str(e.value) == message, name


def test_an_ipv6_hetzner_fabric_routes_each_node_a_64_of_its_own() -> None:
    nodes = [{**n, "internal_ip": ip} for n, ip in zip(BASE["nodes"], ("fd10:0:1:1::1/48", "fd10:0:1:2::1/48",
                                                                        "fd10:0:1:2::2/48"), strict=True)]
    with pytest.raises(InputError) as e:
        parse_lab(doc([6], nodes, fabrics={"fd10:0:1::/48": "hetzner"}))
    assert str(e.value) == ("nodes.b1.internal_ip: 'fd10:0:1:2::2' is in the /64 of a2 (the hetzner fabric "
                            "fd10:0:1::/48 routes each node a /64 of its own)")
    nodes[2]["internal_ip"] = "fd10:0:1::5/48"
    with pytest.raises(InputError, match="is in the /64 of the gateway"):
        parse_lab(doc([6], nodes, fabrics={"fd10:0:1::/48": "hetzner"}))
    nodes[2]["internal_ip"] = "fd10:0:1:3::1/48"
    assert parse_lab(doc([6], nodes, fabrics={"fd10:0:1::/48": "hetzner"})).options.fabrics[0].kind == "hetzner"


def test_derived_addresses_embed_the_ipv4_ones() -> None:
    assert str(pod_cidr6(ipaddress.ip_network("10.42.5.0/24"), 2)) == "fd42:2:a2a:500::/64"
    assert str(private6(ipaddress.ip_interface("10.10.2.12/24"), "x")) == "fd10:a0a:200:c::1/48"
    assert str(subnet6(ipaddress.ip_network("10.10.2.0/24"))) == "fd10:a0a:200::/48"
    assert str(public6(ipaddress.IPv4Address("198.51.100.250"))) == "2001:db8:100::250"


@pytest.mark.parametrize(("name", "families", "v6_pods", "v6_private"), [
    ("dual-stack.yaml", (4, 6), True, False),
    ("ipv6-underlay.yaml", (6,), True, True),
])
def test_shipped_ipv6_lab_files(name: str, families: tuple[int, ...], v6_pods: bool, v6_private: bool) -> None:
    spec = load_lab(str(LABS / name))
    assert spec.options.ip_families == families
    nodes = spec.clusters[0].nodes
    assert [n.name for n in nodes] == ["a1", "a2", "b1", "b2", "c1"]  # the default lab's shape
    assert all({c.version for c in n.pod_cidrs} == {4, 6} for n in nodes) == v6_pods
    assert all(n.internal_ip is not None and (n.internal_ip.version == 6) == v6_private for n in nodes)
    assert all(spec.private_address6(n, "default") is not None for n in nodes)


def _fabric_state(kind: str) -> LabState:
    st = LabState(name="t", prefix="t-", dir="/nonexistent", ip_families=[4, 6])
    st.fabrics = {"10.10.1.0/24": FabricState(0, kind, "n1", 0, "bpriv0", "t-rt0", kind,
                                              subnet6="fd10:a0a:100::/48")}
    c = ClusterState(name="c", id=1, etcd=EtcdAccess(endpoints=[], ca="", cert="", key=""), port=51820)
    c.nodes = [NodeState(name="a1", netns="t-a1", pod_cidrs=["10.42.1.0/24"], public_ip="198.51.100.10",
                         metrics_addr="", dir="", state_dir="", wg_run_dir="", internal_ip="10.10.1.11/24",
                         internal_ip6="fd10:a0a:100:b::1/48", pods=[PodState("t-a1-p0", "10.42.1.2", "pod0")])]
    st.clusters = [c]
    return st


@pytest.mark.parametrize(("name", "kind", "present", "absent"), [
    ("vpc checks node addresses of both families", "vpc",
     ["ether type ip6 ip6 saddr != @nodes6 drop", "ether type ip6 ip6 daddr != @nodes6 drop",
      "ether type ip ip saddr != @nodes drop"], ["icmpv6 } drop"]),
    ("vpc-udp lets ICMPv6 through where it lets ICMP", "vpc-udp", ["meta l4proto != { tcp, udp, icmpv6 } drop"], []),
    ("blackhole answers neighbour solicitations as it answers ARP", "blackhole",
     ["ether type ip6 icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept", "ether type ip6 drop"], []),
    ("l2 filters nothing", "l2", [], ["@nodes6 drop", "ether type ip6 drop"]),
])
def test_fabric_rules_in_both_families(name: str, kind: str, present: list[str], absent: list[str]) -> None:
    st = _fabric_state(kind)
    addresses = fabric.network_addresses(st, "10.10.1.0/24")
    assert addresses == ["10.10.1.1", "10.10.1.11", "fd10:a0a:100::1", "fd10:a0a:100:b::1"]
    rules = fabric.bridge_rules(st.fabrics["10.10.1.0/24"], addresses, ["n0p", "rt0"])
    for line in present:
        assert line in rules, (name, line)
    for line in absent:
        assert line not in rules, (name, line)
    assert "set nodes6 { type ipv6_addr; elements = { fd10:a0a:100::1, fd10:a0a:100:b::1 }; }" in rules


def test_lab_fabric_takes_a_dual_stack_subnet_by_its_ipv6_side(monkeypatch: pytest.MonkeyPatch) -> None:
    st = _fabric_state("l2")
    applied: list[str] = []
    monkeypatch.setattr(fabric, "apply", lambda _st, subnet: applied.append(subnet))
    monkeypatch.setattr(fabric.labstate, "save", lambda _st: None)
    assert fabric.change(st, "fd10:a0a:100::/48", "blackhole").kind == "blackhole"
    assert applied == ["10.10.1.0/24"]  # one entry: both sides change together
    with pytest.raises(InputError, match="fd10:a0a:999::/48' is not a private subnet of lab t"):
        fabric.change(st, "fd10:a0a:999::/48", "l2")


# --- a node's own ip_families (a mixed mesh: IPv4-only, IPv6-only and dual-stack nodes) ----------


def mixed(a1: dict[str, Any] | None = None, **lab: Any) -> dict[str, Any]:
    """BASE dual stack, a1 changed by `a1` (its own ip_families, internal_ip ...)."""
    nodes = copy.deepcopy(BASE["nodes"])
    nodes[0].update(a1 or {})
    return doc(lab.pop("families", [4, 6]), nodes, **lab)


@pytest.mark.parametrize(("name", "a1", "families", "internal6"), [
    ("IPv4-only node: no IPv6 private address", {"ip_families": [4]}, (4,), None),
    ("IPv6-only node: its internal_ip is IPv6", {"ip_families": [6], "internal_ip": "fd10:0:9:1::1/48"}, (6,),
     "fd10:0:9:1::1/48"),
    ("IPv6-only node without a private network", {"ip_families": [6], "internal_ip": None}, (6,), None),
    ("dual stack written: the lab's", {"ip_families": [6, 4]}, (4, 6), "fd10:a0a:100:b::1/48"),
])
def test_a_nodes_own_ip_families(name: str, a1: dict[str, Any], families: tuple[int, ...],
                                 internal6: str | None) -> None:
    spec = parse_lab(mixed(a1))
    node = spec.clusters[0].nodes[0]
    assert spec.options.families_of("a1", "default") == families, name
    assert spec.options.families_of("a2", "default") == (4, 6), name  # the others keep the lab's
    got = spec.private_address6(node, "default")
    assert (str(got) if got is not None else None) == internal6, name
    assert {c.version for c in node.pod_cidrs} == {4, 6}, name  # pods are dual stack on every node


@pytest.mark.parametrize(("name", "a1", "lab", "message"), [
    ("not a family", {"ip_families": [5]}, {},
     "nodes[0].ip_families: [5] is not a list of IP families: [4], [6] or [4, 6]"),
    ("outside the lab's families", {"ip_families": [6]}, {"families": [4]},
     "nodes[0].ip_families: [6] is not within lab.ip_families [4] (a node speaks families of the lab's public "
     "segment; write lab.ip_families: [4, 6] for a mixed mesh)"),
    ("an IPv4 internal address on an IPv6-only node", {"ip_families": [6]}, {},
     "default.nodes.a1.internal_ip: '10.10.1.11/24' is IPv4; with the node's ip_families [6] the lab builds its "
     "private networks from IPv6 internal addresses"),
    ("inside a dual-stack subnet's IPv6 side", {"ip_families": [6], "internal_ip": "fd10:a0a:100:99::1/48"}, {},
     "nodes.a1.internal_ip: 'fd10:a0a:100:99::1/48' is in fd10:a0a:100::/48, the IPv6 side of dual-stack subnet "
     "10.10.1.0/24: give the node an IPv4 internal_ip there, or an IPv6 subnet of its own"),
    ("IPv6-only with the Kubernetes backend", {"ip_families": [6], "internal_ip": "fd10:0:9:1::1/48"},
     {"backend": "kubernetes"}, "nodes.a1.ip_families: [6] is not available with lab.backend kubernetes (the lab's "
     "API server listens on IPv4)"),
    ("an IPv4 NAT on an IPv6-only node", {"ip_families": [6], "internal_ip": "fd10:0:9:1::1/48"},
     {"nat": {"a1": "cone"}},
     "lab.nat.a1: 'cone' is for IPv4-only and dual-stack nodes and a1 speaks [6] (give the node ip_families: [4])"),
    ("an IPv6 firewall on a dual-stack node", {}, {"nat": {"a1": "firewall6"}},
     "lab.nat.a1: 'firewall6' is for IPv6-only nodes and a1 speaks [4, 6] (give the node ip_families: [6])"),
    ("an IPv6 firewall on an IPv4-only node", {"ip_families": [4]}, {"nat": {"a1": "firewall6"}},
     "lab.nat.a1: 'firewall6' is for IPv6-only nodes and a1 speaks [4] (give the node ip_families: [6])"),
    ("an IPv6 firewall in an IPv4 lab", {}, {"families": [4], "nat": {"a1": "firewall6"}},
     "lab.nat.a1: 'firewall6' is for IPv6-only nodes and a1 speaks [4] (lab.ip_families [4] has no IPv6)"),
])
def test_bad_node_ip_families_name_the_field(name: str, a1: dict[str, Any], lab: dict[str, Any],
                                              message: str) -> None:
    with pytest.raises(InputError) as e:
        parse_lab(mixed(a1, **lab))
    assert str(e.value) == message, name


def test_bad_node_ip_families_is_one_line_and_exit_2(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(mixed({"ip_families": [6]}, families=[4])))
    r = CliRunner().invoke(main, ["lab", "up", "-f", str(f)])
    assert r.exit_code == 2, r.output
    assert r.stderr.strip().startswith("error: bad.yaml: nodes[0].ip_families: [6] is not within lab.ip_families [4]")
    assert r.stderr.strip().count("\n") == 0


@pytest.mark.parametrize(("name", "nat", "families"), [
    ("an IPv4 NAT on an IPv4-only node of a dual-stack lab", "cone", [4]),
    ("an IPv6 firewall on an IPv6-only node", "firewall6", [6]),
    ("a home router on a dual-stack node: NAT for IPv4, firewall for IPv6", "symmetric", [4, 6]),
])
def test_nat_kinds_fit_a_node_of_their_family(name: str, nat: str, families: list[int]) -> None:
    a1: dict[str, Any] = {"ip_families": families}
    if families == [6]:
        a1["internal_ip"] = "fd10:0:9:1::1/48"
    assert parse_lab(mixed(a1, nat={"a1": nat})).options.nat_kind("a1") == nat, name
    assert parse_lab(doc([6], nat={"a1": "firewall6"})).options.nat_kind("a1") == "firewall6"


def test_shipped_mixed_families_lab_file() -> None:
    spec = load_lab(str(LABS / "mixed-families.yaml"))
    fams = {n.name: spec.options.families_of(n.name, "default") for n in spec.clusters[0].nodes}
    assert fams == {"d1": (4, 6), "a4": (4,), "b4": (4,), "a6": (6,), "f6": (6,), "g6": (6,), "h": (4, 6)}
    assert spec.options.nat == (("f6", "firewall6"), ("g6", "firewall6"), ("h", "cone"))
    assert len({n.location for n in spec.clusters[0].nodes}) == 7  # each its own location: every node leads
