# SPDX-License-Identifier: Apache-2.0
"""The prober: sends probes shaped like each rung's traffic to every eligible peer, answers the
peers' probes, and feeds what it sees to the pure chooser (mesh.chooser.Chooser).

Probe kinds and their packets (all carry one 36-byte probe payload, UDP port PROBE_PORT):

    direct  an Ethernet frame out of the private NIC to the next hop of the peer's private address,
            IPv4 from this node's probe address to the peer's (the first address of each pod CIDR):
            pod-addressed like the rung's traffic, so a source/destination check drops it
    udp     a UDP datagram between the private addresses, holding a VXLAN-framed pod packet: what
            direct+vxlan and wireguard-private send (a fabric that drops UDP, or routes only some
            addresses, drops it)
    ipip    IP-in-IP between the private addresses around a pod-addressed packet (direct+ipip)

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
from typing import Any

from meshctl.defaults import PROBE_PORT
from meshctl.mesh.chooser import PROBE_KINDS, Change, Chooser, ProbeTuning
from meshctl.mesh.model import RUNGS, PathState, Rung

log = logging.getLogger("meshctl.probe")

ETH_P_IP = 0x0800
ETH_P_ALL = 0x0003
IPPROTO_IPIP = 4
PACKET_OUTGOING = 4
SO_ATTACH_FILTER = 26
MAGIC = b"MSHP"
VERSION = 1
REQUEST, REPLY = 1, 2
NO_CHOICE = 255
PAYLOAD = struct.Struct("!4sBBBBIQQ4sBB2x")  # magic, version, type, kind, flags, seq, nonce, t_ns, sender, caps, choice
UDP = struct.Struct("!HHHH")
VXLAN = struct.Struct("!BxxxI")  # flags (0x08: VNI valid), VNI << 8
VXLAN_FLAGS = 0x08
ETH = struct.Struct("!6s6sH")
INNER_ETH = ETH.pack(b"\0" * 6, b"\0" * 6, ETH_P_IP)
MAX_FRAME = 256
TICK_S = 0.05  # the chooser's rules run at most this often
RCVBUF = 1 << 20
LISTEN_FACTOR = 1.2  # a node hearing the peer's probes waits this much longer than the peer's interval
COALESCE_S = 0.05  # the loop runs at most this often: packets arriving meanwhile are handled together
SO_TIMESTAMPNS = 35  # receive timestamps from the kernel (RTTs stay exact while the loop coalesces)
TIMESPEC = struct.Struct("@qq")  # a burst of answers from a hundred peers must not overflow the sockets


def probe_address(pod_cidrs: Sequence[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> ipaddress.IPv4Address | None:
    """A node's probe address: the first address of its first IPv4 pod CIDR (probes speak IPv4
    only; a node with several IPv4 blocks is probed at the first its record lists)."""
    pod_cidr = next((c for c in pod_cidrs if c.version == 4), None)
    if pod_cidr is None or pod_cidr.num_addresses < 4:
        return None
    return ipaddress.IPv4Address(int(pod_cidr.network_address) + 1)


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


def udp(sport: int, dport: int, payload: bytes) -> bytes:
    return UDP.pack(sport, dport, 8 + len(payload), 0) + payload  # checksum 0: none (IPv4)


def packet_filter(probe_ip: bytes, internal_ip: bytes, port: int) -> bytes:
    """Classic BPF for the AF_PACKET socket: IPv4 UDP to `probe_ip`:`port` (direct probes), or
    IPv4 IP-in-IP to `internal_ip` whose inner packet is UDP to `port` (ipip probes); everything
    else stays out."""
    dst = struct.unpack("!I", probe_ip)[0]
    outer = struct.unpack("!I", internal_ip)[0]
    ld_h, ld_b, ld_w, ldx_msh, ld_h_ind, ld_b_ind = 0x28, 0x30, 0x20, 0xB1, 0x48, 0x50
    jeq, jset, ret = 0x15, 0x45, 0x06
    prog = [
        (ld_h, 0, 0, 12), (jeq, 0, 17, ETH_P_IP),         # 0-1: IPv4, else drop (19)
        (ld_b, 0, 0, 23), (jeq, 0, 7, 17),                # 2-3: UDP, else try IP-in-IP (11)
        (ld_w, 0, 0, 30), (jeq, 0, 13, dst),              # 4-5: to the probe address
        (ld_h, 0, 0, 20), (jset, 11, 0, 0x1FFF),          # 6-7: not a fragment
        (ldx_msh, 0, 0, 14), (ld_h_ind, 0, 0, 16),        # 8-9: UDP destination port
        (jeq, 8, 9, port),                                # 10: accept (19) / drop (20)
        (jeq, 0, 8, IPPROTO_IPIP),                        # 11: IP-in-IP, else drop
        (ld_w, 0, 0, 30), (jeq, 0, 6, outer),             # 12-13: to this node's private address
        (ldx_msh, 0, 0, 14), (ld_b_ind, 0, 0, 23),        # 14-15: inner protocol
        (jeq, 0, 3, 17),                                  # 16: UDP, else drop
        (ld_h_ind, 0, 0, 36), (jeq, 0, 1, port),          # 17-18: inner UDP destination port
        (ret, 0, 0, MAX_FRAME), (ret, 0, 0, 0),           # 19 accept, 20 drop
    ]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


DROP_ALL = struct.pack("HBBI", 0x06, 0, 0, 0)  # ret #0


def _attach_filter(sock: socket.socket, code: bytes) -> None:
    import ctypes

    buf = ctypes.create_string_buffer(code)
    fprog = struct.pack("HL", len(code) // 8, ctypes.addressof(buf))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, fprog)  # the kernel copies the program


@dataclass(frozen=True)
class Target:
    """A peer to probe: its plan name, private address, probe address and ladder (mesh.ladder.pair_rungs)."""

    name: str
    internal: ipaddress.IPv4Address
    probe_ip: ipaddress.IPv4Address
    ladder: tuple[Rung, ...]


def rung_bits(rungs: Iterable[str]) -> int:
    return sum(1 << i for i, r in enumerate(RUNGS) if r in rungs)


def bits_rungs(bits: int) -> frozenset[str]:
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

    def __init__(self, private_if: str, internal: ipaddress.IPv4Address, probe_ip: ipaddress.IPv4Address,
                 local_rungs: Iterable[str], on_change: Callable[[], None] = lambda: None,
                 tuning: ProbeTuning | None = None, port: int = PROBE_PORT) -> None:
        self.private_if = private_if
        self.internal = internal
        self.probe_ip = probe_ip
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
        self._headers: dict[tuple[bytes, bytes], bytes] = {}  # (src, dst) -> inner IPv4 + UDP headers
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
        self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._udp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._udp.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        self._udp.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        self._udp.bind((str(self.internal), self.port))
        self._udp.setblocking(False)
        # ETH_P_ALL: a tap, which sees frames before tc ingress (a protocol-bound socket sees them
        # after, and the fast path decapsulates IP-in-IP there).
        self._pkt = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self._pkt.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        self._pkt.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        _attach_filter(self._pkt, packet_filter(self.probe_ip.packed, self.internal.packed, self.port))
        self._pkt.bind((self.private_if, ETH_P_ALL))
        self._pkt.setblocking(False)
        self._my_mac = self._pkt.getsockname()[4]
        self._ipip = socket.socket(socket.AF_INET, socket.SOCK_RAW, IPPROTO_IPIP)
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
        with self._lock:
            self._targets = {t.name: t for t in targets}
            self._by_internal = {t.internal.packed: t for t in targets}
            self.chooser.set_peers({t.name: t.ladder for t in targets}, time.monotonic())
            self._reschedule(time.monotonic(), spread=True)
            self._tally = {k: v for k, v in self._tally.items() if k[0] in self._targets}
        os.write(self._wake_w, b"x")

    def set_local_rungs(self, rungs: Iterable[str]) -> None:
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

    def status(self) -> dict[str, Any]:
        """The counters and every pair's verdicts, each kind with its tally (sent, answered, last
        RTT and the last answer's age)."""
        with self._lock:
            pairs = self.chooser.status()
            now = time.monotonic()
            for (peer, kind), (sent, answered, rtt, at) in self._tally.items():
                probes = pairs.get(peer, {}).get("probes")
                if isinstance(probes, dict) and kind in probes:
                    probes[kind].update(sent=int(sent), answered=int(answered),
                                        last_rtt_ms=round(rtt * 1000, 3) if answered else None,
                                        last_reply_age_s=round(now - at, 3) if answered else None)
            return {"port": self.port, "local_rungs": sorted(self.chooser.local_rungs, key=RUNGS.index),
                    "sent": self.sent, "received": self.received, "cpu_s": round(self.cpu_s, 3), "pairs": pairs}

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

    def _payload(self, kind: str, typ: int, seq: int, nonce: int, t_ns: int, choice: str | None) -> bytes:
        return PAYLOAD.pack(MAGIC, VERSION, typ, PROBE_KINDS.index(kind), 0, seq, nonce, t_ns, self.internal.packed,
                            rung_bits(self.chooser.local_rungs), RUNGS.index(choice) if choice in RUNGS else NO_CHOICE)

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

    def _send(self, kind: str, peer_internal: bytes, mac: bytes | None, src_pod: bytes, dst_pod: bytes,
              payload: bytes) -> None:
        hdr = self._headers.get((src_pod, dst_pod))
        if hdr is None:  # every probe has the same length: the headers are built once per pair
            hdr = ipv4(src_pod, dst_pod, socket.IPPROTO_UDP, udp(self.port, self.port, payload))[:28]
            if len(self._headers) > 4 * len(self._targets) + 64:
                self._headers.clear()
            self._headers[(src_pod, dst_pod)] = hdr
        inner = hdr + payload
        if kind == "direct":
            if mac is None:
                return  # no neighbour: the probe is lost, as the rung's packets would be
            self._pkt.sendto(ETH.pack(mac, self._my_mac, ETH_P_IP) + inner, (self.private_if, ETH_P_IP))
        elif kind == "udp":
            dgram = VXLAN.pack(VXLAN_FLAGS, 0) + INNER_ETH + inner
            self._udp.sendto(dgram, (socket.inet_ntoa(peer_internal), self.port))
        else:
            self._ipip.sendto(inner, (socket.inet_ntoa(peer_internal), 0))

    def _peer_mac(self, t: Target, now: float) -> bytes | None:
        """The MAC of the peer's private address on the private NIC, from the kernel's neighbour
        table (read whole at most every ARP_REFRESH_S; the udp probes to that address keep the
        entry fresh). None when the peer is not an on-link neighbour: then no direct packet could
        reach it either."""
        if now >= self._arp_until or (str(t.internal) not in self._arp and now >= self._arp_miss_until):
            self._arp = arp_table(self.private_if)
            self._arp_until = now + ARP_REFRESH_S
            self._arp_miss_until = now + ARP_MISS_S
        return self._arp.get(str(t.internal))

    def _drain_udp(self) -> None:
        while True:
            try:
                data, anc, _, (src, _) = self._udp.recvmsg(MAX_FRAME, ANC_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            self._rx_ns = _rx_time(anc)
            off = VXLAN.size + ETH.size
            if len(data) < off + 28:
                continue
            ihl = (data[off] & 0xF) * 4
            inner = data[off:]
            self._handle("udp", socket.inet_aton(src), inner[12:16], inner[16:20], inner[ihl + 8:], None)

    def _drain_pkt(self) -> None:
        while True:
            try:
                frame, anc, _, addr = self._pkt.recvmsg(MAX_FRAME, ANC_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            self._rx_ns = _rx_time(anc)
            if addr[2] == PACKET_OUTGOING or len(frame) < ETH.size + 28:
                continue
            ip = frame[ETH.size:]
            ihl = (ip[0] & 0xF) * 4
            if ip[9] == socket.IPPROTO_UDP:
                self._handle("direct", None, ip[12:16], ip[16:20], ip[ihl + 8:], frame[6:12])
            elif ip[9] == IPPROTO_IPIP:
                inner = ip[ihl:]
                iihl = (inner[0] & 0xF) * 4
                self._handle("ipip", ip[12:16], inner[12:16], inner[16:20], inner[iihl + 8:], None)

    def _handle(self, kind: str, outer_src: bytes | None, src: bytes, dst: bytes, payload: bytes,
                src_mac: bytes | None) -> None:
        if len(payload) < PAYLOAD.size:
            return
        magic, ver, typ, kind_i, _, seq, nonce, t_ns, sender, caps, choice_i = PAYLOAD.unpack_from(payload)
        if magic != MAGIC or ver != VERSION or kind_i >= len(PROBE_KINDS) or PROBE_KINDS[kind_i] != kind:
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
