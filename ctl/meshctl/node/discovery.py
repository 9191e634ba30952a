# SPDX-License-Identifier: Apache-2.0
"""What the node's own interfaces say: its internal addresses and WireGuard endpoints (one per IP
family each), the MTU kilo0 can use, and the pod routes and private address the fast path is
told. The package's one reader of this namespace's addresses and routes: it reads the CALLING
THREAD's network namespace through netlink (never /sys, which shows the namespace /sys was mounted
in, not the caller's), so it answers for a node's namespace when called from a thread that
entered it (meshctl.setns).

The internal address carries its prefix because the prefix is the private subnet: two nodes are
private neighbours when each address lies in the other's subnet. A /32 on the NIC (Hetzner's
private networks hand out 10.x.y.z/32 plus a route to the /16) therefore says nothing about
neighbours: it is not used, and `--force-internal-ip 10.10.0.4/16` states the subnet instead.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pyroute2 import IPRoute
from pyroute2.netlink.rtnl.ifaddrmsg import IFA_F_DADFAILED, IFA_F_DEPRECATED, IFA_F_TEMPORARY

from meshctl.datapath import links
from meshctl.errors import InputError, MeshError
from meshctl.mesh import fields
from meshctl.mesh.model import Endpoint, IPAddress, IPInterface, IPNetwork, sort_key_net
from meshctl.node import rtnl
from meshctl.node.rtnl import MAIN_TABLE, RTN_UNICAST

log = logging.getLogger(__name__)

# WireGuard adds 60 bytes over IPv4 and 80 over IPv6; 80 keeps kilo0 safe on either underlay.
WG_OVERHEAD = 80
DEFAULT_NIC_MTU = 1500  # a NIC whose MTU cannot be read (or a node without a private one)
_TUNNEL_KINDS = ("wireguard", "tun", "vxlan", "ipip", "gre", "sit")
RTPROT_KERNEL = 2
RT_SCOPE_UNIVERSE = 0
# Address flags of addresses a node must not publish, by family: IPv6 privacy addresses (whose
# flag bit, in IPv4, means secondary), deprecated ones and ones that failed DAD.
_UNPUBLISHABLE = {socket.AF_INET: IFA_F_DEPRECATED | IFA_F_DADFAILED,
                  socket.AF_INET6: IFA_F_DEPRECATED | IFA_F_DADFAILED | IFA_F_TEMPORARY}


# --- netlink readers shared by the appliers and the fast path ----------------------------------


def link_info(ipr: IPRoute, index: int) -> Any:
    return ipr.get_links(index)[0]


def link_kind(link: Any) -> str | None:
    kind = link.get_nested("IFLA_LINKINFO", "IFLA_INFO_KIND")
    return None if kind is None else str(kind)


def _global_addresses(ipr: IPRoute, index: int, family: int = socket.AF_UNSPEC, *,
                      publishable: bool = False) -> list[IPInterface]:
    """Global-scope addresses of one interface (no link-local, no host scope), in the kernel's
    order: an IPv4 subnet's primary address before its secondaries. `publishable`: also none the
    node must not publish (IPv6 privacy addresses, deprecated ones, ones that failed DAD)."""
    out: list[IPInterface] = []
    for a in ipr.get_addr(index=index, family=family):
        if a["scope"] != RT_SCOPE_UNIVERSE:
            continue
        if publishable and (a.get("IFA_FLAGS") or a["flags"]) & _UNPUBLISHABLE.get(a["family"], 0):
            continue
        ip = a.get("IFA_LOCAL") or a.get("IFA_ADDRESS")
        if ip:
            out.append(ipaddress.ip_interface(f"{ip}/{a['prefixlen']}"))
    return out


def interface_addresses(ipr: IPRoute, index: int, *, publishable: bool = False) -> list[IPInterface]:
    """Global-scope addresses of one interface, in the project's address order (`publishable`:
    see _global_addresses)."""
    return sorted(_global_addresses(ipr, index, publishable=publishable), key=sort_key_net)


def private_address(dev: str, version: int = 4) -> IPAddress | None:
    """The first global address of IP version `version` on `dev` in the kernel's order (the
    node's private address of that family, the one encapsulated packets are addressed to); None
    without one or without the device."""
    idx = links.ifindex_or_none(dev)
    if idx is None:
        return None
    with IPRoute() as ipr:
        found = _global_addresses(ipr, idx, socket.AF_INET if version == 4 else socket.AF_INET6)
    return found[0].ip if found else None


def private_ipv4(dev: str) -> IPAddress | None:
    return private_address(dev, 4)


def private_ipv6(dev: str) -> IPAddress | None:
    return private_address(dev, 6)


@dataclass(frozen=True)
class HostRoute:
    """A main-table route to one address (/32, /128) through a device."""

    oif: int
    dst: IPNetwork
    unicast: bool
    by_kernel: bool  # proto kernel: the kernel's route for an address of the device's own


def host_routes(family: int) -> list[HostRoute]:
    """The main table's routes of `family` to a single address through a device, in the kernel's order."""
    full = 32 if family == socket.AF_INET else 128
    net = ipaddress.IPv4Network if family == socket.AF_INET else ipaddress.IPv6Network
    return [HostRoute(r.oif, net((int.from_bytes(r.dst, "big"), full)), r.type == RTN_UNICAST, r.proto == RTPROT_KERNEL)
            for r in main_routes(family, full) if r.dst and r.oif]


class DumpedRoute(NamedTuple):
    """The parts of a route of the main table that discovery reads (`dst`: the address bytes,
    empty for a default route; `oif`: 0 when the route names no device)."""

    dst: bytes
    oif: int
    type: int
    proto: int


def main_routes(family: int, dst_len: int) -> list[DumpedRoute]:
    """The main table's routes of `family` whose prefix length is `dst_len`, in the kernel's order,
    read with one netlink dump of the main table looked at in place: an agent at 50,000 nodes
    has 100,000 routes there, and pyroute2's parser builds a message object tree per route
    (seconds of CPU and hundreds of MB at once, on every pod-interface rescan); here only the
    routes of that length have their attributes read."""
    out: list[DumpedRoute] = []
    with rtnl.Rtnl() as nl:
        for data, off, length in nl.dump(family, table=MAIN_TABLE):
            _, plen, _, _, _, proto, _, rtype, _ = rtnl.RTMSG.unpack_from(data, off + rtnl.NLMSG.size)
            if plen == dst_len:
                attrs = rtnl.attributes(data, off, length)
                oif = attrs.get(rtnl.RTA_OIF)
                out.append(DumpedRoute(attrs.get(rtnl.RTA_DST, b""), rtnl.U32.unpack(oif)[0] if oif else 0,
                                       rtype, proto))
    return out


def routes_changed_outside(data: bytes, protos: frozenset[int]) -> bool:
    """Whether the netlink notifications in `data` (one read of a socket subscribed to route,
    link and address groups) may change anything but routes of `protos` or routes that are not
    main-table host routes: a link or address message, or a main-table /32 (/128) route of
    another protocol. An agent writing 10,000 routes of its own sends as many notifications; a
    reader of pod routes (node/pods.py) need not dump the main table again for them."""
    for off, length, kind, _, _ in rtnl.messages(data):
        if length < rtnl.NLMSG.size:
            return True  # not a message this reader understands: assume it matters
        if kind not in (rtnl.RTM_NEWROUTE, rtnl.RTM_DELROUTE) or off + rtnl.NLMSG.size + rtnl.RTMSG.size > len(data):
            return True
        family, plen, _, _, table, proto = rtnl.RTMSG.unpack_from(data, off + rtnl.NLMSG.size)[:6]
        host = 32 if family == socket.AF_INET else 128
        if proto not in protos and plen == host and table == MAIN_TABLE:
            return True
    return False


def pod_routes(pod_ifs: Iterable[str]) -> dict[IPAddress, int]:
    """Pod address -> host veth ifindex: the unicast host routes through `pod_ifs` (how the lab and
    most CNIs route pods), not counting the kernel's routes for the host side's own addresses."""
    wanted = {idx for idx in map(links.ifindex_or_none, pod_ifs) if idx is not None}
    if not wanted:
        return {}
    return {r.dst.network_address: r.oif for family in (socket.AF_INET, socket.AF_INET6)
            for r in host_routes(family) if r.oif in wanted and r.unicast and not r.by_kernel}


def _is_host_prefix(i: IPInterface) -> bool:
    return i.network.prefixlen == i.max_prefixlen


def _private(ip: IPAddress) -> bool:
    return not Endpoint(str(ip), 1).is_public


def _given_interface(flag: str, name: str) -> int:
    """The index of the interface a flag names, or InputError saying the node has none of that name."""
    idx = links.ifindex_or_none(name)
    if idx is None:
        raise InputError(flag, name, "is not an interface of this node")
    return idx


def _default_route_ifindex() -> int | None:
    for family in (socket.AF_INET, socket.AF_INET6):
        for r in main_routes(family, 0):
            if r.oif:
                return r.oif
    return None


# --- discovery ---------------------------------------------------------------------------------


def discover_internal_ips(private_interface: str | None, internal_cidrs: Sequence[IPNetwork],
                          force: Sequence[IPInterface], private_networks: Sequence[IPNetwork] = ()
                          ) -> tuple[IPInterface, ...]:
    """The node's internal addresses, at most one per IP family (IPv4 first), each with its
    private subnet's prefix; empty for a tunnel-only node.

    `force` (`--force-internal-ip`, one per family) wins whole; else the first usable address of
    each family on `private_interface`; else, per CIDR of `internal_cidrs`, the first address inside
    it on any interface; else each family's first private address, the default-route interface's
    first. Usable: global scope, neither temporary (privacy) nor deprecated nor failed DAD (a node's
    record must not change with an address the kernel rotates). A host prefix (/32, /128) says
    nothing about neighbours, so it is used only inside one of `private_networks`
    (`mesh.private_networks`: the plan joins such nodes over that network, Hetzner's case);
    elsewhere it is skipped with a warning naming the two ways to use it.
    """
    if force:
        return tuple(force)
    with IPRoute() as ipr:
        if private_interface:
            idx = _given_interface("--private-interface", private_interface)
            candidates = [(private_interface, a) for a in interface_addresses(ipr, idx, publishable=True)]
        else:
            candidates = []
            default_idx = _default_route_ifindex()
            for link in sorted(ipr.get_links(), key=lambda lk: lk["index"] != default_idx):
                name = link.get("ifname")
                if name == "lo" or link_kind(link) in _TUNNEL_KINDS:
                    continue
                candidates.extend((name, a) for a in interface_addresses(ipr, link["index"], publishable=True))
    if internal_cidrs:
        candidates = [(n, a) for n, a in candidates
                      if any(a.version == w.version and a.ip in w for w in internal_cidrs)]
    elif not private_interface:
        candidates = [(n, a) for n, a in candidates if _private(a.ip)]
    found: dict[int, IPInterface] = {}
    for name, a in candidates:
        if a.version in found:
            continue
        if _is_host_prefix(a) and not any(a.ip in net for net in private_networks if net.version == a.version):
            log.warning("internal address %s on %s is a host prefix and says nothing about the private subnet; "
                        "list its network in mesh.private_networks, or pass --force-internal-ip %s/<subnet prefix>, "
                        "to use it", a, name, a.ip)
            continue
        found[a.version] = a
    return tuple(found[f] for f in sorted(found))


def discover_endpoints(endpoint: str | None, public_interface: str | None, port: int) -> tuple[Endpoint, ...]:
    """The WireGuard endpoints to publish, at most one per family: `--endpoint` (one per family,
    comma-separated, port optional, default `port`), else the first usable global address of each
    family on `public_interface`, else on the default-route interface. Public addresses go first
    (the first endpoint is the one older readers see, and a public one can be called by anyone);
    between equals IPv4 first. Empty when nothing fits: peers then wait for us to call."""
    if endpoint:
        return fields.endpoints(endpoint, "--endpoint", default_port=port)
    with IPRoute() as ipr:
        idx = _given_interface("--public-interface", public_interface) if public_interface else \
            _default_route_ifindex()
        if idx is None:
            return ()
        addrs = interface_addresses(ipr, idx, publishable=True)
    addrs.sort(key=lambda a: (_private(a.ip), a.version))
    found: dict[int, Endpoint] = {}
    for a in addrs:
        found.setdefault(a.version, Endpoint(str(a.ip), port))
    return tuple(found.values())


def wg_mtu(private_if: str | None, default: int = DEFAULT_NIC_MTU) -> int:
    """kilo0's MTU: the private NIC's MTU (else `default`) minus WireGuard's IPv6-safe overhead."""
    mtu = default
    if private_if:
        try:
            mtu = links.mtu(private_if)
        except MeshError:
            log.warning("private interface %s not found; kilo0 MTU from the default %d", private_if, default)
    return mtu - WG_OVERHEAD
