# SPDX-License-Identifier: Apache-2.0
"""Compile the programs with bcc, pin them and their maps, or reopen what is already pinned.

An agent restart must not drop a packet: programs and maps stay pinned under
`<pin_root>/<node>/`, and a restarted agent whose source is unchanged reopens them without
compiling. A changed source is compiled against the same pinned maps and the links are switched
to the new programs atomically (bpf_link_update). Pinned maps of another layout version are
unpinned and rebuilt (the old programs keep running on the old maps until their links switch).
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

from meshctl.datapath import features, layout, libbpf, objcache
from meshctl.datapath.maps import NodeMaps
from meshctl.errors import MeshError

log = logging.getLogger("meshctl.datapath")

PROGRAMS = ("from_pod", "from_private", "flow_egress")
SOURCE = "datapath.c"


def bpf_dir() -> Path:
    """The C sources, shipped as the data package meshctl.bpf (the repository's bpf/ folder)."""
    d = Path(str(files("meshctl.bpf")))
    if not (d / SOURCE).exists():
        raise MeshError(f"the BPF sources ({SOURCE}) are not installed in {d}")
    return d


def source(pin_dir: str) -> tuple[Path, list[str], int]:
    """What bcc compiles for this node: the main source, its cflags (load-time settings and the
    include path) and a 63-bit hash of both with every header (stored in config: a change of any
    of them recompiles)."""
    d = bpf_dir()
    cflags = [f"-I{d}", "-Wno-unused-function", *layout.cflags(pin_dir), *features.probe().cflags()]
    h = hashlib.sha256("\0".join(cflags).encode())
    for f in sorted(p for p in d.rglob("*") if p.suffix in (".c", ".h")):
        h.update(str(f.relative_to(d)).encode() + b"\0" + f.read_bytes())
    return d / SOURCE, cflags, int.from_bytes(h.digest()[:8], "little") >> 1


def bpffs_mounted(path: str) -> bool:
    """Whether `path` lies on a bpf filesystem mount of this mount namespace."""
    best = ""
    fstype = ""
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) < 3:
                continue
            mnt = parts[1]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, fstype = mnt, parts[2]
    return fstype == "bpf"


def ensure_bpffs(pin_root: str) -> None:
    """Mount bpffs on /sys/fs/bpf if nothing is mounted there (as Cilium does); pin_root elsewhere
    must already be on bpffs."""
    if bpffs_mounted(pin_root):
        return
    if not (pin_root == "/sys/fs/bpf" or pin_root.startswith("/sys/fs/bpf/")):
        raise MeshError(f"{pin_root} is not on a bpf filesystem")
    if not bpffs_mounted("/sys/fs/bpf"):
        p = subprocess.run(["mount", "-t", "bpf", "bpf", "/sys/fs/bpf"], capture_output=True, text=True)
        if p.returncode != 0 and not bpffs_mounted("/sys/fs/bpf"):
            raise MeshError(f"cannot mount bpffs on /sys/fs/bpf: {p.stderr.strip()}")


def prog_path(pin_dir: str, name: str) -> str:
    return f"{pin_dir}/prog_{name}"


def remove_maps_and_progs(pin_dir: str) -> None:
    """Unpin maps and programs (links keep running programs alive until they are switched)."""
    for n in (*NodeMaps.NAMES, *layout.MONITOR_MAPS):
        libbpf.unpin(f"{pin_dir}/{n}")
    for p in PROGRAMS:
        libbpf.unpin(prog_path(pin_dir, p))


@dataclass
class Loaded:
    maps: NodeMaps
    progs: dict[str, int]      # name -> fd
    prog_ids: dict[str, int]   # name -> kernel prog id
    compiled: bool
    migrated_from: int | None  # layout version replaced, if any

    def close(self) -> None:
        for fd in self.progs.values():
            os.close(fd)
        self.progs = {}
        self.maps.close()


def _config_slots(pin_dir: str, *slots: int) -> list[int] | None:
    """Slots of a pinned config map (0 where unset); None when there is none. A config map not of
    our shape reads as all -1 (an unknown layout: rebuilt)."""
    path = f"{pin_dir}/config"
    if not os.path.exists(path):
        return None
    fd = libbpf.obj_get(path)
    try:
        info = libbpf.map_info(fd)
        if (info.key_size, info.value_size) != layout.MAP_SIZES["config"]:
            return [-1] * len(slots)
        out = []
        for slot in slots:
            v = libbpf.lookup(fd, layout.U32.pack(slot), layout.CONFIG_VALUE.size)
            out.append(layout.CONFIG_VALUE.unpack(v)[0] if v else 0)
        return out
    finally:
        os.close(fd)


def _pinned_config(pin_dir: str) -> tuple[int, int] | None:
    """(layout version, source hash) of what is pinned; layout -1 when unknown or unset."""
    cfg = _config_slots(pin_dir, layout.CFG_LAYOUT, layout.CFG_SOURCE_HASH)
    return None if cfg is None else (cfg[0] or -1, cfg[1])


def used_clsact(pin_dir: str) -> bool:
    """Whether this node's loader fell back to clsact filters (recorded in config)."""
    try:
        cfg = _config_slots(pin_dir, layout.CFG_CLSACT)
    except OSError:
        return False
    return bool(cfg and cfg[0] == 1)


def object_key() -> str:
    """The compiled-object cache key (meshctl.datapath.objcache): every source and header, and the
    load-time settings except the pin directory, which the bytecode does not depend on (maps reach
    the instructions as descriptors)."""
    d = bpf_dir()
    settings = [f for f in (*layout.cflags(""), *features.probe().cflags()) if not f.startswith("-DMC_PIN_DIR=")]
    files = sorted(f for f in d.rglob("*") if f.suffix in (".c", ".h"))
    return objcache.cache_key(["\0".join(settings).encode(),
                               *(str(f.relative_to(d)).encode() + b"\0" + f.read_bytes() for f in files)])


COMPILE_TIMEOUT_ENV = "MESHCTL_BPF_COMPILE_TIMEOUT"
COMPILE_TIMEOUT = 120.0  # seconds a bcc compile may take before the node falls back to kernel routes


def compile_timeout() -> float:
    """COMPILE_TIMEOUT, or $MESHCTL_BPF_COMPILE_TIMEOUT where compiles are known to be slow (the
    test matrix under emulation)."""
    try:
        return float(os.environ.get(COMPILE_TIMEOUT_ENV, COMPILE_TIMEOUT))
    except ValueError:
        return COMPILE_TIMEOUT


def _compile_and_pin(pin_dir: str) -> None:
    """Load the cached compiled programs when there are any for these sources and headers;
    otherwise compile and pin in a child process: bcc brings LLVM (~140 MB resident) that the
    agent should not keep for its lifetime. The child leaves pinned programs and maps; we reopen them."""
    if objcache.load_and_pin(object_key(), pin_dir, {p: prog_path(pin_dir, p) for p in PROGRAMS}):
        return
    pkg_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), pkg_root) if p)
    try:
        p = subprocess.run([sys.executable, "-m", "meshctl.datapath.compile", pin_dir], capture_output=True,
                           text=True, env=env, timeout=compile_timeout())
    except subprocess.TimeoutExpired:
        raise MeshError(f"compiling {SOURCE} took more than {compile_timeout():.0f} s") from None
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
        raise MeshError(lines[-1] if lines else f"the BPF compiler exited with {p.returncode}")


def compile_and_pin_here(pin_dir: str) -> None:
    """bcc compile in this process; maps are created (or reopened) at their pinned paths by
    BPF_TABLE_PINNED; programs replace the old pins. (meshctl.datapath.compile runs this.)"""
    main, cflags, _ = source(pin_dir)
    try:
        from bcc import BPF  # noqa: PLC0415 - optional dependency, checked at run time
    except ImportError as e:
        raise MeshError(f"bcc is not importable ({e})") from None
    try:
        b = BPF(src_file=str(main).encode(), cflags=cflags)
    except Exception as e:  # bcc raises bare Exception on compile/load errors
        raise MeshError(f"bcc could not compile/load {SOURCE}: {_first_line(e)}") from None
    try:
        for name in PROGRAMS:
            try:
                fn = b.load_func(name.encode(), BPF.SCHED_CLS)
            except Exception as e:  # the verifier refused it: a helper this kernel lacks
                raise MeshError(f"the kernel refused program {name}: {_first_line(e)}") from None
            # bpffs has no rename: a pin is replaced by unpin + pin (links hold the running program).
            libbpf.unpin(prog_path(pin_dir, name))
            libbpf.obj_pin(fn.fd, prog_path(pin_dir, name))
        objcache.store(object_key(), b, PROGRAMS, (*NodeMaps.NAMES, *layout.MONITOR_MAPS))
    finally:
        b.cleanup()


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def reopen(pin_dir: str) -> Loaded:
    """Open what is pinned, compiling and changing nothing (for inspection: `maps dump`)."""
    cfg = _pinned_config(pin_dir)
    if cfg is None:
        raise MeshError(f"nothing is pinned under {pin_dir} (datapath not loaded)")
    if cfg[0] != layout.LAYOUT_VERSION:
        raise MeshError(f"{pin_dir} holds layout {cfg[0]}, this meshctl reads layout {layout.LAYOUT_VERSION}")
    return _open_pinned(pin_dir, compiled=False, migrated=None)


def _open_pinned(pin_dir: str, compiled: bool, migrated: int | None) -> Loaded:
    maps = NodeMaps(pin_dir)
    progs: dict[str, int] = {}
    try:
        for p in PROGRAMS:
            progs[p] = libbpf.obj_get(prog_path(pin_dir, p))
        ids = {p: libbpf.prog_info(fd).id for p, fd in progs.items()}
    except BaseException:
        for fd in progs.values():
            os.close(fd)
        maps.close()
        raise
    return Loaded(maps, progs, ids, compiled, migrated)


def load(pin_dir: str) -> Loaded:
    """Reopen or (re)build this node's programs and maps. Raises MeshError/OSError/ImportError
    when the fast path cannot run here; the caller turns that into kernel-routes mode."""
    os.makedirs(pin_dir, exist_ok=True)
    _, _, digest = source(pin_dir)
    migrated: int | None = None
    cfg = _pinned_config(pin_dir)
    pinned, pinned_hash = cfg if cfg is not None else (None, 0)
    if pinned is not None and pinned != layout.LAYOUT_VERSION:
        log.warning("datapath: pinned maps in %s have layout %s, this agent %s: rebuilding them",
                    pin_dir, pinned, layout.LAYOUT_VERSION)
        remove_maps_and_progs(pin_dir)
        migrated = pinned
    have_progs = all(os.path.exists(prog_path(pin_dir, p)) for p in PROGRAMS)
    compiled = False
    if not (pinned == layout.LAYOUT_VERSION and have_progs and pinned_hash == digest):
        _compile_and_pin(pin_dir)
        compiled = True
    loaded = _open_pinned(pin_dir, compiled, migrated)
    try:
        loaded.maps.config_set(layout.CFG_SOURCE_HASH, digest)
        loaded.maps.config_set(layout.CFG_MARK, layout.MARK)
        loaded.maps.config_set(layout.CFG_LAYOUT, layout.LAYOUT_VERSION)
    except BaseException:
        loaded.close()
        raise
    return loaded
