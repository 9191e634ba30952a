# SPDX-License-Identifier: Apache-2.0
"""Nodes behind NAT in the pure core (docs/nat.md): discovered endpoints are parsed like every other
field and used only when two other nodes confirm them; pairs that cannot reach each other are
relayed through a public node, the same way on both ends, and go back to direct once they report
a handshake."""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

import pytest

from meshctl.errors import InputError
from meshctl.mesh.model import Endpoint
from meshctl.mesh.natview import DISCOVERY_QUORUM, nat_view
from meshctl.mesh.plan import plan_node
from meshctl.mesh.records import node_to_record, parse_node, parse_topology

from .fixtures import key

# Two public nodes, two behind cone NATs, two behind symmetric NATs (the lab's nat.yaml): NATed
# nodes publish only their inside address.
NAT_MESH: dict[str, Any] = {
    "mesh": {"granularity": "full"},
    "nodes": [
        {"name": "pa", "endpoint": "198.51.100.10:51820", "pod_cidr": "10.42.1.0/24", "public_key": key(1)},
        {"name": "pb", "endpoint": "198.51.100.11:51820", "pod_cidr": "10.42.2.0/24", "public_key": key(2)},
        {"name": "ca", "endpoint": "192.168.3.2:51820", "pod_cidr": "10.42.3.0/24", "public_key": key(3),
         "persistent_keepalive": 1},
        {"name": "cb", "endpoint": "192.168.4.2:51820", "pod_cidr": "10.42.4.0/24", "public_key": key(4),
         "persistent_keepalive": 1},
        {"name": "sa", "endpoint": "192.168.5.2:51820", "pod_cidr": "10.42.5.0/24", "public_key": key(5),
         "persistent_keepalive": 1},
        {"name": "sb", "endpoint": "192.168.6.2:51820", "pod_cidr": "10.42.6.0/24", "public_key": key(6),
         "persistent_keepalive": 1},
    ],
}
CA_OUT, CB_OUT = "203.0.113.3:20200", "203.0.113.4:20300"


def mesh(reports: dict[str, dict[str, str]] | None = None, unreached: dict[str, list[str]] | None = None,
         granularity: str = "full") -> Any:
    doc = copy.deepcopy(NAT_MESH)
    doc["mesh"]["granularity"] = granularity
    for n in doc["nodes"]:
        if reports and n["name"] in reports:
            n["discovered_endpoints"] = reports[n["name"]]
        if unreached and n["name"] in unreached:
            n["unreached_peers"] = unreached[n["name"]]
        if granularity == "location":
            n["location"] = f"loc-{n['name']}"
    return parse_topology(doc)


# Both public nodes saw both cone nodes at their NAT's outside address; each saw the symmetric
# nodes at a different port (a new mapping per destination).
SETTLED = {
    "pa": {"ca": CA_OUT, "cb": CB_OUT, "sa": "203.0.113.5:40001", "sb": "203.0.113.6:40002"},
    "pb": {"ca": CA_OUT, "cb": CB_OUT, "sa": "203.0.113.5:51234", "sb": "203.0.113.6:37777"},
}


def peer(plan: Any, name: str) -> Any:
    return next(p for p in plan.peers if p.name == name)


def test_record_round_trip_and_bad_values_name_the_field():
    rec = {"name": "pa", "pod_cidr": "10.42.1.0/24", "public_key": key(1),
           "discovered_endpoints": {"ca": CA_OUT}, "unreached_peers": ["sb"]}
    n = parse_node(rec, "nodes[0]")
    assert n.discovered_endpoints == (("ca", Endpoint("203.0.113.3", 20200)),) and n.unreached_peers == ("sb",)
    assert node_to_record(n) == rec
    bad = [
        ({"ca": "gw.example.com:1"}, "nodes[0].discovered_endpoints.ca: 'gw.example.com:1' is not an IP address"),
        ({"ca": "203.0.113.3"}, "nodes[0].discovered_endpoints.ca: '203.0.113.3' is not an endpoint: no port"),
        ({"pa": CA_OUT}, "nodes[0].discovered_endpoints.pa: '203.0.113.3:20200' is the node's own name"),
        ({"Not_A_Name": CA_OUT}, "nodes[0].discovered_endpoints.Not_A_Name: 'Not_A_Name' is not a DNS-1123 name"),
        (["ca"], "nodes[0].discovered_endpoints: ['ca'] is not a mapping"),
    ]
    for value, msg in bad:
        with pytest.raises(InputError) as e:
            parse_node({**rec, "discovered_endpoints": value}, "nodes[0]")
        assert str(e.value).startswith(msg), str(e.value)
    with pytest.raises(InputError, match=r"unreached_peers\[0\]: 'pa' is the node's own name"):
        parse_node({**rec, "unreached_peers": ["pa"]}, "nodes[0]")


def test_one_reporter_cannot_redirect_a_node():
    """A single node (say, with stolen credentials) claims ca is at an address of its choice: no one
    uses it. A second, independent report of the same endpoint confirms it."""
    assert DISCOVERY_QUORUM == 2
    lie = mesh({"pb": {"ca": "198.51.100.66:4444"}})
    assert nat_view(lie.nodes).confirmed == {}
    for me in ("cb", "pa", "sa"):
        assert peer(plan_node(lie, me), "ca").endpoint == "192.168.3.2:51820"  # as ca configured it
    # The liar plus an honest public node that saw ca elsewhere: still no agreement.
    split = mesh({"pa": {"ca": CA_OUT}, "pb": {"ca": "198.51.100.66:4444"}})
    assert nat_view(split.nodes).confirmed == {}
    agreed = mesh({"pa": {"ca": CA_OUT}, "sb": {"ca": CA_OUT}})
    assert nat_view(agreed.nodes).confirmed == {"ca": Endpoint("203.0.113.3", 20200)}
    p = peer(plan_node(agreed, "cb"), "ca")
    assert p.endpoint == CA_OUT and p.discovered and p.roaming


def test_private_and_unknown_claims_are_never_confirmed():
    topo = mesh({"pa": {"ca": "10.9.9.9:51820", "ghost": CA_OUT}, "pb": {"ca": "10.9.9.9:51820", "ghost": CA_OUT}})
    view = nat_view(topo.nodes)
    assert view.confirmed == {}  # a private address says nothing to other networks; ghost is no node
    assert ("pa", "ghost") not in view.handshakes


def test_symmetric_nat_never_reaches_the_quorum():
    view = nat_view(mesh(SETTLED).nodes)
    assert set(view.confirmed) == {"ca", "cb"}
    assert view.confirmed["cb"] == Endpoint("203.0.113.4", 20300)


@pytest.mark.parametrize("granularity", ["full", "location"])
def test_settled_mesh_cone_direct_symmetric_pair_relayed(granularity):
    topo = mesh(SETTLED, granularity=granularity)
    plans = {n.name: plan_node(topo, n.name) for n in topo.nodes}
    # Cone nodes: everyone calls them at the confirmed endpoint; paths are tunnels.
    for me in ("pa", "pb", "cb", "sa", "sb"):
        assert peer(plans[me], "ca").endpoint == CA_OUT
        assert plans[me].paths["ca"] == "tunnel"
    assert plans["ca"].paths["cb"] == "tunnel" and plans["cb"].paths["ca"] == "tunnel"
    # The symmetric pair: relayed through the same public node on both ends, with a reason.
    via, why = plans["sa"].relays["sb"]
    assert plans["sb"].relays["sa"] == (via, why) and via == "pa"
    assert "neither sa nor sb has a reachable endpoint" in why
    assert plans["sa"].paths["sb"] == "relay" and plans["sb"].paths["sa"] == "relay"
    sb_pod, sa_pod = ipaddress.ip_network("10.42.6.0/24"), ipaddress.ip_network("10.42.5.0/24")
    relay_wg = peer(plans["sa"], "pa").allowed_ips
    assert sb_pod in relay_wg and sb_pod not in peer(plans["sa"], "sb").allowed_ips
    route = next(r for r in plans["sa"].routes if r.dst == sb_pod)
    assert route.dev == "wireguard" and route.via in {a.network_address for a in relay_wg if a.prefixlen == 32}
    assert sa_pod in peer(plans["sb"], "pa").allowed_ips
    # The relay's own plan reaches both directly (its routes carry the forwarded traffic).
    assert plans["pa"].paths["sa"] == "tunnel" and plans["pa"].paths["sb"] == "tunnel"
    assert plans["pa"].relays == {}


def test_relay_until_a_handshake_is_reported_then_direct():
    before = plan_node(mesh(SETTLED), "sa")
    assert before.paths["sb"] == "relay"
    after = plan_node(mesh({**SETTLED, "sb": {"sa": "203.0.113.5:3333"}}), "sa")
    assert after.paths["sb"] == "tunnel" and after.relays == {}
    assert ipaddress.ip_network("10.42.6.0/24") in peer(after, "sb").allowed_ips


def test_unreached_report_relays_a_pair_that_could_have_gone_direct():
    """cone<->cone whose NATs filter after all: one end reports the other unreached past the wait."""
    topo = mesh(SETTLED, unreached={"ca": ["cb"]})
    a, b = plan_node(topo, "ca"), plan_node(topo, "cb")
    assert a.paths["cb"] == "relay" and b.paths["ca"] == "relay"
    assert a.relays["cb"] == b.relays["ca"] and "ca reported no handshake with cb" in a.relays["cb"][1]
    # A relay that itself reports one of the pair unreached is passed over.
    pa_lost_cb = {**SETTLED, "pa": {k: v for k, v in SETTLED["pa"].items() if k != "cb"},
                  "sa": {"cb": CB_OUT}}
    topo2 = mesh(pa_lost_cb, unreached={"ca": ["cb"], "pa": ["cb"]})
    assert plan_node(topo2, "ca").relays["cb"][0] == "pb" and plan_node(topo2, "cb").relays["ca"][0] == "pb"


def test_relay_choice_prefers_leaders_and_is_stable():
    doc = copy.deepcopy(NAT_MESH)
    doc["nodes"][1]["leader"] = True  # pb
    for n in doc["nodes"]:
        n["discovered_endpoints"] = SETTLED.get(n["name"])
        if n["discovered_endpoints"] is None:
            del n["discovered_endpoints"]
    topo = parse_topology(doc)
    assert plan_node(topo, "sa").relays["sb"][0] == "pb"
    reordered = parse_topology({**doc, "nodes": list(reversed(doc["nodes"]))})
    assert plan_node(reordered, "sb").relays["sa"][0] == "pb"


def test_an_endpoint_routed_into_the_tunnel_is_left_out():
    """A NATed node's configured endpoint is its inside address, which is also its internal
    address, routed through WireGuard: used as the endpoint it would loop (or, for a relayed pair,
    go through the relay). Left out: the NATed node calls (keepalive) and WireGuard learns."""
    doc = copy.deepcopy(NAT_MESH)
    for n in doc["nodes"][2:]:
        n["internal_ip"] = n["endpoint"].split(":")[0] + "/24"
    topo = parse_topology(doc)
    pa = plan_node(topo, "pa")
    assert peer(pa, "ca").endpoint is None and peer(pa, "pb").endpoint == "198.51.100.11:51820"
    assert any(r.dst == ipaddress.ip_network("192.168.3.2/32") and r.dev == "wireguard" for r in pa.routes)
    for n in doc["nodes"]:
        if n["name"] in SETTLED:
            n["discovered_endpoints"] = SETTLED[n["name"]]
    sa = plan_node(parse_topology(doc), "sa")
    assert sa.paths["sb"] == "relay" and peer(sa, "sb").endpoint is None
    assert peer(sa, "ca").endpoint == CA_OUT  # a confirmed public endpoint stays


def test_a_public_node_is_never_relayed_even_when_reported_unreached():
    """An idle NATed node without keepalive goes quiet; a public node reporting it unreached must
    not send their pair through another public node (a relay cannot reach it better)."""
    topo = mesh(SETTLED, unreached={"pa": ["ca"], "ca": ["pa"]})
    assert plan_node(topo, "pa").paths["ca"] == "tunnel" and plan_node(topo, "ca").paths["pa"] == "tunnel"
    # ... but pa is no longer a relay candidate for pairs with ca.
    pa_lost_ca = {**SETTLED, "pa": {k: v for k, v in SETTLED["pa"].items() if k != "ca"}, "sa": {"ca": CA_OUT}}
    topo2 = mesh(pa_lost_ca, unreached={"pa": ["ca"], "ca": ["cb"]})
    assert plan_node(topo2, "ca").relays["cb"][0] == "pb"
