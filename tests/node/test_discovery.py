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
from meshctl.node.discovery import (
    MAIN_TABLE,
    discover_endpoints,
    discover_internal_ips,
    main_routes,
    pod_routes,
    private_ipv4,
    wg_mtu,
)

from .conftest import NodeLab, in_ns

IF = ipaddress.ip_interface
N = ipaddress.ip_network


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
    assert in_ns(node, discover_internal_ips, "eth1", (), ()) == ()
    assert "--force-internal-ip 10.10.0.4/" in caplog.text
    assert in_ns(node, discover_internal_ips, "eth1", (), (IF("10.10.0.4/16"),)) == (IF("10.10.0.4/16"),)


def test_host_prefix_inside_a_private_network_is_used(node: str, caplog):
    """Hetzner: a /32 on the NIC inside `mesh.private_networks` is the node's internal address
    (the plan joins it over that network); outside every listed network it is still skipped."""
    caplog.set_level(logging.WARNING)
    joined = [ipaddress.ip_network("10.10.0.0/16")]
    assert in_ns(node, discover_internal_ips, "eth1", (), (), joined) == (IF("10.10.0.4/32"),)
    assert "host prefix" not in caplog.text
    elsewhere = [ipaddress.ip_network("10.99.0.0/16")]
    assert in_ns(node, discover_internal_ips, "eth1", (), (), elsewhere) == ()
    assert "mesh.private_networks" in caplog.text


def test_internal_address_from_interface_cidr_or_default_route(node: str):
    assert in_ns(node, discover_internal_ips, "eth2", (), ()) == (IF("10.20.0.4/24"),)
    assert in_ns(node, discover_internal_ips, None, (N("10.20.0.0/16"),), ()) == (IF("10.20.0.4/24"),)
    assert in_ns(node, discover_internal_ips, None, (N("10.30.0.0/16"),), ()) == ()
    assert in_ns(node, discover_internal_ips, None, (), ()) == (IF("10.20.0.4/24"),)  # private, default-route NIC
    with pytest.raises(InputError, match="--private-interface: 'eth9'"):
        in_ns(node, discover_internal_ips, "eth9", (), ())


def test_endpoint_from_flag_or_interface(node: str):
    assert discover_endpoints("198.51.100.7", None, 51820) == (Endpoint("198.51.100.7", 51820),)
    assert discover_endpoints("[fd00::1]:5555", None, 51820) == (Endpoint("fd00::1", 5555),)
    assert discover_endpoints("gw.example.com:1234", None, 51820) == (Endpoint("gw.example.com", 1234),)
    assert discover_endpoints("198.51.100.7, [2001:db8::7]", None, 51820) == (
        Endpoint("198.51.100.7", 51820), Endpoint("2001:db8::7", 51820))
    with pytest.raises(InputError, match="--endpoint"):
        discover_endpoints("fd00::1:5555", None, 51820)
    assert in_ns(node, discover_endpoints, None, "pu", 51820) == (Endpoint("203.0.113.5", 51820),)
    assert in_ns(node, discover_endpoints, None, None, 51820) == (Endpoint("10.20.0.4", 51820),)


# Stable IPv6 addresses that sort after the privacy addresses the kernel makes from their prefix
# (a random interface id below ffff:ffff:ffff:fffe), so discovery must skip those to find them.
PRIV6 = "fd10::ffff:ffff:ffff:fffe/64"
PUB6 = "2001:db8:1::ffff:ffff:ffff:fffe/64"


@pytest.fixture
def dual(lab: NodeLab) -> str:
    """A dual-stack node: a private NIC (veth `priv`, its peer in a namespace of its own, so the
    link has a carrier and a link-local address) with an IPv4 and an IPv6 subnet, plus a
    deprecated IPv6 address and the privacy (temporary) address the kernel makes beside PRIV6; a
    public NIC with a public address of each family (and a temporary one), a private IPv6 one and
    the default routes."""
    ns, peer = lab.ns("dual"), lab.ns("dualp")
    for dev, other in (("priv", "privx"), ("pub", "pubx")):
        lab.sh(ns, "ip", "link", "add", dev, "type", "veth", "peer", "name", other, "netns", peer)
        lab.sh(peer, "ip", "link", "set", other, "up")
        lab.sh(ns, "ip", "link", "set", dev, "up")
        lab.sh(ns, "sysctl", "-qw", f"net.ipv6.conf.{dev}.use_tempaddr=2")
    lab.sh(ns, "ip", "addr", "add", "10.0.0.4/24", "dev", "priv")
    lab.sh(ns, "ip", "addr", "add", PRIV6, "dev", "priv", "nodad", "mngtmpaddr")
    lab.sh(ns, "ip", "addr", "add", "fd10::2/64", "dev", "priv", "nodad", "preferred_lft", "0")  # deprecated
    lab.sh(ns, "ip", "addr", "add", "198.51.100.4/24", "dev", "pub")
    lab.sh(ns, "ip", "addr", "add", PUB6, "dev", "pub", "nodad", "mngtmpaddr")
    lab.sh(ns, "ip", "addr", "add", "fd99::4/64", "dev", "pub", "nodad")  # private: after the public one
    lab.sh(ns, "ip", "route", "add", "default", "via", "198.51.100.1", "dev", "pub")
    lab.sh(ns, "ip", "-6", "route", "add", "default", "via", "2001:db8:1::1", "dev", "pub")
    for dev in ("priv", "pub"):
        shown = lab.sh(ns, "ip", "-6", "addr", "show", "dev", dev).stdout
        assert "temporary" in shown and "fe80::" in shown, shown  # there, for discovery to skip
    return ns


@pytest.mark.parametrize(("case", "private_interface", "cidrs", "want"), [
    ("private NIC: the first of each family", "priv", (), ("10.0.0.4/24", PRIV6)),
    ("one CIDR per family", None, ("fd10::/48", "10.0.0.0/8"), ("10.0.0.4/24", PRIV6)),
    ("an IPv6 CIDR alone", None, ("fd10::/48",), (PRIV6,)),
    ("nothing given: private addresses, default-route NIC first", None, (), ("10.0.0.4/24", "fd99::4/64")),
])
def test_internal_addresses_of_both_families(dual: str, case: str, private_interface: str | None,
                                             cidrs: tuple[str, ...], want: tuple[str, ...]):
    """One internal address per family, IPv4 first; never a link-local (fe80::/10), temporary or
    deprecated one, though those sort first."""
    got = in_ns(dual, discover_internal_ips, private_interface, tuple(map(N, cidrs)), ())
    assert got == tuple(map(IF, want)), case


def test_forced_internal_addresses_replace_discovery_in_every_family(dual: str):
    forced = (IF("10.10.0.4/16"), IF("fd20::4/64"))
    assert in_ns(dual, discover_internal_ips, "priv", (), forced) == forced
    assert in_ns(dual, discover_internal_ips, "priv", (), forced[1:]) == forced[1:]


def test_endpoints_of_both_families(dual: str, lab: NodeLab):
    """The public NIC's public address of each family (the private fd99:: loses to the public one,
    the temporary one is skipped); with the public one gone, the private one; a family the NIC has
    no address of, none."""
    pub6 = str(IF(PUB6).ip)
    both = (Endpoint("198.51.100.4", 51820), Endpoint(pub6, 51820))
    assert in_ns(dual, discover_endpoints, None, "pub", 51820) == both
    assert in_ns(dual, discover_endpoints, None, None, 51820) == both  # the default-route NIC
    lab.sh(dual, "ip", "addr", "del", "198.51.100.4/24", "dev", "pub")
    assert in_ns(dual, discover_endpoints, None, "pub", 51820) == (Endpoint(pub6, 51820),)
    lab.sh(dual, "ip", "addr", "del", PUB6, "dev", "pub")
    lab.sh(dual, "ip", "-6", "addr", "flush", "dev", "pub", "temporary")
    assert in_ns(dual, discover_endpoints, None, "pub", 51820) == (Endpoint("fd99::4", 51820),)


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


def _pyroute2_main_routes(family: int, dst_len: int) -> list[tuple[bytes, int, int, int]]:
    """What pyroute2's parser reads of the same dump: the reference the in-place reader matches."""
    import socket

    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        return [(ipaddress.ip_address(r.get("RTA_DST")).packed if r.get("RTA_DST") else b"", int(r.get("RTA_OIF") or 0),
                 r["type"], r["proto"])
                for r in ipr.get_routes(family=family, table=MAIN_TABLE) if r["dst_len"] == dst_len
                and r.get("RTA_TABLE", r["table"]) == MAIN_TABLE] if family in (socket.AF_INET, socket.AF_INET6) else []


def test_the_route_dump_reads_what_pyroute2_reads_across_many_messages(node: str, lab: NodeLab, tmp_path):
    """main_routes reads the dump in place (an agent at 50,000 nodes has 100,000 routes): the same
    routes, in the same order, as pyroute2's parser, over a dump of many datagrams, with routes of
    other tables, other lengths, a blackhole and IPv6 among them."""
    import socket

    batch = [f"route add 10.77.{i // 250}.{i % 250 + 1}/32 dev eth2" for i in range(3000)]
    batch += [f"route add 10.78.{i}.0/24 dev eth2" for i in range(50)]
    batch += [f"route add 10.79.0.{i + 1}/32 dev eth2 table 100" for i in range(50)]
    batch += ["route add blackhole 10.80.0.1/32"]
    batch += [f"route add fd77::{i + 1:x}/128 dev eth2" for i in range(1000)]
    (tmp_path / "routes").write_text("\n".join(batch) + "\n")
    lab.sh(node, "ip", "-batch", str(tmp_path / "routes"))
    for family, dst_len in ((socket.AF_INET, 32), (socket.AF_INET, 24), (socket.AF_INET, 0),
                            (socket.AF_INET6, 128), (socket.AF_INET6, 0)):
        got = [tuple(r) for r in in_ns(node, main_routes, family, dst_len)]
        want = in_ns(node, _pyroute2_main_routes, family, dst_len)
        assert got == want, (family, dst_len, len(got), len(want))
    assert len(in_ns(node, main_routes, socket.AF_INET, 32)) >= 3001
