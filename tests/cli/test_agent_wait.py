# SPDX-License-Identifier: Apache-2.0
"""How long a command waits for an agent's answer: 3 s, `MESHCTL_AGENT_WAIT` seconds when set (a
bad value is one line naming the variable), and 30 s for an agent in an emulated lab VM (the lab
sets it for the commands it runs in the guest, and for the host's own commands about a VM node)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from meshctl import defaults
from meshctl.lab.rigs.waiting import EMULATED_AGENT_WAIT, agent_wait, guest_env


@pytest.fixture
def silent_agent():
    """A listening socket that never answers: a request to it times out."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"127.0.0.1:{s.getsockname()[1]}"


def status(addr: str, wait: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != defaults.ANSWER_WAIT_ENV}
    if wait is not None:
        env[defaults.ANSWER_WAIT_ENV] = wait
    return subprocess.run([sys.executable, "-m", "meshctl.cli", "status", "--addr", addr], capture_output=True,
                          text=True, timeout=60, env=env)


@pytest.mark.parametrize("wait,said", [(None, "3"), ("1", "1"), ("1.5", "1.5")])
def test_a_silent_agent_is_waited_for_as_long_as_said(silent_agent, wait, said) -> None:
    p = status(silent_agent, wait)
    assert p.returncode == 1
    assert p.stderr == f"error: the meshctl agent at {silent_agent} did not answer within {said} s\n"


@pytest.mark.parametrize("wait", ["soon", "0", "-1", ""])
def test_a_bad_wait_is_one_line_naming_the_variable(silent_agent, wait) -> None:
    p = status(silent_agent, wait)
    assert p.returncode == 2, p.stderr
    assert p.stderr == f"error: MESHCTL_AGENT_WAIT: {wait!r} is not a positive number of seconds\n"


def test_an_emulated_vm_waits_longer_and_kvm_as_the_host() -> None:
    from meshctl.lab.namespaces.state import VmRecord

    tcg, kvm = VmRecord("a1", "6.1", "/run/x", accel="tcg"), VmRecord("a1", "6.1", "/run/x", accel="kvm")
    assert agent_wait(tcg) == EMULATED_AGENT_WAIT > defaults.ANSWER_WAIT_S
    assert agent_wait(kvm) is None and agent_wait(None) is None
    assert guest_env(tcg) == {defaults.ANSWER_WAIT_ENV: str(EMULATED_AGENT_WAIT)}
    assert guest_env(kvm) == guest_env(None) == {}


def test_lab_check_reads_an_emulated_vm_nodes_counters_as_patiently() -> None:
    """lab check's /status reads: the host's agents 2 s, a KVM guest's 5 s, a TCG guest's 30 s (a
    measurement without the source's fast-path counters misreads a direct pair as tunnel)."""
    from meshctl.lab.namespaces import check
    from meshctl.lab.namespaces.state import NodeState, VmRecord

    def node(accel: str | None) -> NodeState:
        vm = VmRecord("a1", "6.1", "/run/x", accel=accel) if accel else None
        return NodeState("a1", None, ["10.42.1.0/24"], "198.51.100.1", "198.51.100.1:9736", "/d", "/s", "/w", vm=vm)

    assert check.status_wait(node(None)) == check.HOST_STATUS_WAIT
    assert check.status_wait(node("kvm")) == check.VM_STATUS_WAIT
    assert check.status_wait(node("tcg")) == EMULATED_AGENT_WAIT
