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

from ..names import unique


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



def test_a_command_for_a_namespace_is_forked_into_it(tmp_path):
    """The namespace lab inside a guest starts its agents as `nsenter --net=FILE -- python -m ...`:
    the fork lands in that namespace, as nsenter would put it; outside a warm server nothing is
    forked (the host's `lab up` starts new processes)."""
    from meshctl.lab.rigs import netns
    from meshctl.lab.vms.vmnodes import forked_spawner
    from meshctl.node.shell import exec_prefix

    ns = unique("zyg")
    argv = [*exec_prefix(ns), sys.executable, "-m", "meshctl.cli", "--help"]
    assert zygote.split_netns(argv) == (f"/run/netns/{ns}", argv[3:])
    assert zygote.split_netns(argv[3:]) == (None, argv[3:])
    netns.add(ns)
    try:
        zygote.warm_in_background()
        zygote.await_warm(60)
        (tmp_path / "zyg_probe.py").write_text("import os\nprint(os.readlink('/proc/self/ns/net'))\n")
        sys.path.insert(0, str(tmp_path))  # the fork inherits it
        try:
            with open(tmp_path / "out", "wb") as out:
                pid = zygote.spawn("zyg_probe", [], stdout=out.fileno(), stderr=out.fileno(),
                                   env=dict(os.environ), netns=f"/run/netns/{ns}")
                rc, timed_out = zygote.wait(pid, 60)
        finally:
            sys.path.remove(str(tmp_path))
        assert not timed_out and rc == 0
        inode = os.stat(f"/run/netns/{ns}").st_ino
        assert (tmp_path / "out").read_text().strip() == f"net:[{inode}]"
        assert os.readlink("/proc/self/ns/net") != f"net:[{inode}]"  # the caller stayed where it was
        with open(tmp_path / "log", "wb") as log:
            pid = forked_spawner(argv, log=log.fileno(), env=dict(os.environ))
        assert zygote.wait(pid, 60) == (0, False)
    finally:
        netns.delete(ns)
