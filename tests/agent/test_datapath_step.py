# SPDX-License-Identifier: Apache-2.0
"""The agent's datapath step rebuilds the flow filter once per resync interval (the slots of
flows the LRUs evicted cleared), counting from when the datapath it was handed was opened (which
built the filter)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from meshctl.agent import steps
from meshctl.agent.config import AgentConfig
from meshctl.agent.steps import DatapathStep, LoadedDatapath, PassInput
from meshctl.backends.file import load_topology
from meshctl.mesh.plan import plan_node

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cross-mesh.yaml"
RESYNC = 30.0


class FakeDatapath:
    """What the step calls of a Datapath, recorded."""

    mode = "ebpf"

    def __init__(self) -> None:
        self.rebuilds: list[float] = []
        self.staged = 0
        self.now = 0.0

    def attach(self, *args: object, **kw: object) -> None:
        pass

    def stage(self, *args: object) -> None:
        self.staged += 1

    def rebuild_flow_filter(self) -> None:
        self.rebuilds.append(self.now)


@pytest.mark.parametrize(("name", "passes", "rebuilt"), [
    ("within the interval of the open: none", [1.0, 29.0], []),
    ("one interval after the open", [1.0, 30.0, 45.0], [30.0]),
    ("then once per interval, however many passes", [10.0, 31.0, 40.0, 60.0, 61.0, 90.0], [31.0, 61.0]),
])
def test_the_flow_filter_is_rebuilt_once_per_resync_interval(monkeypatch: pytest.MonkeyPatch, name: str,
                                                             passes: list[float], rebuilt: list[float]) -> None:
    dp = FakeDatapath()
    monkeypatch.setattr(steps.time, "monotonic", lambda: dp.now)
    monkeypatch.setattr(steps.discovery, "pod_routes", lambda ifs: {})
    monkeypatch.setattr(steps.discovery, "private_ipv4", lambda name: None)
    monkeypatch.setattr(steps.discovery, "private_ipv6", lambda name: None)
    cfg = dataclasses.replace(AgentConfig(node_name="a1"), private_interface="priv", resync_interval=RESYNC)
    slot = LoadedDatapath()
    slot.put(dp, at=0.0)  # type: ignore[arg-type]  # opened at t=0
    step = DatapathStep(cfg, slot)
    topo = load_topology(EXAMPLE)
    p = PassInput(plan=plan_node(topo, topo.nodes[0].name), topo=topo, me=topo.nodes[0], mesh_cidrs=frozenset(),
                  pod_ifs=())
    for t in passes:
        dp.now = t
        step.sync(p)
    assert dp.rebuilds == rebuilt, name
    assert dp.staged == len(passes)
