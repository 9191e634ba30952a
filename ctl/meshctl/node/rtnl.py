# SPDX-License-Identifier: Apache-2.0
"""Routes over one raw rtnetlink socket: many route messages per `sendmsg`, each acknowledged on
its own, and dumps the kernel filters. The calling THREAD's network namespace is the one read
and written (meshctl.setns).

Why not a subprocess or pyroute2: an agent at 50,000 nodes holds 100,000 routes, and a remote
cluster renumbering its segments replaces 10,000 of them in one pass. `ip -batch` makes a round
trip per route in a process of its own (while the agent waits), and pyroute2 builds a message
object per route; here a route is one `struct.pack`, a few hundred go to the kernel in one call,
and the kernel answers each with an acknowledgement naming its sequence number, so a refused
route is still reported on its own, with the kernel's reason.

Dumps ask the kernel to filter (NETLINK_GET_STRICT_CHK: table, protocol, type), so reading the
agent's own routes never copies the rest of the table to user space, and messages are looked at
in place: headers first, attributes only of the messages wanted.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Iterator, Sequence
from typing import NamedTuple

NETLINK_ROUTE = 0  # the netlink family of routes, addresses and links
MAIN_TABLE = 254  # RT_TABLE_MAIN
RTN_UNICAST = 1

NLMSG = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
RTA = struct.Struct("=HH")  # rtattr: length, type
U32 = struct.Struct("=I")
_U16 = struct.Struct("=H")
_ERR = struct.Struct("=i")

NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
NLM_F_REQUEST, NLM_F_ACK, NLM_F_DUMP = 0x1, 0x4, 0x300
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x100, 0x200, 0x400
NLM_F_ACK_TLVS = 0x200  # in an acknowledgement: extended-ack attributes follow
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_TABLE, RTA_VIA = 1, 4, 5, 6, 15, 18
NLMSGERR_ATTR_MSG = 1
RTNH_F_ONLINK = 4
_SOL_NETLINK, _NETLINK_CAP_ACK, _NETLINK_EXT_ACK, _NETLINK_GET_STRICT_CHK = 270, 10, 11, 12
RT_TABLE_UNSPEC = 0

# Messages per sendmsg: their acknowledgements (36 bytes each, more with a reason) must fit the
# receive buffer, or the kernel drops them.
CHUNK = 256
_RCVBUF = 1 << 20
TIMEOUT_S = 30.0  # an answer the kernel never sends (it cannot lose one it owes) must not hang the agent


def _attr(kind: int, payload: bytes) -> bytes:
    n = RTA.size + len(payload)
    return RTA.pack(n, kind) + payload + b"\0" * (-n & 3)


class Refused(NamedTuple):
    """A message the kernel refused: its errno and its extended-ack message ('' without one)."""

    errno: int
    message: str

    def __str__(self) -> str:
        return f"{os.strerror(self.errno)}: {self.message}" if self.message else os.strerror(self.errno)


class RouteForm:
    """What route requests share but their destination: kind, flags, table, protocol, scope,
    device, next hop, metric. `message(dst, dst_len)` is one request (sequence number 0:
    `Rtnl.apply` numbers them); 100,000 routes have a few hundred forms, packed once each.
    `gateway`: (its address family, its address); one of another family than the route's is sent
    as RTA_VIA (an IPv4 route through an IPv6 next hop, RFC 5549)."""

    __slots__ = ("_head", "_tail")

    def __init__(self, kind: int, flags: int, *, family: int, table: int, proto: int, scope: int,
                 rtype: int = RTN_UNICAST, rtm_flags: int = 0, oif: int | None = None,
                 gateway: tuple[int, bytes] | None = None, priority: int | None = None) -> None:
        self._head = (kind, NLM_F_REQUEST | NLM_F_ACK | flags, family, table if table < 256 else RT_TABLE_UNSPEC,
                      proto, scope, rtype, rtm_flags)
        tail = _attr(RTA_TABLE, U32.pack(table))
        if oif is not None:
            tail += _attr(RTA_OIF, U32.pack(oif))
        if gateway is not None:
            gw_family, gw = gateway
            tail += _attr(RTA_GATEWAY, gw) if gw_family == family else \
                _attr(RTA_VIA, struct.pack("=H", gw_family) + gw)
        if priority is not None:
            tail += _attr(RTA_PRIORITY, U32.pack(priority))
        self._tail = tail

    def message(self, dst: bytes, dst_len: int) -> bytes:
        kind, flags, family, table, proto, scope, rtype, rtm_flags = self._head
        body = RTMSG.pack(family, dst_len, 0, 0, table, proto, scope, rtype, rtm_flags) + _attr(RTA_DST, dst)
        body += self._tail
        return NLMSG.pack(NLMSG.size + len(body), kind, flags, 0, 0) + body


def messages(data: bytes) -> Iterator[tuple[int, int, int, int, int]]:
    """The netlink messages of one read, as (offset, length, type, flags, sequence). A header whose
    length is shorter than a header (not a message anyone can read) is yielded last, as it is: the
    caller decides what it means."""
    off = 0
    while off + NLMSG.size <= len(data):
        length, kind, flags, seq, _ = NLMSG.unpack_from(data, off)
        yield off, length, kind, flags, seq
        if length < NLMSG.size:
            return
        off += (length + 3) & ~3


class Rtnl:
    """One rtnetlink socket of the calling thread's namespace (a context manager)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        try:
            self.sock.bind((0, 0))
            for opt in (_NETLINK_CAP_ACK, _NETLINK_EXT_ACK, _NETLINK_GET_STRICT_CHK):
                self.sock.setsockopt(_SOL_NETLINK, opt, 1)
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
            self.sock.settimeout(TIMEOUT_S)
        except OSError:
            self.sock.close()
            raise
        self._seq = 0

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def apply(self, messages: Sequence[bytes]) -> dict[int, Refused]:
        """Send `messages` (from `RouteForm.message`), CHUNK per sendmsg; the index of each
        refused message -> why. The kernel handles every message of a chunk, whatever happened
        to the ones before it, before `send` returns, and answers a refused one whether or not it
        asked for an acknowledgement: so only a chunk's last message asks for one, and when that
        arrives every refusal of the chunk has (10,000 routes: 40 answers to read, not 10,000)."""
        refused: dict[int, Refused] = {}
        for start in range(0, len(messages), CHUNK):
            part = messages[start:start + CHUNK]
            base = self._seq + 1
            self._seq += len(part)
            buf = bytearray(b"".join(part))
            off = 0
            for i, m in enumerate(part):
                flags = _U16.unpack_from(buf, off + 6)[0]
                _U16.pack_into(buf, off + 6, flags | NLM_F_ACK if i == len(part) - 1 else flags & ~NLM_F_ACK)
                U32.pack_into(buf, off + 8, base + i)  # nlmsg_seq
                off += len(m)
            self.sock.send(bytes(buf))
            last = base + len(part) - 1
            for data, at, length, kind, flags, seq in self._incoming():
                if kind == NLMSG_ERROR and base <= seq <= last:
                    err = -_ERR.unpack_from(data, at + NLMSG.size)[0]
                    if err:
                        refused[start + seq - base] = Refused(err, _ext_message(data, at, length, flags))
                    if seq == last:
                        break
        return refused

    def _incoming(self) -> Iterator[tuple[bytes, int, int, int, int, int]]:
        """Every message the socket receives, as (buffer, offset, length, type, flags, sequence)."""
        while True:
            data = self.sock.recv(1 << 17)
            for off, length, kind, flags, seq in messages(data):
                if length < NLMSG.size:
                    break
                yield data, off, length, kind, flags, seq

    def dump(self, family: int, *, table: int = 0, proto: int = 0, rtype: int = 0) -> Iterator[tuple[bytes, int, int]]:
        """The routes of `family`, filtered by the kernel on what is given (0: any): each as (the
        buffer holding it, its offset, its length), to be read in place (`attributes`)."""
        self._seq += 1
        seq = self._seq
        body = RTMSG.pack(family, 0, 0, 0, table if table < 256 else RT_TABLE_UNSPEC, proto, 0, rtype, 0)
        if table >= 256:
            body += _attr(RTA_TABLE, U32.pack(table))
        self.sock.send(NLMSG.pack(NLMSG.size + len(body), RTM_GETROUTE, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + body)
        for data, off, length, kind, _, mseq in self._incoming():
            if mseq != seq:
                continue
            if kind == NLMSG_DONE:
                return
            if kind == NLMSG_ERROR:
                err = -_ERR.unpack_from(data, off + NLMSG.size)[0]
                if err:
                    raise OSError(err, f"route dump: {os.strerror(err)}")
            elif kind == RTM_NEWROUTE:
                yield data, off, length


def _ext_message(data: bytes, at: int, length: int, flags: int) -> str:
    """The extended acknowledgement's message (NLMSGERR_ATTR_MSG) of the error message at `at`."""
    if not flags & NLM_F_ACK_TLVS:
        return ""
    pos, end = at + NLMSG.size + _ERR.size + NLMSG.size, at + length  # capped: the request's header only
    while pos + RTA.size <= end:
        alen, atype = RTA.unpack_from(data, pos)
        if alen < RTA.size:
            break
        if atype == NLMSGERR_ATTR_MSG:
            return data[pos + RTA.size:pos + alen].split(b"\0", 1)[0].decode(errors="replace")
        pos += (alen + 3) & ~3
    return ""


def attributes(data: bytes, off: int, length: int) -> dict[int, bytes]:
    """The attributes of the route message at `off` (type -> payload)."""
    out: dict[int, bytes] = {}
    at, end = off + NLMSG.size + RTMSG.size, off + length
    while at + RTA.size <= end:
        alen, atype = RTA.unpack_from(data, at)
        if alen < RTA.size:
            break
        out[atype] = data[at + RTA.size:at + alen]
        at += (alen + 3) & ~3
    return out
