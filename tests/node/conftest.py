# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the node appliers: namespaces named `mnd<pid>-...` made per test and removed on
success and failure, a way to run applier code inside one (the appliers act on the current
network namespace, as the agent runs under `nsenter --net`), and wireguard-go cleanup."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from meshctl.lab.rigs import netns
from meshctl.node.wireguard.uapi import running_pid, stop
from meshctl.setns import in_netns
from tests.names import unique

T = TypeVar("T")

pytestmark = pytest.mark.root


def in_ns(ns: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` run in a thread that has joined namespace `ns` (setns is per thread, and
    so are netlink sockets, /proc/sys/net and the children that thread starts)."""
    return in_netns(ns, functools.partial(fn, *args, **kwargs))


class NodeLab:
    """Namespaces and run dirs of one test; `close` removes them and any wireguard-go they hold."""

    def __init__(self, prefix: str, tmp: Path):
        self.prefix = prefix
        self.tmp = tmp
        self.namespaces: list[str] = []
        self.procs: list[subprocess.Popen[str]] = []

    def ns(self, name: str) -> str:
        full = f"{self.prefix}{name}"
        netns.add(full)
        self.namespaces.append(full)
        return full

    def route_node(self, name: str) -> str:
        """A namespace with a private NIC `pv` (10.20.0.1/24) and a stand-in `wg` device (a veth:
        the kernel has no WireGuard module, and routes only need a device)."""
        ns = self.ns(name)
        for dev, peer in (("pv", "pvx"), ("wg", "wgx")):
            self.sh(ns, "ip", "link", "add", dev, "type", "veth", "peer", "name", peer)
            self.sh(ns, "ip", "link", "set", dev, "up")
            self.sh(ns, "ip", "link", "set", peer, "up")
        self.sh(ns, "ip", "addr", "add", "10.20.0.1/24", "dev", "pv")
        self.sh(ns, "ip", "addr", "add", "10.4.0.1/16", "dev", "wg")
        return ns

    def run_dir(self, name: str) -> Path:
        return self.tmp / f"run-{name}"

    def sh(self, ns: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return netns.run(ns, list(args), check=check)

    def spawn(self, ns: str, *args: str) -> subprocess.Popen[str]:
        """A long-running command inside `ns`, killed (by its pid) when the test ends."""
        p = subprocess.Popen([*netns.exec_prefix(ns), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            p.kill()
            p.wait(timeout=10)
        for pidfile in self.tmp.glob("run-*/*.pid"):
            pid = running_pid(pidfile)
            if pid is not None:
                stop(pid)
        for ns in self.namespaces:
            netns.delete(ns)


@pytest.fixture
def prefix() -> str:
    return unique("mnd") + "-"


@pytest.fixture
def lab(prefix: str) -> Iterator[NodeLab]:
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces")
    # A short directory of our own: UAPI socket paths must stay under 108 bytes.
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    lab = NodeLab(prefix, tmp)
    try:
        yield lab
    finally:
        lab.close()
        shutil.rmtree(tmp, ignore_errors=True)
