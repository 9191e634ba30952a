# SPDX-License-Identifier: Apache-2.0
"""The lab's IP families (`lab.ip_families`) and the IPv6 addresses it derives from IPv4 ones.

`[4]` (the default) builds IPv4 networks; `[4, 6]` builds dual-stack private and public networks and
pods; `[6]` builds IPv6-only private and public networks (pods may still be dual stack).

Where a lab file gives only an IPv4 address, the lab derives the IPv6 one, so any IPv4 lab file
runs dual stack by adding `ip_families: [4, 6]`. Each derived address embeds the IPv4 one (its 32
bits in hex groups), so the two read alike:

    pod CIDR 10.42.1.0/24 of cluster id 1   -> fd42:1:a2a:100::/64    (POD_ULA, one /64 a node)
    private  10.10.1.11/24                  -> fd10:a0a:100:b::1/48   (PRIVATE_ULA: the subnet a /48,
                                                                        each node in a /64 of its own)
    public   198.51.100.10/24               -> 2001:db8:100::10/64    (PUBLIC_NET6: the same last digits)

A node's private /64 of its own is what the hetzner fabric routes to it (Hetzner hands every
server a /64); on the other fabrics the node's address is on-link in the whole /48.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from meshctl.errors import InputError
from meshctl.mesh.model import IPInterface, IPNetwork

IP_FAMILIES = ((4,), (6,), (4, 6))
DEFAULT_IP_FAMILIES = (4,)
POD_ULA = ipaddress.IPv6Network("fd42::/16")
PRIVATE_ULA = ipaddress.IPv6Network("fd10::/16")
PUBLIC_NET = ipaddress.IPv4Network("198.51.100.0/24")
PUBLIC_NET6 = ipaddress.IPv6Network("2001:db8:100::/64")
PRIVATE6_PREFIX = 48  # a derived private subnet: PRIVATE_ULA + the IPv4 subnet's 32 bits
NODE6_PREFIX = 64  # each node's own block inside it (what hetzner routes to the node)


def parse_ip_families(value: Any, path: str = "lab.ip_families") -> tuple[int, ...]:
    """`[4]`, `[6]` or `[4, 6]` (in either order); anything else names the field and the value."""
    if (isinstance(value, list) and all(type(v) is int for v in value)
            and tuple(sorted(value)) in IP_FAMILIES and len(set(value)) == len(value)):
        return tuple(sorted(value))
    raise InputError(path, value, "is not a list of IP families: [4], [6] or [4, 6]")


def pod_cidr6(cidr4: IPNetwork, cluster_id: int) -> ipaddress.IPv6Network:
    """A node's IPv6 pod CIDR derived from its IPv4 one: fd42:<cluster id>:<IPv4 network>::/64."""
    return ipaddress.IPv6Network((int(POD_ULA.network_address) | cluster_id << 96
                                  | int(cidr4.network_address) << 64, 64))


def private6(internal4: IPInterface, path: str) -> ipaddress.IPv6Interface:
    """A node's IPv6 private address derived from its IPv4 one: the subnet fd10:<IPv4 network>::/48,
    the node at ::1 of the /64 numbered by its IPv4 host bits (which must fit 16 bits)."""
    host = int(internal4.ip) - int(internal4.network.network_address)
    if host >= 1 << 16:
        raise InputError(path, str(internal4), "has more host bits than an IPv6 /48 numbers by /64 "
                         "(16): write the node's IPv6 address, or use a /16 or longer")
    net = int(subnet6(internal4.network).network_address)
    return ipaddress.IPv6Interface((net | host << 64 | 1, PRIVATE6_PREFIX))


def subnet6(subnet4: IPNetwork) -> ipaddress.IPv6Network:
    """The IPv6 side of a dual-stack lab's private subnet: fd10:<IPv4 network>::/48."""
    return ipaddress.IPv6Network((int(PRIVATE_ULA.network_address) | int(subnet4.network_address) << 80,
                                  PRIVATE6_PREFIX))


def public6(public4: ipaddress.IPv4Address) -> ipaddress.IPv6Address:
    """The public IPv6 address matching a public IPv4 one: its last octet's decimal digits as the last group."""
    last = int(public4) - int(PUBLIC_NET.network_address)
    return ipaddress.IPv6Address(f"{PUBLIC_NET6.network_address}{last}")


def own_block(address: IPInterface) -> ipaddress.IPv6Interface:
    """A node's IPv6 private address with the prefix of its own /64 (the block hetzner routes to
    that node alone)."""
    return ipaddress.IPv6Interface(f"{address.ip}/{NODE6_PREFIX}")


def family_of(address: str) -> int:
    """4 or 6: the family of an address or CIDR written as text."""
    return ipaddress.ip_interface(address).version
