# SPDX-License-Identifier: Apache-2.0
"""NAT routers for lab nodes (`lab.nat: {NODE: cone|symmetric|firewall6}`) and `meshctl lab nat NODE --rebind`.

A NATed node's `pub` interface does not sit on the public segment: it is wired to a router
namespace `P<node>-nat` that holds the node's public address and translates:

    node P<node>  pub 192.168.<i>.2/24 --- in 192.168.<i>.1/24  P<node>-nat  pub 198.51.100.x --- bpub

- `cone`: endpoint-independent mapping AND filtering ("full cone"): the node's WireGuard port
  always leaves as one external port, whatever the destination, and anything arriving at that
  port is forwarded to the node. Every peer that saw the node's handshakes saw the same
  endpoint, and any peer may call it there.
- `symmetric`: a new mapping per destination with a random port (`masquerade fully-random`),
  and only replies come back in. What one peer saw is useless to every other peer.

Other traffic of the node (its etcd connection) is masqueraded in both kinds. `rebind` gives
the node a new external port at run time, as a home router does after a reboot: a cone moves its
port, and both kinds drop their WireGuard mappings (conntrack entries carry a mark for that).

- `firewall6`: IPv6 has no NAT; a home or office router is a stateful firewall instead. The node
  keeps its public IPv6 address (a /128 on its `pub`, reached through the router's fe80::1); the
  router answers neighbour solicitations for it on the public segment (proxy NDP) and forwards
  to it only packets of connections the node opened (`ct state established,related`): anything
  new from outside is dropped and counted. Its peers may call its published endpoint once it has
  called them (a WireGuard handshake or keepalive from the same port opens the way back); two
  such nodes reach each other by calling at once. `rebind` makes the firewall forget its state.

    node P<node>  pub 2001:db8:100::x/128 --- in fe80::1  P<node>-nat  pub 2001:db8:100::fe:x --- bpub

A dual-stack node behind `cone` or `symmetric` sits behind a home router: one router namespace that
translates IPv4 as its kind says and is a `firewall6` for IPv6 (the node keeps its public IPv6
address; new inbound IPv6 is dropped and counted, inbound IPv4 is the NAT's business).

Everything is named with the lab prefix: the router namespace and the nft table.
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Callable

from meshctl.errors import MeshError
from meshctl.lab.namespaces.state import NatState, NodeState
from meshctl.lab.rigs import netns

NAT_KINDS: tuple[str, ...] = ("cone", "symmetric", "firewall6")
FIREWALL6 = "firewall6"  # the IPv6 kind: a stateful firewall, no translation
ROUTER_LINK6 = "fe80::1"  # a firewall6 router's address on its `in` link, the node's gateway
FIREWALL6_DROP = "inbound-new"  # the comment of a firewall6 router's drop rule (its counter)
ROUTER_SLOT6 = 0xFE << 16  # a firewall6 router's public address: the node's plus this (::x -> ::fe:x)
INSIDE_NET = ipaddress.ip_network("192.168.0.0/16")  # node i's link to its router: 192.168.<i>.0/24
CONE_PORT_BASE = 20000  # a cone maps node i's WireGuard port to CONE_PORT_BASE + 100*i (+1 per rebind)
CT_MARK = 0x6d6e  # conntrack mark of WireGuard mappings ("mn"), flushed by rebind


def nat_families(kind: str) -> tuple[int, ...]:
    """The IP family a router of `kind` translates or filters: IPv6 for firewall6, IPv4 for the NATs."""
    return (6,) if kind == FIREWALL6 else (4,)


def nat_fits(kind: str, families: tuple[int, ...]) -> bool:
    """Whether a node speaking `families` may sit behind a router of `kind`: a NAT fronts an IPv4-only
    node or a dual-stack one (whose IPv6 it firewalls), firewall6 an IPv6-only node."""
    return families == (6,) if kind == FIREWALL6 else families in ((4,), (4, 6))


def router_ns(node_netns: str) -> str:
    return f"{node_netns}-nat"


def inside_addresses(idx: int) -> tuple[str, str]:
    """(router, node) addresses of node `idx`'s inside link, without prefix length."""
    base = INSIDE_NET.network_address + 256 * (idx + 1)
    return str(base + 1), str(base + 2)


def _ruleset(table: str, kind: str, node_ip: str, public_ip: str, wg_port: int, ext_port: int | None) -> str:
    udp_wg = f'oifname "pub" ip saddr {node_ip} udp sport {wg_port}'
    if kind == "cone":
        pre = f'iifname "pub" udp dport {ext_port} ct mark set {CT_MARK} dnat to {node_ip}:{wg_port}'
        post = f"{udp_wg} ct mark set {CT_MARK} snat to {public_ip}:{ext_port}"
    else:
        pre = ""
        post = f"{udp_wg} ct mark set {CT_MARK} masquerade to :10000-60000 fully-random"
    return f"""table ip {table} {{
  chain pre {{
    type nat hook prerouting priority dstnat; policy accept;
    {pre}
  }}
  chain post {{
    type nat hook postrouting priority srcnat; policy accept;
    {post}
    oifname "pub" masquerade
  }}
}}
"""


def _firewall6_ruleset(table: str, wg_port: int) -> str:
    """Forward to the node only what belongs to connections it opened; count the rest. The
    node's WireGuard flows carry CT_MARK (rebind forgets them)."""
    return f"""table inet {table} {{
  chain forward {{
    type filter hook forward priority filter; policy accept;
    meta nfproto ipv6 iifname "in" oifname "pub" udp sport {wg_port} ct mark set {CT_MARK}
    meta nfproto ipv6 iifname "pub" oifname "in" ct state established,related accept
    meta nfproto ipv6 iifname "pub" oifname "in" counter drop comment "{FIREWALL6_DROP}"
  }}
}}
"""


def _apply_rules(nat: NatState, wg_port: int) -> None:
    ns = nat.router_ns
    if nat.kind == FIREWALL6 or nat.firewall6_ip is not None:
        netns.run(ns, ["nft", "delete", "table", "inet", nat.table], check=False)
        netns.run(ns, ["nft", "-f", "-"], input=_firewall6_ruleset(nat.table, wg_port))
    if nat.kind == FIREWALL6:
        return
    rs = _ruleset(nat.table, nat.kind, nat.inside_ip, nat.public_ip, wg_port, nat.port)
    netns.run(ns, ["nft", "delete", "table", "ip", nat.table], check=False)
    netns.run(ns, ["nft", "-f", "-"], input=rs)


def dropped(nat: NatState) -> int:
    """Packets a firewall6 router dropped as new connections from outside."""
    out = netns.run(nat.router_ns, ["nft", "list", "chain", "inet", nat.table, "forward"]).stdout
    for line in out.splitlines():
        if FIREWALL6_DROP in line and "packets" in line:
            return int(line.split("packets", 1)[1].split()[0])
    return 0


def build_router(prefix: str, fab: str, node_netns: str, idx: int, kind: str, public_ip: str,
                 public_prefixlen: int, wg_port: int, add_ns: Callable[[str], str],
                 public6: tuple[str, int] | None = None) -> NatState:
    """Wire node `idx` (namespace `node_netns`) to the public bridge through a NAT router of `kind`;
    `add_ns(name)` makes (and records) a namespace. `public6` (address, prefix length): the IPv6
    public address of a dual-stack node behind a NAT, which the same router firewalls. Returns the
    state kept as the node's `nat`."""
    if kind not in NAT_KINDS:
        raise MeshError(f"lab.nat: {kind!r} is not one of {', '.join(NAT_KINDS)}")
    if kind == FIREWALL6:
        return _build_firewall6(prefix, fab, node_netns, idx, public_ip, public_prefixlen, wg_port, add_ns)
    rns = add_ns(router_ns(node_netns))
    router_ip, node_ip = inside_addresses(idx)
    netns.veth(fab, f"n{idx}u", rns, "pub")
    netns.enslave(fab, f"n{idx}u", "bpub")
    netns.addr(rns, "pub", f"{public_ip}/{public_prefixlen}")
    netns.veth(rns, "in", node_netns, "pub")
    netns.addr(rns, "in", f"{router_ip}/24")
    netns.addr(node_netns, "pub", f"{node_ip}/24")
    public_net = ipaddress.ip_interface(f"{public_ip}/{public_prefixlen}").network
    netns.run(node_netns, ["ip", "route", "add", str(public_net), "via", router_ip])
    netns.sysctl(rns, "net.ipv4.ip_forward", "1")
    if public6 is not None:
        _firewall6_wiring(rns, node_netns, *public6)
    nat = NatState(kind=kind, router_ns=rns, table=f"{prefix}nat", inside_ip=node_ip, router_ip=router_ip,
                   public_ip=public_ip, port=cone_port(node_ip) if kind == "cone" else None, rebinds=0,
                   firewall6_ip=public6[0] if public6 is not None else None)
    _apply_rules(nat, wg_port)
    return nat


def _build_firewall6(prefix: str, fab: str, node_netns: str, idx: int, public_ip: str, public_prefixlen: int,
                     wg_port: int, add_ns: Callable[[str], str]) -> NatState:
    """Node `idx` keeps its public IPv6 address behind a stateful firewall (the module's doc)."""
    rns = add_ns(router_ns(node_netns))
    netns.veth(fab, f"n{idx}u", rns, "pub")
    netns.enslave(fab, f"n{idx}u", "bpub")
    netns.veth(rns, "in", node_netns, "pub")
    _firewall6_wiring(rns, node_netns, public_ip, public_prefixlen)
    nat = NatState(kind=FIREWALL6, router_ns=rns, table=f"{prefix}nat", inside_ip=public_ip, router_ip=ROUTER_LINK6,
                   public_ip=public_ip, port=None, rebinds=0)
    _apply_rules(nat, wg_port)
    return nat


def _firewall6_wiring(rns: str, node_netns: str, public_ip: str, public_prefixlen: int) -> None:
    """The IPv6 side of a router whose `pub` and `in` links exist: the node keeps `public_ip` (a /128
    on its `pub`, its gateway the router's fe80::1), which the router routes to `in` and answers
    neighbour solicitations for on the public segment."""
    public_net = ipaddress.ip_interface(f"{public_ip}/{public_prefixlen}").network
    router_pub = ipaddress.IPv6Address(int(ipaddress.IPv6Address(public_ip)) + ROUTER_SLOT6)
    for ns, dev, cidr in ((rns, "pub", f"{router_pub}/{public_prefixlen}"), (rns, "in", f"{ROUTER_LINK6}/64"),
                          (node_netns, "pub", f"{public_ip}/128")):
        netns.run(ns, ["ip", "-6", "addr", "add", cidr, "dev", dev, "nodad"])
    netns.run(node_netns, ["ip", "-6", "route", "add", str(public_net), "via", ROUTER_LINK6, "dev", "pub"])
    netns.run(rns, ["ip", "-6", "route", "add", f"{public_ip}/128", "dev", "in"])
    netns.sysctl(rns, "net.ipv6.conf.all.forwarding", "1")
    netns.sysctl(rns, "net.ipv6.conf.pub.proxy_ndp", "1")
    netns.run(rns, ["ip", "-6", "neigh", "add", "proxy", public_ip, "dev", "pub"])


def _flush_mappings(router: str) -> None:
    """Delete the router's conntrack entries of WireGuard mappings (the marked ones)."""
    code = f"from pyroute2 import Conntrack\nct = Conntrack()\nct.flush(mark={CT_MARK})\nct.close()\n"
    netns.run(router, [sys.executable, "-c", code])


def _nat_of(node: NodeState) -> NatState:
    if node.nat is None:
        raise MeshError(f"lab node {node.name} is not behind a NAT (lab.nat)")
    return node.nat


def rebind(node: NodeState, wg_port: int) -> NatState:
    """Give a NATed lab node a new external WireGuard port now; returns the node's NAT state."""
    nat = _nat_of(node)
    nat.rebinds += 1
    if nat.kind == "cone":
        nat.port = (nat.port or cone_port(nat.inside_ip)) + 1
        _apply_rules(nat, wg_port)
    _flush_mappings(nat.router_ns)
    return nat


def set_kind(node: NodeState, kind: str, wg_port: int) -> NatState:
    """Turn a NATed lab node's router into another kind now (a symmetric NAT replaced by a cone:
    a relayed pair may then go direct); returns the node's NAT state."""
    if kind not in NAT_KINDS:
        raise MeshError(f"--kind: {kind!r} is not one of {', '.join(NAT_KINDS)}")
    nat = _nat_of(node)
    if nat_families(kind) != nat_families(nat.kind):
        raise MeshError(f"--kind: {kind} is for IPv{nat_families(kind)[0]} and {node.name} is behind a {nat.kind} "
                        f"(IPv{nat_families(nat.kind)[0]})")
    nat.kind, nat.port = kind, (cone_port(nat.inside_ip) + nat.rebinds if kind == "cone" else None)
    _apply_rules(nat, wg_port)
    _flush_mappings(nat.router_ns)
    return nat


def cone_port(inside_ip: str) -> int:
    """The external port a cone NAT first gives the node behind it (from the node's inside address)."""
    third_octet = int(ipaddress.ip_address(inside_ip)) >> 8 & 0xFF  # node i sits on 192.168.<i+1>.0/24
    return CONE_PORT_BASE + 100 * (third_octet - 1)
