# SPDX-License-Identifier: Apache-2.0
"""Prefixes as the kernel's and WireGuard's tools print them, parsed from integers: a routing
table or a WireGuard device at 50,000 nodes holds 100,000 of them, and ipaddress's string parser
is most of the cost of reading one."""

from __future__ import annotations

import ipaddress
import socket

from meshctl.mesh.model import IPNetwork


def parse_prefix(text: str) -> IPNetwork:
    """`10.4.0.0/16`, `fd00::/64`, or an address alone (a host prefix, as `ip route` prints it),
    host bits masked. Raises ValueError (OSError's subclass from inet_pton included) when the
    text is not one."""
    addr, _, plen = text.partition("/")
    try:
        if ":" in addr:
            v6 = int.from_bytes(socket.inet_pton(socket.AF_INET6, addr), "big")
            return ipaddress.IPv6Network((v6, int(plen or 128)), strict=False)
        v4 = int.from_bytes(socket.inet_pton(socket.AF_INET, addr), "big")
        return ipaddress.IPv4Network((v4, int(plen or 32)), strict=False)
    except OSError as e:
        raise ValueError(f"{text!r} is not a prefix: {e}") from None
