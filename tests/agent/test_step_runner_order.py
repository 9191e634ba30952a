# SPDX-License-Identifier: Apache-2.0
"""The step runner's make-before-break order: every step's sync runs before any retire, retires
run in reverse order and only on the steps that synced, a failing retire is counted and makes
its step run again next pass. The steps here record what the runner calls on them (the runner
sees steps only through the Step protocol)."""

from __future__ import annotations

import ipaddress
from collections.abc import Hashable
from pathlib import Path

from meshctl.agent.reporting import ErrorCounts, PassLog
from meshctl.agent.step_runner import StepRunner
from meshctl.agent.steps import NOTHING, NOTHING_SHOWN, PassInput, StepReport
from meshctl.backends.file import load_topology
from meshctl.mesh.plan import plan_node

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cross-mesh.yaml"


class Recording:
    """A step that writes its calls to a shared journal; `fail` names the calls that raise."""

    provides = NOTHING
    needs = NOTHING
    serves: tuple[type, ...] = ()

    def __init__(self, name: str, journal: list[str], fail: frozenset[str] = frozenset(),
                 disturbs: frozenset[str] = NOTHING) -> None:
        self.name, self.journal, self.fail, self.disturbs = name, journal, fail, disturbs

    def _call(self, what: str) -> None:
        self.journal.append(f"{what} {self.name}")
        if what in self.fail:
            raise RuntimeError(f"{self.name} {what} failed")

    def inputs(self, p: PassInput) -> Hashable:
        return "same"

    def sync(self, p: PassInput) -> frozenset[str]:
        self._call("sync")
        return NOTHING

    def retire(self, p: PassInput) -> frozenset[str]:
        self._call("retire")
        return self.disturbs

    def forget(self) -> None:
        self.journal.append(f"forget {self.name}")

    def wants_pass(self, now: float, last_pass: float) -> bool:
        return False

    def status(self) -> StepReport:
        return NOTHING_SHOWN


def _input() -> PassInput:
    topo = load_topology(EXAMPLE)
    me = topo.nodes[0]
    return PassInput(plan=plan_node(topo, me.name), topo=topo, me=me,
                     mesh_cidrs=frozenset({ipaddress.ip_network("10.42.0.0/16")}), pod_ifs=())


def test_all_syncs_then_retires_in_reverse_and_a_failed_sync_retires_nothing() -> None:
    journal: list[str] = []
    steps = [Recording("wireguard", journal), Recording("routes", journal, frozenset({"sync"})),
             Recording("datapath", journal)]
    runner = StepRunner(steps, resync_interval=3600)
    run = PassLog(ErrorCounts())
    runner.run(_input(), run)  # the first pass is a full one: every step forgets first
    assert journal == ["forget wireguard", "forget routes", "forget datapath",
                       "sync wireguard", "sync routes", "forget routes", "sync datapath",
                       "retire datapath", "retire wireguard"]
    assert set(run.errors) == {"routes"}
    journal.clear()
    runner.run(_input(), PassLog(ErrorCounts()))  # the same inputs: only the failed step runs again
    assert journal == ["sync routes", "forget routes"]


def test_a_failed_retire_is_counted_and_its_step_runs_again() -> None:
    journal: list[str] = []
    steps = [Recording("wireguard", journal, frozenset({"retire"})), Recording("routes", journal)]
    runner = StepRunner(steps, resync_interval=3600)
    run = PassLog(ErrorCounts())
    runner.run(_input(), run)
    assert journal == ["forget wireguard", "forget routes", "sync wireguard", "sync routes",
                       "retire routes", "retire wireguard", "forget wireguard"]
    assert set(run.errors) == {"wireguard"} and set(run.steps_ms) == {"wireguard", "routes"}
    journal.clear()
    runner.run(_input(), PassLog(ErrorCounts()))
    assert journal == ["sync wireguard", "retire wireguard", "forget wireguard"]


def test_a_step_a_retire_disturbed_runs_again_in_the_same_pass() -> None:
    """kilo0 left without an address (its retire) loses its routes: the route step forgets and
    syncs and retires again after the retires, once."""
    journal: list[str] = []
    steps = [Recording("wireguard", journal, disturbs=frozenset({"routes"})), Recording("routes", journal)]
    runner = StepRunner(steps, resync_interval=3600)
    runner.run(_input(), PassLog(ErrorCounts()))
    assert journal[2:] == ["sync wireguard", "sync routes", "retire routes", "retire wireguard",
                           "forget routes", "sync routes", "retire routes"]
