# SPDX-License-Identifier: Apache-2.0
"""BPF_PROG_TEST_RUN harness: crafted frames in, program verdict, time and output frame out.

Used by the unit tests of the programs and by bench/datapath.py (ns per packet per action).
"""

from __future__ import annotations

import ipaddress
import statistics
import struct
from dataclasses import dataclass

from meshctl.datapath import libbpf

TC_ACT_OK = 0
TC_ACT_SHOT = 2
TC_ACT_REDIRECT = 7
VERDICTS = {TC_ACT_OK: "ok", TC_ACT_SHOT: "shot", TC_ACT_REDIRECT: "redirect"}

PROTO_ICMP, PROTO_TCP, PROTO_UDP, PROTO_ICMP6 = 1, 6, 17, 58
_SRC_MAC = bytes.fromhex("020000000001")
_DST_MAC = bytes.fromhex("020000000002")


def ip_checksum(header: bytes) -> int:
    s = sum(struct.unpack(f"!{len(header) // 2}H", header))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return int(~s & 0xFFFF)


def _l4(proto: int, sport: int, dport: int, payload: bytes) -> bytes:
    if proto == PROTO_TCP:
        return struct.pack("!HHIIBBHHH", sport, dport, 1, 0, 5 << 4, 0x02, 65535, 0, 0) + payload
    if proto == PROTO_UDP:
        return struct.pack("!HHHH", sport, dport, 8 + len(payload), 0) + payload
    return struct.pack("!BBHHH", 8 if proto == PROTO_ICMP else 128, 0, 0, 1, 1) + payload


def frame(src: str, dst: str, *, ttl: int = 64, proto: int = PROTO_TCP, sport: int = 40000, dport: int = 80,
          payload: bytes = b"x" * 32, df: bool = False) -> bytes:
    """An Ethernet frame carrying an IPv4 or IPv6 packet (by the addresses' family); `df` sets
    IPv4's don't-fragment bit."""
    s, d = ipaddress.ip_address(src), ipaddress.ip_address(dst)
    if s.version == 4 and proto == PROTO_ICMP6:
        proto = PROTO_ICMP
    body = _l4(proto, sport, dport, payload)
    if s.version == 4:
        hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(body), 1, 0x4000 if df else 0, ttl, proto, 0, s.packed,
                          d.packed)
        hdr = hdr[:10] + struct.pack("!H", ip_checksum(hdr)) + hdr[12:]
        return _DST_MAC + _SRC_MAC + b"\x08\x00" + hdr + body
    hdr = struct.pack("!IHBB16s16s", 6 << 28, len(body), proto, ttl, s.packed, d.packed)
    return _DST_MAC + _SRC_MAC + b"\x86\xdd" + hdr + body


def non_ip_frame() -> bytes:
    """An ARP request."""
    return _DST_MAC + _SRC_MAC + b"\x08\x06" + bytes(28)


@dataclass(frozen=True)
class Result:
    verdict: str
    ns: int
    out: bytes
    mark: int = 0  # skb->mark as the program left it (when run with a mark)

    @property
    def ttl(self) -> int:
        """TTL / hop limit of the output frame."""
        return self.out[14 + 8] if self.out[12:14] == b"\x08\x00" else self.out[14 + 7]

    @property
    def ipv4_checksum_ok(self) -> bool:
        return ip_checksum(self.out[14:34]) == 0


def run(prog_fd: int, data: bytes, repeat: int = 1, mark: int | None = None) -> Result:
    """One BPF_PROG_TEST_RUN. `mark` sets skb->mark (struct __sk_buff: len, pkt_type, mark)."""
    ctx = struct.pack("<III", 0, 0, mark) if mark is not None else b""
    ret, ns, out, ctx_out = libbpf.test_run(prog_fd, data, repeat, ctx)
    return Result(VERDICTS.get(ret, str(ret)), ns, out, struct.unpack_from("<I", ctx_out, 8)[0] if ctx_out else 0)


def ns_per_packet(prog_fd: int, data: bytes, *, repeat: int = 200, rounds: int = 15) -> float:
    """Median over `rounds` of the kernel's mean ns per run. Each round starts from the same frame
    (a program that decrements TTL reruns its own output: with TTL 255 and repeat <= 250 every
    run still takes the same branch)."""
    return statistics.median(run(prog_fd, data, repeat).ns for _ in range(rounds))


def _fold(s: int) -> int:
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def _sum16(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    return sum(struct.unpack(f"!{len(data) // 2}H", data))


# Where each protocol keeps its checksum in its header.
L4_CSUM_OFFSET = {PROTO_TCP: 16, PROTO_UDP: 6, PROTO_ICMP: 2, PROTO_ICMP6: 2}


def _l3(frame_: bytes) -> tuple[int, bytes, bytes, int, int]:
    """(IP version, source, destination, protocol, L4 offset) of an Ethernet frame."""
    if frame_[12:14] == b"\x08\x00":
        ihl = (frame_[14] & 0xF) * 4
        return 4, frame_[26:30], frame_[30:34], frame_[23], 14 + ihl
    return 6, frame_[22:38], frame_[38:54], frame_[20], 54


def l4_sum(version: int, src: bytes, dst: bytes, proto: int, segment: bytes) -> int:
    """The ones' complement sum of an L4 segment with its pseudo-header (none for ICMPv4): 0xFFFF
    when the segment's checksum is right."""
    pseudo = 0 if proto == PROTO_ICMP else _sum16(src + dst) + proto + len(segment)
    return _fold(pseudo + _sum16(segment))


def with_checksums(frame_: bytes) -> bytes:
    """The frame with its IPv4 header's and its L4 checksum (TCP, UDP, ICMP, ICMPv6) computed, as a
    sending stack leaves them (`frame` leaves the L4 one 0)."""
    version, src, dst, proto, l4 = _l3(frame_)
    off = l4 + L4_CSUM_OFFSET[proto]
    body = frame_[:off] + b"\0\0" + frame_[off + 2:]
    csum = ~l4_sum(version, src, dst, proto, body[l4:]) & 0xFFFF
    if proto == PROTO_UDP and csum == 0:
        csum = 0xFFFF
    return body[:off] + struct.pack("!H", csum) + body[off + 2:]


def l4_checksum_ok(frame_: bytes) -> bool:
    """Whether the frame's L4 checksum is right (a UDP checksum of 0 means none: right)."""
    version, src, dst, proto, l4 = _l3(frame_)
    if proto == PROTO_UDP and frame_[l4 + 6:l4 + 8] == b"\0\0":
        return True
    return l4_sum(version, src, dst, proto, frame_[l4:]) == 0xFFFF
