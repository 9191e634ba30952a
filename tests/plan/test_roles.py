# SPDX-License-Identifier: Apache-2.0
"""Each role's share of a plan, case by case (a table per role, as in Kilo's pkg/mesh tests): what
a location member, a location leader, one end of a full/cross pair and the holder of the extra
peers contribute, and how `_merge` joins the shares."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from meshctl.mesh.model import Endpoint, PathState
from meshctl.mesh.plan import (
    Encap,
    PeerPlan,
    PlanCache,
    Route,
    Share,
    _extra_peers,
    _location_leader,
    _location_member,
    _location_members,
    _merge,
    _pair,
    _remote_segment,
    _Seat,
    _seat,
)

from .fixtures import KILO_CLASSIC, topo


def net(s: str) -> Any:
    return ipaddress.ip_network(s)


def ip(s: str) -> Any:
    return ipaddress.ip_address(s)


def seat(node: str, state: PathState | None = None, **mesh: Any) -> _Seat:
    return _seat(topo(KILO_CLASSIC, **mesh), node, state or {}, PlanCache())


def how(share: Share, dst: str) -> Route | Encap:
    """The first claim of the share on `dst` (what the merge keeps)."""
    return next(h for d, h in share.claims if d == net(dst))


def peers(shares: list[Share]) -> dict[str, PeerPlan]:
    return {p.name: p for s in shares for p, _ in s.peers}


# --- location granularity (KILO_CLASSIC: a leads aws = {a, b}; gcp = {c}; d has no location) ----


@pytest.mark.parametrize(("state", "dst", "expected"), [
    pytest.param(None, "10.2.3.0/24", Route(net("10.2.3.0/24"), ip("10.0.1.1"), "private"),
                 id="another location's pod CIDR goes raw to the leader"),
    pytest.param(None, "10.4.0.3/32", Route(net("10.4.0.3/32"), ip("10.0.1.1"), "private"),
                 id="every segment's WireGuard IP goes to the leader"),
    pytest.param({"a": frozenset({"direct+vxlan"})}, "10.2.4.0/24",
                 Encap("vxlan", ip("10.0.1.2"), ip("10.0.1.1")),
                 id="on an encapsulated rung to the leader, pod CIDRs are wrapped to it"),
    pytest.param({"a": frozenset({"direct+vxlan"})}, "10.1.0.1/32",
                 Route(net("10.1.0.1/32"), ip("10.0.1.1"), "private"),
                 id="on an encapsulated rung, other addresses still go raw"),
])
def test_location_member(state: PathState | None, dst: str, expected: Route | Encap) -> None:
    share = _location_member(seat("b", state))
    assert how(share, dst) == expected
    assert not share.peers  # a member holds no WireGuard peer
    assert dict(share.paths) == {"c": "via-leader", "d": "via-leader"}


@pytest.mark.parametrize(("state", "expected"), [
    pytest.param(None, Route(net("10.2.2.0/24"), ip("10.0.1.2"), "private"), id="private neighbours go direct"),
    pytest.param({"b": frozenset({"direct+ipip"})}, Encap("ipip", ip("10.0.1.1"), ip("10.0.1.2")),
                 id="a probed ladder takes the cheapest rung that delivers"),
])
def test_location_members(state: PathState | None, expected: Route | Encap) -> None:
    share = _location_members(seat("a", state))
    assert [d for d, _ in share.claims] == [net("10.2.2.0/24")] and how(share, "10.2.2.0/24") == expected


def test_location_leader_has_one_peer_per_other_segment() -> None:
    shares = _location_leader(seat("a"))
    by_name = peers(shares)
    assert sorted(by_name) == ["c", "d"]
    assert set(by_name["c"].allowed_ips) == {net("10.2.3.0/24"), net("10.1.0.1/32"), net("10.4.0.2/32")}
    assert by_name["c"].endpoint == "198.51.100.3:51820" and by_name["c"].kind == "segment"
    c = next(s for s in shares if dict(s.paths).get("c"))
    assert how(c, "10.2.3.0/24") == Route(net("10.2.3.0/24"), ip("10.4.0.2"), "wireguard")
    assert dict(c.paths) == {"c": "tunnel"}


# --- full and cross granularity -----------------------------------------------------------------


@pytest.mark.parametrize(("mesh", "state", "other", "peer_endpoint", "pod", "path"), [
    pytest.param({"granularity": "full", "intra_subnet": "direct"}, None, "b", None,
                 Route(net("10.2.2.0/24"), ip("10.0.1.2"), "private"), "direct",
                 id="a fixed private rung carries the pair: no WireGuard peer"),
    pytest.param({"granularity": "full"}, None, "b", "10.0.1.2:51820",
                 Route(net("10.2.2.0/24"), ip("10.0.1.2"), "private"), "direct",
                 id="auto: WireGuard stands by at the private endpoint"),
    pytest.param({"granularity": "full"}, {"b": frozenset({"direct+vxlan"})}, "b", "203.0.113.2:51820",
                 Encap("vxlan", ip("10.0.1.1"), ip("10.0.1.2")), "direct+vxlan",
                 id="auto: wireguard-private down, the peer is called at its public endpoint"),
    pytest.param({"granularity": "full"}, None, "c", "198.51.100.3:51820",
                 Route(net("10.2.3.0/24"), ip("10.4.0.3"), "wireguard"), "tunnel",
                 id="no private network joins the pair: WireGuard over the public endpoint"),
    pytest.param({"granularity": "cross"}, None, "b", "10.0.1.2:51820",
                 Route(net("10.2.2.0/24"), ip("10.0.1.2"), "private"), "direct",
                 id="cross: a private pair within a location"),
])
def test_pair(mesh: dict[str, Any], state: PathState | None, other: str, peer_endpoint: str | None,
              pod: Route | Encap, path: str) -> None:
    st = seat("a", state, **mesh)
    s = next(s for s in st.segs if s.leader.name == other)
    share = _pair(st, s)
    assert how(share, str(s.leader.pod_cidrs[0])) == pod
    assert dict(share.paths) == {other: path}
    if peer_endpoint is None:
        assert not share.peers
    else:
        [(peer, _)] = share.peers
        assert peer.name == other and peer.endpoint == peer_endpoint


# --- every granularity --------------------------------------------------------------------------


@pytest.mark.parametrize(("node", "names", "via", "dev"), [
    pytest.param("a", ["p1", "p2"], None, "wireguard", id="the leader holds the extra peers"),
    pytest.param("b", [], ip("10.0.1.1"), "private", id="a member routes them to its leader"),
])
def test_extra_peers(node: str, names: list[str], via: Any, dev: str) -> None:
    st = seat(node)
    share = _extra_peers(st, topo(KILO_CLASSIC).peers)
    assert [p.name for p, _ in share.peers] == names
    assert [h for _, h in share.claims] == [Route(net("10.5.0.1/32"), via, dev), Route(net("10.5.0.2/32"), via, dev)]


# --- the merge ----------------------------------------------------------------------------------


def _peer(name: str, endpoint: str) -> PeerPlan:
    return PeerPlan(name, "node", "k", endpoint, (), 0, discovered=True)


ENC = Encap("vxlan", ip("10.0.0.1"), ip("10.0.0.2"))
WG = Route(net("10.9.0.0/24"), ip("10.4.0.2"), "wireguard")


@pytest.mark.parametrize(("shares", "claimed", "paths", "endpoints"), [
    pytest.param([Share(claims=((net("10.9.0.0/24"), ENC),)), Share(claims=((net("10.9.0.0/24"), WG),))],
                 {net("10.9.0.0/24"): ENC}, {}, {}, id="the first claim on a destination wins"),
    pytest.param([Share(paths=(("x", "tunnel"), ("y", "tunnel"))), Share(paths=(("x", "relay"),))],
                 {}, {"x": "relay", "y": "tunnel"}, {}, id="a later path replaces an earlier one"),
    pytest.param([Share(peers=((_peer("x", "10.9.0.7:51820"), ip("10.9.0.7")),), claims=((WG.dst, WG),))],
                 {WG.dst: WG}, {}, {"x": None}, id="an endpoint routed into WireGuard is dropped"),
    pytest.param([Share(peers=((_peer("x", "10.9.0.7:51820"), None),), claims=((WG.dst, WG),))],
                 {WG.dst: WG}, {}, {"x": "10.9.0.7:51820"}, id="a peer not offered for the check keeps it"),
])
def test_merge(shares: list[Share], claimed: dict[Any, Any], paths: dict[str, str],
               endpoints: dict[str, str | None]) -> None:
    got_peers, got_claimed, got_paths, _ = _merge(shares)
    # Claims are kept by the destination's sort key, each with its destination.
    assert dict(got_claimed.values()) == claimed and list(got_paths.items()) == list(paths.items())
    assert {p.name: p.endpoint for p in got_peers} == endpoints


def test_remote_segment_share_is_kept_in_the_plan_cache() -> None:
    st = seat("a")
    r = topo(KILO_CLASSIC).node("c")
    assert r is not None and r.internal_ip is not None
    args = (st.me, (ipaddress.ip_interface("10.5.0.1/16"),), r, (r,), True, (), 0)
    cache = PlanCache()
    first = _remote_segment(args, cache)
    assert _remote_segment(args, cache) is first
    assert _remote_segment(args, PlanCache()) is not first and _remote_segment(args, PlanCache()) == first
    [(peer, inside)] = first.peers
    assert peer.endpoint == str(Endpoint("198.51.100.3", 51820)) and inside is None
