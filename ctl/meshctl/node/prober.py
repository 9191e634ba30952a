# SPDX-License-Identifier: Apache-2.0
"""The prober: sends probes shaped like each rung's traffic to every eligible peer, answers the
peers' probes, and feeds what it sees to the pure chooser (mesh.chooser.Chooser).

Probe kinds and their packets (all carry one probe payload, UDP port PROBE_PORT):

    direct  an Ethernet frame out of the private NIC to the next hop of the peer's private address,
            from this node's probe address to the peer's (the first address of a pod CIDR):
            pod-addressed like the rung's traffic, so a source/destination check drops it
    udp     a UDP datagram between the private addresses, holding a VXLAN-framed pod packet: what
            direct+vxlan and wireguard-private send (a fabric that drops UDP, or routes only some
            addresses, drops it)
    ipip    IP-in-IP between the private addresses around a pod-addressed packet (direct+ipip):
            protocol / next header 4 around an IPv4 pod packet, 41 around an IPv6 one

Two families, each fixed per prober: the underlay's (the private addresses': the outer header of
udp and ipip probes, the neighbour table the direct probe's MAC comes from) and the pods' (the
probe addresses: the packet inside). A node on an IPv6 underlay probes its IPv4 pods inside IPv6
and its IPv6 pods the same way; the payload names its sender by private address (4 bytes in
VERSION 1 payloads, 16 in VERSION 2 ones: an IPv6 underlay's).

Answers go back the same way (same kind, addresses swapped), so a kind is up only when both
directions deliver. Direct and IP-in-IP probes are received on an AF_PACKET socket with a
classic BPF filter (only frames for this node's probe address or IP-in-IP with a probe inside wake
the thread); the tap sees frames before tc ingress, so the eBPF fast path's decapsulation does not
hide them (the socket is bound to ETH_P_ALL for that). Replies carry the responder's rungs and
its own choice for the pair (both ends agree).

Only peers the agent named are answered (no reflection for strangers), and every reply must echo
the request's random nonce. One thread; its cost at 100 peers is measured by bench/probe.py.
"""

from __future__ import annotations

import dataclasses
import heapq
import ipaddress
import logging
import os
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any  # noqa: F401 - in a type comment

from meshctl.defaults import PROBE_PORT
from meshctl.mesh.chooser import PROBE_KINDS, Change, Chooser, ProbeStatus, ProbeTuning
from meshctl.mesh.model import RUNGS, PathState, Rung

log = logging.getLogger("meshctl.probe")

ETH_P_IP = 0x0800
ETH_P_IPV6 = 0x86DD
ETH_P_ALL = 0x0003
IPPROTO_IPIP = 4
IPPROTO_IPV6 = 41
PACKET_OUTGOING = 4
SO_ATTACH_FILTER = 26
MAGIC = b"MSHP"
VERSION = 1   # the sender an IPv4 private address
VERSION6 = 2  # the sender an IPv6 private address
REQUEST, REPLY = 1, 2
NO_CHOICE = 255
# magic, version, type, kind, flags, seq, nonce, t_ns, sender, caps, choice
PAYLOAD = struct.Struct("!4sBBBBIQQ4sBB2x")
PAYLOAD6 = struct.Struct("!4sBBBBIQQ16sBB2x")
PAYLOADS = {VERSION: PAYLOAD, VERSION6: PAYLOAD6}
UDP = struct.Struct("!HHHH")
VXLAN = struct.Struct("!BxxxI")  # flags (0x08: VNI valid), VNI << 8
VXLAN_FLAGS = 0x08
ETH = struct.Struct("!6s6sH")
ETH_TYPE = {4: ETH_P_IP, 6: ETH_P_IPV6}
INNER_ETH = {v: ETH.pack(b"\0" * 6, b"\0" * 6, t) for v, t in ETH_TYPE.items()}
IPIP_PROTO = {4: IPPROTO_IPIP, 6: IPPROTO_IPV6}  # the outer protocol around a pod packet of each version
IPV6_HLEN = 40
MAX_FRAME = 256
TICK_S = 0.05  # the chooser's rules run at most this often
RCVBUF = 1 << 20
LISTEN_FACTOR = 1.2  # a node hearing the peer's probes waits this much longer than the peer's interval
COALESCE_S = 0.05  # the loop runs at most this often: packets arriving meanwhile are handled together
SO_TIMESTAMPNS = 35  # receive timestamps from the kernel (RTTs stay exact while the loop coalesces)
TIMESPEC = struct.Struct("@qq")  # a burst of answers from a hundred peers must not overflow the sockets


IPAddr = ipaddress.IPv4Address | ipaddress.IPv6Address


def probe_address(pod_cidrs: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network],
                  family: int | None = None) -> IPAddr | None:
    """A node's probe address: the first address of its first pod CIDR of IP version `family`
    (None: IPv4 where the node has an IPv4 pod CIDR, else IPv6); a node with several blocks of a
    family is probed at the first its record lists. None when it has no block of that family (or
    one too small to spare an address)."""
    if family is None:
        family = 4 if any(c.version == 4 for c in pod_cidrs) else 6
    pod_cidr = next((c for c in pod_cidrs if c.version == family), None)
    if pod_cidr is None or pod_cidr.num_addresses < 4:
        return None
    return ipaddress.ip_address(int(pod_cidr.network_address) + 1)


def _csum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack(f"!{len(data) // 2}H", data))
    s = (s >> 16) + (s & 0xFFFF)
    s += s >> 16
    return int(~s & 0xFFFF)


def ipv4(src: bytes, dst: bytes, proto: int, payload: bytes, ident: int = 0) -> bytes:
    """An IPv4 packet (DF set, TTL 64) around `payload`."""
    hdr = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), ident & 0xFFFF, 0x4000, 64, proto, 0, src, dst)
    return hdr[:10] + struct.pack("!H", _csum(hdr)) + hdr[12:] + payload


def ipv6(src: bytes, dst: bytes, nexthdr: int, payload: bytes) -> bytes:
    """An IPv6 packet (hop limit 64) around `payload`."""
    return struct.pack("!IHBB16s16s", 6 << 28, len(payload), nexthdr, 64, src, dst) + payload


def udp(sport: int, dport: int, payload: bytes) -> bytes:
    return UDP.pack(sport, dport, 8 + len(payload), 0) + payload  # checksum 0: none (IPv4)


def udp6_checksum(src: bytes, dst: bytes, segment: bytes) -> int:
    """The UDP checksum of `segment` (header with checksum 0, then data) over IPv6 (never 0:
    RFC 8200 wants 0xffff for a sum of 0)."""
    c = _csum(src + dst + struct.pack("!I3xB", len(segment), socket.IPPROTO_UDP) + segment)
    return c or 0xFFFF


def pod_packet(src: bytes, dst: bytes, sport: int, dport: int, payload: bytes) -> bytes:
    """A UDP packet between two probe (pod) addresses, IPv4 or IPv6 by their length."""
    seg = udp(sport, dport, payload)
    if len(src) == 4:
        return ipv4(src, dst, socket.IPPROTO_UDP, seg)
    seg = seg[:6] + struct.pack("!H", udp6_checksum(src, dst, seg)) + seg[8:]
    return ipv6(src, dst, socket.IPPROTO_UDP, seg)


def parse_ip(buf: bytes) -> tuple[int, bytes, bytes, bytes] | None:
    """(protocol / first next header, source, destination, what follows the header) of an IPv4
    or IPv6 packet; None when truncated or neither."""
    if len(buf) < 20:
        return None
    if buf[0] >> 4 == 4:
        ihl = (buf[0] & 0xF) * 4
        return buf[9], buf[12:16], buf[16:20], buf[ihl:]
    if buf[0] >> 4 == 6 and len(buf) >= IPV6_HLEN:
        return buf[6], buf[8:24], buf[24:40], buf[IPV6_HLEN:]
    return None


# Classic BPF opcodes (linux/filter.h).
_LD_H, _LD_B, _LD_W, _LDX_MSH, _LD_H_IND, _LD_B_IND = 0x28, 0x30, 0x20, 0xB1, 0x48, 0x50
_JEQ, _JSET, _RET = 0x15, 0x45, 0x06
_ACCEPT, _DROP = "accept", "drop"


def _assemble(prog: list[tuple]) -> bytes:
    """Classic BPF from (op, jt, jf, k) rows whose jump targets may be labels (a str row
    ("label",) marks a position; "accept" and "drop" are appended at the end)."""
    rows: list[tuple] = []
    labels: dict[str, int] = {}
    for ins in [*prog, (_ACCEPT,), (_RET, 0, 0, MAX_FRAME), (_DROP,), (_RET, 0, 0, 0)]:
        if len(ins) == 1:
            labels[ins[0]] = len(rows)
        else:
            rows.append(ins)
    out = []
    for i, (op, jt, jf, k) in enumerate(rows):
        jt, jf = (labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
        out.append(struct.pack("HBBI", op, jt, jf, k))
    return b"".join(out)


def _match_addr(offset: int, addr: bytes, miss: str) -> list[tuple]:
    """Rows comparing the address at frame `offset` with `addr` (4 or 16 bytes), word by word."""
    rows: list[tuple] = []
    for i in range(0, len(addr), 4):
        rows += [(_LD_W, 0, 0, offset + i), (_JEQ, 0, miss, struct.unpack("!I", addr[i:i + 4])[0])]
    return rows


def packet_filter(probe_ip: bytes, internal_ip: bytes, port: int) -> bytes:
    """Classic BPF for the AF_PACKET socket: UDP to `probe_ip`:`port` (direct probes: an IPv4 or
    IPv6 pod packet by the address's length), or IP-in-IP to `internal_ip` (an IPv4 or IPv6 outer
    header by its length) whose inner packet, of the probe address's version, is UDP to `port`
    (ipip probes); everything else stays out. The IPv4 headers may carry options, an IPv6 header
    no extension header (neither sender builds one)."""
    v6_pod, v6_outer = len(probe_ip) == 16, len(internal_ip) == 16
    prog: list[tuple] = [(_LD_H, 0, 0, 12), (_JEQ, 0, "not_direct", ETH_TYPE[6 if v6_pod else 4])]
    if v6_pod:  # direct: IPv6 UDP to the probe address, port
        prog += [(_LD_B, 0, 0, 14 + 6), (_JEQ, 0, "not_direct", socket.IPPROTO_UDP)]
        prog += _match_addr(14 + 24, probe_ip, "not_direct")
        prog += [(_LD_H, 0, 0, 14 + IPV6_HLEN + 2), (_JEQ, _ACCEPT, "not_direct", port)]
    else:  # direct: IPv4 UDP to the probe address, not a fragment, port
        prog += [(_LD_B, 0, 0, 23), (_JEQ, 0, "not_direct", socket.IPPROTO_UDP)]
        prog += _match_addr(30, probe_ip, "not_direct")
        prog += [(_LD_H, 0, 0, 20), (_JSET, "not_direct", 0, 0x1FFF),
                 (_LDX_MSH, 0, 0, 14), (_LD_H_IND, 0, 0, 16), (_JEQ, _ACCEPT, "not_direct", port)]
    prog += [("not_direct",), (_LD_H, 0, 0, 12), (_JEQ, 0, _DROP, ETH_TYPE[6 if v6_outer else 4])]
    inner_proto = IPIP_PROTO[6 if v6_pod else 4]
    if v6_outer:  # the inner packet at the fixed offset 14 + 40: absolute loads
        prog += [(_LD_B, 0, 0, 14 + 6), (_JEQ, 0, _DROP, inner_proto)]
        prog += _match_addr(14 + 24, internal_ip, _DROP)
        inner = 14 + IPV6_HLEN
        if v6_pod:
            prog += [(_LD_B, 0, 0, inner + 6), (_JEQ, 0, _DROP, socket.IPPROTO_UDP),
                     (_LD_H, 0, 0, inner + IPV6_HLEN + 2), (_JEQ, _ACCEPT, _DROP, port)]
        else:
            prog += [(_LD_B, 0, 0, inner + 9), (_JEQ, 0, _DROP, socket.IPPROTO_UDP),
                     (_LD_H, 0, 0, inner + 20 + 2), (_JEQ, _ACCEPT, _DROP, port)]
    else:  # the inner packet after the outer IPv4 header's length (X)
        prog += [(_LD_B, 0, 0, 23), (_JEQ, 0, _DROP, inner_proto)]
        prog += _match_addr(30, internal_ip, _DROP)
        prog += [(_LDX_MSH, 0, 0, 14)]
        if v6_pod:
            prog += [(_LD_B_IND, 0, 0, 14 + 6), (_JEQ, 0, _DROP, socket.IPPROTO_UDP),
                     (_LD_H_IND, 0, 0, 14 + IPV6_HLEN + 2), (_JEQ, _ACCEPT, _DROP, port)]
        else:
            prog += [(_LD_B_IND, 0, 0, 23), (_JEQ, 0, _DROP, socket.IPPROTO_UDP),
                     (_LD_H_IND, 0, 0, 36), (_JEQ, _ACCEPT, _DROP, port)]
    return _assemble(prog)


DROP_ALL = struct.pack("HBBI", 0x06, 0, 0, 0)  # ret #0


def _attach_filter(sock: socket.socket, code: bytes) -> None:
    """Attach classic BPF `code` to `sock`, then drop what the socket queued before it: a raw
    socket receives from the moment it is opened, and those packets never met the filter."""
    import ctypes

    buf = ctypes.create_string_buffer(code)
    fprog = struct.pack("HL", len(code) // 8, ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)  # the kernel copies the program
    try:
        while True:
            sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_TRUNC)
    except BlockingIOError:
        pass


def open_tap(ifname: str, code: bytes, rcvbuf: int | None = None) -> socket.socket:
    """An AF_PACKET socket that sees every frame `ifname` sends or receives (ETH_P_ALL) that `code`
    accepts, non-blocking. It is opened with protocol 0, which receives nothing (packet(7)), and
    bound to ETH_P_ALL only once filtered: no frame enters its queue unfiltered, so none needs to
    be dropped, and none that the filter accepts is lost."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    try:
        if rcvbuf is not None:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        _attach_filter(s, code)
        s.bind((ifname, ETH_P_ALL))
        s.setblocking(False)
    except OSError:
        s.close()
        raise
    return s


@dataclass(frozen=True)
class Target:
    """A peer to probe: its plan name, private address, probe address and ladder
    (mesh.ladder.pair_rungs). Its addresses are of the prober's two families (set_targets leaves
    out a target whose are not)."""

    name: str
    internal: IPAddr
    probe_ip: IPAddr
    ladder: tuple[Rung, ...]


def rung_bits(rungs: Iterable[Rung]) -> int:
    return sum(1 << i for i, r in enumerate(RUNGS) if r in rungs)


def bits_rungs(bits: int) -> frozenset[Rung]:
    return frozenset(r for i, r in enumerate(RUNGS) if bits & (1 << i))


ANC_SIZE = socket.CMSG_SPACE(TIMESPEC.size)


def _rx_time(anc: list[tuple[int, int, bytes]]) -> int:
    """The kernel's receive timestamp (ns, wall clock) from recvmsg's ancillary data, or 0."""
    for level, typ, data in anc:
        if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS and len(data) >= TIMESPEC.size:
            sec, nsec = TIMESPEC.unpack_from(data)
            return int(sec) * 1_000_000_000 + int(nsec)
    return 0


ARP_TABLE = "/proc/thread-self/net/arp"  # this thread's network namespace
ATF_COM = 0x2  # a complete entry
ARP_REFRESH_S = 5.0
ARP_MISS_S = 0.5


NUD_VALID = 0x02 | 0x04 | 0x08 | 0x10 | 0x40 | 0x80  # reachable, stale, delay, probe, noarp, permanent


def ndisc_table(dev: str) -> dict[str, bytes]:
    """Valid entries of the kernel's IPv6 neighbour table on `dev` (netlink: no /proc file holds
    it): address -> hardware address."""
    from pyroute2 import IPRoute

    out: dict[str, bytes] = {}
    try:
        with IPRoute() as ipr:
            idx = ipr.link_lookup(ifname=dev)
            if not idx:
                return out
            for n in ipr.get_neighbours(family=socket.AF_INET6, ifindex=idx[0]):
                dst, ll = n.get("NDA_DST"), n.get("NDA_LLADDR")
                if dst and ll and n["state"] & NUD_VALID:
                    out[str(ipaddress.ip_address(dst))] = bytes.fromhex(ll.replace(":", ""))
    except (OSError, ValueError):
        pass
    return out


def arp_table(dev: str) -> dict[str, bytes]:
    """Complete entries of the kernel's neighbour table on `dev`: address -> hardware address."""
    out: dict[str, bytes] = {}
    try:
        with open(ARP_TABLE) as f:
            next(f, None)
            for line in f:
                cols = line.split()
                if len(cols) >= 6 and cols[5] == dev and int(cols[2], 16) & ATF_COM:
                    out[cols[0]] = bytes.fromhex(cols[3].replace(":", ""))
    except (OSError, ValueError):
        pass
    return out


class Prober:
    """Probes the private rungs of every target; `path_state()` is what the plan reads and
    `on_change` is called (from the prober thread) when it changed."""

    def __init__(self, private_if: str, internal: IPAddr, probe_ip: IPAddr,
                 local_rungs: Iterable[Rung], on_change: Callable[[], None] = lambda: None,
                 tuning: ProbeTuning | None = None, port: int = PROBE_PORT) -> None:
        self.private_if = private_if
        self.internal = internal
        self.probe_ip = probe_ip
        self.underlay = internal.version  # the outer family of udp and ipip probes
        self.pods = probe_ip.version      # the family of the packet inside
        self.port = port
        self.on_change = on_change
        self.chooser = Chooser(local_rungs, tuning)
        self._lock = threading.Lock()
        self._targets: dict[str, Target] = {}
        self._by_internal: dict[bytes, Target] = {}
        # When each (peer, kind) probes next, and a heap of the same (stale heap items are skipped:
        # an item counts only while its time equals the dict's).
        self._next: dict[tuple[str, str], float] = {}
        self._heap: list[tuple[float, str, str]] = []
        self._touched: set[str] = set()  # peers observed since the last tick
        # seq -> (peer, kind, sent, nonce), oldest first (sent times only grow)
        self._pending: dict[int, tuple[str, str, float, int]] = {}
        self._last_tick = 0.0
        self._seq = 0
        self._arp: dict[str, bytes] = {}
        self._arp_until = 0.0  # the table is read again after this ...
        self._arp_miss_until = 0.0  # ... or, for a peer missing from it, after this
        self._sent_ns: dict[int, int] = {}  # seq -> wall-clock send time (kernel timestamps are wall-clock)
        # (peer, kind) -> [sent, answered, last RTT s, monotonic time of the last answer] (status only)
        self._tally: dict[tuple[str, str], list[float]] = {}
        self._waiters: dict[int, tuple[threading.Event, list[float | None]]] = {}  # probe_once's, by seq
        self._rx_ns = 0  # the kernel's receive time of the packet being handled
        self._rng = random.Random(os.urandom(32))  # nonces: unguessable off-path, no syscall per probe
        self._headers: dict[tuple[bytes, bytes], bytes] = {}  # (src, dst) -> inner IPv4 + UDP headers (IPv4 pods)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe()
        self.sent = 0
        self.received = 0
        self._clock: int | None = None  # the prober thread's CPU clock
        self._udp = self._pkt = self._ipip = None  # type: Any
        self._my_mac = b"\0" * 6

    # --- life cycle ---------------------------------------------------------------------------

    def start(self) -> None:
        af = socket.AF_INET6 if self.underlay == 6 else socket.AF_INET
        self._udp = socket.socket(af, socket.SOCK_DGRAM)
        self._udp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        self._udp.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self._udp.bind((str(self.internal), self.port))
        self._udp.setblocking(False)
        # ETH_P_ALL: a tap, which sees frames before tc ingress (a protocol-bound socket sees them
        # after, and the fast path decapsulates IP-in-IP there).
        self._pkt = open_tap(self.private_if, packet_filter(self.probe_ip.packed, self.internal.packed, self.port),
                             RCVBUF)
        self._pkt.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self._my_mac = self._pkt.getsockname()[4]
        # The outer header around a pod packet of our pods' version: 4 (IPv4) or 41 (IPv6).
        self._ipip = socket.socket(af, socket.SOCK_RAW, IPIP_PROTO[self.pods])
        _attach_filter(self._ipip, DROP_ALL)  # send only: IP-in-IP arrives on the tap
        self._ipip.bind((str(self.internal), 0))
        self._ipip.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="prober", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=5)
        for s in (self._udp, self._pkt, self._ipip):
            if s is not None:
                s.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def set_targets(self, targets: Sequence[Target]) -> None:
        """Probe these peers (and no others); a target whose private address is not of this
        prober's underlay family, or whose probe address is not of its pods' family, is left out
        (logged): no probe of ours could reach it."""
        fits = [t for t in targets if t.internal.version == self.underlay and t.probe_ip.version == self.pods]
        for t in targets:
            if t not in fits:
                log.info("probe: %s left out: %s / %s is not IPv%d / IPv%d", t.name, t.internal, t.probe_ip,
                         self.underlay, self.pods)
        targets = fits
        with self._lock:
            self._targets = {t.name: t for t in targets}
            self._by_internal = {t.internal.packed: t for t in targets}
            self.chooser.set_peers({t.name: t.ladder for t in targets}, time.monotonic())
            self._reschedule(time.monotonic(), spread=True)
            self._tally = {k: v for k, v in self._tally.items() if k[0] in self._targets}
        os.write(self._wake_w, b"x")

    def set_local_rungs(self, rungs: Iterable[Rung]) -> None:
        """What this node can send and receive (the datapath may gain encapsulations later)."""
        with self._lock:
            self.chooser.local_rungs = frozenset(rungs)
            self.chooser.set_peers({t.name: t.ladder for t in self._targets.values()}, time.monotonic())
            self._reschedule(time.monotonic(), spread=True)

    @property
    def cpu_s(self) -> float:
        """CPU time the prober thread has used (syscalls included), read from outside it."""
        if self._clock is None:
            return 0.0
        try:
            return time.clock_gettime(self._clock)
        except OSError:
            return 0.0

    def path_state(self) -> PathState:
        with self._lock:
            return self.chooser.path_state()

    def changes(self) -> list[Change]:
        with self._lock:
            return list(self.chooser.changes)

    def status(self) -> ProbeStatus:
        """The counters and every pair's verdicts, each kind with its tally (sent, answered, last
        RTT and the last answer's age)."""
        with self._lock:
            pairs = self.chooser.status()
            now = time.monotonic()
            for (peer, kind), (sent, answered, rtt, at) in self._tally.items():
                pair = pairs.get(peer)
                if pair is not None and kind in pair.probes:
                    pair.probes[kind] = dataclasses.replace(
                        pair.probes[kind], sent=int(sent), answered=int(answered),
                        last_rtt_ms=round(rtt * 1000, 3) if answered else None,
                        last_reply_age_s=round(now - at, 3) if answered else None)
            return ProbeStatus(self.port, tuple(sorted(self.chooser.local_rungs, key=RUNGS.index)), self.sent,
                               self.received, round(self.cpu_s, 3), pairs)

    def probe_once(self, peer: str, kind: str, timeout: float | None = None) -> float | None:
        """Send one probe of `kind` to `peer` now and wait for its answer: the round trip in
        seconds, or None when none came within `timeout` (default: the tuning's). It counts as
        one of the pair's probes (the chooser sees it too). KeyError: the peer is not probed on
        that kind."""
        wait = self.chooser.tuning.timeout if timeout is None else timeout
        done = threading.Event()
        box: list[float | None] = [None]
        with self._lock:
            t, pair = self._targets.get(peer), self.chooser.pairs.get(peer)
            if t is None or pair is None or kind not in pair.kinds:
                raise KeyError(f"{peer} is not probed on {kind}")
            self._probe(t, kind, time.monotonic())
            seq = self._seq
            self._waiters[seq] = (done, box)
        os.write(self._wake_w, b"x")
        done.wait(wait)
        with self._lock:
            self._waiters.pop(seq, None)
        return box[0]

    # --- the loop -----------------------------------------------------------------------------

    def _run(self) -> None:
        socks = [self._udp, self._pkt, self._wake_r]
        self._clock = time.pthread_getcpuclockid(threading.get_ident())
        last = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now - last < COALESCE_S:
                time.sleep(COALESCE_S - (now - last))
                now = time.monotonic()
            last = now
            changed = False
            # Answers that arrived while this thread was not running are read before any probe
            # is declared lost: a busy machine delays us, not the fabric.
            self._drain_udp()
            self._drain_pkt()
            with self._lock:
                self._expire(now)
                self._send_due(now)
                if self._touched and now - self._last_tick >= TICK_S or self._hold_due(now):
                    changed = self.chooser.tick(now, self._touched if not self._hold_due(now) else None)
                    self._touched = set()
                    self._last_tick = now
                wait = self._next_wakeup(now)
            if changed:
                try:
                    self.on_change()
                except Exception as e:  # noqa: BLE001 - the prober must keep going
                    log.warning("path change callback: %s", e)
            try:
                ready, _, _ = select.select(socks, [], [], wait)
            except (OSError, ValueError):
                return  # closed under us by stop()
            for s in ready:
                if s is self._wake_r:
                    os.read(self._wake_r, 64)
                elif s is self._udp:
                    self._drain_udp()
                else:
                    self._drain_pkt()

    def _next_wakeup(self, now: float) -> float:
        """Sleep until a probe is due, one times out, a hold runs out or observations wait for a
        tick (an idle prober does not wake for nothing: its cost is per probe)."""
        at = self._heap[0][0] if self._heap else now + 1.0
        oldest = next(iter(self._pending.values()), None)
        if oldest is not None:
            at = min(at, oldest[2] + self.chooser.tuning.timeout)
        hold = self.chooser.next_deadline()
        if hold is not None:
            at = min(at, hold)
        if self._touched:
            at = min(at, self._last_tick + TICK_S)
        return max(0.0, min(at - now, 1.0))

    def _hold_due(self, now: float) -> bool:
        hold = self.chooser.next_deadline()
        return hold is not None and now >= hold

    def _schedule(self, key: tuple[str, str], at: float) -> None:
        """Probe (peer, kind) at `at`, or earlier if it already was to be."""
        cur = self._next.get(key)
        if cur is not None and cur <= at:
            return
        self._next[key] = at
        heapq.heappush(self._heap, (at, key[0], key[1]))

    def _postpone(self, key: tuple[str, str], at: float) -> None:
        """Probe (peer, kind) at `at` even if it was to be sooner."""
        if key in self._next:
            self._next[key] = at
            heapq.heappush(self._heap, (at, key[0], key[1]))

    def _reschedule(self, now: float, spread: bool = False) -> None:
        """Every (peer, kind) the chooser has, not yet scheduled: first probes spread over one
        interval (no burst of N probes at once); keys of peers gone are dropped."""
        live = {(name, kind) for name, p in self.chooser.pairs.items() for kind in p.kinds}
        for key in [k for k in self._next if k not in live]:
            del self._next[key]
        n = max(1, len(live))
        for i, key in enumerate(sorted(live - self._next.keys())):
            self._schedule(key, now + (self.chooser.tuning.interval * i / n if spread else 0.0))

    def _expire(self, now: float) -> None:
        timeout = self.chooser.tuning.timeout
        while self._pending:
            seq, (peer, kind, sent, _) = next(iter(self._pending.items()))
            if now - sent < timeout:
                return
            del self._pending[seq]
            self._sent_ns.pop(seq, None)
            self.chooser.lost(peer, kind, now)
            p = self.chooser.pairs.get(peer)
            if p is None or kind not in p.kinds:
                continue
            # A loss makes every kind of the pair probe fast now (Chooser.due): stand-by kinds
            # scheduled seconds ahead are pulled in, so their verdicts are fresh if the rung goes.
            self._touched.add(peer)
            for k in p.kinds:
                self._schedule((peer, k), now + self.chooser.due(peer, k))

    def _send_due(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            at, name, kind = heapq.heappop(heap)
            key = (name, kind)
            if self._next.get(key) != at:
                continue  # rescheduled or gone
            del self._next[key]
            if name not in self._targets or name not in self.chooser.pairs:
                continue
            self._probe(self._targets[name], kind, now)
            self._schedule(key, now + self.chooser.due(name, kind))

    # --- packets ------------------------------------------------------------------------------

    def _payload(self, kind: str, typ: int, seq: int, nonce: int, t_ns: int, choice: Rung | None) -> bytes:
        version = VERSION6 if self.underlay == 6 else VERSION
        return PAYLOADS[version].pack(MAGIC, version, typ, PROBE_KINDS.index(kind), 0, seq, nonce, t_ns,
                                      self.internal.packed, rung_bits(self.chooser.local_rungs),
                                      RUNGS.index(choice) if choice in RUNGS else NO_CHOICE)

    def _probe(self, t: Target, kind: str, now: float) -> None:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        nonce = self._rng.getrandbits(64)
        p = self.chooser.pairs.get(t.name)
        choice = self.chooser.own_choice(p) if p is not None else None
        payload = self._payload(kind, REQUEST, self._seq, nonce, time.monotonic_ns(), choice)
        # Stamped before sending: on a fast fabric the kernel may receive the answer before the
        # send returns, and its receive stamp must not precede this one.
        self._sent_ns[self._seq] = time.time_ns()
        try:
            self._send(kind, t.internal.packed, self._peer_mac(t, now) if kind == "direct" else None,
                       self.probe_ip.packed, t.probe_ip.packed, payload)
        except OSError as e:
            log.debug("probe %s to %s: %s", kind, t.name, e)
        self._pending[self._seq] = (t.name, kind, now, nonce)
        self.sent += 1
        self._tally.setdefault((t.name, kind), [0, 0, 0.0, 0.0])[0] += 1

    def _inner(self, src_pod: bytes, dst_pod: bytes, payload: bytes) -> bytes:
        """The pod-addressed UDP packet around `payload`. IPv4: every probe has the same length
        and no UDP checksum, so the headers are built once per pair; IPv6 needs the checksum."""
        if self.pods == 6:
            return pod_packet(src_pod, dst_pod, self.port, self.port, payload)
        hdr = self._headers.get((src_pod, dst_pod))
        if hdr is None:
            hdr = pod_packet(src_pod, dst_pod, self.port, self.port, payload)[:28]
            if len(self._headers) > 4 * len(self._targets) + 64:
                self._headers.clear()
            self._headers[(src_pod, dst_pod)] = hdr
        return hdr + payload

    def _send(self, kind: str, peer_internal: bytes, mac: bytes | None, src_pod: bytes, dst_pod: bytes,
              payload: bytes) -> None:
        inner = self._inner(src_pod, dst_pod, payload)
        peer = str(ipaddress.ip_address(peer_internal))
        if kind == "direct":
            if mac is None:
                return  # no neighbour: the probe is lost, as the rung's packets would be
            eth_type = ETH_TYPE[self.pods]
            self._pkt.sendto(ETH.pack(mac, self._my_mac, eth_type) + inner, (self.private_if, eth_type))
        elif kind == "udp":
            dgram = VXLAN.pack(VXLAN_FLAGS, 0) + INNER_ETH[self.pods] + inner
            self._udp.sendto(dgram, (peer, self.port))
        else:
            self._ipip.sendto(inner, (peer, 0))

    def _peer_mac(self, t: Target, now: float) -> bytes | None:
        """The MAC of the peer's private address on the private NIC, from the kernel's neighbour
        table (read whole at most every ARP_REFRESH_S; the udp probes to that address keep the
        entry fresh). None when the peer is not an on-link neighbour: then no direct packet could
        reach it either."""
        if now >= self._arp_until or (str(t.internal) not in self._arp and now >= self._arp_miss_until):
            self._arp = (ndisc_table if self.underlay == 6 else arp_table)(self.private_if)
            self._arp_until = now + ARP_REFRESH_S
            self._arp_miss_until = now + ARP_MISS_S
        return self._arp.get(str(t.internal))

    def _drain_udp(self) -> None:
        while True:
            try:
                data, anc, _, addr = self._udp.recvmsg(MAX_FRAME, ANC_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            self._rx_ns = _rx_time(anc)
            pkt = parse_ip(data[VXLAN.size + ETH.size:])
            if pkt is None or pkt[0] != socket.IPPROTO_UDP:
                continue
            _, src, dst, l4 = pkt
            self._handle("udp", ipaddress.ip_address(addr[0]).packed, src, dst, l4[UDP.size:], None)

    def _drain_pkt(self) -> None:
        while True:
            try:
                frame, anc, _, addr = self._pkt.recvmsg(MAX_FRAME, ANC_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            self._rx_ns = _rx_time(anc)
            if addr[2] == PACKET_OUTGOING:
                continue
            pkt = parse_ip(frame[ETH.size:])  # the filter let in only probe-shaped frames
            if pkt is None:
                continue
            proto, src, dst, rest = pkt
            if proto == socket.IPPROTO_UDP:
                self._handle("direct", None, src, dst, rest[UDP.size:], frame[6:12])
            elif proto == IPIP_PROTO[self.pods]:
                inner = parse_ip(rest)
                if inner is not None and inner[0] == socket.IPPROTO_UDP:
                    self._handle("ipip", src, inner[1], inner[2], inner[3][UDP.size:], None)

    def _handle(self, kind: str, outer_src: bytes | None, src: bytes, dst: bytes, payload: bytes,
                src_mac: bytes | None) -> None:
        layout = PAYLOADS.get(payload[4]) if len(payload) > 4 else None
        if layout is None or len(payload) < layout.size:
            return
        magic, _, typ, kind_i, _, seq, nonce, t_ns, sender, caps, choice_i = layout.unpack_from(payload)
        if magic != MAGIC or kind_i >= len(PROBE_KINDS) or PROBE_KINDS[kind_i] != kind:
            return
        if outer_src is not None and outer_src != sender:
            return  # the outer source must be the node the probe says it is from
        now = time.monotonic()
        with self._lock:
            t = self._by_internal.get(sender)
            if t is None or src != t.probe_ip.packed or dst != self.probe_ip.packed:
                return  # not a peer of ours, or not for us: never answered, never counted
            self.received += 1
            if typ == REQUEST:
                p = self.chooser.pairs.get(t.name)
                if p is not None and kind in p.kinds:
                    # The peer probes this kind: its probe is our evidence too, and our own next
                    # probe of it waits (unless we are probing fast after a loss).
                    self.chooser.reply(t.name, kind, None, now, bits_rungs(caps),
                                       RUNGS[choice_i] if choice_i < len(RUNGS) else None)
                    self._touched.add(t.name)
                    if not p.kinds[kind].fast:
                        self._postpone((t.name, kind), now + LISTEN_FACTOR * self.chooser.due(t.name, kind))
                choice = self.chooser.own_choice(p) if p is not None else None
                reply = self._payload(kind, REPLY, seq, nonce, t_ns, choice)
                try:
                    if kind == "direct":
                        self._send(kind, sender, src_mac, dst, src, reply)
                    else:
                        self._send(kind, sender, None, dst, src, reply)
                except OSError as e:
                    log.debug("probe reply %s to %s: %s", kind, t.name, e)
                return
            pend = self._pending.get(seq)
            if typ != REPLY or pend is None or pend[0] != t.name or pend[1] != kind or pend[3] != nonce:
                return
            del self._pending[seq]
            sent_ns = self._sent_ns.pop(seq, None)
            rtt = (self._rx_ns - sent_ns) / 1e9 if sent_ns is not None and self._rx_ns else now - pend[2]
            tally = self._tally.setdefault((t.name, kind), [0, 0, 0.0, 0.0])
            tally[1:] = [tally[1] + 1, rtt, now]
            waiter = self._waiters.pop(seq, None)
            if waiter is not None:
                waiter[1][0] = rtt
                waiter[0].set()
            self.chooser.reply(t.name, kind, rtt, now, bits_rungs(caps),
                               RUNGS[choice_i] if choice_i < len(RUNGS) else None)
            self._touched.add(t.name)
            self._schedule((t.name, kind), pend[2] + self.chooser.due(t.name, kind))
