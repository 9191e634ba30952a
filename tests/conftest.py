# SPDX-License-Identifier: Apache-2.0
"""Shared test helpers. Tests that need root and namespaces create their own, with prefixes unique
to the test run, and remove them on success and failure."""

from __future__ import annotations

import pytest

VM_TESTS = "tests/vm/"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test` runs two workers, `--dist loadgroup`): each test file is
    one group, so a module's lab or VM fixture is built once, on one worker; the VM tests are one
    group and come first, so the worker that takes them spends the run booting TCG guests while
    the other worker runs the host tests beside it. Without xdist the markers do nothing and only
    the order changes (the VM tests first)."""
    def group(item: pytest.Item) -> str:
        path = item.nodeid.split("::", 1)[0]
        return "vm" if path.startswith(VM_TESTS) else path

    items.sort(key=lambda item: not item.nodeid.startswith(VM_TESTS))  # stable: the rest keep their order
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group(item)))
