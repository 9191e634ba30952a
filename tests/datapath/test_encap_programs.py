# SPDX-License-Identifier: Apache-2.0
"""BPF_PROG_TEST_RUN of the encapsulated direct paths: what from_pod puts on the wire for
direct+vxlan and direct+ipip (outer addresses, VNI, VTEP MACs, checksums, TTL), what from_private
accepts and unwraps (every rung, only for this node), and ICMP "fragmentation needed" for a DF
packet that would not fit the private NIC once encapsulated."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from meshctl.datapath import layout
from meshctl.lab.rigs.testrun import PROTO_ICMP, PROTO_UDP, frame, ip_checksum, run
from meshctl.mesh.plan import Encap, FastPathEntry
from meshctl.setns import in_netns
from tests.datapath.conftest import SMALL_MTU

net = ipaddress.ip_network
ip = ipaddress.ip_address

ME, PEER = ip("192.168.0.1"), ip("192.168.0.2")
POD = "10.42.1.5"
PLAN = [
    FastPathEntry(net("10.42.1.0/24"), "local", None),
    FastPathEntry(net("10.44.0.0/24"), "direct", None, Encap("vxlan", ME, PEER)),
    FastPathEntry(net("10.45.0.0/24"), "direct", None, Encap("ipip", ME, PEER)),
    FastPathEntry(net("fd00:44::/64"), "direct", None, Encap("vxlan", ME, PEER)),
    FastPathEntry(net("fd00:45::/64"), "direct", None, Encap("ipip", ME, PEER)),
]
LO = 1  # the loopback's ifindex in every network namespace: the "private NIC" of these runs


@pytest.fixture(scope="module")
def dp(unit_dp):
    unit_dp.sync(PLAN, "lo")
    unit_dp.maps.config_set(layout.CFG_PRIVATE4, layout.config_addr(PEER))  # decapsulate as the peer would
    # the private NIC's MTU as attach() records it: what a kernel without bpf_check_mtu compares with
    # (small_mtu_ns's loopback); a kernel with it asks the device itself
    unit_dp.maps.config_set(layout.CFG_PRIVATE_MTU, SMALL_MTU)
    unit_dp.maps.pods.sync({layout.pod_key(ip("10.44.0.9")): layout.pod_value(LO),
                            layout.pod_key(ip("fd00:44::9")): layout.pod_value(LO)})
    return unit_dp


def delta(dp, fn):
    before = dp.counters()
    out = fn()
    after = dp.counters()
    return out, {k: (after[k][0] - before[k][0], after[k][1] - before[k][1]) for k in after if after[k] != before[k]}


def outer(out: bytes) -> dict:
    """The outer IPv4 header of a frame from_pod encapsulated."""
    assert out[12:14] == b"\x08\x00", "the outer Ethernet type is IPv4"
    h = out[14:34]
    ver_ihl, _, tot, _, frag, ttl, proto, _, src, dst = struct.unpack("!BBHHHBBH4s4s", h)
    assert ip_checksum(h) == 0, "outer IPv4 checksum"
    return {"ihl": ver_ihl, "len": tot, "df": bool(frag & 0x4000), "ttl": ttl, "proto": proto,
            "src": ip(src), "dst": ip(dst)}


@pytest.mark.parametrize("dst,family", [("10.44.0.9", 4), ("fd00:44::9", 6)])
def test_vxlan_wraps_the_pod_packet_between_the_private_addresses(dp, dst, family):
    src = POD if family == 4 else "fd00:42:1::5"
    pkt = frame(src, dst, ttl=64)
    res, moved = delta(dp, lambda: run(dp.programs["from_pod"], pkt))
    assert res.verdict == "redirect"
    assert moved == {"encap": (1, len(pkt))}
    o = outer(res.out)
    assert (o["ihl"], o["proto"], o["src"], o["dst"], o["df"]) == (0x45, PROTO_UDP, ME, PEER, True)
    assert o["len"] == len(pkt) - 14 + layout.VXLAN_OVERHEAD
    sport, dport, ulen, csum, flags, vni = struct.unpack("!HHHHII", res.out[34:50])
    assert dport == layout.VXLAN_PORT and 32768 <= sport <= 60999 and ulen == o["len"] - 20 and csum == 0
    assert (flags, vni >> 8) == (0x08000000, layout.VXLAN_VNI)
    inner_eth = res.out[50:64]
    assert inner_eth[:6].hex(":") == layout.vtep_mac(PEER) and inner_eth[6:12].hex(":") == layout.vtep_mac(ME)
    assert inner_eth[12:14] == pkt[12:14]
    inner = res.out[64:]
    ttl_at = 8 if family == 4 else 7
    assert inner[ttl_at] == 63, "the pod packet's TTL is decremented (the node forwards it)"
    assert inner[:ttl_at] == pkt[14:14 + ttl_at]
    assert inner[ttl_at + 1:ttl_at + 2] == pkt[14 + ttl_at + 1:14 + ttl_at + 2]
    if family == 4:
        assert ip_checksum(inner[:20]) == 0


@pytest.mark.parametrize("dst,proto", [("10.45.0.9", 4), ("fd00:45::9", 41)])
def test_ipip_wraps_ipv4_as_ipip_and_ipv6_as_6in4(dp, dst, proto):
    src = POD if proto == 4 else "fd00:42:1::5"
    pkt = frame(src, dst, ttl=64)
    res, moved = delta(dp, lambda: run(dp.programs["from_pod"], pkt))
    assert res.verdict == "redirect" and moved == {"encap": (1, len(pkt))}
    o = outer(res.out)
    assert (o["proto"], o["src"], o["dst"], o["len"]) == (proto, ME, PEER, len(pkt) - 14 + 20)
    assert res.out[34:34 + 7] == pkt[14:14 + 7], "the inner header follows the outer one"


@pytest.mark.parametrize("dst", ["10.44.0.9", "fd00:44::9"])
@pytest.mark.parametrize("rung", ["vxlan", "ipip"])
def test_the_receiver_unwraps_every_rung_into_the_pod(dp, rung, dst):
    """What from_pod built is what from_private accepts, whichever rung the sender is on."""
    src = POD if ":" not in dst else "fd00:42:1::5"
    pkt = frame(src, dst, ttl=64)
    entry = FastPathEntry(net(dst + ("/32" if ":" not in dst else "/128")), "direct", None, Encap(rung, ME, PEER))
    before = dp.maps.routes.items()
    dp.maps.sync_routes({**before, **layout.route_table([entry], LO)})
    try:
        wire = run(dp.programs["from_pod"], pkt).out
    finally:
        dp.maps.sync_routes(before)
    res, moved = delta(dp, lambda: run(dp.programs["from_private"], wire))
    assert res.verdict == "redirect"
    assert moved == {"decap": (1, len(wire)), "peer": (1, len(wire))}
    # The pod gets its packet back, TTL decremented once per node, Ethernet header of the wire.
    ttl_at = 14 + (8 if ":" not in dst else 7)
    assert res.out[12:14] == pkt[12:14]
    assert res.out[14:ttl_at] == pkt[14:ttl_at] and res.out[ttl_at] == 62 and res.out[ttl_at + 3:] == pkt[ttl_at + 3:]


def test_the_receiver_leaves_what_is_not_for_it_to_the_kernel(dp):
    wire = run(dp.programs["from_pod"], frame(POD, "10.44.0.9")).out
    cases = {
        "another node's outer address": wire[:30] + ME.packed + wire[34:],
        "another VNI": wire[:46] + struct.pack("!I", 7 << 8) + wire[50:],
        "another UDP port": wire[:36] + struct.pack("!H", 4790) + wire[38:],
    }
    for what, pkt in cases.items():
        res, moved = delta(dp, lambda pkt=pkt: run(dp.programs["from_private"], pkt))
        assert res.verdict == "ok" and res.out == pkt, what
        assert moved == {"pass": (1, len(pkt))}, what


@pytest.mark.parametrize("rung,dst", [("vxlan", "10.44.0.9"), ("ipip", "10.45.0.9")])
def test_a_df_packet_too_big_once_encapsulated_gets_fragmentation_needed(dp, small_mtu_ns, rung, dst):
    overhead = layout.OVERHEAD[rung]
    fits = frame(POD, dst, proto=PROTO_ICMP, payload=bytes(1500 - 28 - overhead), df=True)
    big = frame(POD, dst, proto=PROTO_ICMP, payload=bytes(1500 - 28 - overhead + 1), df=True)
    res = in_netns(small_mtu_ns, lambda: run(dp.programs["from_pod"], fits))
    assert res.verdict == "redirect" and len(res.out) == 14 + 1500
    res, moved = delta(dp, lambda: in_netns(small_mtu_ns, lambda: run(dp.programs["from_pod"], big)))
    assert res.verdict == "redirect" and moved == {"too_big": (1, len(big))}
    out = res.out
    assert out[:6] == big[6:12] and out[6:12] == big[:6], "back to the pod: MACs swapped"
    h = out[14:34]
    assert ip_checksum(h) == 0 and h[9] == PROTO_ICMP
    assert ip(h[12:16]) == PEER, "from the node's private address (MC_CFG_PRIVATE4)"
    assert ip(h[16:20]) == ip(POD)
    icmp = out[34:]
    typ, code, _, _, mtu = struct.unpack("!BBHHH", icmp[:8])
    assert (typ, code, mtu) == (3, 4, 1500 - overhead)
    assert ip_checksum(icmp) == 0
    assert icmp[8:8 + 28] == big[14:14 + 28], "the offending header and 8 bytes follow"
    # Without DF the kernel decides (it fragments): nothing is answered here.
    no_df = frame(POD, dst, proto=PROTO_ICMP, payload=bytes(1500 - 28 - overhead + 1))
    res = in_netns(small_mtu_ns, lambda: run(dp.programs["from_pod"], no_df))
    assert res.verdict == "ok" and res.out == no_df


def icmp6_checksum_ok(pkt: bytes) -> bool:
    """The ICMPv6 checksum of an IPv6 packet (header at 0) over its pseudo-header."""
    src, dst, body = pkt[8:24], pkt[24:40], pkt[40:]
    pseudo = src + dst + struct.pack("!I3xB", len(body), 58)
    data = pseudo + body + (b"\0" if len(body) % 2 else b"")
    return ip_checksum(data) == 0


@pytest.mark.parametrize("rung,dst", [("vxlan", "fd00:44::9"), ("ipip", "fd00:45::9")])
def test_an_ipv6_packet_too_big_once_encapsulated_gets_packet_too_big(dp, small_mtu_ns, rung, dst):
    overhead = layout.OVERHEAD[rung]
    src = "fd00:42:1::5"
    big = frame(src, dst, proto=PROTO_UDP, payload=bytes(1500 - 48 - overhead + 1))
    res, moved = delta(dp, lambda: in_netns(small_mtu_ns, lambda: run(dp.programs["from_pod"], big)))
    assert res.verdict == "redirect" and moved == {"too_big": (1, len(big))}
    out = res.out
    assert out[12:14] == b"\x86\xdd" and out[:6] == big[6:12]
    h = out[14:]
    assert (h[6], ip(h[8:24]), ip(h[24:40])) == (58, ip(dst), ip(src))
    typ, code, _, mtu = struct.unpack("!BBHI", h[40:48])
    assert (typ, code, mtu) == (2, 0, 1500 - overhead)
    assert icmp6_checksum_ok(h)
    assert h[48:48 + 48] == big[14:14 + 48], "the offending header and 8 bytes follow"


def test_maps_dump_shows_encapsulation_and_outer_addresses(dp):
    rows = {e["prefix"]: e for e in dp.entries()}
    assert rows["10.44.0.0/24"] == {"prefix": "10.44.0.0/24", "action": "direct", "nexthop": None, "ifname": "lo",
                                    "encap": "vxlan", "outer_src": str(ME), "outer_dst": str(PEER)}
    assert rows["fd00:45::/64"]["encap"] == "ipip"
    assert rows["10.42.1.0/24"]["encap"] is None
