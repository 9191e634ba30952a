# SPDX-License-Identifier: Apache-2.0
"""ensure_sysctls in a real namespace: forwarding on, rp_filter loose on the mesh's interfaces,
only what differs is written, and the root namespace is left alone."""

from __future__ import annotations

from pathlib import Path

from meshctl.node.sysctls import ensure_sysctls

from .conftest import NodeLab, in_ns


def test_forwarding_and_loose_rp_filter_only_where_needed(lab: NodeLab):
    ns = lab.ns("sys")
    lab.sh(ns, "ip", "link", "add", "pv", "type", "veth", "peer", "name", "pvx")
    lab.sh(ns, "sysctl", "-qw", "net.ipv4.conf.pv.rp_filter=1", "net.ipv4.conf.pvx.rp_filter=1")
    root_forward = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    changed = in_ns(ns, ensure_sysctls, "pv", "kilo0")  # kilo0 does not exist yet: skipped
    assert changed == {"net.ipv4.ip_forward": "1", "net.ipv4.conf.pv.rp_filter": "2"}
    got = lab.sh(ns, "sysctl", "-n", "net.ipv4.ip_forward", "net.ipv4.conf.pv.rp_filter",
                 "net.ipv4.conf.pvx.rp_filter").stdout.split()
    assert got == ["1", "2", "1"]  # an interface outside the mesh keeps its setting
    assert in_ns(ns, ensure_sysctls, "pv", "kilo0") == {}
    lab.sh(ns, "ip", "link", "add", "kilo0", "type", "veth", "peer", "name", "k0x")
    lab.sh(ns, "sysctl", "-qw", "net.ipv4.conf.kilo0.rp_filter=1")
    assert in_ns(ns, ensure_sysctls, "pv", "kilo0", ipv6=True) == {
        "net.ipv6.conf.all.forwarding": "1", "net.ipv4.conf.kilo0.rp_filter": "2"}
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == root_forward
