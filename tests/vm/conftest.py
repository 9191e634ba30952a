# SPDX-License-Identifier: Apache-2.0
"""The VM tests boot TCG guests, which take every CPU they are given. Under `make test` they run on
one xdist worker beside the host tests (tests/conftest.py), whose labs keep timing bounds of a
few seconds: the guests started here run at a lower CPU priority, so they use what the host
tests leave idle (most of it: those tests mostly wait on agents and pings)."""

from __future__ import annotations

import os

import pytest

VM_NICENESS = 10  # CFS weight 110 against the host tests' 1024
# The VM labs' `lab up --wait` here: niced guests beside the host tests get what those leave, and
# on a busy machine five agents in the one-VM lab's 2-vCPU TCG guest had not converged after the
# default 600 s (2026-12-07: 14:20 run, 860 s; 15:20 run, past 600 s). Alone they take 2-4 min.
LOADED_CONVERGE_WAIT_S = 1200
# ... and what `lab up` itself may take: the wait, the guest's build (vmlab.GUEST_BUILD_TIMEOUT)
# and its boot
LAB_UP_TIMEOUT_S = LOADED_CONVERGE_WAIT_S + 900


@pytest.fixture(scope="module", autouse=True)
def guests_yield_the_cpu():
    """Everything this module starts (lab up, vng, QEMU) inherits the lower priority; the worker
    goes back to its own afterwards (root may raise it again)."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, max(before, VM_NICENESS))
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)
