# SPDX-License-Identifier: Apache-2.0
"""What this kernel offers the programs, probed at load (not guessed from the version).

Each feature has a fallback: no tcx (before 6.6) -> clsact direct-action filters; a missing helper
or map type -> the node keeps the kernel's routes, with the reason naming what is missing (rather
than a verifier dump). `datapath status` shows the probe results.

Probes touch no interface: map types and helpers through libbpf's probes (a throwaway map or
program); tcx by asking for a tcx link on ifindex 0: a kernel with tcx answers ENODEV (no such
device), one without rejects the attach type itself (EINVAL).
"""

from __future__ import annotations

import errno
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cache
from itertools import combinations

from meshctl.datapath import libbpf

# the helpers datapath.c calls (besides the map helpers), by their BPF_FUNC_* number
HELPERS = {
    "map_lookup_elem": 1,
    "map_update_elem": 2,
    "ktime_get_ns": 5,
    "skb_store_bytes": 9,
    "redirect": 23,
    "skb_load_bytes": 26,
    "csum_diff": 28,
    "get_hash_recalc": 34,
    "skb_change_tail": 38,
    "skb_pull_data": 39,
    "skb_change_proto": 31,
    "skb_adjust_room": 50,
    "redirect_neigh": 152,
    "redirect_peer": 155,
    "check_mtu": 163,
}
# What the programs can do without: absent, they are compiled with the setting at 0 and a fallback
# (the C says which). bpf_check_mtu came in 5.12: before it the NIC's MTU is compared. The VXLAN
# flag BPF_F_ADJ_ROOM_ENCAP_L2_ETH came in 5.18 (an older kernel refuses the call, EINVAL, so every
# VXLAN packet would be dropped): before it the inner protocol is left as IP, which the kernel's
# GSO segments the same, only a NIC's VXLAN offload does not take it.
# The decapsulation flags (6.3) let adjust_room change the IP version as it pops the outer header:
# before them a packet inside an outer header of the other IP version (IPv6 in IPv4, IPv4 in IPv6)
# is turned into its own version first with bpf_skb_change_proto.
OPTIONAL = {"check_mtu": "MC_HAVE_CHECK_MTU", "adjust_room_encap_l2_eth": "MC_HAVE_ADJ_ROOM_L2_ETH",
            "adjust_room_decap_l3": "MC_HAVE_ADJ_ROOM_DECAP_L3"}
OPTIONAL_HELPERS = {"check_mtu"}
# as the kernel's headers spell them
FLAG_NAMES = {"adjust_room_encap_l2_eth": "BPF_F_ADJ_ROOM_ENCAP_L2_ETH",
              "adjust_room_decap_l3": "BPF_F_ADJ_ROOM_DECAP_L3_IPV4"}
# bpf_skb_adjust_room calls the probes test-run: (room to add, or to take with a negative number; flags)
_ADJ_ROOM_PROBES = {
    # ENCAP_L3_IPV4 | ENCAP_L4_UDP | ENCAP_L2_ETH | ENCAP_L2(14)
    "adjust_room_encap_l2_eth": (50, (1 << 1) | (1 << 4) | (1 << 6) | (14 << 56)),
    "adjust_room_decap_l3": (-20, 1 << 7),  # DECAP_L3_IPV4
}
# Compile as if these optional features were absent (e.g. to build, on a newer host, the programs an
# older kernel will load from the compiled-object cache): a comma-separated list of OPTIONAL names.
WITHOUT_ENV = "MESHCTL_BPF_WITHOUT"
# Ethernet, IPv4 (UDP, 68 bytes), UDP and 40 bytes: enough for adjust_room to add or take 20-50 bytes
_PROBE_PACKET = (b"\x02" * 6 + b"\x04" * 6 + b"\x08\x00" + bytes([0x45, 0, 0, 68, 0, 0, 0x40, 0, 64, 17, 0, 0,
                 10, 0, 0, 1, 10, 0, 0, 2]) + bytes([0x30, 0x39, 0x12, 0xB5, 0, 48, 0, 0]) + bytes(40))


def _adjust_room_prog(len_diff: int, flags: int) -> bytes:
    """r2 = len_diff; r3 = BPF_ADJ_ROOM_MAC; r4 = flags (ld_imm64); call bpf_skb_adjust_room; exit:
    the program returns the helper's answer (0, or -EINVAL for a flag this kernel does not know)."""
    return b"".join([
        struct.pack("<BBhi", 0xB7, 0x02, 0, len_diff),
        struct.pack("<BBhi", 0xB7, 0x03, 0, 1),
        struct.pack("<BBhI", 0x18, 0x04, 0, flags & 0xFFFFFFFF), struct.pack("<BBhI", 0, 0, 0, flags >> 32),
        struct.pack("<BBhi", 0x85, 0, 0, HELPERS["skb_adjust_room"]),
        struct.pack("<BBhi", 0x95, 0, 0, 0),
    ])
# the map types of meshctl_maps.h, by their BPF_MAP_TYPE_* number
MAP_TYPES = {"hash": 1, "array": 2, "percpu_array": 6, "lru_hash": 9, "lpm_trie": 11}
_PROBE_NAME = "mc_probe"
_RET0_EXIT = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])  # r0 = 0; exit


@dataclass(frozen=True)
class Features:
    tcx: bool
    helpers: dict[str, bool] = field(default_factory=dict)
    map_types: dict[str, bool] = field(default_factory=dict)
    flags: dict[str, bool] = field(default_factory=dict)  # helper flags the programs pass (OPTIONAL)

    def has(self, name: str) -> bool:
        """Whether an OPTIONAL feature (a helper or a flag) is there."""
        return self.helpers.get(name, False) if name in OPTIONAL_HELPERS else self.flags.get(name, False)

    def missing(self) -> list[str]:
        """What the programs need and this kernel lacks (empty: they can load)."""
        return ([f"helper bpf_{h}" for h, ok in self.helpers.items() if not ok and h not in OPTIONAL_HELPERS]
                + [f"map type {m}" for m, ok in self.map_types.items() if not ok])

    def fallbacks(self) -> list[str]:
        """The optional features this kernel lacks (the programs use their fallbacks)."""
        return [f"helper bpf_{n}" if n in OPTIONAL_HELPERS else f"flag {FLAG_NAMES[n]}" for n in OPTIONAL
                if not self.has(n)]

    def variant(self) -> frozenset[str]:
        """The program variant this kernel selects: the OPTIONAL features it has."""
        return frozenset(n for n in OPTIONAL if self.has(n))

    def cflags(self) -> list[str]:
        """The compiler settings the probe results decide (-DMC_HAVE_<...>=0|1)."""
        return variant_cflags(self.variant())

    def as_dict(self) -> dict[str, object]:
        return {"tcx": self.tcx, "helpers": dict(self.helpers), "map_types": dict(self.map_types),
                "flags": dict(self.flags), "missing": self.missing(), "fallbacks": self.fallbacks()}


def variant_cflags(present: Iterable[str]) -> list[str]:
    """The compiler settings of the variant with the OPTIONAL features `present` (-DMC_HAVE_<...>=0|1)."""
    have = set(present)
    return [f"-D{macro}={int(n in have)}" for n, macro in sorted(OPTIONAL.items())]


def variants() -> list[frozenset[str]]:
    """Every variant a probe can select (each subset of OPTIONAL), fewest features first: what the
    image ships compiled, so a node of any kernel finds its programs without compiling."""
    names = sorted(OPTIONAL)
    return [frozenset(c) for r in range(len(names) + 1) for c in combinations(names, r)]


def variant_name(variant: Iterable[str]) -> str:
    """A variant as a file name: its features joined by '+' in a stable order, 'base' for none."""
    return "+".join(sorted(variant)) or "base"


def _probe_adjust_room(len_diff: int, flags: int) -> bool:
    """Whether bpf_skb_adjust_room takes `flags`: a test run of one call with them (the helper
    answers EINVAL at run time for a flag it does not know; loading proves nothing)."""
    try:
        fd = libbpf.prog_load(_PROBE_NAME, _adjust_room_prog(len_diff, flags))
    except OSError:
        return False
    try:
        retval, _, _, _ = libbpf.test_run(fd, _PROBE_PACKET)
        return retval == 0
    except OSError:
        return False
    finally:
        os.close(fd)


def _probe_tcx() -> bool:
    try:
        fd = libbpf.prog_load(_PROBE_NAME, _RET0_EXIT)
    except OSError:
        return False
    try:
        link = libbpf.link_create(fd, 0, libbpf.BPF_TCX_INGRESS)
    except OSError as e:
        return e.errno == errno.ENODEV
    else:  # cannot happen for ifindex 0; never leave a link behind
        os.close(link)
        return True
    finally:
        os.close(fd)


@cache
def probe() -> Features:
    """The features of the running kernel (once per process: they do not change under us)."""
    helpers = {h: libbpf.probe_helper(n) for h, n in HELPERS.items()}
    maps = {m: libbpf.probe_map_type(n) for m, n in MAP_TYPES.items()}
    tcx = _probe_tcx()
    flags = {name: _probe_adjust_room(diff, bits) for name, (diff, bits) in _ADJ_ROOM_PROBES.items()}
    for name in os.environ.get(WITHOUT_ENV, "").split(","):
        name = name.strip()
        if name in OPTIONAL_HELPERS:
            helpers[name] = False
        elif name in OPTIONAL:
            flags[name] = False
    return Features(tcx, helpers, maps, flags)
