# SPDX-License-Identifier: Apache-2.0
"""Properties of the plan over generated topologies (hypothesis)."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from meshctl.mesh.plan import plan_node
from meshctl.mesh.records import parse_topology
from meshctl.mesh.render import plan_to_json
from meshctl.mesh.segments import segments

from .fixtures import key

SUBNETS = ["10.10.0.{}/24", "10.20.0.{}/24", "10.30.0.{}/24"]


@st.composite
def topologies(draw):
    n = draw(st.integers(2, 10))
    gran = draw(st.sampled_from(["location", "full", "cross"]))
    intra = draw(st.sampled_from(["direct", "wireguard-private", "wireguard"]))
    nodes = []
    for i in range(n):
        node = {"name": f"n{i}", "pod_cidr": f"10.42.{i}.0/24", "public_key": key(i + 1),
                "location": draw(st.sampled_from(["", "l1", "l2", "l3"]))}
        if draw(st.booleans()) or draw(st.booleans()):
            node["internal_ip"] = draw(st.sampled_from(SUBNETS)).format(i + 1)
        if draw(st.booleans()):
            node["endpoint"] = draw(st.sampled_from([f"198.51.100.{i + 1}:51820", f"10.99.0.{i + 1}:51820",
                                                     f"n{i}.example.com:51820"]))
        if draw(st.integers(0, 4)) == 0:
            node["leader"] = True
        if draw(st.integers(0, 4)) == 0:
            node["persistent_keepalive"] = 25
        if draw(st.integers(0, 5)) == 0:
            node["allowed_location_ips"] = [f"192.168.{i}.0/24"]
        nodes.append(node)
    peers = [{"name": f"p{j}", "public_key": key(1000 + j), "allowed_ips": [f"10.5.0.{j + 1}/32"]}
             for j in range(draw(st.integers(0, 2)))]
    return {"mesh": {"granularity": gran, "intra_subnet": intra}, "nodes": nodes, "peers": peers}


@settings(max_examples=150, deadline=None)
@given(topologies(), st.randoms(use_true_random=False))
def test_independent_of_input_order(doc, rnd: random.Random) -> None:
    t1 = parse_topology(doc)
    shuffled = dict(doc, nodes=rnd.sample(doc["nodes"], len(doc["nodes"])),
                    peers=rnd.sample(doc["peers"], len(doc["peers"])))
    t2 = parse_topology(shuffled)
    for n in doc["nodes"]:
        assert plan_to_json(plan_node(t1, n["name"])) == plan_to_json(plan_node(t2, n["name"]))


@settings(max_examples=150, deadline=None)
@given(topologies())
def test_peering_is_symmetric_in_full_and_cross(doc) -> None:
    t = parse_topology(doc)
    if t.mesh.granularity == "location":
        return
    peers = {n.name: {p.name for p in plan_node(t, n.name).peers if p.kind == "node"} for n in t.nodes}
    for a, ps in peers.items():
        for b in ps:
            assert a in peers[b], f"{b} is a peer of {a} but not the other way round"


@settings(max_examples=150, deadline=None)
@given(topologies())
def test_one_route_and_one_entry_per_other_pod_cidr(doc) -> None:
    t = parse_topology(doc)
    for me in t.nodes:
        p = plan_node(t, me.name)
        dsts = [r.dst for r in p.routes]
        assert len(dsts) == len(set(dsts)), "two routes share a destination"
        prefixes = [e.prefix for e in p.fastpath]
        assert len(prefixes) == len(set(prefixes))
        for other in t.nodes:
            if other.name == me.name:
                for c in me.pod_cidrs:
                    assert [e.action for e in p.fastpath if e.prefix == c] == ["local"]
                    assert c not in dsts
                continue
            for c in other.pod_cidrs:
                assert dsts.count(c) == 1
                (entry,) = [e for e in p.fastpath if e.prefix == c]
                (route,) = [r for r in p.routes if r.dst == c]
                assert entry.action == ("direct" if route.dev == "private" else "tunnel")
                if entry.action == "direct":
                    assert entry.nexthop == route.via


@settings(max_examples=150, deadline=None)
@given(topologies())
def test_wireguard_ips_unique_and_inside_subnet(doc) -> None:
    t = parse_topology(doc)
    wgs = [s.wireguard_ip for s in segments(t)]
    assert len(set(wgs)) == len(wgs)
    assert all(w.ip in t.mesh.subnet and w.network == t.mesh.subnet for w in wgs)
    leaders = [plan_node(t, n.name).wireguard_ip for n in t.nodes]
    used = [w for w in leaders if w is not None]
    assert len(set(used)) == len(used)


@settings(max_examples=100, deadline=None)
@given(topologies())
def test_tunnelled_destinations_are_covered_by_a_peer(doc) -> None:
    """Every WireGuard route's destination lies inside some peer's allowed IPs (else WireGuard drops it)."""
    t = parse_topology(doc)
    for me in t.nodes:
        p = plan_node(t, me.name)
        allowed = [a for peer in p.peers for a in peer.allowed_ips]
        for r in p.routes:
            if r.dev == "wireguard":
                assert any(r.dst.subnet_of(a) for a in allowed if a.version == r.dst.version), r
