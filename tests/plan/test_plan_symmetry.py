# SPDX-License-Identifier: Apache-2.0
"""Both ends of a pair decide the same (docs/nat.md: relays are a pure function of the records):
over generated topologies, the two leaders of every pair of segments reach each other the same
way (the same rung, or through the same relay), and a packet one end puts into WireGuard is
accepted where it arrives: the receiving peer carries every address the sender sends from."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshctl.mesh.model import IPNetwork, Topology, host_net
from meshctl.mesh.plan import NodePlan, PeerPlan, plan_node
from meshctl.mesh.records import parse_topology
from meshctl.mesh.segments import Segment, segments

from .fixtures import key

# Two nodes of one subnet are private neighbours; 10.30/16 is a routed private network they may list.
SUBNETS = ("10.30.1.{}/24", "10.30.2.{}/24", "10.30.3.{}/32")


@st.composite
def nat_topologies(draw: Any) -> dict[str, Any]:
    """Every granularity and intra_subnet mode; public, private and missing endpoints; leaders;
    routed private networks; unreached reports: the inputs relays and rungs depend on."""
    n = draw(st.integers(2, 6))
    mesh: dict[str, Any] = {
        "granularity": draw(st.sampled_from(["location", "full", "cross"])),
        "intra_subnet": draw(st.sampled_from(["auto", "direct", "ipip", "vxlan", "wireguard-private", "wireguard"])),
    }
    if draw(st.booleans()):
        mesh["private_networks"] = ["10.30.0.0/16"]
    nodes = []
    for i in range(n):
        node: dict[str, Any] = {"name": f"n{i}", "pod_cidr": f"10.42.{i}.0/24", "public_key": key(i + 1),
                                "location": draw(st.sampled_from(["", "l1", "l2"]))}
        internal = draw(st.sampled_from([None, *SUBNETS])) if draw(st.booleans()) else SUBNETS[0]
        if internal is not None:
            node["internal_ip"] = internal.format(i + 1)
        kind = draw(st.sampled_from(["public", "private", "inside", "none"]))
        if kind == "public":
            node["endpoint"] = f"198.51.100.{i + 1}:51820"
        elif kind == "private":
            node["endpoint"] = f"10.99.0.{i + 1}:51820"
        elif kind == "inside" and internal is not None:
            node["endpoint"] = f"{internal.format(i + 1).split('/')[0]}:51820"
        if draw(st.integers(0, 3)) == 0:
            node["leader"] = True
        if draw(st.integers(0, 4)) == 0:
            node["allowed_location_ips"] = [f"192.168.{i}.0/24"]
        if draw(st.integers(0, 4)) == 0:
            node["unreached_peers"] = [f"n{(i + 1) % n}"]
        nodes.append(node)
    return {"mesh": mesh, "nodes": nodes}


def _sources(s: Segment) -> list[IPNetwork]:
    """What a segment's leader sends from into WireGuard: its members' pods and location IPs."""
    return [a for m in s.members for a in (*m.pod_cidrs, *m.allowed_location_ips)]


def _how(p: NodePlan, s: Segment) -> set[tuple[str, str]]:
    """How plan `p` reaches segment s's members: (path, relay or '') for each."""
    return {(p.paths[m.qualified_name], p.relays.get(m.qualified_name, ("", ""))[0]) for m in s.members}


def _peer_for(p: NodePlan, dst: IPNetwork) -> PeerPlan | None:
    """The peer WireGuard hands a packet to `dst` (the longest allowed IP covering it)."""
    best = None
    for peer in p.peers:
        for a in peer.allowed_ips:
            if a.version == dst.version and dst.subnet_of(a) and (best is None or a.prefixlen > best[0]):
                best = (a.prefixlen, peer)
    return best[1] if best else None


def _accepts(p: NodePlan, peer_name: str, sources: list[IPNetwork]) -> list[IPNetwork]:
    """The sources plan `p`'s peer `peer_name` would drop (not inside its allowed IPs)."""
    peer = next((x for x in p.peers if x.name == peer_name), None)
    allowed = peer.allowed_ips if peer else ()
    return [a for a in sources if not any(a.version == b.version and a.subnet_of(b) for b in allowed)]


def _tunnelled(p: NodePlan, dst: IPNetwork) -> bool:
    return any(e.prefix == dst and e.action == "tunnel" for e in p.fastpath)


def check_pair(t: Topology, plans: dict[str, NodePlan], s: Segment, r: Segment) -> None:
    """Segment s's leader towards segment r's: the same decision at both ends, and every packet it
    tunnels to r's pods accepted by the peer it reaches (r's leader, or the relay and then r)."""
    by_peer = {x.peer_name: x for x in segments(t)}
    a, b = plans[s.leader.name], plans[r.leader.name]
    assert _how(a, r) == _how(b, s), f"{s.leader.name} and {r.leader.name} decide differently"
    for pod in (c for m in r.members for c in m.pod_cidrs):
        if not _tunnelled(a, pod):
            continue
        first = _peer_for(a, pod)
        assert first is not None, f"{s.leader.name} tunnels {pod} to no peer"
        srcs = _sources(s)
        if first.name == r.peer_name:  # direct: r's leader receives from s's
            assert not _accepts(b, s.peer_name, [*srcs, host_net(s.wireguard_ip)]), \
                f"{r.leader.name}'s peer for {s.leader.name} drops what {s.leader.name} sends"
            continue
        relay = by_peer[first.name]
        c = plans[relay.leader.name]
        assert not _accepts(c, s.peer_name, srcs), f"relay {first.name} drops what {s.leader.name} sends"
        if _tunnelled(c, pod):
            nxt = _peer_for(c, pod)
            assert nxt is not None and nxt.name == r.peer_name, f"relay {first.name} does not forward to {r.peer_name}"
            assert not _accepts(b, first.name, srcs), \
                f"{r.leader.name}'s peer for relay {first.name} drops what {s.leader.name} sends"


def check_symmetric(t: Topology) -> None:
    segs = segments(t)
    plans = {s.leader.name: plan_node(t, s.leader.name) for s in segs}
    for i, s in enumerate(segs):
        for r in segs[i + 1:]:
            check_pair(t, plans, s, r)
            check_pair(t, plans, r, s)


@settings(max_examples=200, deadline=None)
@given(nat_topologies())
def test_both_ends_of_every_pair_decide_the_same(doc: dict[str, Any]) -> None:
    check_symmetric(parse_topology(doc))


def _issue_case(intra: str) -> dict[str, Any]:
    """Full mesh: n1 public and a private neighbour of n2; n2 and n3 (another location) have
    private endpoints only."""
    return {"mesh": {"granularity": "full", "intra_subnet": intra}, "nodes": [
        {"name": "n1", "location": "l1", "internal_ip": "10.10.0.1/24", "endpoint": "198.51.100.1:51820",
         "pod_cidr": "10.42.1.0/24", "public_key": key(1)},
        {"name": "n2", "location": "l1", "internal_ip": "10.10.0.2/24", "endpoint": "10.10.0.2:51820",
         "pod_cidr": "10.42.2.0/24", "public_key": key(2)},
        {"name": "n3", "location": "l2", "internal_ip": "10.20.0.3/24", "endpoint": "10.20.0.3:51820",
         "pod_cidr": "10.42.3.0/24", "public_key": key(3)}]}


@pytest.mark.parametrize(("intra", "how"), [
    pytest.param("direct", "tunnel", id="direct: n1 holds no WireGuard peer for n2, so it relays for neither end"),
    pytest.param("ipip", "tunnel", id="ipip: the same for an encapsulated fixed rung"),
    pytest.param("auto", "relay", id="auto: n1 keeps a WireGuard peer for n2 and relays for both ends"),
    pytest.param("wireguard-private", "relay", id="wireguard-private: n1 relays for both ends"),
    pytest.param("wireguard", "relay", id="wireguard: n1 relays for both ends"),
])
def test_a_relays_private_neighbour_and_the_far_end_agree(intra: str, how: str) -> None:
    t = parse_topology(_issue_case(intra))
    n2, n3 = plan_node(t, "n2"), plan_node(t, "n3")
    assert n2.paths["n3"] == n3.paths["n2"] == how
    assert {k: v[0] for k, v in n2.relays.items()} == ({"n3": "n1"} if how == "relay" else {})
    assert {k: v[0] for k, v in n3.relays.items()} == ({"n2": "n1"} if how == "relay" else {})
    peer = {p.name: p for p in n3.peers}
    carried = peer["n1" if how == "relay" else "n2"].allowed_ips
    assert ipaddress.ip_network("10.42.2.0/24") in carried  # n3 accepts n2's pods where they arrive
    check_symmetric(t)
