# SPDX-License-Identifier: Apache-2.0
"""The package's rooms keep their promises, read from the code's own imports:

- `mesh/` is pure: it imports only itself, `errors` and standard modules that do no I/O;
- `node/`, `datapath/`, `backends/` and `etcd/` never reach up into `agent/` or `cli/`;
- every package under ctl/ is listed in pyproject.toml (the list is explicit so bpf/ can ship).

The lab's isolation and the absence of import circles are test_import_graph.py's.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.layout.graph import PKG, ROOT, imports, module_name

PURE_STDLIB = {"__future__", "base64", "bisect", "collections", "collections.abc", "contextlib", "dataclasses",
               "difflib", "enum", "functools", "hashlib", "ipaddress", "itertools", "math", "operator", "re", "typing",
               "weakref"}

MODULES = sorted(PKG.rglob("*.py"))


def top_room(path: Path) -> str:
    """The first folder under ctl/meshctl a file sits in ("" for the top)."""
    rel = path.relative_to(PKG).parts
    return rel[0] if len(rel) > 1 else ""


@pytest.mark.parametrize("path", [p for p in MODULES if top_room(p) == "mesh"], ids=lambda p: str(p.relative_to(PKG)))
def test_mesh_is_pure(path: Path) -> None:
    bad = sorted(m for m in imports(path)
                 if not (m in PURE_STDLIB or m.startswith(("meshctl.mesh", "meshctl.errors"))
                         or m.split(".")[0] in PURE_STDLIB or m.rpartition(".")[0] in PURE_STDLIB))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


LOWER = ("mesh", "node", "datapath", "backends", "etcd")


@pytest.mark.parametrize("path", [p for p in MODULES if top_room(p) in LOWER], ids=lambda p: str(p.relative_to(PKG)))
def test_lower_rooms_do_not_reach_up(path: Path) -> None:
    up = ("meshctl.cli", "meshctl.agent.loop", "meshctl.agent.steps", "meshctl.agent.run", "meshctl.agent.server")
    bad = sorted(m for m in imports(path) if m.startswith(up))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_every_package_is_listed_in_pyproject() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {module_name(p) for p in PKG.rglob("__init__.py")} | {"meshctl.bpf"}
    assert listed == found


def test_the_checks_would_catch_a_lab_import(tmp_path: Path) -> None:
    """The import reader sees function-level and relative imports (what a violation would use)."""
    pkg = tmp_path / "meshctl"
    f = pkg / "node" / "probe.py"
    f.parent.mkdir(parents=True)
    f.write_text("def x():\n    from ..lab import netns\n    return netns\n")
    assert "meshctl.lab.netns" in imports(f, pkg)
