# SPDX-License-Identifier: Apache-2.0
"""Compiled programs kept on disk, so a node loads them without running bcc/LLVM or having headers.

A bcc compile of `datapath.c` costs LLVM's time on every node, and far more under emulation (a TCG
guest of the kernel matrix) or with several agents compiling at once; and most cloud images, Talos,
Bottlerocket, COS and Flatcar have no kernel headers to compile against. The bytecode does not
depend on the node: the programs use only UAPI structures, the pin directory only names where bcc
opens the maps, and the instructions reach maps through file descriptors. So a compile's bytecode
is stored with its map relocations (instruction index -> map name), each map's definition, the map
layout version it was built for and the key of what it was built from; a later load creates or
reopens the pinned maps, writes their descriptors into the instructions and loads the programs
with BPF_PROG_LOAD.

Two places hold objects in this format:
- the cache (`cache_dir()`): what bcc compiled on this node, keyed by the sources, the settings,
  the kernel headers bcc compiled against and bcc's version (`cache_key`);
- the shipped objects (`shipped_dir()`): one file per program variant, built with bcc when the
  image is built (`meshctl datapath build-objects`), keyed by the sources and settings only.

An object of another map layout version than this code's is refused loudly (an ERROR naming both
versions and the file, counted in `refusals()`): loading it would let programs and Python disagree
about every map's bytes. A kernel that refuses the programs (a helper it lacks) fails the load; the
loader then takes its next source.
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
from meshctl.datapath.layout import LAYOUT_VERSION

log = logging.getLogger("meshctl.datapath")

CACHE_DIR = "/var/lib/meshctl/bpf"
CACHE_ENV = "MESHCTL_BPF_CACHE"
# Not under /var/lib/meshctl: the DaemonSet mounts the host's directory there, hiding the image's.
SHIPPED_DIR = "/usr/lib/meshctl/bpf-objects"
SHIPPED_ENV = "MESHCTL_BPF_OBJECTS"
HEADERS_ENV = "MESHCTL_KERNEL_HEADERS"
LIBBCC = "/usr/lib/x86_64-linux-gnu/libbcc.so.0"
KHEADERS = "/sys/kernel/kheaders.tar.xz"
BPF_PSEUDO_MAP_FD = 1
LD_IMM64 = 0x18


def headers_dir() -> Path:
    """The kernel headers bcc compiles against: $MESHCTL_KERNEL_HEADERS when set (a test points it
    at an empty directory to hide them; the compile child gets it as bcc's BCC_KERNEL_SOURCE), else
    /lib/modules/<release>/build (on most distributions a link into /usr/src)."""
    override = os.environ.get(HEADERS_ENV)
    return Path(override) if override else Path(f"/lib/modules/{os.uname().release}/build")


def have_headers() -> bool:
    """Whether bcc has headers to compile against here: a non-empty headers_dir() (a link into an
    unmounted /usr/src dangles), or, unless $MESHCTL_KERNEL_HEADERS names the headers, the kernel's
    own archive (CONFIG_IKHEADERS), which bcc unpacks by itself."""
    d = headers_dir()
    with contextlib.suppress(OSError):
        if d.is_dir() and any(d.iterdir()):
            return True
    return HEADERS_ENV not in os.environ and os.path.exists(KHEADERS)


def cache_key(sources: Iterable[bytes]) -> str:
    """The hash of what a bytecode compiled on this node depends on (see the module doc)."""
    h = hashlib.sha256()
    h.update(shipped_key(sources).encode())
    build = headers_dir()
    h.update(str(build.resolve()).encode() if have_headers() else b"no-headers")
    with contextlib.suppress(OSError):
        h.update(Path(LIBBCC).resolve().name.encode())
    return h.hexdigest()[:32]


def shipped_key(sources: Iterable[bytes]) -> str:
    """The hash of what a shipped object was built from: sources and settings, nothing of a node."""
    h = hashlib.sha256()
    for s in sources:
        h.update(hashlib.sha256(s).digest())
    return h.hexdigest()[:32]


def cache_dir() -> Path:
    """Where compiled objects are kept: $MESHCTL_BPF_CACHE, else /var/lib/meshctl/bpf (not under
    /var/cache, which a virtme-ng guest hides)."""
    return Path(os.environ.get(CACHE_ENV, CACHE_DIR))


def shipped_dir() -> Path:
    """Where the image keeps the objects built for every variant: $MESHCTL_BPF_OBJECTS, else
    /usr/lib/meshctl/bpf-objects."""
    return Path(os.environ.get(SHIPPED_ENV, SHIPPED_DIR))


def cache_path(key: str) -> Path:
    return cache_dir() / f"{key}.json"


_refused: list[str] = []


def refusals() -> int:
    """How many objects this process refused for their map layout version."""
    return len(_refused)


def store(key: str, b: Any, programs: Iterable[str], maps: Iterable[str]) -> bool:
    """Save the programs bcc object `b` compiled under `key` in the cache. Best effort: False when
    the bytecode references a map we do not know or the cache is not writable."""
    return write(cache_path(key), key, b, programs, maps)


def write(path: Path, key: str, b: Any, programs: Iterable[str], maps: Iterable[str]) -> bool:
    """Save the programs bcc object `b` compiled (load_func is not needed: bcc's compile already
    created the maps) at `path`, marked with `key` and this code's LAYOUT_VERSION. False when the
    bytecode references a map we do not know or `path` is not writable."""
    from bcc.libbcc import lib as bcc_lib  # noqa: PLC0415 - only where bcc compiled

    fds: dict[int, str] = {}
    defs: dict[str, dict[str, int]] = {}
    for name in maps:
        fd = b.get_table(name.encode()).get_fd()
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
    doc = {"layout": LAYOUT_VERSION, "key": key, "maps": defs, "programs": progs}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)
    except OSError as e:
        log.debug("datapath: cannot store compiled programs at %s: %s", path, e)
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


def load_and_pin(path: Path, key: str, pin_dir: str, prog_paths: dict[str, str]) -> str | None:
    """Load the programs stored at `path` against the maps under `pin_dir` (created when missing)
    and pin each at prog_paths[name]. None when they run; else why not (no such file, built from
    other sources than `key`, another map layout version: logged as an ERROR and counted, or
    the kernel refused them)."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return f"no object at {path}"
    except (OSError, ValueError) as e:
        return f"cannot read {path}: {e}"
    got = doc.get("layout") if isinstance(doc, dict) else None
    if got != LAYOUT_VERSION:
        _refused.append(str(path))
        log.error("datapath: refused compiled object %s: map layout version %s, this meshctl's is %s",
                  path, got, LAYOUT_VERSION)
        return f"{path} has map layout version {got}, this meshctl's is {LAYOUT_VERSION}"
    if doc.get("key") != key:
        return f"{path} was built from other sources ({doc.get('key')}, these are {key})"
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
    except (OSError, KeyError, ValueError, TypeError) as e:
        log.info("datapath: compiled programs %s not usable here (%s)", path, e)
        return f"the kernel refused {path}: {e}"
    finally:
        for fd in (*map_fds.values(), *prog_fds.values()):
            os.close(fd)
    return None
