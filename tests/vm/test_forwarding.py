# SPDX-License-Identifier: Apache-2.0
"""Which commands run where a VM lab is (pure: argv in, decision out), and how the matrix reads
pytest's closing line."""

from __future__ import annotations

import pytest

from meshctl.lab.vms.matrix import parse_summary
from meshctl.lab.vms.vmlab import _named_lab, _wants_lab


@pytest.mark.parametrize("argv", [
    ["lab", "check"], ["lab", "status", "-o", "json"], ["lab", "check", "--lab", "vm1"],
    ["status", "--node", "a1"], ["status", "--node=a1"], ["node", "list", "--node", "a1"],
    ["status", "--lab-node", "a1"], ["status", "--lab-node=a1"], ["node", "list", "--lab-node", "a1"],
    ["maps", "dump", "--node", "a1"], ["datapath", "status", "--node", "a1", "-o", "json"],
    ["node", "list"], ["node", "list", "--lab", "vm1", "-o", "json"],
])
def test_commands_about_a_lab_run_where_the_lab_is(argv):
    assert _wants_lab(argv)


@pytest.mark.parametrize("argv", [
    [], ["lab", "up", "--kernel", "6.1"], ["lab", "down"], ["lab"], ["lab", "--help"],
    ["status"], ["status", "--addr", "127.0.0.1:9736"], ["plan", "-f", "t.yaml", "--node", "a1"],
    ["maps", "dump", "--node", "a1", "--bpf-pin-root", "/sys/fs/bpf/x"], ["datapath", "status"],
    ["maps", "dump", "--node", "a1", "--pin-root", "/sys/fs/bpf/x"],
    ["node", "list", "--etcd-endpoints", "https://10.0.0.1:2379"], ["node", "list", "--addr", "1.2.3.4:9736"],
    ["node", "list", "--kubeconfig", "k3s.yaml"], ["node", "list", "--kubeconfig=k3s.yaml", "-o", "json"],
])
def test_commands_of_this_host_run_here(argv):
    assert not _wants_lab(argv)


def test_the_named_lab_is_read_in_both_spellings():
    assert _named_lab(["lab", "check", "--lab", "vm1"]) == "vm1"
    assert _named_lab(["lab", "check", "--lab=vm2"]) == "vm2"
    assert _named_lab(["lab", "check"]) is None


def test_pytest_closing_lines_become_counts():
    assert parse_summary("....\n37 passed, 1 failed in 349.82s (0:05:49)\n") == {"passed": 37, "failed": 1}
    assert parse_summary("x\n24 passed, 3 failed, 1 skipped in 231.0s\n") == {"passed": 24, "failed": 3, "skipped": 1}
    assert parse_summary("1 error in 0.5s") == {"error": 1}
    assert parse_summary("Traceback ...\nKilled") == {}
