# SPDX-License-Identifier: Apache-2.0
"""The agent's sysctls step: forwarding and rp_filter once per run, and IPv6 forwarding as soon as
the mesh carries an IPv6 CIDR (issue 22: a node forwarding IPv6 pods)."""

from __future__ import annotations

import dataclasses
import ipaddress
from pathlib import Path

import pytest

from meshctl.agent import steps
from meshctl.agent.config import AgentConfig
from meshctl.agent.steps import PassInput, SysctlsStep
from meshctl.backends.file import load_topology
from meshctl.mesh.plan import plan_node

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cross-mesh.yaml"


def _input(*cidrs: str) -> PassInput:
    topo = load_topology(EXAMPLE)
    me = topo.nodes[0]
    return PassInput(plan=plan_node(topo, me.name), topo=topo, me=me,
                     mesh_cidrs=frozenset(ipaddress.ip_network(c) for c in cidrs), pod_ifs=())


@pytest.mark.parametrize(("name", "passes", "calls"), [
    ("IPv4 only: once, without IPv6", [("10.42.0.0/16",), ("10.42.0.0/16",)], [False]),
    ("dual stack from the start: once, with IPv6", [("10.42.0.0/16", "fd42::/48"), ("10.42.0.0/16", "fd42::/48")],
     [True]),
    ("IPv6 arrives later: set again, then left alone", [("10.42.0.0/16",), ("10.42.0.0/16", "fd42::/48"),
                                                          ("10.42.0.0/16", "fd42::/48"), ("10.42.0.0/16",)],
     [False, True]),
])
def test_ipv6_forwarding_follows_the_mesh(monkeypatch: pytest.MonkeyPatch, name: str,
                                          passes: list[tuple[str, ...]], calls: list[bool]) -> None:
    seen: list[bool] = []

    def record(private_if: str | None, wg_if: str | None, *, ipv6: bool = False) -> dict[str, str]:
        assert (private_if, wg_if) == ("priv", "kilo0")
        seen.append(ipv6)
        return {}

    monkeypatch.setattr(steps.sysctls, "ensure_sysctls", record)
    cfg = dataclasses.replace(AgentConfig(node_name="a1"), private_interface="priv", wg_interface="kilo0")
    step = SysctlsStep(cfg)
    for cidrs in passes:
        step.sync(_input(*cidrs))
    assert seen == calls, name
