# SPDX-License-Identifier: Apache-2.0
"""The `clusterset.local` DNS server of the cluster-mesh cache (`meshctl clustermesh cache --mcs
--dns-addr`): UDP and TCP on one address, answers from the zone the Multi-Cluster Services
controller hands it (mesh.mcs.answer decides; this only speaks the wire format, with dnslib).
CoreDNS forwards the zone to it (docs/clustermesh.md shows the stanza).

The zone is swapped by reference (`set_zone`), so a question is answered from one zone, never a
half-built one. Every answer is authoritative, with the zone's SOA in the authority section of a
negative answer (its minimum, DNS_TTL, bounds how long a resolver caches an NXDOMAIN). A UDP
answer that does not fit the client's size (512 bytes, or its EDNS size) is sent truncated (TC),
and the client asks again over TCP.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import struct
import threading
from typing import Any

from dnslib import AAAA, QTYPE, RCODE, RR, SOA, SRV, A, DNSRecord

from meshctl.http_serving import SleepsWhenIdle
from meshctl.mesh.mcs import DNS_TTL, ZONE, DnsAnswer, Srv, Zone, answer

log = logging.getLogger("meshctl.clusterset.dns")

_RCODES = {"NOERROR": RCODE.NOERROR, "NXDOMAIN": RCODE.NXDOMAIN, "REFUSED": RCODE.REFUSED}


def reply_to(data: bytes, zone: Zone, max_size: int | None = None) -> bytes | None:
    """The wire answer to one query, or None for what is not a query (nothing is sent back).
    `max_size`: truncate above it (UDP); None: never (TCP)."""
    try:
        req = DNSRecord.parse(data)
    except Exception:  # noqa: BLE001 - dnslib raises its own errors (and struct's) on garbage
        return None
    if req.header.qr or not req.questions:
        return None
    reply = req.reply(ra=0, aa=1)
    q = req.questions[0]
    qname = str(q.qname)
    got: DnsAnswer = answer(zone, qname, QTYPE.get(q.qtype, str(q.qtype)))
    reply.header.rcode = _RCODES[got.rcode]
    for r in got.records:
        rdata: Any
        if isinstance(r.data, Srv):
            rdata = SRV(r.data.priority, r.data.weight, r.data.port, r.data.target + ".")
        else:
            rdata = A(str(r.data)) if r.type == "A" else AAAA(str(r.data))
        reply.add_answer(RR(r.name + ".", getattr(QTYPE, r.type), rdata=rdata, ttl=r.ttl))
    if got.apex_soa:
        reply.add_answer(_soa(zone))
    elif got.soa:
        reply.add_auth(_soa(zone))
    wire: bytes = reply.pack()
    if max_size is not None:
        edns = next((o for o in req.ar if o.rtype == QTYPE.OPT), None)
        limit = max(512, min(int(edns.rclass), 4096)) if edns is not None else 512
        if len(wire) > min(limit, max_size):
            reply.rr, reply.auth = [], []
            reply.header.tc = 1
            wire = reply.pack()
    return wire


class AnswerMemo:
    """The wire answers given from one zone, by the question's bytes after its ID: a name asked
    again (every pod of a Deployment asks the same) costs a dict lookup and the ID copied in. A new
    zone (another object) forgets them all; at most `size` are kept."""

    def __init__(self, size: int = 10_000) -> None:
        self.size = size
        self._zone: Zone | None = None
        self._answers: dict[tuple[bytes, int], bytes | None] = {}

    def reply(self, data: bytes, zone: Zone, max_size: int | None = 4096) -> bytes | None:
        if zone is not self._zone:
            self._zone, self._answers = zone, {}
        key = (data[2:], max_size or 0)
        if key in self._answers:
            out = self._answers[key]
            return data[:2] + out[2:] if out is not None and len(data) >= 2 else None
        out = reply_to(data, zone, max_size)
        if len(self._answers) >= self.size:
            self._answers.clear()
        self._answers[key] = out
        return out


def _soa(zone: Zone) -> RR:
    return RR(ZONE + ".", QTYPE.SOA, ttl=DNS_TTL,
              rdata=SOA(f"ns.dns.{ZONE}.", f"hostmaster.{ZONE}.", (zone.serial, 60, 10, 3600, DNS_TTL)))


class ClusterSetDns:
    """The server on `host:port` (port 0: any free one, see `port`)."""

    def __init__(self, host: str, port: int) -> None:
        self.zone = Zone()
        self.queries = 0
        self._memo = AnswerMemo()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._udp = socket.socket(family, socket.SOCK_DGRAM)
        self._udp.bind((host, port))
        self.port = self._udp.getsockname()[1]
        server = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                server._serve_tcp(self.request)

        class Tcp(SleepsWhenIdle, socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True
            address_family = family

        self._tcp = Tcp((host, self.port), Handler)
        self._threads: list[threading.Thread] = []

    def set_zone(self, zone: Zone) -> None:
        self.zone = zone

    def start(self) -> None:
        self._threads = [threading.Thread(target=self._serve_udp, name="dns-udp", daemon=True),
                         threading.Thread(target=self._tcp.serve_forever,
                                          name="dns-tcp", daemon=True)]
        for t in self._threads:
            t.start()
        log.info("clusterset.local DNS on port %d (udp, tcp)", self.port)

    def stop(self) -> None:
        self._tcp.shutdown()
        self._tcp.server_close()
        with contextlib.suppress(OSError):
            self._udp.shutdown(socket.SHUT_RDWR)
        self._udp.close()

    def _serve_udp(self) -> None:
        while True:
            try:
                data, peer = self._udp.recvfrom(4096)
            except OSError:
                return  # closed
            out = self._memo.reply(data, self.zone)
            self.queries += 1
            if out is not None:
                with contextlib.suppress(OSError):
                    self._udp.sendto(out, peer)

    def _serve_tcp(self, sock: socket.socket) -> None:
        sock.settimeout(5)
        with contextlib.suppress(OSError):
            while True:
                head = _read(sock, 2)
                if head is None:
                    return
                data = _read(sock, struct.unpack("!H", head)[0])
                if data is None:
                    return
                out = reply_to(data, self.zone)
                self.queries += 1
                if out is None:
                    return
                sock.sendall(struct.pack("!H", len(out)) + out)


def _read(sock: socket.socket, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf
