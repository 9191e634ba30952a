# SPDX-License-Identifier: Apache-2.0
"""Pod interfaces found by themselves: the host ends of pod interfaces, from netlink.

A pod interface is where this node's pods enter the host, so the fast path attaches there:
- a veth with a host route (/32, /128) to an address inside this node's pod CIDR: how the lab,
  Calico and the `ptp` CNI plugin route each pod;
- a bridge holding an address inside the pod CIDR: the `bridge` CNI plugin's `cni0` (pods sit
  behind it; Kilo's and flannel's layout).
The interface counts once its route or address exists, which is when the CNI has finished with
the pod (a veth alone carries nothing yet).

`PodInterfaceWatcher` keeps the set current: it listens to netlink's link, address and route
groups and recomputes on every event, so a new pod's interface is seen within milliseconds of its
route, and a pod that goes takes its interface with it. `--pod-interfaces GLOB` overrides it.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import select
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from meshctl.mesh.model import IPNetwork
from meshctl.node.discovery import host_routes, routes_changed_outside
from meshctl.node.encap import RT_PROTO_ENCAP
from meshctl.node.routes import RT_PROTO
from meshctl.node.rtnl import NETLINK_ROUTE

log = logging.getLogger("meshctl.pods")

# Wait this long after a netlink event for the rest of a burst (a CNI adds the veth, its address
# and its route in a few calls) before reading the interfaces again.
SETTLE_S = 0.02
# Read again this long after the last event anyway (a lost event must not hide a pod for long).
RESCAN_S = 5.0
# RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_IFADDR | RTMGRP_IPV6_ROUTE
_GROUPS = 0x1 | 0x10 | 0x40 | 0x100 | 0x400
# The protocols of the agent's own routes (node/routes.py, node/encap.py): never a pod's route,
# and written by the ten thousand when a remote cluster renumbers.
MESH_PROTOS = frozenset({RT_PROTO, RT_PROTO_ENCAP})


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    kind: str  # "veth", "bridge", ... ("" for a device without link info, like lo)


def pod_interfaces_of(links: Iterable[Link], host_routes: Iterable[tuple[int, IPNetwork]],
                      addresses: Iterable[tuple[int, ipaddress.IPv4Interface | ipaddress.IPv6Interface]],
                      pod_cidrs: Sequence[IPNetwork]) -> tuple[str, ...]:
    """The pod interfaces among `links` (sorted names): veths with a host route into one of
    `pod_cidrs` (`host_routes` are (oif, dst) pairs), and bridges holding an address inside one."""
    by_index = {link.index: link for link in links}
    found: set[str] = set()
    for oif, dst in host_routes:
        link = by_index.get(oif)
        if link is not None and link.kind == "veth" and dst.prefixlen == dst.max_prefixlen and \
                any(dst.version == c.version and dst.subnet_of(c) for c in pod_cidrs):  # type: ignore[arg-type]
            found.add(link.name)
    for index, addr in addresses:
        link = by_index.get(index)
        if link is not None and link.kind == "bridge" and \
                any(addr.version == c.version and addr.ip in c for c in pod_cidrs):
            found.add(link.name)
    return tuple(sorted(found))


def read_pod_interfaces(pod_cidrs: Sequence[IPNetwork]) -> tuple[str, ...]:
    """`pod_interfaces_of` over this network namespace's links, main-table routes and addresses
    (of each family `pod_cidrs` hold)."""
    from pyroute2 import IPRoute

    routes: list[tuple[int, IPNetwork]] = []
    addrs: list[tuple[int, ipaddress.IPv4Interface | ipaddress.IPv6Interface]] = []
    with IPRoute() as ipr:
        links = [Link(m["index"], m.get("IFLA_IFNAME") or "", m.get(("IFLA_LINKINFO", "IFLA_INFO_KIND")) or "")
                 for m in ipr.get_links()]
        for version in sorted({c.version for c in pod_cidrs}):
            family = socket.AF_INET if version == 4 else socket.AF_INET6
            routes += [(r.oif, r.dst) for r in host_routes(family)]
            addrs += [(a["index"], ipaddress.ip_interface(f"{a.get('IFA_ADDRESS')}/{a['prefixlen']}"))
                      for a in ipr.get_addr(family=family) if a.get("IFA_ADDRESS")]
    return pod_interfaces_of(links, routes, addrs, pod_cidrs)


class PodInterfaceWatcher:
    """The current pod interfaces of this namespace, kept up to date from netlink events;
    `changed()` is called (on the watcher's thread) whenever the set changes."""

    def __init__(self, pod_cidrs: Sequence[IPNetwork], changed: Callable[[], None]) -> None:
        self.pod_cidrs = tuple(pod_cidrs)
        self._changed = changed
        self._lock = threading.Lock()
        self._current: tuple[str, ...] = ()
        self._stop = threading.Event()
        # Written by stop(): wakes the watcher's select at once (an agent restarting must be back
        # before its lease runs out: its stop may not wait out a poll interval).
        self._wake_r, self._wake_w = os.pipe()
        self._thread: threading.Thread | None = None
        self.errors = 0

    @property
    def current(self) -> tuple[str, ...]:
        with self._lock:
            return self._current

    def start(self) -> PodInterfaceWatcher:
        # Subscribe before the first read, so nothing that happens in between is missed. A plain
        # netlink socket: only the wake-up matters, the state is read again with a dump.
        events = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
        events.bind((0, _GROUPS))
        events.setblocking(False)
        self.refresh()
        self._thread = threading.Thread(target=self._run, args=(events,), name="pod-interfaces", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        if self._thread is not None:
            self._thread.join(timeout=1)

    def retarget(self, pod_cidrs: Sequence[IPNetwork]) -> None:
        """Follow this node's pod CIDRs as they change under a running agent (a Calico block
        claimed or released): read the interfaces again at once when they differ, so a moved
        block's pods get the fast path without waiting for the next netlink event."""
        cidrs = tuple(pod_cidrs)
        if not cidrs or cidrs == self.pod_cidrs:
            return
        self.pod_cidrs = cidrs
        self.refresh()

    def refresh(self) -> bool:
        """Read the interfaces again; True when the set changed."""
        try:
            now = read_pod_interfaces(self.pod_cidrs)
        except Exception as e:  # noqa: BLE001 - a netlink hiccup must not stop the watcher
            self.errors += 1
            log.warning("reading pod interfaces: %s", e)
            return False
        with self._lock:
            if now == self._current:
                return False
            added, gone = set(now) - set(self._current), set(self._current) - set(now)
            self._current = now
        log.info("pod interfaces: %d (added %s, gone %s)", len(now), ",".join(sorted(added)) or "-",
                 ",".join(sorted(gone)) or "-")
        return True

    def _run(self, events: socket.socket) -> None:
        try:
            while not self._stop.is_set():
                woke, _, _ = select.select([events.fileno(), self._wake_r], [], [], RESCAN_S)
                if self._stop.is_set():
                    break
                if not woke:
                    if self.refresh():
                        self._changed()
                    continue
                # Drain the burst (a CNI makes the veth, addresses and routes in a few calls), then read
                # once, unless the burst held only routes that cannot be a pod's (the agent's own).
                ready, matters = True, False
                while ready:
                    matters = _drain(events) or matters
                    ready = bool(select.select([events], [], [], SETTLE_S)[0])
                if matters and self.refresh():
                    self._changed()
        except Exception as e:  # noqa: BLE001 - the agent keeps its last set
            self.errors += 1
            log.error("pod interface watcher stopped: %s", e)
        finally:
            events.close()
            for fd in (self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    os.close(fd)


def _drain(sock: socket.socket) -> bool:
    """Read every notification waiting; True when one may change the pod interfaces (anything but
    the routes of MESH_PROTOS and routes that are not host routes), or when some were lost."""
    matters = False
    while True:
        try:
            data = sock.recv(1 << 16)
        except BlockingIOError:
            return matters
        except OSError as e:  # ENOBUFS: events were lost; read the whole state
            if e.errno == errno.ENOBUFS:
                matters = True
                continue
            raise
        matters = matters or routes_changed_outside(data, MESH_PROTOS)
