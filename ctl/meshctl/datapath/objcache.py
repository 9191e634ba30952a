# SPDX-License-Identifier: Apache-2.0
"""Compiled programs kept on disk, so a node loads them without running bcc/LLVM.

A bcc compile of `datapath.c` costs LLVM's time on every node, and far more under emulation (a TCG
guest of the kernel matrix) or with several agents compiling at once. The
bytecode does not depend on the node: the pin directory only names where bcc opens the maps, and
the instructions reach maps through file descriptors. So after a compile the bytecode is stored
with its map relocations (instruction index -> map name) and each map's definition; a later load
creates or reopens the pinned maps, writes their descriptors into the instructions and loads the
programs with BPF_PROG_LOAD.

The cache key is everything the bytecode depends on: the C sources, the kernel headers bcc
compiled against (the real path of /lib/modules/<release>/build) and bcc's version. A kernel that
refuses the cached programs (a helper it lacks) makes the load fail; the loader then compiles with
bcc, which reports the verifier's reason.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import hashlib
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from meshctl.datapath import libbpf

log = logging.getLogger("meshctl.datapath")

CACHE_DIR = "/var/lib/meshctl/bpf"
BPF_PSEUDO_MAP_FD = 1
LD_IMM64 = 0x18


def cache_key(sources: Iterable[bytes]) -> str:
    """The hash of what the bytecode depends on (see the module doc)."""
    h = hashlib.sha256()
    for s in sources:
        h.update(hashlib.sha256(s).digest())
    build = Path(f"/lib/modules/{os.uname().release}/build")
    h.update(str(build.resolve()).encode() if build.exists() else b"no-headers")
    with contextlib.suppress(OSError):
        h.update(Path("/usr/lib/x86_64-linux-gnu/libbcc.so.0").resolve().name.encode())
    return h.hexdigest()[:32]


def cache_dir() -> Path:
    """Where compiled objects are kept: $MESHCTL_BPF_CACHE, else /var/lib/meshctl/bpf (not under
    /var/cache, which a virtme-ng guest hides)."""
    return Path(os.environ.get("MESHCTL_BPF_CACHE", CACHE_DIR))


def _path(key: str) -> Path:
    return cache_dir() / f"{key}.json"


def store(key: str, b: Any, programs: Iterable[str], maps: Iterable[str]) -> bool:
    """Save the programs bcc object `b` compiled (after load_func) under `key`. Best effort: False
    when the bytecode references a map we do not know or the cache is not writable."""
    from bcc.libbcc import lib as bcc_lib  # noqa: PLC0415 - only where bcc compiled

    fds: dict[int, str] = {}
    defs: dict[str, dict[str, int]] = {}
    for name in maps:
        fd = b.get_table(name).get_fd()
        info = libbpf.map_info(fd)
        fds[fd] = name
        defs[name] = {"type": info.type, "key_size": info.key_size, "value_size": info.value_size,
                      "max_entries": info.max_entries, "map_flags": info.map_flags}
    progs: dict[str, Any] = {}
    for prog in programs:
        start = bcc_lib.bpf_function_start(b.module, prog.encode())
        size = bcc_lib.bpf_function_size(b.module, prog.encode())
        if not start or size <= 0:
            return False
        code = ctypes.string_at(start, size)
        relocs = []
        for idx in range(0, len(code) // libbpf.INSN.size):
            op, regs, _, imm = libbpf.INSN.unpack_from(code, idx * libbpf.INSN.size)
            if op == LD_IMM64 and (regs >> 4) == BPF_PSEUDO_MAP_FD:
                if imm not in fds:
                    return False
                relocs.append([idx, fds[imm]])
        progs[prog] = {"insns": base64.b64encode(code).decode(), "relocs": relocs}
    doc = {"maps": defs, "programs": progs}
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        tmp = _path(key).with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, _path(key))
    except OSError as e:
        log.debug("datapath: cannot store compiled programs in %s: %s", cache_dir(), e)
        return False
    return True


def _open_or_create_map(path: str, name: str, d: dict[str, int]) -> int:
    """The map pinned at `path` when its definition matches `d`, else a new one pinned there."""
    if os.path.exists(path):
        fd = libbpf.obj_get(path)
        info = libbpf.map_info(fd)
        got = (info.type, info.key_size, info.value_size, info.max_entries, info.map_flags)
        if got == (d["type"], d["key_size"], d["value_size"], d["max_entries"], d["map_flags"]):
            return fd
        os.close(fd)
        raise OSError(f"pinned map {path} differs from the cached definition")
    fd = libbpf.map_create(name, d["type"], d["key_size"], d["value_size"], d["max_entries"], d["map_flags"])
    try:
        libbpf.obj_pin(fd, path)
    except OSError:
        os.close(fd)
        raise
    return fd


def load_and_pin(key: str, pin_dir: str, prog_paths: dict[str, str]) -> bool:
    """Load the cached programs for `key` against the maps under `pin_dir` (created when missing)
    and pin each at prog_paths[name]. False on a miss or when the kernel refuses them."""
    try:
        doc = json.loads(_path(key).read_text())
    except (OSError, ValueError):
        return False
    map_fds: dict[str, int] = {}
    prog_fds: dict[str, int] = {}
    try:
        for name, d in doc["maps"].items():
            map_fds[name] = _open_or_create_map(f"{pin_dir}/{name}", name, d)
        for prog, spec in doc["programs"].items():
            code = bytearray(base64.b64decode(spec["insns"]))
            for idx, mname in spec["relocs"]:
                op, regs, off, _ = libbpf.INSN.unpack_from(code, idx * libbpf.INSN.size)
                libbpf.INSN.pack_into(code, idx * libbpf.INSN.size, op, regs, off, map_fds[mname])
            prog_fds[prog] = libbpf.prog_load(prog, code)
        for prog, fd in prog_fds.items():
            libbpf.unpin(prog_paths[prog])
            libbpf.obj_pin(fd, prog_paths[prog])
    except (OSError, KeyError, ValueError) as e:
        log.info("datapath: cached programs %s not usable here (%s): compiling", key, e)
        return False
    finally:
        for fd in (*map_fds.values(), *prog_fds.values()):
            os.close(fd)
    return True
