# SPDX-License-Identifier: Apache-2.0
"""Discovery from a node's own interfaces: internal address (and the /32 case that needs the
override), endpoint, kilo0's MTU, and the pod routes and private address the fast path is told
(the same answers iproute2 gives)."""

from __future__ import annotations

import ipaddress
import json
import logging

import pytest

from meshctl.errors import InputError
from meshctl.mesh.model import Endpoint
from meshctl.node.discovery import discover_endpoint, discover_internal_ip, pod_routes, private_ipv4, wg_mtu

from .conftest import NodeLab, in_ns

IF = ipaddress.ip_interface


@pytest.fixture
def node(lab: NodeLab) -> str:
    ns = lab.ns("disc")
    for dev in ("eth1", "eth2", "pu"):
        lab.sh(ns, "ip", "link", "add", dev, "type", "veth", "peer", "name", f"{dev}x")
        lab.sh(ns, "ip", "link", "set", dev, "up")
    # Hetzner: a /32 on the private NIC and a route to the private /16 through a gateway.
    lab.sh(ns, "ip", "addr", "add", "10.10.0.4/32", "dev", "eth1")
    lab.sh(ns, "ip", "route", "add", "10.10.0.1", "dev", "eth1", "scope", "link")
    lab.sh(ns, "ip", "route", "add", "10.10.0.0/16", "via", "10.10.0.1", "dev", "eth1")
    lab.sh(ns, "ip", "addr", "add", "10.20.0.4/24", "dev", "eth2")
    lab.sh(ns, "ip", "link", "set", "eth2", "mtu", "9000")
    lab.sh(ns, "ip", "route", "add", "default", "via", "10.20.0.1", "dev", "eth2")
    lab.sh(ns, "ip", "addr", "add", "203.0.113.5/24", "dev", "pu")
    return ns


def test_host_prefix_on_the_nic_needs_the_force_override(node: str, caplog):
    caplog.set_level(logging.WARNING)
    assert in_ns(node, discover_internal_ip, "eth1", None, None) is None
    assert "--force-internal-ip 10.10.0.4/" in caplog.text
    assert in_ns(node, discover_internal_ip, "eth1", None, "10.10.0.4/16") == IF("10.10.0.4/16")
    with pytest.raises(InputError, match="--force-internal-ip"):
        in_ns(node, discover_internal_ip, None, None, "10.10.0.4")


def test_host_prefix_inside_a_private_network_is_used(node: str, caplog):
    """Hetzner: a /32 on the NIC inside `mesh.private_networks` is the node's internal address
    (the plan joins it over that network); outside every listed network it is still skipped."""
    caplog.set_level(logging.WARNING)
    joined = [ipaddress.ip_network("10.10.0.0/16")]
    assert in_ns(node, discover_internal_ip, "eth1", None, None, joined) == IF("10.10.0.4/32")
    assert "host prefix" not in caplog.text
    elsewhere = [ipaddress.ip_network("10.99.0.0/16")]
    assert in_ns(node, discover_internal_ip, "eth1", None, None, elsewhere) is None
    assert "mesh.private_networks" in caplog.text


def test_internal_address_from_interface_cidr_or_default_route(node: str):
    assert in_ns(node, discover_internal_ip, "eth2", None, None) == IF("10.20.0.4/24")
    assert in_ns(node, discover_internal_ip, None, "10.20.0.0/16", None) == IF("10.20.0.4/24")
    assert in_ns(node, discover_internal_ip, None, "10.30.0.0/16", None) is None
    assert in_ns(node, discover_internal_ip, None, None, None) == IF("10.20.0.4/24")  # private, default-route NIC
    with pytest.raises(InputError, match="--private-interface: 'eth9'"):
        in_ns(node, discover_internal_ip, "eth9", None, None)


def test_endpoint_from_flag_or_interface(node: str):
    assert discover_endpoint("198.51.100.7", None, 51820) == Endpoint("198.51.100.7", 51820)
    assert discover_endpoint("[fd00::1]:5555", None, 51820) == Endpoint("fd00::1", 5555)
    assert discover_endpoint("gw.example.com:1234", None, 51820) == Endpoint("gw.example.com", 1234)
    with pytest.raises(InputError, match="--endpoint"):
        discover_endpoint("fd00::1:5555", None, 51820)
    assert in_ns(node, discover_endpoint, None, "pu", 51820) == Endpoint("203.0.113.5", 51820)
    assert in_ns(node, discover_endpoint, None, None, 51820) == Endpoint("10.20.0.4", 51820)


def test_kilo0_mtu_is_the_private_nic_minus_overhead(node: str):
    assert in_ns(node, wg_mtu, "eth2") == 8920
    assert in_ns(node, wg_mtu, "eth1") == 1420
    assert in_ns(node, wg_mtu, None) == 1420
    assert in_ns(node, wg_mtu, "eth9", 1450) == 1370


def test_private_ipv4_is_the_primary_global_ipv4_address(node: str, lab: NodeLab):
    lab.sh(node, "ip", "addr", "add", "10.20.0.9/24", "dev", "eth2")  # a secondary, after the primary
    lab.sh(node, "ip", "addr", "add", "10.20.1.1/24", "dev", "eth2", "scope", "link")
    lab.sh(node, "ip", "addr", "add", "fd00::4/64", "dev", "eth2")
    assert in_ns(node, private_ipv4, "eth2") == ipaddress.ip_address("10.20.0.4")
    assert in_ns(node, private_ipv4, "eth9") is None
    out = json.loads(lab.sh(node, "ip", "-j", "-4", "addr", "show", "dev", "eth2", "scope", "global").stdout)
    shown = [a["local"] for a in out[0]["addr_info"] if a]  # iproute2 prints {} for the link-scope one
    assert shown == ["10.20.0.4", "10.20.0.9"]


def test_pod_routes_are_the_unicast_host_routes_through_the_pod_interfaces(node: str, lab: NodeLab):
    for dev in ("vp1", "vp2"):
        lab.sh(node, "ip", "link", "add", dev, "type", "veth", "peer", "name", f"{dev}x")
        lab.sh(node, "ip", "link", "set", dev, "up")
    lab.sh(node, "ip", "addr", "add", "10.42.1.1", "peer", "10.42.1.9/32", "dev", "vp1")  # a proto kernel route
    lab.sh(node, "ip", "route", "add", "10.42.1.5/32", "dev", "vp1")
    lab.sh(node, "ip", "route", "add", "10.42.1.6/32", "dev", "vp2")
    lab.sh(node, "ip", "route", "add", "10.42.2.0/24", "dev", "vp1")  # not a host route
    lab.sh(node, "ip", "route", "add", "blackhole", "10.42.1.7/32")
    lab.sh(node, "ip", "-6", "route", "add", "fd42::5/128", "dev", "vp1")
    vp1 = int(json.loads(lab.sh(node, "ip", "-j", "link", "show", "dev", "vp1").stdout)[0]["ifindex"])
    assert in_ns(node, pod_routes, ["vp1", "gone"]) == {ipaddress.ip_address("10.42.1.5"): vp1,
                                                       ipaddress.ip_address("fd42::5"): vp1}
    assert in_ns(node, pod_routes, []) == {}
