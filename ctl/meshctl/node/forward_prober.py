# SPDX-License-Identifier: Apache-2.0
"""The forwarding prober: whether each other member of this node's location forwards, and (when
this node leads) whether each other location's leader it peers forwards, shown the way a leader's
work is done.

Hairpins through members. It sends, out of the private NIC to the member's MAC, a UDP packet
from this node's private address to this node's private address: the member's kernel must route
it back (IP forwarding, its forward hook, its route to this node), exactly as it forwards the
location's traffic into and out of WireGuard when it leads. A member whose forwarding is off
(`ip_forward` reset, a firewall's forward chain, kilo#489's leader) or that is cut off from the
private network drops it; one that forwards returns it within a millisecond. Its own traffic,
record and agent say nothing of this. Hairpins come back on an AF_PACKET socket whose classic BPF
filter lets in only UDP to this node's address on FORWARD_PORT (the kernel itself drops the
returning packet: its source is one of its own addresses); each carries a random nonce and the
member it went through.

Echoes. An ICMP echo to each member's private address (answered by its kernel, no forwarding:
whether this node reaches it at all), and, for each other location's leader this node peers, an
echo to that leader's private address through the tunnel (answered by the leader itself) and
echoes to up to THROUGH_TARGETS other members of its location (the leader forwards each from
WireGuard to the private network, and the member's answer back into WireGuard: what it does for
the location's traffic). A leader that answers but whose members do not is a leader that does not
forward; one that does not answer at all is down or out of reach, and is not judged. Echo replies
come back on a raw ICMP socket whose filter lets in only echo replies with this prober's
identifier; each echo carries a random nonce.

Only nodes the agent named are probed. What the answers and losses mean is mesh/leaders.py's
(LeaderWitness): this thread only sends, receives and reports the verdicts' changes. IPv4 private
addresses only; hairpins need an on-link private network (the member's MAC from the neighbour
table): a location whose members reach each other through a router (a VPC fabric) is not probed
by hairpins, and its leaders stay those of the documented order.
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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from meshctl.mesh.leaders import ForwardingReport, Judged, JudgeTuning, LeaderTarget, LeaderWitness
from meshctl.node.prober import (
    _JEQ,
    _LD_B_IND,
    _LD_H_IND,
    _LDX_MSH,
    ETH,
    ETH_P_IP,
    PACKET_OUTGOING,
    _assemble,
    _attach_filter,
    _csum,
    _match_addr,
    arp_table,
    ipv4,
    open_tap,
    udp,
)

log = logging.getLogger("meshctl.forwarding")

FORWARD_PORT = 51872  # UDP port of the hairpin probes (source and destination)
MAGIC = b"MSHF"
HAIRPIN = struct.Struct("!4sIQ64s")  # magic, seq, nonce, the member's name (NUL-padded)
ARP_REFRESH_S = 2.0
MAX_FRAME = 256
_LD_H, _LD_B, _JSET = 0x28, 0x30, 0x45
ECHO_MAGIC = b"MSHE"
ECHO = struct.Struct("!BBHHH4sIQ")  # ICMP type, code, checksum, identifier, sequence; magic, seq, nonce
ICMP_ECHO, ICMP_ECHO_REPLY = 8, 0


def hairpin_filter(own: bytes, port: int) -> bytes:
    """Classic BPF: IPv4 UDP to `own`:`port`, not a fragment; nothing else wakes the thread."""
    prog: list[tuple] = [(_LD_H, 0, 0, 12), (_JEQ, 0, "drop", ETH_P_IP),
                         (_LD_B, 0, 0, 23), (_JEQ, 0, "drop", socket.IPPROTO_UDP)]
    prog += _match_addr(30, own, "drop")
    prog += [(_LD_H, 0, 0, 20), (_JSET, "drop", 0, 0x1FFF),
             (_LDX_MSH, 0, 0, 14), (_LD_H_IND, 0, 0, 16), (_JEQ, "accept", "drop", port)]
    return _assemble(prog)


def echo_filter(ident: int) -> bytes:
    """Classic BPF for a raw ICMP socket (the packet from its IPv4 header): echo replies with
    identifier `ident`; nothing else wakes the thread."""
    return _assemble([(_LDX_MSH, 0, 0, 0), (_LD_B_IND, 0, 0, 0), (_JEQ, 0, "drop", ICMP_ECHO_REPLY),
                      (_LD_H_IND, 0, 0, 4), (_JEQ, "accept", "drop", ident)])


def echo_request(ident: int, seq: int, nonce: int) -> bytes:
    body = ECHO.pack(ICMP_ECHO, 0, 0, ident, seq & 0xFFFF, ECHO_MAGIC, seq, nonce)
    return body[:2] + struct.pack("!H", _csum(body)) + body[4:]


@dataclass
class _Round:
    """One round of echoes about one node: what has answered so far."""

    node: str
    sent: float
    own: bool = False
    through: bool | None = None  # None: no echo through it was sent


class ForwardProber:
    """Probes every member `set_targets` names through itself (a hairpin) and at its own address
    (an echo), and every other location's leader it names through the tunnel (echoes), a round
    every `tuning.interval`; `verdicts()` and `report()` are the witness's (mesh.leaders.LeaderWitness),
    and `on_change` is called (from this thread) when one changed.
    `now` is the clock the verdicts' times are in (wall-clock seconds: reports are read by other
    nodes)."""

    def __init__(self, private_if: str | None, own: str | None, hold: float,
                 on_change: Callable[[], None] = lambda: None, tuning: JudgeTuning | None = None,
                 port: int = FORWARD_PORT, now: Callable[[], float] = time.time) -> None:
        self.private_if = private_if
        self.own = socket.inet_aton(own) if own is not None else None
        self.port = port
        self.on_change = on_change
        self.now = now
        self.witness = LeaderWitness(hold, tuning)
        self._lock = threading.Lock()
        self._members: dict[str, bytes] = {}  # name -> private IPv4 address (packed)
        self._leaders: dict[str, LeaderTarget] = {}
        self._pending: dict[int, tuple[str, float, int]] = {}  # seq -> (member, sent, nonce)
        self._echoes: dict[int, tuple[int, float, int, bytes, bool]] = {}  # seq -> (round, sent, nonce, to, own)
        self._rounds: dict[int, _Round] = {}
        self._seq = 0
        self._rng = random.Random(os.urandom(16))
        self._ident = self._rng.getrandbits(16)
        self._arp: dict[str, bytes] = {}
        self._arp_at = -1e9
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None
        self._kick: socket.socket | None = None
        self._icmp: socket.socket | None = None
        self._my_mac = b"\0" * 6
        self.sent = self.received = 0

    def start(self) -> None:
        """Open the sockets (hairpins only with a private NIC and address) and start the thread;
        OSError when a socket cannot be opened."""
        try:
            if self.private_if is not None and self.own is not None:
                s = self._sock = open_tap(self.private_if, hairpin_filter(self.own, self.port))
                self._my_mac = s.getsockname()[4]
                # An ordinary UDP socket: a datagram to a member with no neighbour entry makes the
                # kernel resolve its MAC (the hairpin needs it).
                self._kick = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                self._kick.setblocking(False)
            e = self._icmp = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
            _attach_filter(e, echo_filter(self._ident))
            e.setblocking(False)
        except OSError:
            self._close()
            raise
        self._thread = threading.Thread(target=self._run, name="forward-prober", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._close()

    def _close(self) -> None:
        for s in (self._sock, self._kick, self._icmp):
            if s is not None:
                s.close()

    def set_targets(self, members: Mapping[str, str], leaders: Mapping[str, LeaderTarget] | None = None,
                    keep: Iterable[str] = ()) -> None:
        """Probe these members (name -> private IPv4 address) and other locations' leaders, and
        no others; a leader in `keep` no longer probed keeps a `bad` or `recovering` verdict."""
        with self._lock:
            self._members = {n: socket.inet_aton(a) for n, a in members.items()}
            self._leaders = dict(leaders or {})
            self.witness.set_targets(self._members, self._leaders, keep, self.now())

    def set_hold(self, hold: float) -> None:
        with self._lock:
            self.witness.set_hold(hold)

    def verdicts(self) -> dict[str, Judged]:
        with self._lock:
            return self.witness.verdicts()

    def report(self, node: str, cluster: str, at: float) -> ForwardingReport:
        with self._lock:
            return self.witness.report(node, cluster, at)

    def _run(self) -> None:
        socks = [s for s in (self._sock, self._icmp) if s is not None]
        interval = self.witness.tuning.interval
        next_round = 0.0
        while not self._stop.is_set():
            t = time.monotonic()
            if t >= next_round:
                next_round = t + interval
                with self._lock:
                    self._send_round()
            try:
                wait = max(0.0, min(next_round - time.monotonic(), interval))
                ready, _, _ = select.select(socks, [], [], wait)
            except (OSError, ValueError):
                return
            if self._sock in ready:
                self._drain()
            if self._icmp in ready:
                self._drain_echoes()
            with self._lock:
                self._expire()
                changed = self.witness.tick(self.now())
            if changed:
                try:
                    self.on_change()
                except Exception as e:  # noqa: BLE001 - the prober must keep going
                    log.warning("forwarding verdict callback: %s", e)

    def _send_round(self) -> None:
        for name, addr in self._members.items():
            self._echo_round(name, addr, [])
        for name, t in self._leaders.items():
            self._echo_round(name, socket.inet_aton(t.own), [socket.inet_aton(a) for a in t.through])
        if self._sock is None or self.own is None or self.private_if is None:
            return
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

    def _echo_round(self, node: str, own: bytes, through: list[bytes]) -> None:
        """Echoes to `node`'s own address and through it to each of `through`."""
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        rid, sent = self._seq, time.monotonic()
        self._rounds[rid] = _Round(node, sent, through=False if through else None)
        for to in (own, *through):
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            nonce = self._rng.getrandbits(64)
            self._echoes[self._seq] = (rid, sent, nonce, to, to == own)
            self.sent += 1
            try:
                assert self._icmp is not None
                self._icmp.sendto(echo_request(self._ident, self._seq, nonce), (socket.inet_ntoa(to), 0))
            except OSError as e:  # no route (yet): this echo is lost
                log.debug("echo to %s about %s: %s", socket.inet_ntoa(to), node, e)

    def _drain_echoes(self) -> None:
        assert self._icmp is not None
        while True:
            try:
                pkt = self._icmp.recv(MAX_FRAME)
            except OSError:
                return
            if len(pkt) < 20:
                continue
            ihl = (pkt[0] & 0xF) * 4
            if len(pkt) < ihl + ECHO.size:
                continue
            typ, _, _, ident, _, magic, seq, nonce = ECHO.unpack_from(pkt, ihl)
            if typ != ICMP_ECHO_REPLY or ident != self._ident or magic != ECHO_MAGIC:
                continue
            with self._lock:
                pend = self._echoes.get(seq)
                if pend is None or pend[2] != nonce or pend[3] != pkt[12:16]:
                    continue
                del self._echoes[seq]
                self.received += 1
                rnd = self._rounds.get(pend[0])
                if rnd is None:
                    continue
                if pend[4]:
                    rnd.own = True
                else:
                    rnd.through = True
                if rnd.own and rnd.through is not False:  # all it can tell: settled now
                    del self._rounds[pend[0]]
                    self.witness.echo(rnd.node, True, rnd.through, self.now())

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
                self.witness.hairpin(pend[0], True, self.now())

    def _expire(self) -> None:
        timeout = self.witness.tuning.timeout
        t = time.monotonic()
        now = self.now()
        while self._pending:
            seq, (name, sent, _) = next(iter(self._pending.items()))
            if t - sent < timeout:
                break
            del self._pending[seq]
            self.witness.hairpin(name, False, now)
        while self._echoes:
            seq, (_, sent, _, _, _) = next(iter(self._echoes.items()))
            if t - sent < timeout:
                break
            del self._echoes[seq]
        while self._rounds:
            rid, rnd = next(iter(self._rounds.items()))
            if t - rnd.sent < timeout:
                break
            del self._rounds[rid]
            self.witness.echo(rnd.node, rnd.own, rnd.through, now)

    def status(self) -> dict[str, object]:
        with self._lock:
            return {"port": self.port, "sent": self.sent, "received": self.received,
                    "verdicts": {n: v.to_json() for n, v in self.witness.verdicts().items()},
                    "reached": list(self.witness.reached())}
