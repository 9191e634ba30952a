# SPDX-License-Identifier: Apache-2.0
"""The lab's rooms keep their order, read from the code's own imports: rigs <- namespaces <- vms <-
cli (an arrow points at what imports), so the namespace lab never reaches into the VM labs and the
rigs know no lab; no import of the lab's own modules hides inside a function; no circle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CTL = Path(__file__).resolve().parents[2] / "ctl"
LAB = CTL / "meshctl" / "lab"
ORDER = {"rigs": 0, "namespaces": 1, "vms": 2, "cli": 3}
MODULES = sorted(LAB.rglob("*.py"))


def module(path: Path) -> str:
    parts = ("meshctl", *path.relative_to(LAB.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room(mod: str) -> str | None:
    parts = mod.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["meshctl", "lab"] and parts[2] in ORDER else None


def lab_imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at module level) of every lab module `path` imports."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("meshctl.lab"):
            for a in node.names:
                full = f"{node.module}.{a.name}"
                mod = full if (CTL / (full.replace(".", "/") + ".py")).exists() else node.module  # a module, or a name
                out.append((mod, id(node) in top))
        elif isinstance(node, ast.Import):
            out += [(a.name, id(node) in top) for a in node.names if a.name.startswith("meshctl.lab")]
    return out


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(LAB)))
def test_no_room_imports_a_room_above_it(path: Path) -> None:
    mine = room(module(path))
    if mine is None:
        return
    up = [m for m, _ in lab_imports(path) if ORDER.get(room(m) or "", -1) > ORDER[mine]]
    assert not up, f"{path.relative_to(LAB)} ({mine}) imports {up}"


# The command modules import the lab's rooms when a command runs, so `meshctl --help` and
# `meshctl lab X --help` load none of them (tests/cli/test_help.py); the rooms themselves import at
# module level, where the graph below sees every edge.
COMMAND_MODULES = ("cli.py", "plugin.py")


@pytest.mark.parametrize("path", [p for p in MODULES if str(p.relative_to(LAB)) not in COMMAND_MODULES],
                         ids=lambda p: str(p.relative_to(LAB)))
def test_lab_imports_are_at_module_level(path: Path) -> None:
    hidden = [m for m, top in lab_imports(path) if not top]
    assert not hidden, f"{path.relative_to(LAB)} imports {hidden} inside a function"


def test_the_lab_has_no_import_circle() -> None:
    graph = {module(p): {m for m, _ in lab_imports(p)} for p in MODULES}
    done: set[str] = set()

    def visit(mod: str, path: list[str]) -> None:
        if mod in path:
            raise AssertionError("import circle: " + " -> ".join([*path[path.index(mod):], mod]))
        if mod in done:
            return
        for dep in graph.get(mod, ()):
            visit(dep, [*path, mod])
        done.add(mod)

    for mod in graph:
        visit(mod, [])
