# SPDX-License-Identifier: Apache-2.0
"""The package read as code: which modules each file imports, and the module and room graphs those
imports make. Every function takes the package folder, so the checks run on the real tree and on
small synthetic trees alike (a check that is never seen to fail proves nothing)."""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "ctl" / "meshctl"

Graph = Mapping[str, Iterable[str]]


def module_name(path: Path, pkg: Path = PKG) -> str:
    """The dotted name `path` imports as (a package's `__init__.py` is the package)."""
    parts = list(path.relative_to(pkg.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(path: Path, pkg: Path) -> Iterator[tuple[str, list[str]]]:
    """Each import statement in `path` at any depth, as (module, names it takes from that module)."""
    here = module_name(path, pkg)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            yield mod, [a.name for a in node.names]


def imports(path: Path, pkg: Path = PKG) -> set[str]:
    """Every module `path` imports, at any depth (function-level imports count too), and every
    `module.name` it takes with `from module import name` (so `from meshctl import lab` shows)."""
    out: set[str] = set()
    for mod, names in _imported(path, pkg):
        out.add(mod)
        out.update(f"{mod}.{n}" for n in names)
    return out


def modules(pkg: Path = PKG) -> dict[str, Path]:
    """The package's modules by dotted name."""
    return {module_name(p, pkg): p for p in sorted(pkg.rglob("*.py"))}


def module_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """Module -> the package's own modules it imports. `from a import b` is an edge to `a.b` when
    that is a module, else to `a`: the module whose code the import statement needs."""
    mods = modules(pkg)
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps: set[str] = set()
        for mod, taken in _imported(path, pkg):
            subs = {f"{mod}.{n}" for n in taken} & mods.keys()
            deps |= subs
            if mod in mods and (not taken or len(subs) < len(taken)):
                deps.add(mod)
        graph[name] = deps - {name}
    return graph


def room(path: Path, pkg: Path = PKG) -> str:
    """The folder a file sits in, relative to the package: `mesh`, `lab/vms`; "" for the top."""
    rel = path.parent.relative_to(pkg)
    return "" if rel == Path(".") else rel.as_posix()


def room_graph(pkg: Path = PKG) -> dict[str, set[str]]:
    """Room -> the other rooms its modules import."""
    mods = modules(pkg)
    graph: dict[str, set[str]] = {}
    for name, deps in module_graph(pkg).items():
        here = room(mods[name], pkg)
        graph.setdefault(here, set()).update(room(mods[d], pkg) for d in deps)
        graph[here].discard(here)
    return graph


def find_circle(graph: Graph) -> list[str]:
    """One circle in `graph` in import order, its first node repeated at the end
    (`[a, b, c, a]`: a imports b, b imports c, c imports a); [] when there is none."""
    done: set[str] = set()
    path: list[str] = []

    def visit(node: str) -> list[str]:
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return []
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if circle := visit(nxt):
                return circle
        path.pop()
        done.add(node)
        return []

    for start in sorted(graph):
        if circle := visit(start):
            return circle
    return []


def forbidden_imports(pkg: Path, who: Callable[[str], bool], forbidden: Iterable[str]) -> dict[str, list[str]]:
    """Each module `who` accepts (by dotted name) that imports one of `forbidden` or a module under
    one, with what it imports."""
    banned = tuple(forbidden)
    out: dict[str, list[str]] = {}
    for name, path in modules(pkg).items():
        if who(name):
            bad = sorted(m for m in imports(path, pkg) if m in banned or m.startswith(tuple(f"{b}." for b in banned)))
            if bad:
                out[name] = bad
    return out
