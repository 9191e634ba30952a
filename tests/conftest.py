# SPDX-License-Identifier: Apache-2.0
"""Shared test helpers. Tests that need root and namespaces create their own, with prefixes unique
to the test run, and remove them on success and failure."""

from __future__ import annotations

from typing import Any

import pytest

from tests.kubernetes import api, kclient, kube, own_kube  # noqa: F401  (the tests' real control plane)

VM_TESTS = "tests/vm/"


def _is_vm(nodeid: str) -> bool:
    return nodeid.startswith(VM_TESTS)


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The VM tests first, then the modules with a test marked slow (the labs), then the rest
    (stable: a module's tests stay together and in their order). Under pytest-xdist the worker
    that takes the VM tests boots TCG guests from the start while the other runs the labs, and
    the last units left are short ones that even out the two workers' ends."""
    slow = {_module(i.nodeid) for i in items if i.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: 0 if _is_vm(item.nodeid) else 1 if _module(item.nodeid) in slow else 2)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test`'s two xdist workers: each test file is one unit of work, so a module's lab or VM
    fixture is built once, on one worker; all VM tests are one unit, so one worker boots guests
    while the other runs the host tests beside it, and two TCG guests never compete for the 2 CPUs."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFileVmTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "vm" if _is_vm(nodeid) else _module(nodeid)

    # The units in the collection's order (pytest_collection_modifyitems), not xdist's default of
    # the most tests first: a module of many quick tests is not a long unit.
    config.option.loadscopereorder = False
    return ByFileVmTogether(config, log)


from tests.agent_image import agent_image  # noqa: E402, F401 - the session's agent image, for every test that runs it
