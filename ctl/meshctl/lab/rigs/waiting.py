# SPDX-License-Identifier: Apache-2.0
"""Polling helpers shared by the lab's tests and benchmarks, and how long a lab waits for its agents
(light on purpose: `meshctl lab up --help` shows these bounds without importing the lab builder)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from meshctl.defaults import ANSWER_WAIT_ENV

CONVERGE_WAIT = 60.0  # s `lab up` waits for the agents to converge, unless told otherwise
# Under TCG a guest runs ~10-50x slower: five agents took 2-5 minutes to converge where the host
# takes seconds. A lab in such a VM waits longer by default (lab/vms).
EMULATED_CONVERGE_WAIT = 600.0
# An agent in a TCG guest on a busy host has taken more than 3 s (defaults.ANSWER_WAIT_S) to
# answer a command's /status request; under emulation commands wait this long for it.
EMULATED_AGENT_WAIT = 30.0


# Polling agents costs them too: each /status answer is a snapshot serialised, and under emulation
# one round over five agents took seconds of the CPU they converge with. After a round a waiter
# rests POLL_REST times as long as the round took (at least its own floor): its polling takes at
# most 1/(1 + POLL_REST) of the time, and on a host, where a round takes milliseconds, the floor
# rules as before.
POLL_REST = 3.0


def rest_after(started: float, floor: float) -> None:
    """Sleep after a polling round that began at `started` (time.monotonic())."""
    time.sleep(max(floor, POLL_REST * (time.monotonic() - started)))


class Booted(Protocol):
    """A VM as its record says it was booted (state.VmRecord)."""

    accel: str | None


def agent_wait(vm: Booted | None) -> float | None:
    """How long a command waits for an agent in `vm` (None: not in a VM, or under KVM: the shipped
    default)."""
    return EMULATED_AGENT_WAIT if vm is not None and vm.accel not in (None, "kvm") else None


def guest_env(vm: Booted | None) -> dict[str, str]:
    """The environment of a command run inside `vm`: a longer wait for the agents there when it
    is emulated."""
    wait = agent_wait(vm)
    return {} if wait is None else {ANSWER_WAIT_ENV: str(wait)}


def wait_for(pred: Callable[[], Any], timeout: float = 10.0, step: float = 0.05) -> Any:
    """pred()'s first truthy value within `timeout` s (else its last value, for the assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    return pred()


def wait_until(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition", step: float = 0.05) -> Any:
    """Like wait_for, but a timeout is an AssertionError naming `what`."""
    got = wait_for(cond, timeout, step)
    if not got:
        raise AssertionError(f"timed out waiting for {what}")
    return got
