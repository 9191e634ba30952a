# SPDX-License-Identifier: Apache-2.0
"""Pod interfaces found from netlink: which links count (pure), and the watcher in a namespace of
this test seeing a routed veth and a CNI bridge come and go."""

from __future__ import annotations

import ipaddress
import os
import select
import socket
import struct
import threading
from pathlib import Path

import pytest

from meshctl.node import pods
from meshctl.node.discovery import routes_changed_outside
from meshctl.node.pods import MESH_PROTOS, Link, PodInterfaceWatcher, pod_interfaces_of
from tests.waiting import wait_for, wait_until

from .conftest import NodeLab, in_ns

N = ipaddress.ip_network
IFACE = ipaddress.ip_interface
POD_CIDR = N("10.42.1.0/24")


def test_which_links_are_pod_interfaces() -> None:
    links = [Link(1, "lo", ""), Link(2, "cali1", "veth"), Link(3, "priv", "veth"), Link(4, "cni0", "bridge"),
             Link(5, "docker0", "bridge"), Link(6, "kilo0", "wireguard"), Link(7, "cali2", "veth")]
    routes = [(2, N("10.42.1.5/32")), (3, N("10.10.0.0/24")), (3, N("10.42.2.0/24")), (6, N("10.42.3.0/24")),
              (7, N("10.42.9.5/32")), (6, N("10.42.1.9/32"))]
    addrs = [(4, IFACE("10.42.1.1/24")), (5, IFACE("172.17.0.1/16")), (3, IFACE("10.10.0.4/24"))]
    # cali1: a host route into the pod CIDR; cni0: the bridge with the pod gateway. Not: a veth
    # routing another node's pod CIDR or another CIDR, a bridge outside it, a non-veth with a /32.
    assert pod_interfaces_of(links, routes, addrs, (POD_CIDR,)) == ("cali1", "cni0")


@pytest.fixture
def prefix() -> str:
    return f"k8{os.getpid() % 10000}-"


def test_watcher_follows_pods_as_they_come_and_go(lab: NodeLab) -> None:
    ns = lab.ns("pw")
    changed = threading.Event()
    w = in_ns(ns, lambda: PodInterfaceWatcher((POD_CIDR,), changed.set).start())
    try:
        assert w.current == ()
        lab.sh(ns, "ip", "link", "add", "veth1", "type", "veth", "peer", "name", "veth1p")
        lab.sh(ns, "ip", "link", "set", "veth1", "up")
        assert not changed.wait(0.3) and w.current == ()  # a veth alone carries nothing yet
        lab.sh(ns, "ip", "route", "add", "10.42.1.7/32", "dev", "veth1")
        assert changed.wait(1.0) and w.current == ("veth1",)
        changed.clear()
        lab.sh(ns, "ip", "link", "add", "cni0", "type", "bridge")
        lab.sh(ns, "ip", "addr", "add", "10.42.1.1/24", "dev", "cni0")
        assert changed.wait(1.0) and w.current == ("cni0", "veth1")
        changed.clear()
        lab.sh(ns, "ip", "link", "del", "veth1")
        assert changed.wait(1.0) and w.current == ("cni0",)
    finally:
        w.stop()


def test_watcher_retargeted_to_a_new_block_finds_its_veths_at_once(lab: NodeLab) -> None:
    """A Calico block claimed by (or moved to) this node under a running agent: its pods' veths
    are pod interfaces as soon as the watcher is told the node's new blocks, not at the next
    netlink event; told the same blocks again, it reads nothing."""
    ns = lab.ns("pr")
    first, second = N("10.42.1.0/26"), N("10.42.1.64/26")
    w = in_ns(ns, lambda: PodInterfaceWatcher((first,), lambda: None).start())
    try:
        for dev, addr in (("cali1", "10.42.1.5/32"), ("cali2", "10.42.1.70/32")):
            lab.sh(ns, "ip", "link", "add", dev, "type", "veth", "peer", "name", f"{dev}p")
            lab.sh(ns, "ip", "link", "set", dev, "up")
            lab.sh(ns, "ip", "route", "add", addr, "dev", dev)
        assert wait_for(lambda: w.current == ("cali1",))  # cali2's address is in no block of the node
        in_ns(ns, lambda: w.retarget((first, second)))
        assert w.current == ("cali1", "cali2") and w.pod_cidrs == (first, second)
        in_ns(ns, lambda: w.retarget((second,)))  # the first block moved away
        assert w.current == ("cali2",)
        in_ns(ns, lambda: w.retarget(()))  # no block at all: the last ones are kept
        assert w.pod_cidrs == (second,)
    finally:
        w.stop()



def _route_msg(kind: int, family: int, plen: int, proto: int, table: int = 254) -> bytes:
    """A route notification as the kernel sends it (header and rtmsg; attributes do not matter)."""
    body = struct.pack("=BBBBBBBBI", family, plen, 0, 0, table, proto, 0, 1, 0)
    return struct.pack("=IHHII", 16 + len(body), kind, 0, 0, 0) + body


OURS, V4, V6 = 109, socket.AF_INET, socket.AF_INET6
NEW, DEL, NEWLINK = 24, 25, 16


@pytest.mark.parametrize(("case", "data", "matters"), [
    ("our /25 added", _route_msg(NEW, V4, 25, OURS), False),
    ("our /32 replaced, then deleted", _route_msg(NEW, V4, 32, OURS) + _route_msg(DEL, V4, 32, OURS), False),
    ("another owner's /24", _route_msg(NEW, V4, 24, 3), False),
    ("a /32 of another table", _route_msg(NEW, V4, 32, 3, table=100), False),
    ("a pod's /32 after ours", _route_msg(NEW, V4, 25, OURS) + _route_msg(NEW, V4, 32, 3), True),
    ("a pod's /128 deleted", _route_msg(DEL, V6, 128, 3), True),
    ("our /128", _route_msg(NEW, V6, 128, OURS), False),
    ("a link message", struct.pack("=IHHII", 32, NEWLINK, 0, 0, 0) + bytes(16), True),
    ("a truncated message", struct.pack("=IHHII", 8, NEW, 0, 0, 0), True),
])
def test_which_notifications_may_change_pod_interfaces(case: str, data: bytes, matters: bool) -> None:
    assert routes_changed_outside(data, MESH_PROTOS) is matters, case


class _Idle:
    """Stands in for the `select` module of meshctl.node.pods: counts the times the watcher goes
    back to waiting for events (the select with RESCAN_S) with none queued, i.e. every notification
    sent before has been read and acted on. `seen()` is that count. The periodic rescan is put off
    (an hour instead of RESCAN_S): on a loaded machine its read could fall inside the test's window."""

    def __init__(self) -> None:
        self._quiet = 0

    def seen(self) -> int:
        return self._quiet

    def select(self, r: list, w: list, x: list, timeout: float) -> tuple[list, list, list]:
        if timeout == pods.RESCAN_S:
            if not select.select(r, [], [], 0)[0]:
                self._quiet += 1
            timeout = 3600.0
        return select.select(r, w, x, timeout)


def test_watcher_reads_nothing_again_for_the_agents_own_routes(lab: NodeLab, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent's routes (proto 109) by the hundred are no reason to dump the main table again;
    a pod's route right after them is seen as before."""
    ns = lab.ns("po")
    idle = _Idle()
    monkeypatch.setattr(pods, "select", idle)
    changed = threading.Event()
    w = in_ns(ns, lambda: PodInterfaceWatcher((POD_CIDR,), changed.set).start())
    reads = []
    read = w.refresh
    w.refresh = lambda: reads.append(1) or read()  # type: ignore[method-assign]

    def caught_up() -> None:
        """Until the watcher has read every notification queued so far (the kernel queues a
        command's notifications before the command returns)."""
        before = idle.seen()
        wait_until(lambda: idle.seen() > before, 30, "the watcher idle again")

    try:
        lab.sh(ns, "ip", "link", "add", "veth1", "type", "veth", "peer", "name", "veth1p")
        lab.sh(ns, "ip", "link", "set", "veth1", "up")
        caught_up()
        assert reads  # the link events: read
        reads.clear()
        batch = tmp_path / "ours"
        batch.write_text("".join(f"route add 10.99.{i}.0/25 dev veth1 proto 109\n"
                                 f"route add 10.98.{i}.1/32 dev veth1 proto 109\n" for i in range(200)))
        lab.sh(ns, "ip", "-batch", str(batch))
        caught_up()
        assert reads == [] and w.current == ()
        lab.sh(ns, "ip", "route", "add", "10.42.1.7/32", "dev", "veth1")
        assert changed.wait(30) and w.current == ("veth1",) and reads
    finally:
        w.stop()
