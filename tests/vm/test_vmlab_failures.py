# SPDX-License-Identifier: Apache-2.0
"""A lab in a VM that cannot come up says why in its last line and leaves nothing on the host (no
QEMU, no VM directory, no lab state, no namespace); a SIGTERM while it boots tears the VM down too."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import yaml

from meshctl.lab.namespaces import state as labstate
from meshctl.lab.rigs import netns
from meshctl.lab.rigs.waiting import EMULATED_CONVERGE_WAIT
from meshctl.lab.vms import vm
from meshctl.node.shell import pid_alive
from tests.waiting import wait_for

from ..lab.test_cli import meshctl
from ..names import unique

pytestmark = [pytest.mark.root, pytest.mark.slow]

NODES = [
    {"name": "a1", "location": "loc-a", "internal_ip": "10.10.1.11/24", "pod_cidr": "10.42.1.0/24"},
    {"name": "a2", "location": "loc-a", "internal_ip": "10.10.1.12/24", "pod_cidr": "10.42.2.0/24"},
]
# `lab up` in a VM boots (~20 s here under TCG) and builds the lab inside (~1 min) before any agent
# starts. The behaviour: a broken agent fails the run soon after the agents started, not at the end
# of the emulated converge wait (EMULATED_CONVERGE_WAIT, 600 s); the bounds tell the two apart with
# room for a loaded host (the failure came 10-20 s after the agents here).
FAIL_AFTER_AGENTS_S = EMULATED_CONVERGE_WAIT / 4
WHOLE_RUN_S = EMULATED_CONVERGE_WAIT * 3 / 4


@pytest.fixture(scope="module", autouse=True)
def kernel_61():
    try:
        vm.kernel("6.1")
    except vm.MeshError as e:  # `make test` fetches it first (scripts/kernels.sh)
        pytest.skip(str(e))


def _lab_file(tmp_path, prefix: str, **lab: object) -> str:
    f = tmp_path / "lab.yaml"
    f.write_text(yaml.safe_dump({"cluster": {"name": "default", "id": 1},
                                 "mesh": {"granularity": "location", "intra_subnet": "direct"},
                                 "nodes": NODES, "lab": {"prefix": prefix, **lab}}))
    return str(f)


def _nothing_left(name: str, prefix: str) -> list[str]:
    left = [p for p in (vm.VM_ROOT / name, labstate.lab_dir(name)) if p.exists()]
    return [*map(str, left), *netns.list_prefixed(prefix)]


class LabUp:
    """`lab up --kernel 6.1 -f PATH` in the background, its stderr lines kept with the time each came."""

    def __init__(self, path: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "meshctl.cli", "lab", "up", "--kernel", "6.1", "-f", path],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.lines: list[tuple[float, str]] = []
        self.t0 = time.monotonic()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def when(self, text: str) -> float | None:
        return next((t for t, ln in self.lines if text in ln), None)

    def wait_for_line(self, text: str, timeout: float) -> bool:
        """Whether `text` was printed within `timeout` (False at once if `lab up` ended without it)."""
        wait_for(lambda: self.when(text) is not None or self.proc.poll() is not None, timeout, 0.2)
        return self.when(text) is not None

    def finish(self, timeout: float) -> str:
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=10)
        return "\n".join(ln for _, ln in self.lines)


def test_an_agent_that_cannot_start_fails_the_vm_lab_with_its_error(tmp_path):
    prefix = unique("vmf") + "-"
    name = labstate.lab_name(prefix)
    up = LabUp(_lab_file(tmp_path, prefix, agent_args=["--no-such-flag"]))
    try:
        err = up.finish(WHOLE_RUN_S + 120)
    finally:
        meshctl("lab", "down", "--lab", name, timeout=120)  # only what the test left, should it fail
    took = time.monotonic() - up.t0
    started = up.when("started 2 agent(s)")
    last = err.strip().splitlines()[-1] if err.strip() else ""
    assert up.proc.returncode != 0 and "Traceback" not in err, err[-3000:]
    assert started is not None, err[-3000:]
    assert "--no-such-flag: no such option of meshctl agent" in last and ("a1" in last or "a2" in last), last
    after = up.lines[-1][0] - started
    print(f"\nVM lab with a broken agent failed in {took:.0f} s, {after:.0f} s after its agents started")
    assert after <= FAIL_AFTER_AGENTS_S and took <= WHOLE_RUN_S, (after, took)
    assert not _nothing_left(name, prefix)


def test_sigterm_while_the_vm_boots_tears_it_down(tmp_path):
    prefix = unique("vmt") + "-"
    name = labstate.lab_name(prefix)
    up = LabUp(_lab_file(tmp_path, prefix))
    pids: list[int] = []
    try:
        assert up.wait_for_line("VM up in", WHOLE_RUN_S), "\n".join(ln for _, ln in up.lines)[-3000:]
        st = labstate.load(name)
        assert st is not None and st.vm is not None
        pids = [p for p in (st.vm.pid, st.vm.qemu_pid) if p]
        assert pids and all(pid_alive(p) for p in pids)
        up.proc.terminate()
        err = up.finish(120)
    finally:
        if up.proc.poll() is None:
            up.proc.kill()
        meshctl("lab", "down", "--lab", name, timeout=120)
    assert up.proc.returncode == 143 and "Traceback" not in err, err[-3000:]
    assert not any(pid_alive(p) for p in pids), pids
    assert not _nothing_left(name, prefix)
