"""Python mirror of bpf/meshctl_maps.h: byte layouts of every pinned map, and their codecs.

Keep this file and the header in step; tests/datapath compare them through bcc's view of the
compiled structs, and LAYOUT_VERSION must equal MC_LAYOUT_VERSION.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from meshctl.mesh.model import IPAddress, IPNetwork
from meshctl.mesh.plan import FastPathEntry

LAYOUT_VERSION = 1

ROUTES_MAX = 131072
PODS_MAX = 16384
FLOWS_MAX = 65536
MARK = 0x00100000

FAMILY_V4 = 4
FAMILY_V6 = 6

ACTIONS = {"local": 1, "direct": 2, "tunnel": 3}
ACTION_NAMES = {v: k for k, v in ACTIONS.items()}

# Counter slots, in the header's order (MC_C_*).
COUNTERS = ("direct", "tunnel", "local", "pass", "flow", "error", "peer", "tracked")

CFG_LAYOUT = 0
CFG_SOURCE_HASH = 1
CFG_MARK = 2
CFG_CLSACT = 3
CONFIG_SLOTS = 8

ROUTE_KEY = struct.Struct("<II16s")        # prefixlen (32 family bits + address bits), family, addr
ROUTE_VALUE = struct.Struct("<IIII16s")    # action, ifindex, nh_family, pad, nexthop
POD_KEY = struct.Struct("<I16s")           # family, addr
POD_VALUE = struct.Struct("<II")           # ifindex, pad
FLOW4_KEY = struct.Struct("<4s4s2s2sB3x")    # saddr, daddr, sport, dport (network order), proto
FLOW6_KEY = struct.Struct("<16s16s2s2sB3x")  # the same for IPv6
FLOW_VALUE = struct.Struct("<Q")           # created_ns
COUNTER = struct.Struct("<QQ")             # packets, bytes
CONFIG_VALUE = struct.Struct("<Q")
U32 = struct.Struct("<I")

# Map name (as pinned) -> (key size, value size), for checking a pinned map before trusting it.
MAP_SIZES = {
    "routes": (ROUTE_KEY.size, ROUTE_VALUE.size),
    "pods": (POD_KEY.size, POD_VALUE.size),
    "flows4": (FLOW4_KEY.size, FLOW_VALUE.size),
    "flows6": (FLOW6_KEY.size, FLOW_VALUE.size),
    "counters": (U32.size, COUNTER.size),
    "config": (U32.size, CONFIG_VALUE.size),
}


def _family(version: int) -> int:
    return FAMILY_V4 if version == 4 else FAMILY_V6


def route_key(prefix: IPNetwork) -> bytes:
    return ROUTE_KEY.pack(32 + prefix.prefixlen, _family(prefix.version), prefix.network_address.packed)


_ROUTE_KEY4 = struct.Struct("<III12x")  # the IPv4 form of ROUTE_KEY, address as a network-order u32


def route_table(entries: Iterable[FastPathEntry], ifindex: int) -> dict[bytes, bytes]:
    """The routes map the plan's entries call for (`ifindex`: the private NIC, for direct ones).

    Written for speed (the agent re-encodes the whole plan on each sync): it reads the ipaddress
    objects' slots (_version, _prefixlen, _ip: stable since Python 3.3) instead of their
    properties, and encodes each distinct (action, next hop) value once."""
    k4, k6, htonl = _ROUTE_KEY4.pack, ROUTE_KEY.pack, socket.htonl
    values: dict[tuple[str, int, int], bytes] = {}
    out: dict[bytes, bytes] = {}
    for e in entries:
        p: Any = e.prefix  # read through its slots, see above
        if p._version == 4:
            key = k4(32 + p._prefixlen, FAMILY_V4, htonl(p.network_address._ip))
        else:
            key = k6(32 + p._prefixlen, FAMILY_V6, p.network_address.packed)
        nh: Any = e.nexthop
        vk = (e.action, 0, 0) if nh is None else (e.action, nh._version, nh._ip)
        v = values.get(vk)
        if v is None:
            v = values[vk] = route_value(e.action, ifindex if e.action == "direct" else 0, nh)
        out[key] = v
    return out


def route_value(action: str, ifindex: int, nexthop: IPAddress | None) -> bytes:
    if nexthop is None:
        return ROUTE_VALUE.pack(ACTIONS[action], ifindex, 0, 0, b"")
    return ROUTE_VALUE.pack(ACTIONS[action], ifindex, _family(nexthop.version), 0, nexthop.packed)


def _addr(family: int, raw: bytes) -> IPAddress:
    return ipaddress.IPv4Address(raw[:4]) if family == FAMILY_V4 else ipaddress.IPv6Address(raw)


@dataclass(frozen=True)
class RouteEntry:
    prefix: IPNetwork
    action: str
    ifindex: int
    nexthop: IPAddress | None


def decode_route(key: bytes, value: bytes) -> RouteEntry:
    plen, fam, addr = ROUTE_KEY.unpack(key)
    action, ifindex, nh_fam, _, nh = ROUTE_VALUE.unpack(value)
    net = ipaddress.ip_network((_addr(fam, addr), plen - 32))
    return RouteEntry(net, ACTION_NAMES.get(action, f"unknown({action})"), ifindex,
                      _addr(nh_fam, nh) if nh_fam else None)


def pod_key(ip: IPAddress) -> bytes:
    return POD_KEY.pack(_family(ip.version), ip.packed)


def pod_value(ifindex: int) -> bytes:
    return POD_VALUE.pack(ifindex, 0)


def decode_pod(key: bytes, value: bytes) -> tuple[IPAddress, int]:
    fam, addr = POD_KEY.unpack(key)
    return _addr(fam, addr), POD_VALUE.unpack(value)[0]


def flow_key(proto: int, src: IPAddress, sport: int, dst: IPAddress, dport: int) -> bytes:
    """A key of flows4 (IPv4) or flows6."""
    st = FLOW4_KEY if src.version == 4 else FLOW6_KEY
    return st.pack(src.packed, dst.packed, sport.to_bytes(2, "big"), dport.to_bytes(2, "big"), proto)


def decode_flow(key: bytes) -> dict[str, object]:
    st = FLOW4_KEY if len(key) == FLOW4_KEY.size else FLOW6_KEY
    saddr, daddr, sport, dport, proto = st.unpack(key)
    return {"proto": proto, "src": str(ipaddress.ip_address(saddr)), "sport": int.from_bytes(sport, "big"),
            "dst": str(ipaddress.ip_address(daddr)), "dport": int.from_bytes(dport, "big")}
