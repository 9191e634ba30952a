# SPDX-License-Identifier: Apache-2.0
"""Polling helpers shared by the integration tests (they live with the lab, which the benchmarks use
too), with the tests' own default timeout: WAIT_S, what a loaded 2-CPU machine (other suites, TCG
guests beside it) may take to show an event. A wait ends at the event; the timeout only bounds how
long a missing one is waited for, so it is generous. Bounds that are the behaviour (a lease, a hold
time) are passed explicitly, and figures are measured in bench/, not bounded here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshctl.lab.rigs import waiting

WAIT_S = 30.0


def wait_for(pred: Callable[[], Any], timeout: float = WAIT_S, step: float = 0.05) -> Any:
    """pred()'s first truthy value within `timeout` s (else its last value, for the assertion)."""
    return waiting.wait_for(pred, timeout, step)


def wait_until(cond: Callable[[], Any], timeout: float = WAIT_S, what: str = "condition", step: float = 0.05) -> Any:
    """Like wait_for, but a timeout is an AssertionError naming `what`."""
    return waiting.wait_until(cond, timeout, what, step)


__all__ = ["WAIT_S", "wait_for", "wait_until"]
