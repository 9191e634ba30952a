"""What this kernel offers the programs, probed at load (not guessed from the version).

Each feature has a fallback: no tcx (before 6.6) -> clsact direct-action filters; a missing helper
or map type -> the node keeps the kernel's routes, with the reason naming what is missing (rather
than a verifier dump). `datapath status` shows the probe results.

Probes touch no interface: map types and helpers through libbpf's probes (a throwaway map or
program); tcx by asking for a tcx link on ifindex 0: a kernel with tcx answers ENODEV (no such
device), one without rejects the attach type itself (EINVAL).
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass, field
from functools import cache

from meshctl.datapath import libbpf

BPF_PROG_TYPE_SCHED_CLS = 3
# the helpers datapath.c calls (besides the map helpers), by their BPF_FUNC_* number
HELPERS = {
    "map_lookup_elem": 1,
    "map_update_elem": 2,
    "ktime_get_ns": 5,
    "skb_pull_data": 39,
    "redirect_neigh": 152,
    "redirect_peer": 155,
}
# the map types of meshctl_maps.h, by their BPF_MAP_TYPE_* number
MAP_TYPES = {"hash": 1, "array": 2, "percpu_array": 6, "lru_hash": 9, "lpm_trie": 11}
_RET0_EXIT = bytes([0xB7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0])  # r0 = 0; exit


@dataclass(frozen=True)
class Features:
    tcx: bool
    helpers: dict[str, bool] = field(default_factory=dict)
    map_types: dict[str, bool] = field(default_factory=dict)

    def missing(self) -> list[str]:
        """What the programs need and this kernel lacks (empty: they can load)."""
        return ([f"helper bpf_{h}" for h, ok in self.helpers.items() if not ok]
                + [f"map type {m}" for m, ok in self.map_types.items() if not ok])

    def as_dict(self) -> dict[str, object]:
        return {"tcx": self.tcx, "helpers": dict(self.helpers), "map_types": dict(self.map_types),
                "missing": self.missing()}


def _probe_tcx(so: ctypes.CDLL) -> bool:
    so.bpf_prog_load.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.c_void_p]
    so.bpf_prog_load.restype = ctypes.c_int
    code = ctypes.create_string_buffer(_RET0_EXIT, len(_RET0_EXIT))
    fd = so.bpf_prog_load(BPF_PROG_TYPE_SCHED_CLS, b"mc_probe", b"GPL", ctypes.addressof(code), 2, None)
    if fd < 0:
        return False
    try:
        ret = so.bpf_link_create(fd, 0, libbpf.BPF_TCX_INGRESS, None)
        if ret >= 0:  # cannot happen for ifindex 0; never leave a link behind
            os.close(ret)
            return True
        return bool(-ret == errno.ENODEV)
    finally:
        os.close(fd)


@cache
def probe() -> Features:
    """The features of the running kernel (once per process: they do not change under us)."""
    so = libbpf.lib()
    so.libbpf_probe_bpf_helper.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    so.libbpf_probe_bpf_helper.restype = ctypes.c_int
    so.libbpf_probe_bpf_map_type.argtypes = [ctypes.c_int, ctypes.c_void_p]
    so.libbpf_probe_bpf_map_type.restype = ctypes.c_int
    helpers = {h: so.libbpf_probe_bpf_helper(BPF_PROG_TYPE_SCHED_CLS, n, None) == 1 for h, n in HELPERS.items()}
    maps = {m: so.libbpf_probe_bpf_map_type(n, None) == 1 for m, n in MAP_TYPES.items()}
    return Features(_probe_tcx(so), helpers, maps)
