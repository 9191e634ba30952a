# SPDX-License-Identifier: Apache-2.0
"""BPF_PROG_TEST_RUN of each program on crafted frames: every action, longest prefix, IPv6,
TTL 1, truncated and non-IP frames, flow tracking, and the counters each outcome moves."""

from __future__ import annotations

import ipaddress

import pytest

from meshctl.datapath import layout
from meshctl.lab.rigs.testrun import PROTO_ICMP6, PROTO_UDP, frame, non_ip_frame, run
from meshctl.mesh.plan import FastPathEntry

net = ipaddress.ip_network
ip = ipaddress.ip_address

PLAN = [
    FastPathEntry(net("10.42.1.0/24"), "local", None),
    FastPathEntry(net("10.42.2.0/24"), "direct", ip("192.168.0.2")),
    FastPathEntry(net("10.42.0.0/16"), "tunnel", None),        # the /24s above are longer: they win
    FastPathEntry(net("10.42.2.128/25"), "tunnel", None),      # ...and this one wins over the /24
    FastPathEntry(net("fd00:42:2::/64"), "direct", ip("fd00:1::2")),
    FastPathEntry(net("fd00:42::/48"), "tunnel", None),
    FastPathEntry(net("10.43.0.0/24"), "direct", ip("fd00:1::3")),  # IPv4 pods over an IPv6 private net
]
POD = "10.42.1.5"


@pytest.fixture(scope="module")
def dp(unit_dp):
    unit_dp.sync(PLAN, "lo")
    return unit_dp


def delta(dp, fn):
    """Counters moved by fn(): {action: (packets, bytes)} for those that moved."""
    before = dp.counters()
    out = fn()
    after = dp.counters()
    moved = {k: (after[k][0] - before[k][0], after[k][1] - before[k][1]) for k in after if after[k] != before[k]}
    return out, moved


def test_direct_ipv4_redirects_with_ttl_decremented_and_checksum_fixed(dp):
    pkt = frame(POD, "10.42.2.7", ttl=64)
    res, moved = delta(dp, lambda: run(dp.programs["from_pod"], pkt))
    assert res.verdict == "redirect"
    assert res.ttl == 63
    assert res.ipv4_checksum_ok
    assert moved == {"direct": (1, len(pkt))}


def test_tunnel_local_and_miss_go_to_the_kernel_untouched(dp):
    for dst, action in (("10.42.9.9", "tunnel"), ("10.42.1.9", "local"), ("8.8.8.8", "pass")):
        pkt = frame(POD, dst)
        res, moved = delta(dp, lambda pkt=pkt: run(dp.programs["from_pod"], pkt))
        assert res.verdict == "ok", dst
        assert res.out == pkt, f"{dst}: a packet left to the kernel must not be modified"
        assert moved == {action: (1, len(pkt))}, dst


def test_longest_prefix_wins(dp):
    # 10.42.2.200 is in the /16 (tunnel), the /24 (direct) and the /25 (tunnel): the /25 wins.
    assert run(dp.programs["from_pod"], frame(POD, "10.42.2.200")).verdict == "ok"
    assert run(dp.programs["from_pod"], frame(POD, "10.42.2.100")).verdict == "redirect"
    entries = {e["prefix"]: e for e in dp.entries()}
    assert entries["10.42.2.0/24"] == {"prefix": "10.42.2.0/24", "action": "direct", "nexthop": "192.168.0.2",
                                       "ifname": "lo", "encap": None, "outer_src": None, "outer_dst": None}


def test_ipv6_direct_decrements_hop_limit_and_tunnel_passes(dp):
    pkt = frame("fd00:42:1::5", "fd00:42:2::9", ttl=64, proto=PROTO_UDP)
    res, moved = delta(dp, lambda: run(dp.programs["from_pod"], pkt))
    assert (res.verdict, res.ttl) == ("redirect", 63)
    assert moved == {"direct": (1, len(pkt))}
    res, moved = delta(dp, lambda: run(dp.programs["from_pod"], frame("fd00:42:1::5", "fd00:42:0:7::1")))
    assert res.verdict == "ok" and set(moved) == {"tunnel"}
    # An IPv4 address never matches an IPv6 prefix with the same leading bytes, nor the reverse.
    res, moved = delta(dp, lambda: run(dp.programs["from_pod"], frame("::1", "a2a:200::1", proto=PROTO_ICMP6)))
    assert res.verdict == "ok" and set(moved) == {"pass"}


def test_ipv4_over_ipv6_next_hop(dp):
    assert run(dp.programs["from_pod"], frame(POD, "10.43.0.9")).verdict == "redirect"


@pytest.mark.parametrize("src,dst", [(POD, "10.42.2.7"), ("fd00:42:1::5", "fd00:42:2::9")])
def test_ttl_1_is_left_to_the_kernel(dp, src, dst):
    pkt = frame(src, dst, ttl=1)
    res, moved = delta(dp, lambda: run(dp.programs["from_pod"], pkt))
    assert res.verdict == "ok" and res.out == pkt
    assert moved == {"pass": (1, len(pkt))}


@pytest.mark.parametrize("prog", ["from_pod", "from_private", "flow_egress"])
def test_truncated_malformed_and_non_ip_frames_pass(dp, prog):
    # (The kernel's test_run itself refuses IP frames shorter than an IP header; the programs
    # bound-check those too.)
    full = frame(POD, "10.42.2.7")
    v6 = frame("fd00:42:1::5", "fd00:42:2::9")
    cases = {
        "bare ethernet header": full[:12] + b"\x88\xcc",
        "ARP": non_ip_frame(),
        "IPv4 options cut off (ihl 7, 20 bytes)": full[:14] + bytes([0x47]) + full[15:34],
        "IPv4 ethertype, version 6": full[:14] + bytes([0x65]) + full[15:],
        "IPv6 ethertype, version 4": v6[:14] + bytes([0x40]) + v6[15:],
    }
    for what, pkt in cases.items():
        res, moved = delta(dp, lambda pkt=pkt: run(dp.programs[prog], pkt))
        assert res.verdict == "ok", (prog, what)
        assert res.out == pkt, (prog, what)
        if prog != "flow_egress":
            assert moved == {"pass": (1, len(pkt))}, (prog, what)


def test_truncated_l4_still_routes_on_the_ip_header(dp):
    # An IPv4 header whose TCP ports are cut off: routing needs only the IP header.
    pkt = frame(POD, "10.42.2.7", payload=b"")[:14 + 20 + 2]
    assert run(dp.programs["from_pod"], pkt).verdict == "redirect"


def test_from_private_redirects_local_pods_into_the_pod(dp):
    dp.maps.pods.sync({layout.pod_key(ip("10.42.1.5")): layout.pod_value(1),
                       layout.pod_key(ip("fd00:42:1::5")): layout.pod_value(1)})
    for src, dst in (("10.42.2.7", "10.42.1.5"), ("fd00:42:2::9", "fd00:42:1::5")):
        pkt = frame(src, dst, ttl=63)
        res, moved = delta(dp, lambda pkt=pkt: run(dp.programs["from_private"], pkt))
        assert (res.verdict, res.ttl) == ("redirect", 62)
        assert moved == {"peer": (1, len(pkt))}
    res, moved = delta(dp, lambda: run(dp.programs["from_private"], frame("10.42.2.7", "10.42.1.6")))
    assert res.verdict == "ok" and set(moved) == {"pass"}
    # TTL 1 towards a local pod: the kernel answers with time exceeded.
    assert run(dp.programs["from_private"], frame("10.42.2.7", "10.42.1.5", ttl=1)).verdict == "ok"


def test_flows_that_left_through_the_kernel_get_their_replies_back_through_it(dp):
    dp.maps.pods.sync({layout.pod_key(ip("10.42.1.5")): layout.pod_value(1)})
    # A kube-proxy style flow: the pod's packet to a ClusterIP was DNATed to 10.42.2.7:8080 and
    # left through the private NIC; the egress tracker records the reply's tuple.
    out = frame("10.42.1.5", "10.42.2.7", sport=40001, dport=8080)
    res, moved = delta(dp, lambda: run(dp.programs["flow_egress"], out))
    assert res.verdict == "ok" and res.out == out
    assert moved == {"tracked": (1, len(out))}
    assert {"proto": 6, "src": "10.42.2.7", "sport": 8080, "dst": "10.42.1.5", "dport": 40001} in dp.flows()
    # Written only when new: the second packet of the flow adds nothing.
    _, moved = delta(dp, lambda: run(dp.programs["flow_egress"], out))
    assert moved == {}
    reply = frame("10.42.2.7", "10.42.1.5", sport=8080, dport=40001)
    res, moved = delta(dp, lambda: run(dp.programs["from_private"], reply))
    assert res.verdict == "ok" and res.out == reply
    assert moved == {"flow": (1, len(reply))}
    # Another flow between the same pods is not tracked: it takes the fast path.
    other = frame("10.42.2.7", "10.42.1.5", sport=8080, dport=40002)
    assert run(dp.programs["from_private"], other).verdict == "redirect"


def test_from_pod_hands_replies_of_kernel_flows_to_the_kernel(dp):
    # A NodePort-style flow came into the pod through the kernel (pod veth egress): its reply
    # must go back through the kernel's reverse NAT, not the fast path.
    inbound = frame("10.42.2.7", "10.42.1.5", sport=50000, dport=80)
    run(dp.programs["flow_egress"], inbound)
    reply = frame("10.42.1.5", "10.42.2.7", sport=80, dport=50000)
    res, moved = delta(dp, lambda: run(dp.programs["from_pod"], reply))
    assert res.verdict == "ok" and moved == {"flow": (1, len(reply))}


def test_egress_skips_and_clears_packets_from_pod_redirected(dp):
    pkt = frame("10.42.1.5", "10.42.2.7", sport=40099, dport=8080)
    res, moved = delta(dp, lambda: run(dp.programs["flow_egress"], pkt, mark=layout.MARK | 0x1))
    assert moved == {} and res.mark == 0x1
    res = run(dp.programs["from_pod"], frame("10.42.1.5", "10.42.2.7", sport=40100), mark=0)
    assert res.verdict == "redirect" and res.mark == layout.MARK
