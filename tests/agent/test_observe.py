# SPDX-License-Identifier: Apache-2.0
"""What an agent publishes about its NATed peers (agent/observe.py): the endpoint of each fresh
handshake, and peers tried at one planned endpoint past the direct wait without a handshake; a new
planned endpoint is a new attempt with a new wait."""

from __future__ import annotations

import ipaddress
from dataclasses import replace

from meshctl.agent.observe import HandshakeObserver
from meshctl.mesh.model import Endpoint
from meshctl.mesh.plan import NodePlan, PeerPlan
from meshctl.node.wireguard import PeerStatus
from meshctl.node.wireguard.state import HANDSHAKE_FRESH_S
from tests.plan.fixtures import key

WALL = 1_800_000_000.0


def plan(*peers: PeerPlan) -> NodePlan:
    return NodePlan("pa", "full", "pa", None, peers, (), ())


def peer(name: str, i: int, endpoint: str | None, roaming: bool = True, kind: str = "node") -> PeerPlan:
    return PeerPlan(name, kind, key(i), endpoint, (ipaddress.ip_network(f"10.42.{i}.0/24"),), 0,
                    roaming=roaming)  # type: ignore[arg-type]


def live(i: int, endpoint: str | None, handshake: float | None) -> PeerStatus:
    return PeerStatus(key(i), endpoint, (), 0, 0, handshake)


def test_fresh_handshakes_are_discovered_and_silent_peers_unreached_after_the_wait():
    obs = HandshakeObserver(direct_wait=10)
    p = plan(peer("ca", 3, None), peer("sa", 5, None), peer("pb", 2, "198.51.100.11:51820", roaming=False),
             peer("laptop", 9, None, kind="peer"), peer("cluster2/g1", 7, None, kind="segment"))
    state = [live(3, "203.0.113.3:20200", WALL - 5), live(5, None, None), live(2, "198.51.100.11:51820", WALL - 1),
             live(9, "203.0.113.9:1", WALL - 1), live(7, "203.0.113.7:1", WALL - 1)]
    # Only roaming node peers of this cluster are reported (pb has a public endpoint of its own).
    assert obs.observe(p, state, now=0, wall=WALL) == ((("ca", Endpoint("203.0.113.3", 20200)),), ())
    assert obs.observe(p, state, now=9.9, wall=WALL)[1] == ()
    assert obs.observe(p, state, now=10, wall=WALL)[1] == ("sa",)
    # A stale handshake is no discovery: ca goes unreached too (it was tried long enough).
    stale = [replace(state[0], last_handshake=WALL - HANDSHAKE_FRESH_S - 1), *state[1:]]
    assert obs.observe(p, stale, now=11, wall=WALL) == ((), ("ca", "sa"))
    # sa is planned at a newly confirmed endpoint: a new attempt, a new wait.
    p2 = plan(peer("ca", 3, None), peer("sa", 5, "203.0.113.5:40000"))
    assert obs.observe(p2, state, now=12, wall=WALL)[1] == ()
    assert obs.observe(p2, state, now=22, wall=WALL)[1] == ("sa",)
