# SPDX-License-Identifier: Apache-2.0
"""Prefixes as the kernel's and WireGuard's tools print them, parsed from integers: a routing
table or a WireGuard device at 50,000 nodes holds 100,000 of them, and ipaddress's string parser
is most of the cost of reading one."""

from __future__ import annotations

import socket

from meshctl.mesh.model import IPNetwork, network_of


def parse_prefix(text: str) -> IPNetwork:
    """`10.4.0.0/16`, `fd00::/64`, or an address alone (a host prefix, as `ip route` prints it),
    host bits masked. Raises ValueError (OSError's subclass from inet_pton included) when the
    text is not one."""
    addr, _, plen = text.partition("/")
    try:
        if ":" in addr:
            v6 = int.from_bytes(socket.inet_pton(socket.AF_INET6, addr), "big")
            return network_of(6, v6, _length(plen or "128", 128, text))
        v4 = int.from_bytes(socket.inet_pton(socket.AF_INET, addr), "big")
        return network_of(4, v4, _length(plen or "32", 32, text))
    except OSError as e:
        raise ValueError(f"{text!r} is not a prefix: {e}") from None


def _length(plen: str, most: int, text: str) -> int:
    """A prefix length in 0..most (what ipaddress's constructor checked before)."""
    if not plen.isdigit() or int(plen) > most:
        raise ValueError(f"{text!r} is not a prefix: bad prefix length")
    return int(plen)
