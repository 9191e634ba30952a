# SPDX-License-Identifier: Apache-2.0
"""The prober over the lab's fabrics, for real: each fabric kind lets exactly the probe kinds
through that its traffic would pass, and a fabric turned into a blackhole is noticed in time."""

from __future__ import annotations

import ipaddress
import os
import time

import pytest

from meshctl.lab.namespaces import fabric
from meshctl.lab.namespaces.state import LabState, NodeState
from meshctl.lab.rigs.testbed import FabricTestbed
from meshctl.mesh.chooser import ProbeTuning, ProbeVerdict
from meshctl.mesh.model import RUNGS
from meshctl.node.prober import Prober, Target, probe_address
from meshctl.setns import in_netns
from tests.waiting import WAIT_S, wait_for, wait_until

from .conftest import FABRICS_DOC, node_of

pytestmark = pytest.mark.slow

LADDER_L2 = RUNGS
LADDER_ROUTED = RUNGS[1:]
PAIRS = [("l1", "l2"), ("v1", "v2"), ("v1", "v3"), ("u1", "u2"), ("h1", "h2"), ("k1", "k2")]
TUNING = ProbeTuning(interval=0.2, standby_interval=0.5, hold=2.0)


def _target(n: NodeState, ladder) -> Target:
    pods = [ipaddress.ip_network(c) for c in n.pod_cidrs]
    return Target(n.name, ipaddress.ip_interface(n.internal_ip).ip, probe_address(pods), ladder)


def both_ends(probers: dict[str, Prober], a: str, b: str, kind: str) -> tuple[ProbeVerdict, ProbeVerdict]:
    """`kind`'s verdict at a (of b) and at b (of a). Only one end of a pair times and counts a
    kind's answers: the end that hears the other's probes answers them and postpones its own
    (prober.LISTEN_FACTOR), so which end depends on who probed first."""
    return probers[a].status().pairs[b].probes[kind], probers[b].status().pairs[a].probes[kind]


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

        assert wait_for(settled, WAIT_S), "every pair settles on the rung its fabric allows"
        for d, r in want.items():
            back = probers[d].chooser.pairs[src[d]].rung
            assert back == r, (d, back)  # both ends agree
        ps = probers["u1"].path_state()["u2"]
        assert ps == frozenset({"direct+vxlan", "wireguard-private"})  # ipip dropped by vpc-udp
        kinds = probers["v1"].status().pairs["v2"].probes
        assert kinds["direct"].up is False  # the source/destination check caught pod addresses
        assert kinds["udp"].up
        rtt = wait_for(lambda: next((v.rtt_ms for v in both_ends(probers, "v1", "v2", "udp") if v.rtt_ms), None),
                       WAIT_S)
        assert rtt is not None and rtt > 0, "a timed answer to a udp probe between v1 and v2"
    finally:
        for p in probers.values():
            p.stop()


def test_blackhole_is_left_fast_and_recovery_waits_for_the_hold(make_lab) -> None:
    st = make_lab(FABRICS_DOC, start_agents=False)
    probers = start_probers(st, [("l1", "l2")])
    try:
        a = probers["l1"]
        assert wait_for(lambda: a.chooser.pairs["l2"].rung == "direct", WAIT_S), "l1-l2 on direct"
        t0 = time.monotonic()
        fabric.change(st, "10.30.1.0/24", "blackhole")
        assert wait_for(lambda: a.chooser.pairs["l2"].rung == "tunnel", WAIT_S), "l1-l2 falls to the tunnel"
        left = time.monotonic() - t0
        assert a.changes()[-1].reason == "direct stopped delivering"
        t1 = time.monotonic()
        fabric.change(st, "10.30.1.0/24", "l2")
        assert wait_for(lambda: a.chooser.pairs["l2"].rung == "direct", TUNING.hold + WAIT_S), "l1-l2 back on direct"
        back = time.monotonic() - t1
        print(f"\nblackhole left after {left:.2f} s, direct again {back:.2f} s after it healed (hold {TUNING.hold} s)")
        assert back >= TUNING.hold
        assert a.changes()[-1].reason == "direct delivered for the hold time"
    finally:
        for p in probers.values():
            p.stop()


# --- over an IPv6 underlay -------------------------------------------------------------------

V6_PORT = 51900  # not the agents' port: nothing else on these testbeds answers it


def _v6_probers(tb, pods: int, ladder) -> dict[str, Prober]:
    """A prober on each node of the testbed: private IPv6 addresses, probe addresses of family `pods`."""
    out: dict[str, Prober] = {}
    pod_cidrs = {"a": [ipaddress.ip_network("10.42.1.0/24"), ipaddress.ip_network("fd42:1::/64")],
                 "b": [ipaddress.ip_network("10.42.2.0/24"), ipaddress.ip_network("fd42:2::/64")]}
    for node, other in (("a", "b"), ("b", "a")):
        p = Prober("eth1", ipaddress.ip_address(tb.private(node)), probe_address(pod_cidrs[node], pods), RUNGS[:-1],
                   tuning=TUNING, port=V6_PORT)
        in_netns(tb.ns(node), p.start)
        out[node] = p
        p.set_targets([Target(other, ipaddress.ip_address(tb.private(other)), probe_address(pod_cidrs[other], pods),
                              ladder)])
    return out


@pytest.fixture(scope="module")
def v6_beds():
    """Two testbeds on IPv6-only private networks: an L2 one, and one behind a VPC router whose
    source/destination check drops pod-addressed packets."""
    beds = {}
    try:
        for fabric in ("l2", "vpc"):
            beds[fabric] = FabricTestbed(f"p6{fabric}{os.getpid() % 1000}-", fabric=fabric, underlay=6).up()
        yield beds
    finally:
        for tb in beds.values():
            tb.down()


@pytest.mark.parametrize("pods", [4, 6])
def test_the_prober_speaks_every_kind_over_an_ipv6_underlay(v6_beds, pods) -> None:
    """IPv6 private addresses, IPv4 or IPv6 probe addresses: on L2 every kind is answered (direct:
    a pod-addressed frame to the MAC of the peer's IPv6 neighbour entry; udp: VXLAN-framed inside
    UDP over IPv6; ipip: next header 4 or 41); behind the VPC the source/destination check drops
    direct, and the node-addressed kinds pass."""
    want = {"l2": {"direct": True, "udp": True, "ipip": True}, "vpc": {"direct": False, "udp": True, "ipip": True}}
    for kind, tb in v6_beds.items():
        _probe_v6_bed(tb, pods, want[kind], "direct" if kind == "l2" else "direct+ipip")


def _probe_v6_bed(tb, pods: int, want: dict[str, bool], rung: str) -> None:
    """Probers on both nodes: each kind's verdict as `want` says, both ends on `rung`."""
    probers = _v6_probers(tb, pods, RUNGS)
    try:
        def kinds(node: str, peer: str) -> dict:
            return probers[node].status().pairs[peer].probes

        def settled() -> bool:
            return all(kinds(n, o)[k].up is up for n, o in (("a", "b"), ("b", "a")) for k, up in want.items())

        assert wait_for(settled, WAIT_S), (tb.fabric, kinds("a", "b"), kinds("b", "a"))
        def answered(k: str) -> bool:
            return sum(v.answered or 0 for v in both_ends(probers, "a", "b", k)) > 0

        for k, up in want.items():
            seen = wait_for(lambda k=k: answered(k), WAIT_S) if up else answered(k)
            assert seen is up, (tb.fabric, k, both_ends(probers, "a", "b", k))
        # Each end moves to `rung` on its own verdicts: both within the same bound, not at one instant.
        for n, o in (("a", "b"), ("b", "a")):
            chooser = probers[n].chooser
            assert wait_for(lambda c=chooser, o=o: c.pairs[o].rung == rung, WAIT_S), (n, chooser.pairs[o])
    finally:
        for p in probers.values():
            p.stop()


def test_a_target_of_another_family_is_left_out() -> None:
    p = Prober("eth1", ipaddress.ip_address("fd30:1::1"), ipaddress.ip_address("10.42.1.1"), RUNGS[:-1])
    p.set_targets([Target("v4", ipaddress.ip_address("10.30.1.2"), ipaddress.ip_address("10.42.2.1"), RUNGS),
                   Target("v6pods", ipaddress.ip_address("fd30:1::2"), ipaddress.ip_address("fd42:2::1"), RUNGS),
                   Target("ok", ipaddress.ip_address("fd30:1::2"), ipaddress.ip_address("10.42.2.1"), RUNGS)])
    assert set(p.chooser.pairs) == {"ok"}
    p.stop()


@pytest.mark.parametrize("cidrs,family,want", [
    (["10.42.1.0/24", "fd42:1::/64"], None, "10.42.1.1"),
    (["fd42:1::/64", "10.42.1.0/24"], 6, "fd42:1::1"),
    (["fd42:1::/64"], None, "fd42:1::1"),
    (["fd42:1::/64"], 4, None),
    (["10.42.1.0/31"], None, None),
])
def test_probe_address_per_family(cidrs, family, want) -> None:
    got = probe_address([ipaddress.ip_network(c) for c in cidrs], family)
    assert (str(got) if got else None) == want


def _filter_frames(probe: bytes, internal: bytes, other: bytes, port: int) -> dict[str, tuple[bytes, bool]]:
    """Frames on the private NIC and whether the tap's filter must let them in (IPv4 or IPv6 by
    the addresses' lengths: `probe` the probe address, `internal` the node's private one)."""
    from meshctl.node.prober import ETH, ETH_TYPE, IPIP_PROTO, ipv4, ipv6, pod_packet

    pods, under = (6 if len(probe) == 16 else 4), (6 if len(internal) == 16 else 4)
    src = bytes(len(probe))
    outer_src = bytes(len(internal))

    def eth(version: int, payload: bytes) -> bytes:
        return ETH.pack(b"\x02" * 6, b"\x04" * 6, ETH_TYPE[version]) + payload

    def outer(dst: bytes, proto: int, payload: bytes) -> bytes:
        return (ipv6 if under == 6 else ipv4)(outer_src, dst, proto, payload)

    probe_pkt = pod_packet(src, probe, port, port, b"x" * 40)
    return {
        "direct probe": (eth(pods, probe_pkt), True),
        "direct, another address": (eth(pods, pod_packet(src, other[:len(probe)], port, port, b"x" * 40)), False),
        "direct, another port": (eth(pods, pod_packet(src, probe, port, port + 1, b"x" * 40)), False),
        "ipip probe": (eth(under, outer(internal, IPIP_PROTO[pods], probe_pkt)), True),
        "ipip to another node": (eth(under, outer(other[:len(internal)], IPIP_PROTO[pods], probe_pkt)), False),
        "VXLAN traffic to the node": (eth(under, pod_packet(outer_src, internal, 40000, 4789, b"v" * 60)), False),
        "UDP to the node's probe port": (eth(under, pod_packet(outer_src, internal, port, port, b"x" * 40)), False),
    }


@pytest.mark.parametrize("under,pods", [(4, 4), (4, 6), (6, 4), (6, 6)])
def test_the_tap_filter_lets_in_probe_frames_only(under, pods) -> None:
    """The prober's classic BPF filter, attached to a real AF_PACKET socket: of frames sent over a
    veth, exactly the direct and ipip probes to this node arrive (not other UDP, not VXLAN
    traffic, not another node's)."""
    import socket as so

    from meshctl.lab.rigs import netns
    from meshctl.node.prober import open_tap, packet_filter

    probe = ipaddress.ip_address("10.42.1.1" if pods == 4 else "fd42:1::1").packed
    internal = ipaddress.ip_address("10.30.1.1" if under == 4 else "fd30:1::1").packed
    other = ipaddress.ip_address("fd99::9").packed
    frames = _filter_frames(probe, internal, other, V6_PORT)
    ns = f"p6f{os.getpid() % 10000}"
    netns.add(ns)
    try:
        netns.veth(ns, "tx0", ns, "rx0")
        wait_until(lambda: all(netns.link_ready(ns, d) for d in ("tx0", "rx0")), 10, "the veth pair up")

        def run() -> list[bytes]:
            rx = open_tap("rx0", packet_filter(probe, internal, V6_PORT))
            rx.settimeout(0.5)
            tx = so.socket(so.AF_PACKET, so.SOCK_RAW)
            for frame, _ in frames.values():
                tx.sendto(frame, ("tx0", 0))
            got = []
            try:
                while True:
                    got.append(rx.recv(2048))
            except TimeoutError:
                pass
            rx.close()
            tx.close()
            return got

        got = in_netns(ns, run)
    finally:
        netns.delete(ns)
    want = [f for f, ok in frames.values() if ok]
    assert got == want, {name: (f in got) for name, (f, _) in frames.items()}


def test_a_tap_opened_while_other_frames_flow_queues_none_of_them() -> None:
    """open_tap binds only once its filter is attached: frames that flow while it opens (another
    UDP stream here; MLD reports of a link coming up in real life) never reach its queue, and the
    probe sent after them is the first frame it reads."""
    import socket as so
    import threading

    from meshctl.lab.rigs import netns
    from meshctl.node.prober import open_tap, packet_filter

    probe, internal, other = (ipaddress.ip_address(a).packed for a in ("10.42.1.1", "10.30.1.1", "10.99.9.9"))
    frames = _filter_frames(probe, internal, other, V6_PORT)
    noise = frames["UDP to the node's probe port"][0]
    ns = f"p6t{os.getpid() % 10000}"
    netns.add(ns)
    try:
        netns.veth(ns, "tx0", ns, "rx0")
        wait_until(lambda: all(netns.link_ready(ns, d) for d in ("tx0", "rx0")), 10, "the veth pair up")

        def run() -> tuple[int, list[bytes]]:
            stop = threading.Event()
            sent = [0]

            def flood() -> None:
                with so.socket(so.AF_PACKET, so.SOCK_RAW) as tx:
                    while not stop.is_set():
                        tx.sendto(noise, ("tx0", 0))
                        sent[0] += 1

            t = threading.Thread(target=flood)
            t.start()
            try:
                wait_until(lambda: sent[0] > 100, 10, "the other frames flowing")
                taps = [open_tap("rx0", packet_filter(probe, internal, V6_PORT)) for _ in range(20)]
            finally:
                stop.set()
                t.join()
            with so.socket(so.AF_PACKET, so.SOCK_RAW) as tx:
                tx.sendto(frames["direct probe"][0], ("tx0", 0))
            firsts = []
            for rx in taps:
                rx.settimeout(2)
                firsts.append(rx.recv(2048))
                rx.close()
            return sent[0], firsts

        sent, firsts = in_netns(ns, run)
    finally:
        netns.delete(ns)
    assert sent > 100
    assert firsts == [frames["direct probe"][0]] * 20
