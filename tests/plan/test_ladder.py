# SPDX-License-Identifier: Apache-2.0
"""The path ladder in the plan: which pairs may use which rung, and what each rung plans."""

from __future__ import annotations

import ipaddress
import json

import yaml
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.mesh.ladder import choose_rung
from meshctl.mesh.plan import Encap, plan_node
from meshctl.mesh.render import plan_to_json

from .fixtures import CROSS_TWO_SUBNETS, KILO_CLASSIC, topo


def net(s: str):
    return ipaddress.ip_network(s)


def ip(s: str):
    return ipaddress.ip_address(s)


def route(plan, dst: str):
    return next(r for r in plan.routes if r.dst == net(dst))


def entry(plan, prefix: str):
    return next(e for e in plan.fastpath if e.prefix == net(prefix))


def test_auto_is_the_default_and_offline_takes_the_cheapest_rung() -> None:
    t = topo(KILO_CLASSIC, granularity="full")
    assert t.mesh.intra_subnet == "auto"
    p = plan_node(t, "a")
    assert p.paths["b"] == "direct"  # private neighbours, every rung assumed to work
    assert route(p, "10.2.2.0/24").via == ip("10.0.1.2") and entry(p, "10.2.2.0/24").encap is None
    # WireGuard stands by with the private endpoint, so either end may fall back at any time.
    peer = next(x for x in p.peers if x.name == "b")
    assert peer.endpoint == "10.0.1.2:51820" and net("10.2.2.0/24") in peer.allowed_ips
    assert p.paths["c"] == "tunnel"  # another location, no private network joins them


def test_path_state_moves_the_pair_down_the_ladder() -> None:
    t = topo(KILO_CLASSIC, granularity="full")
    p = plan_node(t, "a", path_state={"b": frozenset({"direct+vxlan", "wireguard-private"})})
    assert p.paths["b"] == "direct+vxlan"
    enc = Encap("vxlan", ip("10.0.1.1"), ip("10.0.1.2"))
    assert net("10.2.2.0/24") not in {r.dst for r in p.routes}  # no route: the entry carries it
    assert entry(p, "10.2.2.0/24").action == "direct" and entry(p, "10.2.2.0/24").encap == enc
    j = next(e for e in plan_to_json(p)["fastpath"] if e["prefix"] == "10.2.2.0/24")
    assert j == {"prefix": "10.2.2.0/24", "action": "direct", "nexthop": None, "encap": "vxlan",
                 "outer_src": "10.0.1.1", "outer_dst": "10.0.1.2"}

    p = plan_node(t, "a", path_state={"b": frozenset({"wireguard-private"})})
    assert p.paths["b"] == "wireguard-private"
    assert route(p, "10.2.2.0/24").dev == "wireguard"
    assert next(x for x in p.peers if x.name == "b").endpoint == "10.0.1.2:51820"

    p = plan_node(t, "a", path_state={"b": frozenset()})  # nothing private delivers
    assert p.paths["b"] == "tunnel"
    assert next(x for x in p.peers if x.name == "b").endpoint == "203.0.113.2:51820"
    assert route(p, "10.2.2.0/24").dev == "wireguard"


def test_two_subnets_of_one_location_are_joined_but_never_direct() -> None:
    t = topo(CROSS_TWO_SUBNETS, intra_subnet="auto")
    p = plan_node(t, "x1")
    assert p.paths["x2"] == "direct"          # the same subnet
    assert p.paths["x3"] == "direct+ipip"     # the same location, another subnet: no off-link next hop
    assert entry(p, "10.42.3.0/24").encap == Encap("ipip", ip("10.30.0.1"), ip("10.31.0.3"))
    # x3's internal address stays on the private network (the outer packets go there).
    assert net("10.31.0.3/32") not in {r.dst for r in p.routes}
    assert p.paths["y1"] == "tunnel"          # cross: another location
    # The same pair with direct (today's rule): WireGuard, the internal /32 through it.
    d = plan_node(topo(CROSS_TWO_SUBNETS, intra_subnet="direct"), "x1")
    assert d.paths["x3"] == "tunnel" and route(d, "10.31.0.3/32").dev == "wireguard"


def test_private_networks_join_nodes_of_other_locations() -> None:
    t = topo(KILO_CLASSIC, granularity="full", private_networks=["10.0.0.0/8"])
    assert plan_node(t, "a").paths["c"] == "direct+ipip"
    assert plan_node(topo(KILO_CLASSIC, granularity="full"), "a").paths["c"] == "tunnel"
    # cross granularity keeps private pairs inside a location
    assert plan_node(topo(KILO_CLASSIC, granularity="cross", private_networks=["10.0.0.0/8"]), "a").paths["c"] \
        == "tunnel"


def test_fixed_encapsulations_have_no_standby_peer() -> None:
    for mode, kind in (("vxlan", "vxlan"), ("ipip", "ipip")):
        p = plan_node(topo(KILO_CLASSIC, granularity="full", intra_subnet=mode), "a",
                      path_state={"b": frozenset()})  # fixed modes do not read probes
        assert p.paths["b"] == f"direct+{kind}"
        assert entry(p, "10.2.2.0/24").encap.kind == kind
        assert "b" not in {x.name for x in p.peers}


def test_location_members_on_two_subnets_encapsulate_and_so_do_routes_via_the_leader() -> None:
    doc = {"mesh": {"granularity": "location", "intra_subnet": "auto"}, "nodes": [
        {**n, "location": "hel"} for n in CROSS_TWO_SUBNETS["nodes"][:3]] + [CROSS_TWO_SUBNETS["nodes"][3]]}
    doc["nodes"][0]["leader"] = True
    p = plan_node(topo(doc), "x3")
    assert p.paths["x1"] == "direct+ipip" and p.paths["y1"] == "via-leader"
    assert entry(p, "10.42.4.0/24").encap == Encap("ipip", ip("10.31.0.3"), ip("10.30.0.1"))
    p = plan_node(topo(doc), "x3", path_state={"x1": frozenset({"direct+vxlan"})})
    assert entry(p, "10.42.4.0/24").encap.kind == "vxlan"
    # With intra_subnet direct the location keeps today's plan (an off-link next hop).
    doc["mesh"]["intra_subnet"] = "direct"
    assert route(plan_node(topo(doc), "x3"), "10.42.1.0/24").via == ip("10.30.0.1")


def test_choose_rung() -> None:
    ladder = ("direct", "direct+ipip", "direct+vxlan", "wireguard-private", "tunnel")
    assert choose_rung(ladder, None) == "direct"
    assert choose_rung(ladder, frozenset({"direct+vxlan", "wireguard-private"})) == "direct+vxlan"
    assert choose_rung(ladder, frozenset()) == "tunnel"
    assert choose_rung(("direct+ipip", "direct+vxlan"), frozenset()) == "direct+ipip"


def test_cli_path_state_file(tmp_path) -> None:
    doc = json.loads(json.dumps(KILO_CLASSIC))
    doc["mesh"] = {"granularity": "full"}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc))
    (tmp_path / "ps.yaml").write_text("b: [direct+vxlan]\n")
    r = CliRunner().invoke(main, ["plan", "-f", str(tmp_path / "t.yaml"), "--node", "a", "--path-state",
                                  str(tmp_path / "ps.yaml"), "-o", "json"])
    assert r.exit_code == 0, r.stderr
    fp = {e["prefix"]: e for e in json.loads(r.stdout)["fastpath"]}
    assert fp["10.2.2.0/24"]["encap"] == "vxlan" and fp["10.2.2.0/24"]["outer_dst"] == "10.0.1.2"
    r = CliRunner().invoke(main, ["plan", "-f", str(tmp_path / "t.yaml"), "--node", "a"])
    assert "direct+ipip" not in r.stdout and "b     direct" in r.stdout.replace("  ", "  ")
    (tmp_path / "bad.yaml").write_text("b: [direct+gre]\n")
    r = CliRunner().invoke(main, ["plan", "-f", str(tmp_path / "t.yaml"), "--node", "a", "--path-state",
                                  str(tmp_path / "bad.yaml")])
    assert r.exit_code == 2
    assert "bad.yaml: path_state.b[0]: 'direct+gre' is not one of direct, direct+ipip" in r.stderr
    assert "Traceback" not in r.stderr
