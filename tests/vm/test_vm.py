# SPDX-License-Identifier: Apache-2.0
"""The VM room: a Debian kernel of the matrix boots over this machine's root, runs commands as the
host asks (output, errors and exit status come back), has its kernel's modules (kernel WireGuard),
and leaves no process or directory behind. One VM at a time: TCG here takes ~10 s to boot."""

from __future__ import annotations

import os
import time

import pytest

from meshctl.lab.vms import vm
from meshctl.node.shell import pid_alive

SERIES = "6.1"


@pytest.fixture(scope="module")
def k() -> vm.Kernel:
    try:
        return vm.kernel(SERIES)
    except vm.MeshError as e:  # the kernel cache is filled by `make kernels`, which `make test` runs
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def guest(k):
    machine = vm.VM(k, "vm-test")
    machine.start()
    try:
        yield machine
    finally:
        machine.stop()


def test_the_guest_runs_the_debian_kernel_and_answers_commands(guest):
    res = guest.run(["uname", "-r"], timeout=60)
    assert (res.rc, res.stdout.strip()) == (0, guest.kernel.version)
    assert guest.kernel.version != os.uname().release
    res = guest.run(["sh", "-c", "echo out; echo err >&2; exit 3"], timeout=60)
    assert (res.rc, res.stdout, res.stderr) == (3, "out\n", "err\n")


def test_commands_run_side_by_side_and_a_timeout_is_reported(guest):
    res = guest.run(["sh", "-c", "sleep 2 & sleep 2; wait; echo done"], timeout=60)
    assert res.stdout == "done\n"
    t0 = time.monotonic()
    with pytest.raises(vm.MeshError, match="did not finish"):
        guest.run(["sleep", "60"], timeout=1)
    assert time.monotonic() - t0 < 30, "the command's timeout was not kept (it ran on towards its 60 s)"


def test_the_guest_has_its_kernels_modules_and_kernel_wireguard(guest):
    res = guest.run(["sh", "-c", "ip link add vmwg0 type wireguard && cat /sys/module/wireguard/initstate && "
                     "ip -d link show vmwg0 && ip link del vmwg0"], timeout=120)
    assert res.rc == 0, res.stderr
    assert res.stdout.startswith("live") and "wireguard" in res.stdout
    res = guest.run(["sh", "-c", "mount | grep ' /sys/fs/bpf '"], timeout=60)
    assert res.rc == 0, "bpffs is mounted for the datapath"


def test_stop_leaves_no_process_and_no_directory(guest):
    """Stops the module's guest (every test that needs it runs earlier; its teardown's stop is then
    a no-op), so the suite boots one VM, not two."""
    machine = guest
    pids = [p for p in (machine.pid, machine.qemu_pid) if p]
    assert machine.qemu_pid, "QEMU's pid was recorded"
    assert all(os.path.exists(f"/proc/{p}") for p in pids)
    machine.stop()
    assert not any(pid_alive(p) for p in pids)
    assert not machine.workdir.exists()


def test_kvm_probe_is_bounded_and_says_which_accelerator(k):
    t0 = time.monotonic()
    works = vm.kvm_probe(k, timeout=5)
    assert time.monotonic() - t0 < 30  # bounded by its timeout (and a loaded machine's process start), not hung
    assert vm.accel(k) in ("kvm", "tcg")
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        assert works is False
