# SPDX-License-Identifier: Apache-2.0
"""Compile the programs with bcc, pin them and their maps, or reopen what is already pinned.

An agent restart must not drop a packet: programs and maps stay pinned under
`<pin_root>/<node>/`, and a restarted agent whose source is unchanged reopens them without
compiling. A changed source is compiled against the same pinned maps and the links are switched
to the new programs atomically (bpf_link_update). Pinned maps of another layout version are
unpinned and rebuilt (the old programs keep running on the old maps until their links switch).

Where the programs come from, in order (`Loaded.objects` and config[CFG_OBJECTS] record which):
what bcc compiled on this node before (the object cache), the objects the image ships for the
variant the feature probes select (no headers needed), and a bcc compile where kernel headers
exist. When none loads the caller runs the node on kernel routes.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from meshctl.datapath import features, layout, libbpf, objcache
from meshctl.datapath.maps import NodeMaps
from meshctl.errors import MeshError

log = logging.getLogger("meshctl.datapath")

PROGRAMS = ("from_pod", "from_private", "flow_egress", "from_tunnel", "tunnel_egress")
SOURCE = "datapath.c"


def bpf_dir() -> Path:
    """The C sources, shipped as the data package meshctl.bpf (the repository's bpf/ folder)."""
    d = Path(str(files("meshctl.bpf")))
    if not (d / SOURCE).exists():
        raise MeshError(f"the BPF sources ({SOURCE}) are not installed in {d}")
    return d


# Where the loaded programs came from (Loaded.objects), and their codes in config[CFG_OBJECTS].
OBJECTS_SHIPPED = "shipped"
OBJECTS_COMPILED = "compiled (bcc)"
OBJECTS_CACHED = "compiled (bcc, cached)"
OBJECT_SOURCES = (OBJECTS_SHIPPED, OBJECTS_COMPILED, OBJECTS_CACHED)


def _variant(variant: Iterable[str] | None) -> frozenset[str]:
    """`variant`, or the one this kernel's probes select when None."""
    return features.probe().variant() if variant is None else frozenset(variant)


def source(pin_dir: str, variant: Iterable[str] | None = None) -> tuple[Path, list[str], int]:
    """What bcc compiles: the main source, its cflags (load-time settings, the variant's feature
    settings, this node's unless given, and the include path) and a 63-bit hash of both with every
    header (stored in config: a change of any of them recompiles)."""
    d = bpf_dir()
    cflags = [f"-I{d}", "-Wno-unused-function", *layout.cflags(pin_dir),
              *features.variant_cflags(_variant(variant))]
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
        err = mount_bpffs("/sys/fs/bpf")
        if err is not None and not bpffs_mounted("/sys/fs/bpf"):
            raise MeshError(f"cannot mount bpffs on /sys/fs/bpf: {err}")


MNT_DETACH = 2


def mount_bpffs(path: str) -> str | None:
    """Mount a bpf filesystem on `path` with mount(2) (no util-linux needed in a slim image);
    None when mounted, else why not."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(b"bpf", path.encode(), b"bpf", 0, None) != 0:
        return os.strerror(ctypes.get_errno())
    return None


@contextlib.contextmanager
def build_pin_dir(pin_root: str) -> Iterator[str]:
    """A writable bpffs folder for build-objects' throwaway maps, removed after: `build-<pid>` under
    `pin_root` when that is a bpffs this process can write, else a private bpffs mounted on a new
    temporary folder (an image build's RUN step sees no bpffs, or the host's read-only, as a chroot
    isolation binds /sys). MeshError in one line when neither works (no CAP_SYS_ADMIN to mount)."""
    if bpffs_mounted(pin_root):
        pin_dir = f"{pin_root}/build-{os.getpid()}"
        try:
            os.makedirs(pin_dir, exist_ok=True)
        except OSError as e:
            why = f"{pin_root} is not writable ({e.strerror})"
        else:
            try:
                yield pin_dir
            finally:
                with contextlib.suppress(OSError):
                    os.rmdir(pin_dir)
            return
    else:
        why = f"{pin_root} is not on a bpf filesystem"
    mnt = tempfile.mkdtemp(prefix="meshctl-bpffs-")
    err = mount_bpffs(mnt)
    if err is not None:
        os.rmdir(mnt)
        raise MeshError(f"no writable bpffs: {why}, and mounting a private one on {mnt} failed ({err}); "
                        "build-objects needs CAP_SYS_ADMIN and CAP_BPF")
    try:
        yield mnt
    finally:
        ctypes.CDLL(None, use_errno=True).umount2(mnt.encode(), MNT_DETACH)
        with contextlib.suppress(OSError):
            os.rmdir(mnt)


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
    compiled: bool             # loaded now (else reopened as a previous agent pinned them)
    migrated_from: int | None  # layout version replaced, if any
    objects: str | None = None  # where the programs came from (OBJECT_SOURCES), None: not recorded

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


def _key_sources(variant: Iterable[str] | None) -> list[bytes]:
    """What a compiled object depends on: every source and header, and the load-time settings except
    the pin directory, which the bytecode does not depend on (maps reach the instructions as
    descriptors)."""
    d = bpf_dir()
    settings = [f for f in (*layout.cflags(""), *features.variant_cflags(_variant(variant)))
                if not f.startswith("-DMC_PIN_DIR=")]
    files = sorted(f for f in d.rglob("*") if f.suffix in (".c", ".h"))
    return ["\0".join(settings).encode(), *(str(f.relative_to(d)).encode() + b"\0" + f.read_bytes() for f in files)]


def object_key(variant: Iterable[str] | None = None) -> str:
    """The compiled-object cache key of `variant` (this kernel's when None) compiled on this node."""
    return objcache.cache_key(_key_sources(variant))


def shipped_key(variant: Iterable[str] | None = None) -> str:
    """The key a shipped object of `variant` (this kernel's when None) carries."""
    return objcache.shipped_key(_key_sources(variant))


def shipped_path(variant: Iterable[str] | None = None, directory: Path | None = None) -> Path:
    """The shipped object of `variant` (this kernel's when None) in `directory` (objcache.shipped_dir())."""
    return (directory or objcache.shipped_dir()) / f"{features.variant_name(_variant(variant))}.json"


COMPILE_TIMEOUT_ENV = "MESHCTL_BPF_COMPILE_TIMEOUT"
COMPILE_TIMEOUT = 120.0  # seconds a bcc compile may take before the node falls back to kernel routes


def compile_timeout() -> float:
    """COMPILE_TIMEOUT, or $MESHCTL_BPF_COMPILE_TIMEOUT where compiles are known to be slow (the
    test matrix under emulation)."""
    try:
        return float(os.environ.get(COMPILE_TIMEOUT_ENV, COMPILE_TIMEOUT))
    except ValueError:
        return COMPILE_TIMEOUT


def _compile_and_pin(pin_dir: str) -> str:
    """Load the programs from the first source that works (see the module doc) and say which
    (OBJECT_SOURCES). A compile runs in a child process: bcc brings LLVM (~140 MB resident) that
    the agent should not keep for its lifetime; it leaves pinned programs and maps we reopen.
    MeshError naming why when no source works."""
    progs = {p: prog_path(pin_dir, p) for p in PROGRAMS}
    if objcache.load_and_pin(objcache.cache_path(object_key()), object_key(), pin_dir, progs) is None:
        return OBJECTS_CACHED
    shipped = objcache.load_and_pin(shipped_path(), shipped_key(), pin_dir, progs)
    if shipped is None:
        return OBJECTS_SHIPPED
    if not objcache.have_headers():
        raise MeshError(f"no kernel headers at {objcache.headers_dir()} to compile with bcc, and no shipped "
                        f"object loaded ({shipped})")
    if importlib.util.find_spec("bcc") is None:  # the agent image carries none (docs/kubernetes.md)
        raise MeshError(f"no shipped object loaded ({shipped}), and no bcc here to compile one")
    log.info("datapath: shipped objects not loaded (%s): compiling with bcc", shipped)
    pkg_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), pkg_root) if p)
    if objcache.HEADERS_ENV in env:
        env["BCC_KERNEL_SOURCE"] = env[objcache.HEADERS_ENV]
    try:
        p = subprocess.run([sys.executable, "-m", "meshctl.datapath.compile", pin_dir], capture_output=True,
                           text=True, env=env, timeout=compile_timeout())
    except subprocess.TimeoutExpired:
        raise MeshError(f"compiling {SOURCE} took more than {compile_timeout():.0f} s") from None
    if p.returncode != 0:
        lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
        raise MeshError(lines[-1] if lines else f"the BPF compiler exited with {p.returncode}")
    return OBJECTS_COMPILED


def _bcc_compile(pin_dir: str, variant: Iterable[str] | None = None) -> Any:  # bcc's BPF: untyped
    """bcc's object for the programs of `variant` (this kernel's when None): compiled, maps created
    (or reopened) at their pinned paths under `pin_dir` by BPF_TABLE_PINNED, programs not loaded.
    The caller cleans it up."""
    main, cflags, _ = source(pin_dir, variant)
    try:
        from bcc import BPF  # noqa: PLC0415 - optional dependency, checked at run time
    except ImportError as e:
        raise MeshError(f"bcc is not importable ({e})") from None
    try:
        return BPF(src_file=str(main).encode(), cflags=cflags)
    except Exception as e:  # bcc raises bare Exception on compile/load errors
        raise MeshError(f"bcc could not compile/load {SOURCE}: {_first_line(e)}") from None


def build_objects(out: Path, pin_dir: str) -> list[Path]:
    """Compile with bcc, into `out`, the programs of every variant the feature probes can select
    (features.variants()), one file per variant in the object cache's format: what the image
    ships. The programs are not loaded (a variant this host's kernel lacks a helper for compiles
    all the same); bcc creates the maps, so this needs CAP_BPF and a bpffs, where `pin_dir` lies
    (left empty). MeshError when one does not compile."""
    written = []
    os.makedirs(pin_dir, exist_ok=True)
    try:
        for variant in features.variants():
            b = _bcc_compile(pin_dir, variant)
            try:
                path = shipped_path(variant, out)
                if not objcache.write(path, shipped_key(variant), b, PROGRAMS, (*NodeMaps.NAMES, *layout.MONITOR_MAPS)):
                    raise MeshError(f"cannot write the compiled programs of variant "
                                    f"{features.variant_name(variant)} to {path}")
            finally:
                b.cleanup()
            written.append(path)
    finally:
        remove_maps_and_progs(pin_dir)
    return written


def compile_and_pin_here(pin_dir: str) -> None:
    """bcc compile in this process; maps are created (or reopened) at their pinned paths by
    BPF_TABLE_PINNED; programs replace the old pins. (meshctl.datapath.compile runs this.)"""
    from bcc import BPF  # noqa: PLC0415 - _bcc_compile checked it is there

    b = _bcc_compile(pin_dir)
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
    code = maps.config_get(layout.CFG_OBJECTS)
    objects = OBJECT_SOURCES[code - 1] if 0 < code <= len(OBJECT_SOURCES) else None
    return Loaded(maps, progs, ids, compiled, migrated, objects)


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
    objects = None
    if not (pinned == layout.LAYOUT_VERSION and have_progs and pinned_hash == digest):
        objects = _compile_and_pin(pin_dir)
    loaded = _open_pinned(pin_dir, objects is not None, migrated)
    try:
        if objects is not None:
            loaded.maps.config_set(layout.CFG_OBJECTS, OBJECT_SOURCES.index(objects) + 1)
            loaded.objects = objects
        loaded.maps.config_set(layout.CFG_SOURCE_HASH, digest)
        loaded.maps.config_set(layout.CFG_MARK, layout.MARK)
        loaded.maps.config_set(layout.CFG_LAYOUT, layout.LAYOUT_VERSION)
    except BaseException:
        loaded.close()
        raise
    return loaded
