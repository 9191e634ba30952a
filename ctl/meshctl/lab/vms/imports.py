# SPDX-License-Identifier: Apache-2.0
"""The guest's imports, packed: the standard library and third-party modules the guest's Python
imports, compiled, in one tar it unpacks into its own memory before Python starts.

A guest reads the host's files over 9p under emulation, one round trip per stat, open and read:
importing the lab's entry modules file by file took 48-53 s of a quiet two-core host's guest
and 201 s of a loaded one's (2026-12-07), most of it waiting on 9p. The tar is one sequential
read; unpacked into the guest's tmpfs, at the front of PYTHONPATH, the same imports read memory.

What is packed: every module a fresh interpreter here imports with `WARM_IMPORTS`, as sourceless
`.pyc` (the interpreter's own bytecode: the host and guest run the same Python), extension
modules as they are, and the non-Python files of the third-party packages among them (certifi's
CA bundle). meshctl's own modules are not packed: they find their data beside their `__file__`
(the bpf sources, the labs, vagrant/node-prep.sh), and they are a fifth of the imports.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import shlex
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

from meshctl.errors import MeshError
from meshctl.lab.vms.zygote import WARM_IMPORTS

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
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                             timeout=LIST_TIMEOUT_S)
    except subprocess.CalledProcessError as e:
        last = e.stderr.strip().splitlines()
        raise MeshError(f"listing the guest's imports failed: {last[-1] if last else e.returncode}") from None
    except subprocess.TimeoutExpired:
        raise MeshError(f"listing the guest's imports took more than {LIST_TIMEOUT_S:.0f} s") from None
    files: list[str] = json.loads(out.stdout)
    return files


def _roots() -> list[str]:
    """sys.path's directories, longest first: a file's name in the pack is its name under the first
    that holds it."""
    return sorted({os.path.join(os.path.realpath(p), "") for p in sys.path if p and os.path.isdir(p)},
                  key=len, reverse=True)


def _members(files: list[str]) -> dict[str, str]:
    """{name in the pack: file here}."""
    roots = _roots()
    site = [r for r in roots if r.rstrip(os.sep).endswith(("site-packages", "dist-packages"))]
    out: dict[str, str] = {}
    packages: set[str] = set()
    for f in files:
        real = os.path.realpath(f)
        if real.startswith(_OWN):
            continue
        root = next((r for r in roots if real.startswith(r)), None)
        if root is None:
            continue
        rel = real[len(root):]
        if rel.endswith(".py"):
            pyc = importlib.util.cache_from_source(real)
            if os.path.exists(pyc):
                out[rel + "c"] = pyc
        elif rel.endswith(".so"):
            out[rel] = real
        if root in site and os.sep in rel:
            packages.add(os.path.join(root, rel.split(os.sep, 1)[0]))
    for pkg in packages:  # third-party package data (not code: that is packed above, compiled)
        for dirpath, dirnames, names in os.walk(pkg):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for n in names:
                if not n.endswith((".py", ".pyc", ".so", ".pyi")):
                    full = os.path.join(dirpath, n)
                    out[os.path.relpath(full, os.path.dirname(pkg))] = full
    return out


def pack() -> bytes:
    """The tar of the guest's imports (built once per process: every VM a lab boots shares it)."""
    global _packed
    with _lock:
        if _packed is None:
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                for name, path in sorted(_members(_imported_files()).items()):
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
