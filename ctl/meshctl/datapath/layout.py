# SPDX-License-Identifier: Apache-2.0
"""Python mirror of bpf/meshctl_maps.h: byte layouts of every pinned map, and their codecs.

Keep this file and the header in step; tests/datapath compare them through the kernel's view of
the compiled maps, and the loader passes LAYOUT_VERSION to the compiler, which refuses a header of
another version. The wire constants of encapsulation (VXLAN port and VNI, VTEP MACs) are defined
here once and reach the C as cflags (`cflags()`).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from meshctl.defaults import PROBE_PORT
from meshctl.errors import MeshError
from meshctl.mesh.model import ENCAP_KINDS, EncapKind, IPAddress, IPNetwork
from meshctl.mesh.plan import Encap, FastPathEntry

LAYOUT_VERSION = 4

ROUTES_MAX = 131072
PODS_MAX = 16384
FLOWS_MAX = 65536
MARK = 0x00100000

FAMILY_V4 = 4
FAMILY_V6 = 6

ACTIONS = {"local": 1, "direct": 2, "tunnel": 3}
ACTION_NAMES = {v: k for k, v in ACTIONS.items()}
# MC_ENCAP_*: the mesh's encapsulation kinds numbered from 1 in the order of their table (0: raw).
ENCAPS: dict[EncapKind, int] = {kind: code for code, kind in enumerate(ENCAP_KINDS, start=1)}
ENCAP_NAMES = {v: k for k, v in ENCAPS.items()}

# Encapsulation on the wire (cflags of the programs, and the kernel-routes fallback's devices).
VXLAN_PORT = 4789          # IANA
VXLAN_VNI = 0x6D6573       # "mes": one VNI for the mesh
VTEP_OUI = 0x026D          # a node's VXLAN MAC: 02:6d, then 4 bytes of its private address (vtep_mac)
IPV4_HEADER = 20
IPV6_HEADER = 40
VXLAN_TAIL = 30            # UDP 8 + VXLAN 8 + inner Ethernet 14
VXLAN_OVERHEAD = IPV4_HEADER + VXLAN_TAIL   # 50: over an IPv4 underlay
IPIP_OVERHEAD = IPV4_HEADER                 # 20
VXLAN6_OVERHEAD = IPV6_HEADER + VXLAN_TAIL  # 70: over an IPv6 underlay
IPIP6_OVERHEAD = IPV6_HEADER                # 40
OVERHEAD = {"vxlan": VXLAN_OVERHEAD, "ipip": IPIP_OVERHEAD}      # outer IPv4
OVERHEAD6 = {"vxlan": VXLAN6_OVERHEAD, "ipip": IPIP6_OVERHEAD}   # outer IPv6


def overhead(kind: str, underlay: int) -> int:
    """The bytes an encapsulation of `kind` ("vxlan", "ipip") adds over an underlay of IP version
    `underlay` (4 or 6: the family of the private addresses, the outer header's)."""
    return (OVERHEAD6 if underlay == 6 else OVERHEAD)[kind]

# Counter slots, in the header's order (MC_C_*).
COUNTERS = ("direct", "tunnel", "local", "pass", "flow", "error", "peer", "tracked", "encap", "decap", "too_big",
            "translated")

CFG_LAYOUT = 0
CFG_SOURCE_HASH = 1
CFG_MARK = 2
CFG_CLSACT = 3
CFG_PRIVATE4 = 4
CFG_PRIVATE_MTU = 5  # read by the programs only where the kernel has no bpf_check_mtu
CFG_PRIVATE6 = 8     # and 9: the private IPv6 address, bytes 0-7 and 8-15
CFG_XLATE = 10       # 1: the xlate map holds the cluster's global ranges
CONFIG_SLOTS = 11

ROUTE_KEY = struct.Struct("<II16s")        # prefixlen (32 family bits + address bits), family, addr
# action, ifindex, nh_family, encap, outer_family, flags, pad, nexthop, outer_src, outer_dst
ROUTE_VALUE = struct.Struct("<IIIBBBx16s16s16s")
RT_TRANSLATE = 1  # flags: the prefix is another cluster's and this one has global ranges (FastPathEntry.translate)
# The xlate map (meshctl_maps.h): one slot per family (XLATE_SLOT): prefix length (0: none), pad,
# the pod range's and the global range's first addresses.
XLATE_VALUE = struct.Struct("<II16s16s")
XLATE_SLOT = {4: 0, 6: 1}
POD_KEY = struct.Struct("<I16s")           # family, addr
POD_VALUE = struct.Struct("<II")           # ifindex, pad
FLOW4_KEY = struct.Struct("<4s4s2s2sB3x")    # saddr, daddr, sport, dport (network order), proto
FLOW6_KEY = struct.Struct("<16s16s2s2sB3x")  # the same for IPv6
FLOW_VALUE = struct.Struct("<Q")           # created_ns
COUNTER = struct.Struct("<QQ")             # packets, bytes
CONFIG_VALUE = struct.Struct("<Q")
U32 = struct.Struct("<I")
_DEFINE = re.compile(r"#define\s+(MC_\w+)\s+(0x[0-9a-fA-F]+|\d+)U?L{0,2}\s*(?:/\*\s*(.*?)\s*(?:\*/)?)?$")


def header_defines(prefix: str) -> dict[str, tuple[int, str]]:
    """The integer #defines of meshctl_maps.h whose names start with `prefix`: name without the
    prefix -> (value, the one-line comment after it). The monitor's tables (hooks, event types,
    reasons, slots) are read from the header this way, so the C is their one definition."""
    text = (files("meshctl.bpf") / "meshctl_maps.h").read_text()
    out: dict[str, tuple[int, str]] = {}
    for line in text.splitlines():
        m = _DEFINE.match(line.strip())
        if m and m.group(1).startswith(prefix):
            out[m.group(1)[len(prefix):]] = (int(m.group(2), 0), m.group(3) or "")
    return out


_MON = header_defines("MC_MON_")
CFG_MONITOR = header_defines("MC_CFG_")["MONITOR"][0]  # the gate: a bitmask of claimed monitor slots
CFG_OBJECTS = header_defines("MC_CFG_")["OBJECTS"][0]  # the loader's record of where the programs came from
MON_SLOTS = _MON["SLOTS"][0]
MON_LOST_KINDS = _MON["LOST_KINDS"][0]
MON_LOST_RATE = _MON["LOST_RATE"][0]
MON_LOST_BUFFER = _MON["LOST_BUFFER"][0]
# mc_mon_slot: types, pad, cost_ns, tat_ns, pad, then src and dst (family, prefixlen, addr)
MON_SLOT = struct.Struct("<IIQQQII16sII16s")
MON_LOST = struct.Struct("<Q")
# mc_event: ts_ns, ifindex, len, out_ifindex, mtu, hook, outcome, type, reason, family, proto,
# action, encap, nh_family, decap, outer_family, xlated, sport, dport (network order), saddr, daddr,
# nexthop, outer_src, outer_dst, xsaddr, xdaddr
EVENT = struct.Struct("<QIIIIBBBBBBBBBBBB2s2s16s16s16s16s16s16s16s")
# The monitor's maps (ring buffers: one per slot, mon_ring<i>), pinned next to the others.
MONITOR_MAPS = ("mon_slots", "mon_lost", *(f"mon_ring{i}" for i in range(MON_SLOTS)))

# The flow filter (meshctl_maps.h, flowfilter): one array element, `active` then two halves of slots.
_FF = header_defines("MC_FLOWFILTER_")
FLOWFILTER_BITS = _FF["BITS"][0]
FLOWFILTER_MULT = _FF["MULT"][0]
FLOWFILTER_SLOTS = 1 << FLOWFILTER_BITS    # per half
FLOWFILTER_HEAD = 8                        # active, pad, routes_gen: the slots start here
FLOWFILTER_ROUTES_GEN = 4                  # offset of routes_gen (u32): the route cache's generation
# The route cache (meshctl_maps.h, route_cache): per-CPU slots of gen, family, addr and a routes value.
_RC = header_defines("MC_ROUTE_CACHE_")
ROUTE_CACHE_BITS = _RC["BITS"][0]
ROUTE_CACHE_MULT = _RC["MULT"][0]
ROUTE_CACHE_SLOTS = 1 << ROUTE_CACHE_BITS
ROUTE_CACHE_SLOT = struct.Struct("<II16s" + ROUTE_VALUE.format.lstrip("<") + "Q")  # ..., fills
# Of a slot, its generation and its fills alone (the size of a slot: 8-byte aligned, as per CPU values are).
ROUTE_CACHE_GEN_FILLS = struct.Struct(f"<I{ROUTE_CACHE_SLOT.size - 12}xQ")
assert ROUTE_CACHE_SLOT.size % 8 == 0, "per-CPU values are 8-byte aligned: a slot's stride is its size"
FLOWFILTER_VALUE_SIZE = FLOWFILTER_HEAD + 2 * FLOWFILTER_SLOTS
_U64_MASK = (1 << 64) - 1

# Map name (as pinned) -> (key size, value size), for checking a pinned map before trusting it.
MAP_SIZES = {
    "routes": (ROUTE_KEY.size, ROUTE_VALUE.size),
    "pods": (POD_KEY.size, POD_VALUE.size),
    "flows4": (FLOW4_KEY.size, FLOW_VALUE.size),
    "flows6": (FLOW6_KEY.size, FLOW_VALUE.size),
    "flowfilter": (U32.size, FLOWFILTER_VALUE_SIZE),
    "route_cache": (U32.size, ROUTE_CACHE_SLOT.size),
    "counters": (U32.size, COUNTER.size),
    "xlate": (U32.size, XLATE_VALUE.size),
    "config": (U32.size, CONFIG_VALUE.size),
    "mon_slots": (U32.size, MON_SLOT.size),
    "mon_lost": (U32.size, MON_LOST.size),
}


def cflags(pin_dir: str) -> list[str]:
    """The load-time settings of the programs, as compiler flags (see meshctl_maps.h)."""
    return [f'-DMC_PIN_DIR="{pin_dir}"', f"-DMC_LOADER_LAYOUT={LAYOUT_VERSION}", f"-DMC_MARK={MARK:#x}",
            f"-DMC_VXLAN_PORT={VXLAN_PORT}", f"-DMC_VXLAN_VNI={VXLAN_VNI:#x}", f"-DMC_VTEP_OUI={VTEP_OUI:#x}",
            f"-DMC_PROBE_PORT={PROBE_PORT}"]


def vtep_mac(private_ip: IPAddress) -> str:
    """The VXLAN MAC of the node whose private address is `private_ip` (what both the programs and
    the kernel VXLAN devices of the fallback put in the inner Ethernet header): 02:6d, then the
    IPv4 address, or the four 32-bit words of the IPv6 address XORed into one (so that fd10:1::4
    and fd10:2::4 differ, as their last four bytes would not)."""
    raw = private_ip.packed
    if len(raw) == 16:
        folded = 0
        for i in range(0, 16, 4):
            folded ^= int.from_bytes(raw[i:i + 4], "big")
        raw = folded.to_bytes(4, "big")
    return ":".join(f"{b:02x}" for b in VTEP_OUI.to_bytes(2, "big") + raw)


def config_addr(addr: IPAddress | None) -> int:
    """An IPv4 address as a config slot holds it (network order in the low 32 bits); 0 for None."""
    return int.from_bytes(addr.packed, "little") if addr is not None and addr.version == 4 else 0


def addr_from_config(value: int) -> IPAddress | None:
    return ipaddress.IPv4Address((value & 0xFFFFFFFF).to_bytes(4, "little")) if value else None


def config_addr6(addr: IPAddress | None) -> tuple[int, int]:
    """An IPv6 address as config slots CFG_PRIVATE6 and CFG_PRIVATE6 + 1 hold it (bytes 0-7 and
    8-15, each in packet order in memory); (0, 0) for None or an IPv4 address."""
    if addr is None or addr.version != 6:
        return 0, 0
    raw = addr.packed
    return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")


def addr6_from_config(hi: int, lo: int) -> IPAddress | None:
    if not (hi or lo):
        return None
    return ipaddress.IPv6Address(hi.to_bytes(8, "little") + lo.to_bytes(8, "little"))


def _family(version: int) -> int:
    return FAMILY_V4 if version == 4 else FAMILY_V6


def route_key(prefix: IPNetwork) -> bytes:
    return ROUTE_KEY.pack(32 + prefix.prefixlen, _family(prefix.version), prefix.network_address.packed)


_ROUTE_KEY4 = struct.Struct("<III12x")  # the IPv4 form of ROUTE_KEY, address as a network-order u32


def route_table(entries: Iterable[FastPathEntry], ifindex: int) -> dict[bytes, bytes]:
    """The routes map the plan's entries call for (`ifindex`: the private NIC, for direct ones); a
    prefix given twice keeps its last entry."""
    return dict(zip(*route_rows(entries, ifindex), strict=True))


def route_rows(entries: Iterable[FastPathEntry], ifindex: int) -> tuple[list[bytes], list[bytes]]:
    """route_table as two aligned lists (key i -> value i, in the entries' order, a prefix given
    twice listed twice): what a sync into an empty map hands the batch call as it is.

    Written for speed (the agent re-encodes the whole plan on each sync): it reads the ipaddress
    objects' slots (_version, _prefixlen, _ip: stable since Python 3.3) instead of their
    properties, appends to lists rather than filling a dict, and encodes each distinct (action,
    next hop, encapsulation) value once."""
    k4, k6, htonl = _ROUTE_KEY4.pack, ROUTE_KEY.pack, socket.htonl
    values: dict[tuple[str, int, int, Encap | None, bool], bytes] = {}
    keys: list[bytes] = []
    vals: list[bytes] = []
    add_key, add_value = keys.append, vals.append
    for e in entries:
        p: Any = e.prefix  # read through its slots, see above
        if p._version == 4:
            add_key(k4(32 + p._prefixlen, FAMILY_V4, htonl(p.network_address._ip)))
        else:
            add_key(k6(32 + p._prefixlen, FAMILY_V6, p.network_address.packed))
        nh: Any = e.nexthop
        vk = (e.action, 0, 0, e.encap, e.translate) if nh is None else \
            (e.action, nh._version, nh._ip, e.encap, e.translate)
        v = values.get(vk)
        if v is None:
            v = values[vk] = route_value(e.action, ifindex if e.action == "direct" else 0, nh, e.encap, e.translate)
        add_value(v)
    return keys, vals


def route_value(action: str, ifindex: int, nexthop: IPAddress | None, encap: Encap | None = None,
                translate: bool = False) -> bytes:
    """The outer header's family is the outer addresses' (either pod family fits inside either);
    MeshError for outer addresses of two families. `translate`: FastPathEntry.translate."""
    nh_fam, nh = (0, b"") if nexthop is None else (_family(nexthop.version), nexthop.packed)
    flags = RT_TRANSLATE if translate else 0
    if encap is None:
        return ROUTE_VALUE.pack(ACTIONS[action], ifindex, nh_fam, 0, 0, flags, nh, b"", b"")
    if encap.local.version != encap.remote.version:
        raise MeshError(f"encapsulation {encap.kind} from {encap.local} to {encap.remote}: the outer addresses "
                        "must be of one family")
    return ROUTE_VALUE.pack(ACTIONS[action], ifindex, nh_fam, ENCAPS[encap.kind], _family(encap.local.version), flags,
                            nh, encap.local.packed, encap.remote.packed)


def _addr(family: int, raw: bytes) -> IPAddress:
    return ipaddress.IPv4Address(raw[:4]) if family == FAMILY_V4 else ipaddress.IPv6Address(raw)


@dataclass(frozen=True)
class RouteEntry:
    """A routes map entry read back: the plan entry it encodes and the NIC it redirects to."""

    entry: FastPathEntry
    ifindex: int


def decode_route(key: bytes, value: bytes) -> RouteEntry:
    plen, fam, addr = ROUTE_KEY.unpack(key)
    action, ifindex, nh_fam, enc, outer_fam, flags, nh, osrc, odst = ROUTE_VALUE.unpack(value)
    net = ipaddress.ip_network((_addr(fam, addr), plen - 32))
    encap = None
    if enc:
        kind = ENCAP_NAMES.get(enc, f"unknown({enc})")
        encap = Encap(kind, _addr(outer_fam, osrc), _addr(outer_fam, odst))  # type: ignore[arg-type]
    act = ACTION_NAMES.get(action, f"unknown({action})")
    return RouteEntry(FastPathEntry(net, act, _addr(nh_fam, nh) if nh_fam else None, encap,  # type: ignore[arg-type]
                                    bool(flags & RT_TRANSLATE)), ifindex)


def xlate_table(global_cidrs: Iterable[tuple[IPNetwork, IPNetwork]]) -> dict[bytes, bytes]:
    """The xlate map for a cluster's global ranges (pod range, global range; at most one per
    family): every slot, a family without a range as zeros (an array's slots always exist)."""
    out = {U32.pack(slot): XLATE_VALUE.pack(0, 0, b"", b"") for slot in XLATE_SLOT.values()}
    for pod, glob in global_cidrs:
        out[U32.pack(XLATE_SLOT[pod.version])] = XLATE_VALUE.pack(pod.prefixlen, 0, pod.network_address.packed,
                                                                 glob.network_address.packed)
    return out


def decode_xlate(key: bytes, value: bytes) -> tuple[IPNetwork, IPNetwork] | None:
    """An xlate slot read back: (pod range, global range), or None for a family without."""
    (slot,) = U32.unpack(key)
    plen, _, pod, glob = XLATE_VALUE.unpack(value)
    if plen == 0:
        return None
    fam = FAMILY_V4 if slot == XLATE_SLOT[4] else FAMILY_V6
    return ipaddress.ip_network((_addr(fam, pod), plen)), ipaddress.ip_network((_addr(fam, glob), plen))


def pod_key(ip: IPAddress) -> bytes:
    return POD_KEY.pack(_family(ip.version), ip.packed)


def pod_value(ifindex: int) -> bytes:
    return POD_VALUE.pack(ifindex, 0)


def decode_pod(key: bytes, value: bytes) -> tuple[IPAddress, int]:
    fam, addr = POD_KEY.unpack(key)
    return _addr(fam, addr), POD_VALUE.unpack(value)[0]


def flow_key(src: IPAddress, dst: IPAddress, sport: int, dport: int, proto: int) -> bytes:
    """The flow LRU key of a packet from src:sport to dst:dport (decode_flow's inverse)."""
    st = FLOW4_KEY if src.version == 4 else FLOW6_KEY
    return st.pack(src.packed, dst.packed, sport.to_bytes(2, "big"), dport.to_bytes(2, "big"), proto)


def route_cache_slot(dst: IPAddress) -> int:
    """The route cache slot of destination `dst`: the programs' mc_route, the XOR of the address's
    four 32-bit words (as the 16 bytes of a key hold it, read little-endian) times
    MC_ROUTE_CACHE_MULT, its top ROUTE_CACHE_BITS bits."""
    x = 0
    for (w,) in struct.iter_unpack("<I", dst.packed.ljust(16, b"\0")):
        x ^= w
    return ((x * ROUTE_CACHE_MULT) & 0xFFFFFFFF) >> (32 - ROUTE_CACHE_BITS)


def flow_slot(key: bytes) -> int:
    """The flow filter slot of a flow LRU key (FLOW4_KEY or FLOW6_KEY bytes, as the map holds them):
    the programs' mc_flow4_slot / mc_flow6_slot, a multiply-xor hash over the key's 64-bit words
    (host order, little-endian as every layout here), its top FLOWFILTER_BITS bits."""
    h = 0
    for (w,) in struct.iter_unpack("<Q", key):
        h = ((h ^ w) * FLOWFILTER_MULT) & _U64_MASK
    return h >> (64 - FLOWFILTER_BITS)


def decode_flow(key: bytes) -> dict[str, object]:
    st = FLOW4_KEY if len(key) == FLOW4_KEY.size else FLOW6_KEY
    saddr, daddr, sport, dport, proto = st.unpack(key)
    return {"proto": proto, "src": str(ipaddress.ip_address(saddr)), "sport": int.from_bytes(sport, "big"),
            "dst": str(ipaddress.ip_address(daddr)), "dport": int.from_bytes(dport, "big")}
