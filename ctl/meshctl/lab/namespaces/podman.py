# SPDX-License-Identifier: Apache-2.0
"""podman as the lab runs it (the `lab.agent: image` nodes' containers, and the tests' throwaway
ones), with what this machine kind needs (docs/lab.md, "Containers"):

- runc, not crun: Debian 12's crun refuses a host with hybrid cgroups (v1 controllers, hugetlb on v2);
- explicit limits within the host's hard ones: podman's default `nofile` is above them, and root
  without CAP_SYS_RESOURCE cannot raise a hard limit; podman keeps `nproc` at 32768 at most;
- never podman's default network (its bridge would add `cni-podman0` and NAT rules on the host):
  each caller names `--network` (a node's namespace, or none);
- no pulls: the image is built here (`make image`).
"""

from __future__ import annotations

import resource
import shutil
import subprocess

from meshctl.errors import MeshError
from meshctl.node.shell import sh

NOFILE_MAX = 1048576  # podman's default nofile, which the host's hard limit may be below
NPROC_MAX = 32768  # the most podman gives a container here


def limits() -> list[str]:
    """`--ulimit` options within this process's hard limits."""
    out = []
    for name, which, cap in (("nofile", resource.RLIMIT_NOFILE, NOFILE_MAX),
                             ("nproc", resource.RLIMIT_NPROC, NPROC_MAX)):
        hard = resource.getrlimit(which)[1]
        n = cap if hard == resource.RLIM_INFINITY else min(hard, cap)
        out += ["--ulimit", f"{name}={n}:{n}"]
    return out


def runtime() -> list[str]:
    """`--runtime runc` where runc is installed (else podman's default)."""
    return ["--runtime", "runc"] if shutil.which("runc") else []


def run_prefix() -> list[str]:
    """`podman run` with this host's runtime and limits and no pulls; the caller adds `--network`."""
    return ["podman", *runtime(), "run", "--pull=never", *limits()]


def podman(*args: str, timeout: float = 60.0, check: bool = True) -> subprocess.CompletedProcess[str]:
    """One podman command (with this host's runtime); MeshError naming its last line when `check`
    (one killed at its `timeout` fails as node.shell.sh says)."""
    try:
        p = sh(["podman", *runtime(), *args], check=False, timeout=timeout)
    except FileNotFoundError:
        raise MeshError("podman is not installed (make setup installs it)") from None
    if check and p.returncode != 0:
        lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
        raise MeshError(f"podman {args[0]} failed: {lines[-1] if lines else f'exit {p.returncode}'}")
    return p


def image_exists(image: str) -> bool:
    return podman("image", "exists", image, check=False).returncode == 0


def container_pid(name: str) -> int | None:
    """The host PID of a running container's first process (None when it is not running)."""
    p = podman("inspect", "--format", "{{.State.Pid}}", name, check=False)
    try:
        pid = int(p.stdout.strip())
    except ValueError:
        return None
    return pid or None


def remove(names: list[str], timeout: int = 3) -> list[str]:
    """Stop (SIGTERM, SIGKILL after `timeout` s) and remove the named containers; returns those
    that could not be removed."""
    left = []
    for name in names:
        p = podman("rm", "--force", "--volumes", "--time", str(timeout), "--ignore", name,
                   timeout=timeout + 60.0, check=False)
        if p.returncode != 0:
            left.append(name)
    return left
