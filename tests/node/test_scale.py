# SPDX-License-Identifier: Apache-2.0
"""The appliers at 5,000 nodes: a reconcile that changes nothing changes nothing, one node joining
or leaving changes that node alone, and a flush takes everything away. What each costs is
bench/appliers.py's figure (docs/benchmarks.md), not a bound here; the times are printed."""

from __future__ import annotations

import ipaddress
import time

import pytest

from meshctl.mesh.plan import Route
from meshctl.node.masquerade import NatApplier
from meshctl.node.routes import RouteApplier

from .conftest import NodeLab, in_ns

N = ipaddress.ip_network
COUNT = 5000


def _timed(fn, *args):
    t0 = time.monotonic()
    out = fn(*args)
    return out, time.monotonic() - t0


@pytest.mark.slow
def test_routes_and_sets_with_5000_nodes(lab: NodeLab):
    ns = lab.ns("scale")
    lab.sh(ns, "ip", "link", "add", "pv", "type", "veth", "peer", "name", "pvx")
    lab.sh(ns, "ip", "link", "set", "pv", "up")
    lab.sh(ns, "ip", "addr", "add", "10.20.0.1/16", "dev", "pv")
    plan = [Route(N(f"10.{64 + i // 256}.{i % 256}.0/24"), ipaddress.ip_address(f"10.20.{i // 250}.{i % 250 + 2}"),
                  "private") for i in range(COUNT)]
    ra = in_ns(ns, RouteApplier, "pv", "kilo0")
    diff, first = _timed(in_ns, ns, ra.sync, plan)
    assert len(diff.added) == COUNT
    diff, noop = _timed(in_ns, ns, ra.sync, plan)
    assert not diff
    joined = [*plan, Route(N("10.99.0.0/24"), ipaddress.ip_address("10.20.0.9"), "private")]
    diff, one = _timed(in_ns, ns, ra.sync, joined)
    assert diff.added == ["10.99.0.0/24"]

    nat = in_ns(ns, NatApplier, "mndscale")
    mesh = [r.dst for r in joined]
    _, nat_first = _timed(in_ns, ns, nat.sync, [N("10.42.1.0/24")], mesh, ["pv", "kilo0"])
    changed, nat_noop = _timed(in_ns, ns, nat.sync, [N("10.42.1.0/24")], mesh, ["pv", "kilo0"])
    assert not changed
    changed, nat_one = _timed(in_ns, ns, nat.sync, [N("10.42.1.0/24")], mesh[:-1], ["pv", "kilo0"])
    assert changed
    n, flush = _timed(in_ns, ns, ra.flush)
    assert n == COUNT + 1
    in_ns(ns, nat.cleanup)
    print(f"\n{COUNT} routes: first {first:.2f} s, no-op {noop * 1000:.0f} ms, one added {one * 1000:.0f} ms, "
          f"flush {flush:.2f} s; ipset of {COUNT}: first {nat_first:.2f} s, no-op {nat_noop * 1000:.0f} ms, "
          f"one removed {nat_one * 1000:.0f} ms")
