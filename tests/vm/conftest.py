# SPDX-License-Identifier: Apache-2.0
"""The VM tests boot TCG guests, which take every CPU they are given. Under `make test` they run on
one xdist worker beside the host tests (tests/conftest.py), whose labs keep timing bounds of a
few seconds: the guests started here run at a lower CPU priority, so they use what the host
tests leave idle (most of it: those tests mostly wait on agents and pings)."""

from __future__ import annotations

import os

import pytest

VM_NICENESS = 10  # CFS weight 110 against the host tests' 1024


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
