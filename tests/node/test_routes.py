# SPDX-License-Identifier: Apache-2.0
"""RouteApplier in a real namespace: only routes with the project's protocol number are added,
changed and removed; a foreign route survives; a missing device is skipped, not raised."""

from __future__ import annotations

import ipaddress
import json

import pytest

from meshctl.lab.rigs import netns
from meshctl.mesh.plan import Route
from meshctl.node.routes import RT_PROTO, RouteApplier
from meshctl.node.rtnl import CHUNK

from .conftest import NodeLab, in_ns

N = ipaddress.ip_network
A = ipaddress.ip_address


@pytest.fixture
def node(lab: NodeLab) -> str:
    """A node with a private NIC `pv` (10.20.0.1/24) and a stand-in `wg` device (a veth: the kernel
    has no WireGuard module, and routes only need a device)."""
    return lab.route_node("rt")


def routes(lab: NodeLab, ns: str) -> dict[str, dict]:
    out = json.loads(lab.sh(ns, "ip", "-j", "route", "show", "table", "main").stdout)
    return {r["dst"]: r for r in out}


def test_add_change_remove_only_own_routes(lab: NodeLab, node: str):
    ns = node
    lab.sh(ns, "ip", "route", "add", "10.99.0.0/24", "via", "10.20.0.99", "proto", "static")  # foreign
    ra = in_ns(ns, RouteApplier, "pv", "wg")
    plan = [Route(N("10.42.2.0/24"), A("10.20.0.2"), "private"),
            Route(N("10.42.3.0/24"), A("10.4.0.3"), "wireguard"),
            Route(N("10.50.0.0/16"), None, "wireguard")]
    diff = in_ns(ns, ra.sync, plan)
    assert diff.added == ["10.42.2.0/24", "10.42.3.0/24", "10.50.0.0/16"] and not diff.changed and not diff.removed
    r = routes(lab, ns)
    assert r["10.42.2.0/24"]["gateway"] == "10.20.0.2" and r["10.42.2.0/24"]["dev"] == "pv"
    assert r["10.42.3.0/24"]["dev"] == "wg" and "onlink" in r["10.42.3.0/24"]["flags"]
    assert r["10.50.0.0/16"]["dev"] == "wg" and "gateway" not in r["10.50.0.0/16"]
    assert r["10.50.0.0/16"]["scope"] == "link"
    assert {str(r[d]["protocol"]) for d in diff.added} == {str(RT_PROTO)}
    assert not in_ns(ns, ra.sync, plan), "a second sync with the same plan changed something"

    # Change one, drop one, keep one: the foreign route is never touched.
    plan2 = [Route(N("10.42.2.0/24"), A("10.4.0.2"), "wireguard"), Route(N("10.42.3.0/24"), A("10.4.0.3"), "wireguard")]
    diff = in_ns(ns, ra.sync, plan2)
    assert (diff.added, diff.changed, diff.removed) == ([], ["10.42.2.0/24"], ["10.50.0.0/16"])
    r = routes(lab, ns)
    assert r["10.42.2.0/24"]["dev"] == "wg" and r["10.42.2.0/24"]["gateway"] == "10.4.0.2"
    assert "10.50.0.0/16" not in r
    assert r["10.99.0.0/24"]["protocol"] == "static"

    # An empty plan removes only ours; flush afterwards finds nothing.
    diff = in_ns(ns, ra.sync, [])
    assert sorted(diff.removed) == ["10.42.2.0/24", "10.42.3.0/24"]
    assert set(routes(lab, ns)) >= {"10.99.0.0/24"}
    assert in_ns(ns, ra.flush) == 0


def test_foreign_route_on_the_same_destination_is_not_replaced(lab: NodeLab, node: str):
    ns = node
    lab.sh(ns, "ip", "route", "add", "10.42.2.0/24", "via", "10.20.0.77", "proto", "static")
    ra = in_ns(ns, RouteApplier, "pv", "wg")
    diff = in_ns(ns, ra.sync, [Route(N("10.42.2.0/24"), A("10.20.0.2"), "private")])
    assert not diff.added and diff.skipped and "another owner" in diff.skipped[0]
    assert routes(lab, ns)["10.42.2.0/24"]["gateway"] == "10.20.0.77"


def test_missing_device_and_unreachable_gateway_are_skipped(lab: NodeLab, node: str):
    ns = node
    ra = in_ns(ns, RouteApplier, "pv", "kilo0")  # no kilo0 here
    plan = [Route(N("10.42.3.0/24"), A("10.4.0.3"), "wireguard"),
            Route(N("10.42.4.0/24"), A("192.0.2.1"), "private"),  # not on pv's subnet
            Route(N("10.42.2.0/24"), A("10.20.0.2"), "private")]
    diff = in_ns(ns, ra.sync, plan)
    assert diff.added == ["10.42.2.0/24"]
    assert len(diff.skipped) == 2 and "kilo0 is missing" in diff.skipped[0]
    none_private = in_ns(ns, RouteApplier, None, "wg")
    diff = in_ns(ns, none_private.sync, [Route(N("10.42.2.0/24"), A("10.20.0.2"), "private")])
    # Our route through a device that is gone is no longer wanted: removed, and said why.
    assert "private device (none) is missing" in diff.skipped[0] and diff.removed == ["10.42.2.0/24"]


def test_flush_removes_exactly_ours_in_both_families(lab: NodeLab, node: str):
    ns = node
    netns.addr(ns, "pv", "fd20::1/64")
    lab.sh(ns, "ip", "route", "add", "10.99.0.0/24", "via", "10.20.0.99")
    ra = in_ns(ns, RouteApplier, "pv", "wg")
    plan = [Route(N("10.42.2.0/24"), A("10.20.0.2"), "private"), Route(N("fd42:2::/64"), A("fd20::2"), "private")]
    assert len(in_ns(ns, ra.sync, plan).added) == 2
    v6 = json.loads(lab.sh(ns, "ip", "-6", "-j", "route", "show").stdout)
    assert any(r["dst"] == "fd42:2::/64" for r in v6)
    assert not in_ns(ns, ra.sync, plan)
    assert in_ns(ns, ra.flush) == 2
    assert "10.99.0.0/24" in routes(lab, ns) and "10.42.2.0/24" not in routes(lab, ns)


def test_many_changes_go_in_one_batch_and_failures_are_still_named(lab: NodeLab, node: str):
    ns = node
    lab.sh(ns, "ip", "route", "add", "10.60.5.0/24", "via", "10.20.0.77", "proto", "static")  # foreign, same dst
    plan = [Route(N(f"10.60.{i}.0/24"), A(f"10.20.0.{i + 2}"), "private") for i in range(40)]
    plan[7] = Route(N("10.60.7.0/24"), A("192.0.2.1"), "private")  # gateway not on the private subnet
    ra = in_ns(ns, RouteApplier, "pv", "wg")
    diff = in_ns(ns, ra.sync, plan)
    assert len(diff.added) == 38 and len(diff.skipped) == 2
    assert any(s.startswith("10.60.5.0/24: a route of another owner") for s in diff.skipped)
    assert any(s.startswith("10.60.7.0/24:") for s in diff.skipped)
    assert routes(lab, ns)["10.60.5.0/24"]["gateway"] == "10.20.0.77"
    moved = [Route(r.dst, A("10.4.0.9"), "wireguard") for r in plan]  # all 40 change at once
    diff = in_ns(ns, ra.sync, moved)
    assert len(diff.changed) == 38 and len(diff.added) == 1  # 10.60.7.0/24 now installable
    assert "onlink" in routes(lab, ns)["10.60.20.0/24"]["flags"]
    assert in_ns(ns, ra.flush) == 39
    assert routes(lab, ns)["10.60.5.0/24"]["protocol"] == "static"


def test_syncs_trust_their_memory_until_forget_or_a_failure(lab: NodeLab, node: str):
    """A sync diffs against what the applier last applied (no dump): a route deleted behind its back
    stays deleted until `forget()` (the agent's periodic full pass) or a failed change."""
    ns = node
    ra = in_ns(ns, RouteApplier, "pv", "wg")
    plan = [Route(N(f"10.42.{i}.0/24"), A("10.20.0.2"), "private") for i in range(2, 6)]
    assert len(in_ns(ns, ra.sync, plan).added) == 4
    lab.sh(ns, "ip", "route", "del", "10.42.3.0/24", "proto", str(RT_PROTO))
    # One route added: just that one; the deleted one is not noticed.
    grown = [*plan, Route(N("10.42.9.0/24"), A("10.20.0.2"), "private")]
    diff = in_ns(ns, ra.sync, grown)
    assert diff.added == ["10.42.9.0/24"] and "10.42.3.0/24" not in routes(lab, ns)
    in_ns(ns, ra.forget)
    diff = in_ns(ns, ra.sync, grown)
    assert diff.added == ["10.42.3.0/24"] and "10.42.3.0/24" in routes(lab, ns)

    # A failed change (a foreign route holds the destination) drops the memory: the next sync reads
    # the kernel again and also repairs what was changed behind the applier's back meanwhile.
    lab.sh(ns, "ip", "route", "add", "10.42.10.0/24", "via", "10.20.0.77", "proto", "static")
    failing = [*grown, Route(N("10.42.10.0/24"), A("10.20.0.2"), "private")]
    assert in_ns(ns, ra.sync, failing).skipped
    lab.sh(ns, "ip", "route", "del", "10.42.4.0/24", "proto", str(RT_PROTO))
    lab.sh(ns, "ip", "route", "del", "10.42.10.0/24", "proto", "static")
    diff = in_ns(ns, ra.sync, failing)
    assert sorted(diff.added) == ["10.42.10.0/24", "10.42.4.0/24"] and not diff.skipped
    # A gateway change is a replace of that one route, found without a dump.
    moved = [Route(r.dst, A("10.20.0.3"), "private") if str(r.dst) == "10.42.5.0/24" else r for r in failing]
    assert in_ns(ns, ra.sync, moved).changed == ["10.42.5.0/24"]
    assert routes(lab, ns)["10.42.5.0/24"]["gateway"] == "10.20.0.3"


def test_a_device_that_loses_its_address_gets_its_routes_back(lab: NodeLab, node: str):
    """The kernel flushes a device's routes, without a netlink notification, when it loses its last
    address (kilo0 does when the node's WireGuard address moves). The applier notices the changed
    device and reads the kernel again instead of trusting its memory."""
    ns = node
    ra = in_ns(ns, RouteApplier, "pv", "wg")
    plan = [Route(N("10.42.3.0/24"), A("10.4.0.3"), "wireguard"), Route(N("10.42.2.0/24"), A("10.20.0.2"), "private")]
    assert len(in_ns(ns, ra.sync, plan).added) == 2
    lab.sh(ns, "ip", "addr", "del", "10.4.0.1/16", "dev", "wg")
    lab.sh(ns, "ip", "addr", "add", "10.4.0.7/16", "dev", "wg")
    assert "10.42.3.0/24" not in routes(lab, ns)  # flushed with the old address
    assert in_ns(ns, ra.sync, plan).added == ["10.42.3.0/24"]
    assert routes(lab, ns)["10.42.3.0/24"]["dev"] == "wg"
    # Down and up again (same addresses): the routes went with it; the up-state is watched too.
    lab.sh(ns, "ip", "link", "set", "pv", "down")
    assert "unreachable" in in_ns(ns, ra.sync, plan).skipped[0] and "10.42.2.0/24" not in routes(lab, ns)
    lab.sh(ns, "ip", "link", "set", "pv", "up")
    assert in_ns(ns, ra.sync, plan).added == ["10.42.2.0/24"]


@pytest.mark.parametrize("by_hand,repaired", [
    ("deleted", ["added"]),
    ("gateway changed", ["changed"]),
], ids=["a route deleted by hand", "a route's gateway changed by hand"])
def test_a_full_pass_repairs_only_what_changed_behind_our_back(lab: NodeLab, node: str, by_hand: str,
                                                              repaired: list[str]):
    """After `forget` (the agent's full pass, every resync interval) the dump is compared with what
    the applier believed: the route changed by hand is put back, the 300 others are untouched."""
    ns = node
    ra = in_ns(ns, RouteApplier, "pv", "wg")
    plan = [Route(N(f"10.{50 + i // 250}.{i % 250}.0/24"), A("10.20.0.2"), "private") for i in range(300)]
    assert len(in_ns(ns, ra.sync, plan).added) == 300
    if by_hand == "deleted":
        lab.sh(ns, "ip", "route", "del", "10.50.7.0/24", "proto", str(RT_PROTO))
    else:
        lab.sh(ns, "ip", "route", "replace", "10.50.7.0/24", "via", "10.20.0.9", "proto", str(RT_PROTO))
    assert not in_ns(ns, ra.sync, plan)  # trusted memory: not noticed yet
    in_ns(ns, ra.forget)
    diff = in_ns(ns, ra.sync, plan)
    got = {k: v for k, v in (("added", diff.added), ("changed", diff.changed), ("removed", diff.removed)) if v}
    assert got == {repaired[0]: ["10.50.7.0/24"]}
    assert routes(lab, ns)["10.50.7.0/24"]["gateway"] == "10.20.0.2"


def test_routes_across_ip_families(lab: NodeLab, node: str):
    """An IPv6 pod CIDR routed via a peer's IPv4 WireGuard address goes on the device alone (WireGuard
    picks the peer by allowed IPs); an IPv4 one via an IPv6 private next hop is installed (RFC 5549);
    an IPv6 one via an IPv4 private next hop cannot be, and is skipped with the reason. Both ways
    of writing (a few requests, and hundreds in chunks) read back as written, from memory and from
    a full read."""
    ns = node
    lab.sh(ns, "ip", "-6", "addr", "add", "fd20::1/64", "dev", "pv", "nodad")
    plan = [Route(N("fd42:1::/64"), A("10.4.0.3"), "wireguard"),
            Route(N("10.42.7.0/24"), A("fd20::2"), "private"),
            Route(N("fd42:2::/64"), A("10.20.0.2"), "private")]
    for extra in (0, 300):  # 300 more routes: past one netlink send (rtnl.CHUNK)
        more = [Route(N(f"10.{60 + i // 250}.{i % 250}.0/24"), A("fd20::2"), "private") for i in range(extra)]
        ra = in_ns(ns, RouteApplier, "pv", "wg")
        diff = in_ns(ns, ra.sync, plan + more)
        assert sorted(diff.added) == sorted(["fd42:1::/64", "10.42.7.0/24", *(str(r.dst) for r in more)])
        assert diff.skipped == ["fd42:2::/64: gateway 10.20.0.2 is of another IP version"], diff.skipped
        v6 = {r["dst"]: r for r in json.loads(lab.sh(ns, "ip", "-j", "-6", "route", "show", "proto",
                                                        str(RT_PROTO)).stdout)}
        assert v6["fd42:1::/64"]["dev"] == "wg" and "gateway" not in v6["fd42:1::/64"]
        r = routes(lab, ns)
        assert r["10.42.7.0/24"]["via"] == {"family": "inet6", "host": "fd20::2"} and r["10.42.7.0/24"]["dev"] == "pv"
        again = in_ns(ns, ra.sync, plan + more)
        assert not again.added and not again.changed, "a second sync rewrote cross-family routes"
        in_ns(ns, ra.forget)  # the kernel's dump read back (RTA_VIA, an IPv6 metric) as the plan's form
        reread = in_ns(ns, ra.sync, plan + more)
        assert not reread.added and not reread.changed and not reread.removed, reread
        assert in_ns(ns, ra.flush) == 2 + extra


def test_hundreds_of_changes_in_chunks_each_failure_named_alone(lab: NodeLab, node: str):
    """More routes than one netlink send carries (rtnl.CHUNK): refusals in different chunks are
    each skipped with the kernel's reason, every other route is in."""
    ns = node
    n = 2 * CHUNK + 88
    lab.sh(ns, "ip", "route", "add", "10.61.144.0/24", "via", "10.20.0.77", "proto", "static")  # foreign, same dst
    plan = [Route(N(f"10.61.{i // 4}.{64 * (i % 4)}/26"), A("10.20.0.2"), "private") for i in range(n)]
    plan[7] = Route(plan[7].dst, A("192.0.2.1"), "private")  # no route to this gateway
    plan[576] = Route(N("10.61.144.0/24"), A("10.20.0.2"), "private")
    ra = in_ns(ns, RouteApplier, "pv", "wg")
    diff = in_ns(ns, ra.sync, plan)
    assert len(diff.added) == n - 2 and len(diff.skipped) == 2
    assert any(s.startswith(f"{plan[7].dst}: ") and "unreachable" in s.lower() for s in diff.skipped), diff.skipped
    assert any(s.startswith("10.61.144.0/24: a route of another owner") for s in diff.skipped)
    have = routes(lab, ns)
    assert all(str(r.dst) in have for i, r in enumerate(plan) if i not in (7, 576))
    assert have["10.61.144.0/24"]["protocol"] == "static"
    assert in_ns(ns, ra.flush) == n - 2


def test_a_route_the_plan_drops_goes_and_an_equal_new_object_stays(lab: NodeLab, node: str):
    """Removals are found from the installed Routes the plan no longer hands out: a destination
    whose Route is a new but equal object, or a new one with another gateway, is not removed."""
    ns = node
    plan = [Route(N(f"10.62.{i}.0/24"), A("10.20.0.2"), "private") for i in range(6)]
    ra = in_ns(ns, RouteApplier, "pv", "wg")
    assert len(in_ns(ns, ra.sync, plan).added) == 6
    after = [plan[0], Route(plan[1].dst, A("10.20.0.2"), "private"), Route(plan[2].dst, A("10.20.0.3"), "private"),
             *plan[4:]]  # 10.62.3.0/24 dropped
    diff = in_ns(ns, ra.sync, after)
    assert diff.removed == ["10.62.3.0/24"] and diff.changed == ["10.62.2.0/24"] and not diff.added
    have = routes(lab, ns)
    assert "10.62.3.0/24" not in have and have["10.62.2.0/24"]["gateway"] == "10.20.0.3"
    assert all(f"10.62.{i}.0/24" in have for i in (0, 1, 4, 5))
