# SPDX-License-Identifier: Apache-2.0
"""The one way this package runs a program: `sh` runs it and turns a failure (a timeout too) into a
one-line MeshError naming the command and its last line of stderr; `run` runs it inside a named network
namespace. Namespaces are entered with `nsenter --net=/run/netns/NAME` rather than
`ip netns exec`, which remounts /sys and hides /sys/fs/bpf (the pinned maps).
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from meshctl.errors import MeshError
from meshctl.setns import NETNS_DIR

TIMED_OUT = 124  # the exit status of a command `sh` killed at its timeout (timeout(1)'s)


def sh(args: Sequence[str], *, check: bool = True, timeout: float = 30, input: str | None = None
       ) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise MeshError with the command and its stderr in one line. A
    command still running after `timeout` s is killed and is a failure like any other: exit
    status TIMED_OUT, what it printed, and "timed out after N s" as its stderr."""
    try:
        p = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, input=input)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        p = subprocess.CompletedProcess(list(args), TIMED_OUT, out, f"timed out after {timeout:g} s")
    if check and p.returncode != 0:
        err = (p.stderr or p.stdout).strip().splitlines()
        raise MeshError(f"{' '.join(args)}: {err[-1] if err else f'exit {p.returncode}'}")
    return p


def exec_prefix(ns: str | None, *, keep_sys: bool = True) -> list[str]:
    """The argv prefix that runs a command inside namespace `ns` (None: here)."""
    if ns is None:
        return []
    if keep_sys:
        return ["nsenter", f"--net={NETNS_DIR / ns}", "--"]
    return ["ip", "netns", "exec", ns]


def run(ns: str | None, args: Sequence[str], *, check: bool = True, timeout: float = 30,
        keep_sys: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return sh([*exec_prefix(ns, keep_sys=keep_sys), *args], check=check, timeout=timeout, input=input)


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs: a zombie (exited, its parent has not reaped it yet) counts as gone, so a
    lab that started an agent sees it exit."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
