# SPDX-License-Identifier: Apache-2.0
"""`mesh/` holds no module-level mutable state: a plan is a function of its arguments, and what
plans keep between them is an object its caller owns (mesh.plan.PlanCache, agent.memos.PureMemos).

Read two ways: every value a mesh module binds at module level is immutable, or a plain container
(dict, list, set) used as a constant table; and no code in mesh/ changes such a container or
rebinds a module-level name (`global`). The one exception is named below with its reason.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import importlib
import ipaddress
import operator
import re
import types
import typing
from pathlib import Path

import pytest

from tests.layout.graph import PKG, ROOT, module_name

MESH = sorted((PKG / "mesh").glob("*.py"))

# Immutable values a module may bind.
IMMUTABLE = (int, float, complex, str, bytes, bool, type(None), frozenset, range, type, types.FunctionType,
             types.BuiltinFunctionType, types.ModuleType, re.Pattern, types.MappingProxyType, operator.itemgetter,
             operator.attrgetter, typing.TypeVar, types.GenericAlias, types.UnionType, property, enum.Enum,
             ipaddress.IPv4Address, ipaddress.IPv6Address, ipaddress.IPv4Network, ipaddress.IPv6Network,
             ipaddress.IPv4Interface, ipaddress.IPv6Interface)
CONTAINERS = (dict, list, set)
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "remove", "clear", "update", "setdefault", "add",
            "discard", "sort", "reverse", "__setitem__", "__delitem__", "intersection_update",
            "difference_update", "symmetric_difference_update"}

# The one module-level table mesh/ keeps, and why it may: `model._NETWORKS` interns networks (one
# object per network while anything holds it: 100,000 networks at 50,000 nodes). It is weak (it
# keeps nothing alive) and every function that reads it returns a value equal to the one it would
# build without it, so no result depends on what it holds.
INTERNING = {("meshctl.mesh.model", "_NETWORKS")}


def _module_names(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level by assignment."""
    out: set[str] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, ast.AnnAssign | ast.AugAssign) else []
        out.update(t.id for t in targets if isinstance(t, ast.Name))
    return out


def _immutable(v: object) -> bool:
    if isinstance(v, tuple):
        return all(_immutable(x) for x in v)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return type(v).__dataclass_params__.frozen  # type: ignore[attr-defined]
    return isinstance(v, IMMUTABLE) or type(v) is object or typing.get_origin(v) is not None \
        or type(v).__module__ == "typing"


@pytest.mark.parametrize("path", MESH, ids=lambda p: p.name)
def test_module_level_values_are_constants(path: Path) -> None:
    name = module_name(path)
    mod = importlib.import_module(name)
    bad = sorted(n for n in _module_names(ast.parse(path.read_text()))
                 if (name, n) not in INTERNING and not isinstance(getattr(mod, n), CONTAINERS)
                 and not _immutable(getattr(mod, n)))
    assert not bad, f"{path.relative_to(ROOT)} keeps module-level state: " + \
        ", ".join(f"{n} ({type(getattr(mod, n)).__name__})" for n in bad)


def _mutations(tree: ast.Module, tables: set[str]) -> list[str]:
    """Where code changes one of `tables` (module-level containers) or rebinds a module name."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            out.append(f"line {node.lineno}: global {', '.join(node.names)}")
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Subscript | ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in tables:
                out.append(f"line {node.lineno}: {t.value.id} changed")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS \
                and isinstance(node.func.value, ast.Name) and node.func.value.id in tables:
            out.append(f"line {node.lineno}: {node.func.value.id}.{node.func.attr}()")
    return out


@pytest.mark.parametrize("path", MESH, ids=lambda p: p.name)
def test_no_code_changes_a_module_level_table(path: Path) -> None:
    name = module_name(path)
    mod = importlib.import_module(name)
    tree = ast.parse(path.read_text())
    tables = {n for n in _module_names(tree) if (name, n) not in INTERNING and isinstance(getattr(mod, n), CONTAINERS)}
    found = _mutations(tree, tables)
    assert not found, f"{path.relative_to(ROOT)}: " + "; ".join(found)


def test_the_check_sees_a_cache() -> None:
    """What the plan kept before its cache became an object: a module-level memo is found."""
    from meshctl.mesh.memo import UsedMemo

    assert not _immutable(UsedMemo()) and not isinstance(UsedMemo(), CONTAINERS)
    tree = ast.parse("_SEEN = {}\ndef f(k):\n    _SEEN[k] = 1\n    _SEEN.setdefault(k, 2)\n")
    assert len(_mutations(tree, _module_names(tree))) == 2
