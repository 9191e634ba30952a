# SPDX-License-Identifier: Apache-2.0
"""The kernel side of `--cni flannel` in one namespace: the route applier replaces flannel's route
only where told to take it over; the flannel applier sees flannel rewrite it, writes flannel's form
back only where the route is missing or meshctl's, and never touches a route of flannel's."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshctl.mesh.plan import Route
from meshctl.node.flannel import FLANNEL_DEV, FlannelApplier, FlannelPlan, FlannelRoute
from meshctl.node.routes import RT_PROTO, RouteApplier
from tests.names import unique
from tests.node.conftest import NodeLab, in_ns

pytestmark = pytest.mark.root

N = ipaddress.ip_network
A = ipaddress.ip_address
OWN = N("10.42.2.0/24")  # a node of this node's location: flannel's
OTHER = N("10.42.3.0/24")  # a node of another location: meshctl's


@pytest.fixture
def node() -> Iterator[tuple[NodeLab, str]]:
    """A node with `pv` (10.20.0.1/24), a stand-in `wg` (a veth) and flannel.1 with flannel's
    onlink routes to OWN and OTHER."""
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    prefix = unique("fl") + "-"
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    lab = NodeLab(prefix, tmp)
    try:
        ns = lab.route_node("n")
        lab.sh(ns, "ip", "link", "add", FLANNEL_DEV, "type", "vxlan", "id", "1", "local", "10.20.0.1", "dev", "pv",
               "dstport", "8472", "nolearning")
        lab.sh(ns, "ip", "link", "set", FLANNEL_DEV, "up")
        lab.sh(ns, "ip", "addr", "add", "10.42.1.0/32", "dev", FLANNEL_DEV)
        for dst in (OWN, OTHER):
            lab.sh(ns, "ip", "route", "add", str(dst), "via", str(dst.network_address), "dev", FLANNEL_DEV, "onlink")
        yield lab, ns
    finally:
        lab.close()
        shutil.rmtree(tmp, ignore_errors=True)


def route(lab: NodeLab, ns: str, dst: ipaddress.IPv4Network) -> dict:
    out = json.loads(lab.sh(ns, "ip", "-j", "route", "show", "exact", str(dst)).stdout)
    return out[0] if out else {}


def test_take_over_replace_again_and_hand_back(node: tuple[NodeLab, str]) -> None:
    lab, ns = node
    own_before = route(lab, ns, OWN)
    ra = in_ns(ns, RouteApplier, "pv", "wg")
    fa = FlannelApplier(str(RT_PROTO))
    plan = [Route(OTHER, A("10.4.0.3"), "wireguard")]
    fp = FlannelPlan((FlannelRoute(OWN, OWN.network_address, FLANNEL_DEV, True),), frozenset({OTHER}))

    # Not taken over: flannel's route is another owner's, skipped.
    assert in_ns(ns, ra.sync, plan).skipped and route(lab, ns, OTHER)["dev"] == FLANNEL_DEV
    assert in_ns(ns, fa.rewritten, fp.takeover) == [OTHER]
    # Taken over: replaced in one call; flannel's own-location route untouched.
    ra.take_over(fp.takeover)
    ra.forget()
    assert in_ns(ns, ra.sync, plan).added == [str(OTHER)]
    assert route(lab, ns, OTHER)["dev"] == "wg" and route(lab, ns, OTHER)["protocol"] == str(RT_PROTO)
    assert in_ns(ns, fa.rewritten, fp.takeover) == []
    assert in_ns(ns, fa.restore, fp) == [] and route(lab, ns, OWN) == own_before

    # flannel's resync writes its route again: seen, and replaced once the route applier reads anew.
    lab.sh(ns, "ip", "route", "replace", str(OTHER), "via", str(OTHER.network_address), "dev", FLANNEL_DEV, "onlink")
    assert in_ns(ns, fa.rewritten, fp.takeover) == [OTHER]
    assert not in_ns(ns, ra.sync, plan), "the memory alone does not see flannel's rewrite"
    ra.forget()
    d = in_ns(ns, ra.sync, plan)
    assert d.added == [str(OTHER)] and not d.skipped
    assert route(lab, ns, OTHER)["dev"] == "wg"

    # OTHER becomes flannel's (a granularity change): our route is handed back in flannel's form.
    back = FlannelPlan(fp.own + (FlannelRoute(OTHER, OTHER.network_address, FLANNEL_DEV, True),), frozenset())
    assert in_ns(ns, fa.restore, back) == [str(OTHER)]
    r = route(lab, ns, OTHER)
    assert (r["gateway"], r["dev"], "onlink" in r["flags"], r.get("protocol", "boot")) == \
        (str(OTHER.network_address), FLANNEL_DEV, True, "boot")
    ra.forget()
    assert not in_ns(ns, ra.sync, []).removed  # nothing of ours left there to remove
    assert route(lab, ns, OTHER)["dev"] == FLANNEL_DEV


def test_restore_leaves_flannels_routes_of_any_form_and_fills_a_missing_one(node: tuple[NodeLab, str]) -> None:
    lab, ns = node
    lab.sh(ns, "ip", "route", "replace", str(OWN), "via", "10.20.0.2", "dev", "pv")  # host-gw form: flannel's
    missing = N("10.42.4.0/24")
    fp = FlannelPlan((FlannelRoute(OWN, OWN.network_address, FLANNEL_DEV, True),
                      FlannelRoute(missing, missing.network_address, FLANNEL_DEV, True)), frozenset())
    assert in_ns(ns, FlannelApplier(str(RT_PROTO)).restore, fp) == [str(missing)]
    assert route(lab, ns, OWN)["gateway"] == "10.20.0.2"
    assert route(lab, ns, missing)["dev"] == FLANNEL_DEV
