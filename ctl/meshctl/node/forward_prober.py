# SPDX-License-Identifier: Apache-2.0
"""The forwarding prober: whether each other member of this node's location forwards, shown the
way a leader's work is done. It sends, out of the private NIC to the member's MAC, a UDP packet
from this node's private address to this node's private address: the member's kernel must route
it back (IP forwarding, its forward hook, its route to this node), exactly as it forwards the
location's traffic into and out of WireGuard when it leads. A member whose forwarding is off
(`ip_forward` reset, a firewall's forward chain, kilo#489's leader) or that is cut off from the
private network drops it; one that forwards returns it within a millisecond. Its own traffic,
record and agent say nothing of this.

Hairpins come back on an AF_PACKET socket whose classic BPF filter lets in only UDP to this
node's address on FORWARD_PORT (the kernel itself drops the returning packet: its source is one
of its own addresses); each carries a random nonce and the member it went through, and only
members the agent named are probed. What the answers and losses mean is mesh/leaders.py's
(ForwardingJudge): this thread only sends, receives and reports the verdicts' changes.

IPv4 private addresses on an on-link private network (the member's MAC from the neighbour table)
only: a location whose members reach each other through a router (a VPC fabric) is not probed, and
its leaders stay those of the documented order.
"""

from __future__ import annotations

import logging
import os
import random
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping

from meshctl.mesh.leaders import ForwardingJudge, Judged, JudgeTuning
from meshctl.node.prober import (
    ETH,
    ETH_P_ALL,
    ETH_P_IP,
    PACKET_OUTGOING,
    _assemble,
    _attach_filter,
    _match_addr,
    arp_table,
    ipv4,
    udp,
)

log = logging.getLogger("meshctl.forwarding")

FORWARD_PORT = 51872  # UDP port of the hairpin probes (source and destination)
MAGIC = b"MSHF"
HAIRPIN = struct.Struct("!4sIQ64s")  # magic, seq, nonce, the member's name (NUL-padded)
ARP_REFRESH_S = 2.0
MAX_FRAME = 256
_LD_H, _LD_B, _JEQ, _JSET, _LDX_MSH, _LD_H_IND = 0x28, 0x30, 0x15, 0x45, 0xB1, 0x48


def hairpin_filter(own: bytes, port: int) -> bytes:
    """Classic BPF: IPv4 UDP to `own`:`port`, not a fragment; nothing else wakes the thread."""
    prog: list[tuple] = [(_LD_H, 0, 0, 12), (_JEQ, 0, "drop", ETH_P_IP),
                         (_LD_B, 0, 0, 23), (_JEQ, 0, "drop", socket.IPPROTO_UDP)]
    prog += _match_addr(30, own, "drop")
    prog += [(_LD_H, 0, 0, 20), (_JSET, "drop", 0, 0x1FFF),
             (_LDX_MSH, 0, 0, 14), (_LD_H_IND, 0, 0, 16), (_JEQ, "accept", "drop", port)]
    return _assemble(prog)


class ForwardProber:
    """Probes every member `set_members` names through itself, a hairpin every `tuning.interval`;
    `verdicts()` are the judge's, and `on_change` is called (from this thread) when one changed.
    `now` is the clock the verdicts' times are in (wall-clock seconds: reports are read by other
    nodes)."""

    def __init__(self, private_if: str, own: str, hold: float, on_change: Callable[[], None] = lambda: None,
                 tuning: JudgeTuning | None = None, port: int = FORWARD_PORT,
                 now: Callable[[], float] = time.time) -> None:
        self.private_if = private_if
        self.own = socket.inet_aton(own)
        self.port = port
        self.on_change = on_change
        self.now = now
        self.judge = ForwardingJudge(hold, tuning)
        self._lock = threading.Lock()
        self._members: dict[str, bytes] = {}  # name -> private IPv4 address (packed)
        self._pending: dict[int, tuple[str, float, int]] = {}  # seq -> (member, sent, nonce)
        self._seq = 0
        self._rng = random.Random(os.urandom(16))
        self._arp: dict[str, bytes] = {}
        self._arp_at = -1e9
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._kick: socket.socket | None = None
        self._my_mac = b"\0" * 6
        self.sent = self.received = 0

    def start(self) -> None:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        try:
            _attach_filter(s, hairpin_filter(self.own, self.port))
            s.bind((self.private_if, ETH_P_ALL))
        except OSError:
            s.close()
            raise
        s.setblocking(False)
        self._sock = s
        self._my_mac = s.getsockname()[4]
        # An ordinary UDP socket: a datagram to a member with no neighbour entry makes the kernel
        # resolve its MAC (the hairpin needs it).
        self._kick = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._kick.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="forward-prober", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for s in (self._sock, self._kick):
            if s is not None:
                s.close()

    def set_members(self, members: Mapping[str, str]) -> None:
        """Probe these members (name -> private IPv4 address), and no others."""
        with self._lock:
            self._members = {n: socket.inet_aton(a) for n, a in members.items()}
            self.judge.set_members(self._members, self.now())

    def set_hold(self, hold: float) -> None:
        with self._lock:
            self.judge.hold = hold

    def verdicts(self) -> dict[str, Judged]:
        with self._lock:
            return self.judge.verdicts()

    def _run(self) -> None:
        sock = self._sock
        assert sock is not None
        interval = self.judge.tuning.interval
        next_round = 0.0
        while not self._stop.is_set():
            t = time.monotonic()
            if t >= next_round:
                next_round = t + interval
                with self._lock:
                    self._send_round()
            try:
                wait = max(0.0, min(next_round - time.monotonic(), interval))
                ready, _, _ = select.select([sock], [], [], wait)
            except (OSError, ValueError):
                return
            if ready:
                self._drain()
            with self._lock:
                self._expire()
                changed = self.judge.tick(self.now())
            if changed:
                try:
                    self.on_change()
                except Exception as e:  # noqa: BLE001 - the prober must keep going
                    log.warning("forwarding verdict callback: %s", e)

    def _send_round(self) -> None:
        if time.monotonic() - self._arp_at >= ARP_REFRESH_S:
            self._arp = arp_table(self.private_if)
            self._arp_at = time.monotonic()
        own = self.own
        for name, addr in self._members.items():
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            nonce = self._rng.getrandbits(64)
            self._pending[self._seq] = (name, time.monotonic(), nonce)
            self.sent += 1
            mac = self._arp.get(socket.inet_ntoa(addr))
            try:
                if mac is None:
                    assert self._kick is not None
                    self._kick.sendto(b"", (socket.inet_ntoa(addr), self.port))  # resolve it; this probe is lost
                    self._arp_at = -1e9
                    continue
                payload = HAIRPIN.pack(MAGIC, self._seq, nonce, name.encode()[:64])
                frame = ETH.pack(mac, self._my_mac, ETH_P_IP) + ipv4(own, own, socket.IPPROTO_UDP,
                                                                     udp(self.port, self.port, payload), self._seq)
                assert self._sock is not None
                self._sock.send(frame)
            except OSError as e:
                log.debug("hairpin through %s: %s", name, e)

    def _drain(self) -> None:
        assert self._sock is not None
        while True:
            try:
                frame, addr = self._sock.recvfrom(MAX_FRAME)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if addr[2] == PACKET_OUTGOING or len(frame) < ETH.size + 20:
                continue
            ihl = (frame[ETH.size] & 0xF) * 4
            body = frame[ETH.size + ihl + 8:]
            if len(body) < HAIRPIN.size or frame[ETH.size + 12:ETH.size + 16] != self.own:
                continue
            magic, seq, nonce, name = HAIRPIN.unpack_from(body)
            if magic != MAGIC:
                continue
            with self._lock:
                pend = self._pending.get(seq)
                if pend is None or pend[2] != nonce or pend[0].encode()[:64] != name.rstrip(b"\0"):
                    continue
                del self._pending[seq]
                self.received += 1
                self.judge.answered(pend[0], self.now())

    def _expire(self) -> None:
        timeout = self.judge.tuning.timeout
        t = time.monotonic()
        now = self.now()
        while self._pending:
            seq, (name, sent, _) = next(iter(self._pending.items()))
            if t - sent < timeout:
                return
            del self._pending[seq]
            self.judge.lost(name, now)

    def status(self) -> dict[str, object]:
        with self._lock:
            return {"port": self.port, "sent": self.sent, "received": self.received,
                    "verdicts": {n: v.to_json() for n, v in self.judge.verdicts().items()}}
