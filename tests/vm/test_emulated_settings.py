# SPDX-License-Identifier: Apache-2.0
"""What a lab in VMs changes for its agents under emulation (pure: the file's settings and the
accelerator in, the agents' settings out): a longer lease and a rarer full resync, each only
where the file leaves it to the lab, and neither under KVM."""

from __future__ import annotations

import pytest

from meshctl.lab.vms import vm

RESYNC = (vm.RESYNC_FLAG, f"{vm.EMULATED_RESYNC_S:g}")


@pytest.mark.parametrize(("case", "file_args", "accel", "want"), [
    ("tcg, nothing set: the rarer resync", (), "tcg", RESYNC),
    ("tcg keeps the file's other arguments first", ("--log-level", "debug"), "tcg", ("--log-level", "debug", *RESYNC)),
    ("tcg, the file sets the flag", ("--resync-seconds", "10"), "tcg", ("--resync-seconds", "10")),
    ("tcg, the file sets the flag with =", ("--resync-seconds=10",), "tcg", ("--resync-seconds=10",)),
    ("kvm: the agent's default", ("--log-level", "debug"), "kvm", ("--log-level", "debug")),
])
def test_agent_args_under_emulation(case: str, file_args: tuple[str, ...], accel: str, want: tuple[str, ...]) -> None:
    assert vm.agent_args(file_args, accel) == want, case


@pytest.mark.parametrize(("case", "file_ttl", "accel", "want"), [
    ("tcg, nothing set: the longer lease", None, "tcg", vm.EMULATED_LEASE_TTL),
    ("tcg, the file sets one", 7, "tcg", 7),
    ("kvm, nothing set: the lab's default", None, "kvm", None),
])
def test_lease_ttl_under_emulation(case: str, file_ttl: int | None, accel: str, want: int | None) -> None:
    assert vm.lease_ttl(file_ttl, accel) == want, case
