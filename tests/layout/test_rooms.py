"""The package's rooms keep their promises, read from the code's own imports:

- nothing outside `lab/` imports `lab/` (the lab and test rigs stay out of the agent image);
- `mesh/` is pure: it imports only itself, `errors` and standard modules that do no I/O;
- `node/`, `datapath/`, `backends/` and `etcd/` never reach up into `agent/` or `cli/`;
- every package under ctl/ is listed in pyproject.toml (the list is explicit so bpf/ can ship).
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "ctl" / "meshctl"

PURE_STDLIB = {"__future__", "base64", "bisect", "collections", "collections.abc", "contextlib", "dataclasses",
               "functools", "gc", "ipaddress", "itertools", "re", "typing"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module `path` imports, at any depth (function-level imports count too)."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from meshctl import lab`
    return out


MODULES = sorted(PKG.rglob("*.py"))


def room(path: Path) -> str:
    rel = path.relative_to(PKG).parts
    return rel[0] if len(rel) > 1 else ""


@pytest.mark.parametrize("path", [p for p in MODULES if room(p) != "lab"], ids=lambda p: str(p.relative_to(PKG)))
def test_nothing_outside_lab_imports_lab(path: Path) -> None:
    bad = sorted(m for m in imports(path) if m == "meshctl.lab" or m.startswith("meshctl.lab."))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


@pytest.mark.parametrize("path", [p for p in MODULES if room(p) == "mesh"], ids=lambda p: str(p.relative_to(PKG)))
def test_mesh_is_pure(path: Path) -> None:
    bad = sorted(m for m in imports(path)
                 if not (m in PURE_STDLIB or m.startswith(("meshctl.mesh", "meshctl.errors"))
                         or m.split(".")[0] in PURE_STDLIB or m.rpartition(".")[0] in PURE_STDLIB))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


@pytest.mark.parametrize("path", [p for p in MODULES if room(p) in ("mesh", "node", "datapath", "backends", "etcd")],
                         ids=lambda p: str(p.relative_to(PKG)))
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
    f = PKG / "node" / "_probe_for_test.py"
    try:
        f.write_text("def x():\n    from ..lab import netns\n    return netns\n")
        assert "meshctl.lab.netns" in imports(f)
    finally:
        f.unlink()
