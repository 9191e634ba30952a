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


# Host workers that take units while the VM unit runs. TCG guests take every CPU they are given:
# a second host worker beside them starves the niced guests (20:31 run, docs/benchmarks.md).
HOST_WORKERS_BESIDE_VMS = 1


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`make test`'s xdist workers: each test file is one unit of work, so a module's lab or VM
    fixture is built once, on one worker; all VM tests are one unit, so one worker boots guests
    and two TCG guests never compete for the 2 CPUs. While that unit runs, only
    HOST_WORKERS_BESIDE_VMS other workers take units; the rest are held until it ends, then take
    units too (the host tests mostly wait on agents and pings: a third worker uses the idle CPU)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByFileVmTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "vm" if _is_vm(nodeid) else _module(nodeid)

        def _vm_worker(self) -> Any | None:
            """The worker running the VM unit, while it has tests left; None before and after."""
            for node, work in self.assigned_work.items():
                if "vm" in work and not all(work["vm"].values()):
                    return node
            return None

        def _held(self, node: Any) -> bool:
            vm = self._vm_worker()
            if vm is None or node is vm:
                return False
            busy = [n for n, work in self.assigned_work.items()
                    if n is not vm and n is not node and self._pending_of(work) > 0]
            return len(busy) >= HOST_WORKERS_BESIDE_VMS

        def _assign_work_unit(self, node: Any) -> None:
            if not self._held(node):
                super()._assign_work_unit(node)

        def mark_test_complete(self, node: Any, item_index: int, duration: float = 0) -> None:
            super().mark_test_complete(node, item_index, duration)
            if self._vm_worker() is None:  # the VM unit ended (or there is none): release the held
                for other in self.nodes:
                    if other is not node and not self._pending_of(self.assigned_work[other]):
                        self._reschedule(other)

    # The units in the collection's order (pytest_collection_modifyitems), not xdist's default of
    # the most tests first: a module of many quick tests is not a long unit.
    config.option.loadscopereorder = False
    return ByFileVmTogether(config, log)


from tests.agent_image import agent_image  # noqa: E402, F401 - the session's agent image, for every test that runs it
