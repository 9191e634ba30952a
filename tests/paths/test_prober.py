# SPDX-License-Identifier: Apache-2.0
"""The prober over the lab's fabrics, for real: each fabric kind lets exactly the probe kinds
through that its traffic would pass, and a fabric turned into a blackhole is noticed in time."""

from __future__ import annotations

import ipaddress
import time

from meshctl.lab.namespaces import fabric
from meshctl.lab.namespaces.state import LabState, NodeState
from meshctl.mesh.chooser import ProbeTuning
from meshctl.mesh.model import RUNGS
from meshctl.node.prober import Prober, Target, probe_address
from meshctl.setns import in_netns
from tests.waiting import wait_for

from .conftest import FABRICS_DOC, node_of

LADDER_L2 = RUNGS
LADDER_ROUTED = RUNGS[1:]
PAIRS = [("l1", "l2"), ("v1", "v2"), ("v1", "v3"), ("u1", "u2"), ("h1", "h2"), ("k1", "k2")]
TUNING = ProbeTuning(interval=0.2, standby_interval=0.5, hold=2.0)


def _target(n: NodeState, ladder) -> Target:
    pods = [ipaddress.ip_network(c) for c in n.pod_cidrs]
    return Target(n.name, ipaddress.ip_interface(n.internal_ip).ip, probe_address(pods), ladder)


def start_probers(st: LabState, pairs, tuning=TUNING) -> dict[str, Prober]:
    out: dict[str, Prober] = {}
    peers: dict[str, list[tuple[NodeState, tuple]]] = {}
    for a, b in pairs:
        na, nb = node_of(st, a), node_of(st, b)
        ladder = LADDER_L2 if ipaddress.ip_interface(na.internal_ip).network == \
            ipaddress.ip_interface(nb.internal_ip).network and not na.internal_ip.startswith("10.0.") \
            else LADDER_ROUTED
        peers.setdefault(a, []).append((nb, ladder))
        peers.setdefault(b, []).append((na, ladder))
    for name, targets in peers.items():
        n = node_of(st, name)
        p = Prober("priv", ipaddress.ip_interface(n.internal_ip).ip,
                   probe_address([ipaddress.ip_network(c) for c in n.pod_cidrs]), RUNGS[:-1], tuning=tuning)
        in_netns(n.netns, p.start)
        p.set_targets([_target(t, ladder) for t, ladder in targets])
        out[name] = p
    return out


def test_each_fabric_passes_what_it_should(make_lab) -> None:
    st = make_lab(FABRICS_DOC, start_agents=False)
    probers = start_probers(st, PAIRS)
    try:
        want = {"l2": "direct", "v2": "direct+ipip", "v3": "direct+ipip", "u2": "direct+vxlan",
                "h2": "direct+ipip", "k2": "tunnel"}
        src = {"l2": "l1", "v2": "v1", "v3": "v1", "u2": "u1", "h2": "h1", "k2": "k1"}

        def settled() -> bool:
            return all(probers[src[d]].chooser.pairs[d].rung == r and probers[d].chooser.pairs[src[d]].rung == r
                       for d, r in want.items())

        assert wait_for(settled, 10), "every pair settles on the rung its fabric allows"
        for d, r in want.items():
            back = probers[d].chooser.pairs[src[d]].rung
            assert back == r, (d, back)  # both ends agree
        ps = probers["u1"].path_state()["u2"]
        assert ps == frozenset({"direct+vxlan", "wireguard-private"})  # ipip dropped by vpc-udp
        kinds = probers["v1"].status()["pairs"]["v2"]["probes"]
        assert kinds["direct"]["up"] is False  # the source/destination check caught pod addresses
        assert kinds["udp"]["up"] and kinds["udp"]["rtt_ms"] is not None
    finally:
        for p in probers.values():
            p.stop()


def test_blackhole_is_left_fast_and_recovery_waits_for_the_hold(make_lab) -> None:
    st = make_lab(FABRICS_DOC, start_agents=False)
    probers = start_probers(st, [("l1", "l2")])
    try:
        a = probers["l1"]
        assert wait_for(lambda: a.chooser.pairs["l2"].rung == "direct", 10), "l1-l2 on direct"
        t0 = time.monotonic()
        fabric.change(st, "10.30.1.0/24", "blackhole")
        assert wait_for(lambda: a.chooser.pairs["l2"].rung == "tunnel", 5), "l1-l2 falls to the tunnel"
        assert time.monotonic() - t0 < 3.0
        assert a.changes()[-1].reason == "direct stopped delivering"
        t1 = time.monotonic()
        fabric.change(st, "10.30.1.0/24", "l2")
        assert wait_for(lambda: a.chooser.pairs["l2"].rung == "direct", 10), "l1-l2 back on direct"
        assert time.monotonic() - t1 >= TUNING.hold
        assert a.changes()[-1].reason == "direct delivered for the hold time"
    finally:
        for p in probers.values():
            p.stop()
