# SPDX-License-Identifier: Apache-2.0
"""The loop cannot see into its steps: the pass driver names no step class, and the step runner
touches a step only through the Step protocol's members."""

from __future__ import annotations

import ast
from pathlib import Path

from meshctl.agent import steps

AGENT = Path(steps.__file__).parent
PROTOCOL = {n for n in vars(steps.Step) if not n.startswith("_")}


def _tree(name: str) -> ast.Module:
    return ast.parse((AGENT / name).read_text())


def test_the_loop_names_no_step() -> None:
    imported = {a.name for n in ast.walk(_tree("loop.py")) if isinstance(n, ast.ImportFrom)
                and n.module == "meshctl.agent.steps" for a in n.names}
    assert imported == {"PassInput"}


def test_the_runner_uses_only_the_protocol() -> None:
    def is_step(e: ast.expr) -> bool:
        """`s`, `other` or `by_name[...]`: the runner's names for a step."""
        if isinstance(e, ast.Subscript):
            return isinstance(e.value, ast.Name) and e.value.id == "by_name"
        return isinstance(e, ast.Name) and e.id in {"s", "other"}

    used = {n.attr for n in ast.walk(_tree("step_runner.py")) if isinstance(n, ast.Attribute) and is_step(n.value)}
    assert used and used <= PROTOCOL, used - PROTOCOL
