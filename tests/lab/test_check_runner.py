# SPDX-License-Identifier: Apache-2.0
"""`lab check`'s runner of commands in a lab node's namespace (labcheck.on_host): a command still
running at its timeout is killed and answers node.shell.TIMED_OUT, so a ping that a loaded TCG guest could not
even start in time counts as a ping not answered (the pair is checked again) instead of ending
`lab check` with a traceback (the one-VM lab under make test's load, 2026-12-07)."""

from __future__ import annotations

from meshctl.lab.namespaces import check as labcheck
from meshctl.node.shell import TIMED_OUT


def test_a_command_past_its_timeout_answers_timed_out_instead_of_raising() -> None:
    p = labcheck.on_host(None, None, ["sh", "-c", "echo started; exec sleep 30"], timeout=0.5)
    assert p.returncode == TIMED_OUT
    assert p.stdout == "started\n"  # what it printed before it was killed
    assert p.stderr.startswith("timed out after")


def test_a_ping_that_timed_out_counts_every_ping_lost() -> None:
    def stuck(node, ns, argv, timeout=30.0):
        return labcheck.on_host(node, ns, ["sleep", "30"], timeout=0.2)

    assert labcheck.ping("ns", "10.0.0.1", count=3, run=stuck) == (3, 0, None)
