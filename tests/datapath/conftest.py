# SPDX-License-Identifier: Apache-2.0
"""Fixtures of the datapath tests: a pin root unique to this test run, and one loaded node.

Everything pinned lives under /sys/fs/bpf/mdp<pid>/ and is removed at the end, pass or fail.
"""

from __future__ import annotations

import contextlib
import os
import shutil

import pytest

from meshctl.datapath import Datapath
from meshctl.setns import in_netns

RUN = f"mdp{os.getpid() % 10000}"
SMALL_MTU = 1500  # the private NIC's MTU of the encapsulation tests' "too big" cases


@pytest.fixture(scope="session")
def pin_root():
    from meshctl.datapath.loader import ensure_bpffs

    root = f"/sys/fs/bpf/{RUN}"
    ensure_bpffs(root)
    os.makedirs(root, exist_ok=True)
    try:
        yield root
    finally:
        for node in os.listdir(root) if os.path.isdir(root) else ():
            with contextlib.suppress(Exception):  # cleanup goes on whatever one node left behind
                Datapath.unload(node, pin_root=root)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def unit_dp(pin_root):
    """A node loaded with no interfaces attached: for BPF_PROG_TEST_RUN."""
    dp = Datapath.open("unit", pin_root=pin_root)
    assert dp.mode == "ebpf", dp.reason
    try:
        yield dp
    finally:
        dp.close()
        Datapath.unload("unit", pin_root=pin_root)


def unload_testbed(tb, pin_root: str, nodes: tuple[str, ...] = ("a", "b")) -> None:
    """A testbed fixture's teardown: every node's fast path unloaded (whatever each one left
    behind), then the testbed down."""
    for node in nodes:
        with contextlib.suppress(Exception):  # the namespace may not exist if up() failed early
            in_netns(tb.ns(node), lambda node=node: Datapath.unload(node, pin_root=pin_root))
    tb.down()


def raw_pods_bed(tb, pin_root: str):
    """A two-node fabric testbed up, with an iperf3 server in b's pod and both nodes' pods routed
    raw over the private network (the encapsulation suites' starting point)."""
    tb.up()
    tb.pin_root = pin_root
    tb.spawn("b-p1", ["iperf3", "-s", "-p", "5201"])
    for node in ("a", "b"):
        tb.route_pods(node, "raw")
    return tb


@pytest.fixture(scope="module")
def small_mtu_ns():
    """A namespace whose loopback (the entries' "private NIC", ifindex 1) has a SMALL_MTU-byte MTU."""
    from meshctl.lab.rigs import netns

    name = f"{RUN}-mtu"
    netns.add(name)
    try:
        netns.run(name, ["ip", "link", "set", "lo", "mtu", str(SMALL_MTU), "up"])
        yield name
    finally:
        netns.delete(name)
