# SPDX-License-Identifier: Apache-2.0
"""The guest's imports, packed: the standard library and third-party modules the guest's Python
imports, compiled, in one tar it unpacks into its own memory before Python starts.

A guest reads the host's files over 9p under emulation, one round trip per stat, open and read:
importing the lab's entry modules file by file took 48-53 s of a quiet two-core host's guest
and 201 s of a loaded one's (2026-12-07), most of it waiting on 9p. The tar is one sequential
read; unpacked into the guest's tmpfs, at the front of PYTHONPATH, the same imports read memory.

What is packed: every top-level module and whole package (code and data: certifi's CA bundle) from
which a fresh interpreter here imports anything with `WARM_IMPORTS`, the code as sourceless `.pyc`
(the interpreter's own bytecode: the host and guest run the same Python), extension modules as
they are. meshctl's own modules are not packed: they find their data beside their `__file__`
(the bpf sources, the labs, vagrant/node-prep.sh), and they are a fifth of the imports.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import py_compile
import shlex
import sys
import tarfile
import tempfile
import threading
from pathlib import Path

from meshctl.lab.vms.zygote import WARM_IMPORTS
from meshctl.node.shell import sh

PACK_NAME = "imports.tar"
GUEST_DIR = "/run/meshctl-imports"  # tmpfs in the guest
LIST_TIMEOUT_S = 120.0
_OWN = str(Path(__file__).resolve().parents[2]) + os.sep  # meshctl's package directory

_lock = threading.Lock()
_packed: bytes | None = None


def _imported_files() -> list[str]:
    """The files of every module a fresh interpreter imports with WARM_IMPORTS."""
    script = ("import importlib, json, sys\n"
              f"for m in {WARM_IMPORTS!r}: importlib.import_module(m)\n"
              "print(json.dumps(sorted({f for m in list(sys.modules.values()) "
              "if isinstance(f := getattr(m, '__file__', None), str)})))")
    files: list[str] = json.loads(sh([sys.executable, "-"], input=script, timeout=LIST_TIMEOUT_S).stdout)
    return files


def _roots() -> list[str]:
    """sys.path's directories, longest first: a file's name in the pack is its name under the first
    that holds it."""
    return sorted({os.path.join(os.path.realpath(p), "") for p in sys.path if p and os.path.isdir(p)},
                  key=len, reverse=True)


def _compiled(src: str, scratch: str) -> str:
    """A `.pyc` of `src`: the interpreter's own cache when it is there and not older than the
    source, else compiled into `scratch`."""
    cached = importlib.util.cache_from_source(src)
    with contextlib.suppress(OSError):
        if os.stat(cached).st_mtime >= os.stat(src).st_mtime:
            return cached
    fd, out = tempfile.mkstemp(suffix=".pyc", dir=scratch)
    os.close(fd)
    py_compile.compile(src, cfile=out, dfile=src, doraise=True)
    return out


def _members(files: list[str], scratch: str) -> dict[str, str]:
    """{name in the pack: file here}. A package is packed whole, from the top: one packed in part
    would hide its other modules from the guest (its `__path__` would be the pack's directory
    alone), and the guest may import more of it than this listing did (`click.testing`)."""
    roots = _roots()
    tops: dict[str, str] = {}  # {top-level name (a package dir or a module file): its root}
    for f in files:
        real = os.path.realpath(f)
        root = next((r for r in roots if real.startswith(r)), None)
        if real.startswith(_OWN) or root is None:
            continue
        tops.setdefault(real[len(root):].split(os.sep, 1)[0], root)
    out: dict[str, str] = {}
    for top, root in tops.items():
        path = os.path.join(root, top)
        walked = [(root, [], [top])] if os.path.isfile(path) else os.walk(path)
        for dirpath, dirnames, names in walked:
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for n in names:
                full = os.path.join(dirpath, n)
                rel = os.path.relpath(full, root)
                if n.endswith(".py"):
                    out[rel + "c"] = _compiled(full, scratch)
                elif not n.endswith((".pyc", ".pyi")):
                    out[rel] = full
    return out


def pack() -> bytes:
    """The tar of the guest's imports (built once per process: every VM a lab boots shares it)."""
    global _packed
    with _lock:
        if _packed is None:
            buf = io.BytesIO()
            with tempfile.TemporaryDirectory(prefix="meshctl-imports-") as scratch, \
                    tarfile.open(fileobj=buf, mode="w") as tar:
                for name, path in sorted(_members(_imported_files(), scratch).items()):
                    tar.add(path, arcname=name, recursive=False)
            _packed = buf.getvalue()
        return _packed


def write_pack(shared: Path) -> None:
    """The pack into a VM's shared directory, where the guest's first command unpacks it."""
    (shared / PACK_NAME).write_bytes(pack())


def guest_command(shared: Path, argv: list[str]) -> str:
    """A shell command for the guest's init: unpack the imports into GUEST_DIR, then run `argv`
    with GUEST_DIR at the front of PYTHONPATH (its children inherit it). Without the pack, or if
    unpacking fails, `argv` runs as it would have: over 9p, only slower."""
    pack_path = shlex.quote(str(shared / PACK_NAME))
    d = shlex.quote(GUEST_DIR)
    return (f"if mkdir -p {d} && tar -xf {pack_path} -C {d} 2>/dev/null; "
            f"then export PYTHONPATH={d}${{PYTHONPATH:+:$PYTHONPATH}}; fi; exec {shlex.join(argv)}")
