# SPDX-License-Identifier: Apache-2.0
"""Global ranges in the programs (lib/xlate.h), by BPF_PROG_TEST_RUN on crafted frames: a source
leaving the cluster becomes its image and a global destination arriving becomes the local pod,
in both families, with every checksum right afterwards (IPv4 header, TCP/UDP/ICMPv6 over the
pseudo-header, a UDP checksum of 0 kept 0), first and later fragments, and ICMP errors whose
quoted packet is translated the other way (path MTU messages)."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from meshctl.datapath import layout
from meshctl.lab.rigs.testrun import (
    PROTO_ICMP,
    PROTO_ICMP6,
    PROTO_TCP,
    PROTO_UDP,
    frame,
    ip_checksum,
    l4_checksum_ok,
    l4_sum,
    run,
    with_checksums,
)
from meshctl.mesh.plan import FastPathEntry

net = ipaddress.ip_network
ip = ipaddress.ip_address

GLOBAL = ((net("10.42.0.0/16"), net("10.142.0.0/16")), (net("fd42:42::/32"), net("fd42:142::/32")))
PLAN = [
    FastPathEntry(net("10.42.1.0/24"), "local", None),
    FastPathEntry(net("10.42.2.0/24"), "direct", ip("192.168.0.2")),             # this cluster: untouched
    FastPathEntry(net("10.143.1.0/24"), "direct", ip("192.168.0.3"), None, True),  # cluster B's image, direct
    FastPathEntry(net("10.143.2.0/24"), "tunnel", None, None, True),               # cluster B's image, WireGuard
    FastPathEntry(net("fd42:42:1::/64"), "local", None),
    FastPathEntry(net("fd42:143:1::/64"), "direct", ip("fd00:1::3"), None, True),
]
POD, POD6 = "10.42.1.5", "fd42:42:1::5"
IMAGE, IMAGE6 = "10.142.1.5", "fd42:142:1::5"
REMOTE, REMOTE6 = "10.143.1.7", "fd42:143:1::7"


@pytest.fixture(scope="module")
def dp(unit_dp):
    unit_dp.sync(PLAN, "lo")
    unit_dp.set_global_ranges(GLOBAL)
    try:
        yield unit_dp
    finally:
        unit_dp.set_global_ranges(())


def addrs(out: bytes) -> tuple[str, str]:
    if out[12:14] == b"\x08\x00":
        return str(ip(out[26:30])), str(ip(out[30:34]))
    return str(ip(out[22:38])), str(ip(out[38:54]))


def moved(dp, fn):
    before = dp.counters()
    res = fn()
    after = dp.counters()
    return res, {k for k in after if after[k] != before[k]}


@pytest.mark.parametrize("proto", [PROTO_TCP, PROTO_UDP, PROTO_ICMP6])
@pytest.mark.parametrize("src,image,dst", [(POD, IMAGE, REMOTE), (POD6, IMAGE6, REMOTE6)])
def test_a_pod_leaving_for_another_cluster_leaves_as_its_image(dp, proto, src, image, dst):
    pkt = with_checksums(frame(src, dst, proto=proto, df=True))
    res, counters = moved(dp, lambda: run(dp.programs["from_pod"], pkt))
    assert res.verdict == "redirect"
    assert addrs(res.out) == (image, dst)
    assert l4_checksum_ok(res.out)
    if src == POD:
        assert res.ipv4_checksum_ok
    assert counters == {"direct", "translated"}


def test_inside_the_cluster_and_without_global_ranges_nothing_is_translated(dp):
    pkt = with_checksums(frame(POD, "10.42.2.7"))
    res = run(dp.programs["from_pod"], pkt)
    assert res.verdict == "redirect" and addrs(res.out) == (POD, "10.42.2.7")
    dp.set_global_ranges(())
    try:
        assert addrs(run(dp.programs["from_pod"], with_checksums(frame(POD, REMOTE))).out) == (POD, REMOTE)
        arriving = with_checksums(frame(REMOTE, IMAGE))
        assert run(dp.programs["from_private"], arriving).out == arriving
    finally:
        dp.set_global_ranges(GLOBAL)


@pytest.mark.parametrize("proto", [PROTO_TCP, PROTO_UDP, PROTO_ICMP6])
@pytest.mark.parametrize("src,image,pod", [(REMOTE, IMAGE, POD), (REMOTE6, IMAGE6, POD6)])
def test_a_global_destination_arriving_becomes_the_local_pod(dp, proto, src, image, pod):
    pkt = with_checksums(frame(src, image, proto=proto))
    res, counters = moved(dp, lambda: run(dp.programs["from_private"], pkt))
    assert addrs(res.out) == (src, pod)
    assert l4_checksum_ok(res.out)
    assert "translated" in counters
    if src == REMOTE:
        assert res.ipv4_checksum_ok


def test_a_udp_checksum_of_zero_stays_zero(dp):
    pkt = frame(REMOTE, IMAGE, proto=PROTO_UDP)  # frame() leaves the UDP checksum 0: none
    res = run(dp.programs["from_private"], pkt)
    assert addrs(res.out) == (REMOTE, POD)
    assert res.out[34 + 6:34 + 8] == b"\0\0" and res.ipv4_checksum_ok


def test_a_packet_the_kernel_sends_out_of_the_cluster_is_translated_where_it_leaves(dp):
    # WireGuard's share goes to the kernel untouched; a member sends it to its leader on the private
    # NIC still as the cluster's own (a tunnel entry: no translation there), the tunnel device's
    # egress on the leader translates it (tested in the lab: test_global_ranges_lab).
    pkt = with_checksums(frame(POD, "10.143.2.9"))
    res = run(dp.programs["from_pod"], pkt)
    assert res.verdict == "ok" and res.out == pkt
    assert run(dp.programs["flow_egress"], pkt).out == pkt
    # A kernel-routed packet to a remote node of a direct entry (a Service DNATed to a remote
    # endpoint) leaves the private NIC translated.
    pkt = with_checksums(frame(POD, REMOTE))
    res = run(dp.programs["flow_egress"], pkt)
    assert res.verdict == "ok" and addrs(res.out) == (IMAGE, REMOTE) and l4_checksum_ok(res.out)


def _ipv4_fragments(src: str, dst: str) -> tuple[bytes, bytes, bytes]:
    """A UDP datagram (checksum over all of it) as one frame, and as its first (MF) and second fragments."""
    payload = bytes(range(256)) * 2
    whole = with_checksums(frame(src, dst, proto=PROTO_UDP, payload=payload))
    ip_hdr, udp = whole[14:34], whole[34:]
    cut = 8 + 256  # a multiple of 8
    def frag(part: bytes, off: int, mf: bool) -> bytes:
        h = bytearray(ip_hdr)
        struct.pack_into("!H", h, 2, 20 + len(part))
        struct.pack_into("!H", h, 6, (0x2000 if mf else 0) | off // 8)
        struct.pack_into("!H", h, 10, 0)
        struct.pack_into("!H", h, 10, ip_checksum(bytes(h)))
        return whole[:14] + bytes(h) + part
    return whole, frag(udp[:cut], 0, True), frag(udp[cut:], cut, False)


def test_ipv4_fragments_the_first_carries_the_whole_datagrams_checksum(dp):
    whole, first, second = _ipv4_fragments(REMOTE, IMAGE)
    r1, r2 = run(dp.programs["from_private"], first).out, run(dp.programs["from_private"], second).out
    assert addrs(r1) == addrs(r2) == (REMOTE, POD)
    assert ip_checksum(r1[14:34]) == 0 and ip_checksum(r2[14:34]) == 0
    assert r2[34:] == second[34:], "a later fragment carries no L4 header: its payload is untouched"
    # Reassembled, the datagram's UDP checksum holds over the new pseudo-header.
    reassembled = r1[:16] + struct.pack("!H", 20 + len(whole) - 34) + r1[18:34] + r1[34:] + r2[34:]
    assert l4_checksum_ok(reassembled)


def test_ipv6_fragments_the_first_has_its_checksum_translated(dp):
    payload = bytes(range(200))
    whole = with_checksums(frame(REMOTE6, IMAGE6, proto=PROTO_UDP, payload=payload))
    udp = whole[54:]
    cut = 8 + 96

    def frag(part: bytes, off: int, mf: bool) -> bytes:
        fh = struct.pack("!BBHI", PROTO_UDP, 0, off | (1 if mf else 0), 7)
        hdr = bytearray(whole[14:54])
        struct.pack_into("!H", hdr, 4, len(fh) + len(part))
        hdr[6] = 44
        return whole[:14] + bytes(hdr) + fh + part

    first, second = frag(udp[:cut], 0, True), frag(udp[cut:], cut, False)
    r1, r2 = run(dp.programs["from_private"], first).out, run(dp.programs["from_private"], second).out
    assert addrs(r1) == addrs(r2) == (REMOTE6, POD6)
    assert r2[54:] == second[54:]
    seg = r1[62:] + r2[62:]
    assert l4_sum(6, r1[22:38], r1[38:54], PROTO_UDP, seg) == 0xFFFF


def _icmp4_frag_needed(src: str, dst: str, quoted: bytes, mtu: int = 1200) -> bytes:
    """An ICMP "fragmentation needed" from `src` to `dst` quoting the IP packet `quoted` (header + 8 bytes)."""
    icmp = bytearray(struct.pack("!BBHHH", 3, 4, 0, 0, mtu) + quoted)
    struct.pack_into("!H", icmp, 2, ~l4_sum(4, b"", b"", PROTO_ICMP, bytes(icmp)) & 0xFFFF)
    outer = frame(src, dst, proto=PROTO_ICMP, payload=b"")
    hdr = bytearray(outer[14:34])
    struct.pack_into("!H", hdr, 2, 20 + len(icmp))
    struct.pack_into("!H", hdr, 10, 0)
    struct.pack_into("!H", hdr, 10, ip_checksum(bytes(hdr)))
    return outer[:14] + bytes(hdr) + bytes(icmp)


def _icmp6_too_big(src: str, dst: str, quoted: bytes, mtu: int = 1280) -> bytes:
    outer = frame(src, dst, proto=PROTO_ICMP6, payload=b"")
    body = struct.pack("!BBHI", 2, 0, 0, mtu) + quoted
    hdr = bytearray(outer[14:54])
    struct.pack_into("!H", hdr, 4, len(body))
    return with_checksums(outer[:14] + bytes(hdr) + body)


def test_a_path_mtu_message_from_the_far_side_reaches_the_pod_with_its_own_packet_quoted(dp):
    # What the pod sent, as the far cluster saw it after its own translation: image -> its pod.
    sent = with_checksums(frame(POD, REMOTE, df=True))
    seen_there = run(dp.programs["from_pod"], sent).out   # leaves as IMAGE -> REMOTE
    err = _icmp4_frag_needed("10.10.1.21", IMAGE, seen_there[14:34 + 8])
    res, counters = moved(dp, lambda: run(dp.programs["from_private"], err))
    out = res.out
    assert addrs(out) == ("10.10.1.21", POD)
    assert ip_checksum(out[14:34]) == 0
    assert l4_checksum_ok(out), "the ICMP checksum holds over the rewritten quote"
    quoted = out[34 + 8:34 + 8 + 20]
    assert (str(ip(quoted[12:16])), str(ip(quoted[16:20]))) == (POD, REMOTE), "the pod's own packet, as it sent it"
    assert ip_checksum(quoted) == 0
    assert "translated" in counters


def test_an_icmpv6_packet_too_big_is_translated_with_its_quote(dp):
    sent = with_checksums(frame(POD6, REMOTE6, proto=PROTO_UDP))
    seen_there = run(dp.programs["from_pod"], sent).out
    err = _icmp6_too_big("fd10::21", IMAGE6, seen_there[14:54 + 8])
    out = run(dp.programs["from_private"], err).out
    assert addrs(out) == ("fd10::21", POD6)
    assert l4_checksum_ok(out)
    assert (str(ip(out[62 + 8:62 + 24])), str(ip(out[62 + 24:62 + 40]))) == (POD6, REMOTE6)


def test_an_icmp_error_this_node_sends_another_cluster_quotes_the_image(dp):
    # A packet from cluster B reached a local pod (translated on the way in); an ICMP error this
    # node's kernel sends back about it leaves through the kernel: the egress hook translates the
    # quoted destination (the local pod) to its image, as B's pod addressed it.
    quoted = with_checksums(frame(REMOTE, POD, df=True))[14:34 + 8]
    err = _icmp4_frag_needed("10.10.1.11", REMOTE, quoted)
    out = run(dp.programs["flow_egress"], err).out
    assert addrs(out) == ("10.10.1.11", REMOTE)
    q = out[34 + 8:34 + 8 + 20]
    assert (str(ip(q[12:16])), str(ip(q[16:20]))) == (REMOTE, IMAGE)
    assert ip_checksum(q) == 0 and l4_checksum_ok(out) and ip_checksum(out[14:34]) == 0


def test_the_maps_say_what_they_hold(dp):
    assert dp.global_ranges() == [{"pod_range": "10.42.0.0/16", "global_range": "10.142.0.0/16"},
                                  {"pod_range": "fd42:42::/32", "global_range": "fd42:142::/32"}]
    assert dp.maps is not None and dp.maps.config_get(layout.CFG_XLATE) == 1
    translated = {e.entry.prefix for e in (layout.decode_route(k, v) for k, v in dp.maps.routes.items().items())
                  if e.entry.translate}
    assert translated == {net("10.143.1.0/24"), net("10.143.2.0/24"), net("fd42:143:1::/64")}
