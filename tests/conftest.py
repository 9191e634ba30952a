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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The VM tests first (stable: the rest keep their order), so that under pytest-xdist the
    worker that takes them boots TCG guests from the start while the other runs the host tests."""
    items.sort(key=lambda item: not _is_vm(item.nodeid))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test`'s two xdist workers: each test file is one unit of work, so a module's lab or VM
    fixture is built once, on one worker; all VM tests are one unit, so one worker boots guests
    while the other runs the host tests beside it, and two TCG guests never compete for the 2 CPUs."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFileVmTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "vm" if _is_vm(nodeid) else nodeid.split("::", 1)[0]

    return ByFileVmTogether(config, log)


from tests.agent_image import agent_image  # noqa: E402, F401 - the session's agent image, for every test that runs it
