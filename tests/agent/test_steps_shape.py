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
    assert imported == {"PassInput", "LivePeers"}  # an interface a step serves, not a step


def test_the_runner_uses_only_the_protocol() -> None:
    def is_step(e: ast.expr) -> bool:
        """`s`, `other` or `by_name[...]`: the runner's names for a step."""
        if isinstance(e, ast.Subscript):
            return isinstance(e.value, ast.Name) and e.value.id == "by_name"
        return isinstance(e, ast.Name) and e.id in {"s", "other"}

    used = {n.attr for n in ast.walk(_tree("step_runner.py")) if isinstance(n, ast.Attribute) and is_step(n.value)}
    assert used and used <= PROTOCOL, used - PROTOCOL


def _agent_steps() -> list[steps.Step]:
    from meshctl.agent.config import AgentConfig

    cfg = AgentConfig(node_name="a1")
    return [steps.WireGuardStep(cfg, "k" * 43 + "="), steps.EncapStep(cfg), steps.FlannelStep(cfg),
            steps.RoutesStep(cfg), steps.SysctlsStep(cfg), steps.NatStep(cfg),
            steps.DatapathStep(cfg, steps.LoadedDatapath()), steps.CniStep(cfg)]


def test_the_order_is_derived_from_what_steps_provide_and_need() -> None:
    """Given in any order, the agent's steps run WireGuard first, the encapsulation fallback and
    flannel before the routes, the datapath after the routes (the order a comment used to keep)."""
    from meshctl.agent.step_runner import step_order

    want = ["wireguard", "encap", "flannel", "routes", "sysctls", "nat", "datapath", "cni"]
    assert [s.name for s in step_order(_agent_steps())] == want
    names = [s.name for s in step_order(list(reversed(_agent_steps())))]
    for before, after in (("wireguard", "routes"), ("encap", "routes"), ("flannel", "routes"),
                          ("routes", "datapath"), ("wireguard", "sysctls")):
        assert names.index(before) < names.index(after), names


def test_the_runner_refuses_needs_nobody_provides_or_a_circle() -> None:
    import pytest

    from meshctl.agent.step_runner import StepRunner
    from meshctl.errors import MeshError

    every = _agent_steps()
    without_wireguard = [s for s in every if s.name != "wireguard"]
    with pytest.raises(MeshError, match="routes needs 'wireguard device'"):
        StepRunner(without_wireguard, 30.0)

    class Loop:
        def __init__(self, name: str, provides: str, needs: str) -> None:
            self.name, self.provides, self.needs = name, frozenset({provides}), frozenset({needs})

    with pytest.raises(MeshError, match="circle"):
        from meshctl.agent.step_runner import step_order

        step_order([Loop("a", "x", "y"), Loop("b", "y", "x")])  # type: ignore[list-item]


def test_other_parts_reach_steps_through_the_interfaces_they_serve() -> None:
    """The prober's carriers and the peer source are the steps that declare those interfaces;
    the lifecycle names no step's attribute and hands no step anything after it is made."""
    from meshctl.agent.step_runner import StepRunner

    runner = StepRunner(_agent_steps(), 30.0)
    assert sorted(type(c).__name__ for c in runner.carriers()) == ["DatapathStep", "EncapStep"]
    assert type(runner.live_peers()).__name__ == "WireGuardStep"
    tree = _tree("lifecycle.py")
    step_names = {n for n in vars(steps) if n.endswith("Step")}
    made = {n.targets[0].id for n in ast.walk(tree) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and isinstance(n.value.func, ast.Name) and n.value.func.id in step_names
            and isinstance(n.targets[0], ast.Name)}
    assert not made, f"lifecycle keeps steps by name: {made}"
    loop_tree = _tree("loop.py")
    reached = {n.attr for n in ast.walk(loop_tree) if isinstance(n, ast.Attribute)
               and isinstance(n.value, ast.Attribute) and n.value.attr == "passes"}
    assert not reached & {"runner", "pods", "last_plan", "_runner", "_pods", "_last_plan"}, reached
