# SPDX-License-Identifier: Apache-2.0
"""The guest server's warm interpreter (lab/vms/zygote.py), run here: a forked `python -m` answers
as a new process would (output, one-line error, exit status),
and only the lab's own entry modules are forked."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

from meshctl.lab.vms import zygote


def test_only_the_warm_entry_modules_of_this_python_are_forked():
    assert zygote.forkable([sys.executable, "-m", "meshctl.cli", "status"]) == ("meshctl.cli", ["status"])
    assert zygote.forkable([sys.executable, "-m", "meshctl.lab.vms.vmnodes", "guest-setup", "f"]) == (
        "meshctl.lab.vms.vmnodes", ["guest-setup", "f"])
    assert zygote.forkable(["/usr/bin/python3.9", "-m", "meshctl.cli"]) is None
    assert zygote.forkable([sys.executable, "-c", "print(1)"]) is None
    assert zygote.forkable(["ip", "netns", "exec", "x", sys.executable, "-m", "meshctl.cli"]) is None


def _forked(args: list[str]) -> tuple[int, str, str]:
    with tempfile.TemporaryFile() as so, tempfile.TemporaryFile() as se:
        pid = zygote.spawn("meshctl.cli", args, stdout=so.fileno(), stderr=se.fileno(), env=dict(os.environ))
        rc, timed_out = zygote.wait(pid, 60)
        assert not timed_out
        so.seek(0)
        se.seek(0)
        return rc, so.read().decode(), se.read().decode()


def test_a_forked_command_answers_as_a_new_process_would():
    zygote.warm_in_background()
    zygote.await_warm(60)
    for args in (["plan", "-f", "/nonexistent/topology.yaml", "--node", "a1"], ["plan", "--help"]):
        fresh = subprocess.run([sys.executable, "-m", "meshctl.cli", *args], capture_output=True, text=True,
                               timeout=60)
        rc, out, err = _forked(args)
        assert (rc, out, err) == (fresh.returncode, fresh.stdout, fresh.stderr), args
    rc, _, err = _forked(["plan", "-f", "/nonexistent/topology.yaml", "--node", "a1"])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "/nonexistent/topology.yaml" in err
