# SPDX-License-Identifier: Apache-2.0
"""NAT routers for lab nodes (`lab.nat: {NODE: cone|symmetric}`) and `meshctl lab nat NODE --rebind`.

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
Everything is named with the lab prefix: the router namespace and the nft table.
"""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import Callable

from meshctl.errors import MeshError
from meshctl.lab.namespaces.state import NatState, NodeState
from meshctl.lab.rigs import netns

NAT_KINDS: tuple[str, ...] = ("cone", "symmetric")
INSIDE_NET = ipaddress.ip_network("192.168.0.0/16")  # node i's link to its router: 192.168.<i>.0/24
CONE_PORT_BASE = 20000  # a cone maps node i's WireGuard port to CONE_PORT_BASE + 100*i (+1 per rebind)
CT_MARK = 0x6d6e  # conntrack mark of WireGuard mappings ("mn"), flushed by rebind


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


def _apply_rules(nat: NatState, wg_port: int) -> None:
    rs = _ruleset(nat.table, nat.kind, nat.inside_ip, nat.public_ip, wg_port, nat.port)
    ns = nat.router_ns
    netns.run(ns, ["nft", "delete", "table", "ip", nat.table], check=False)
    netns.run(ns, ["nft", "-f", "-"], input=rs)


def build_router(prefix: str, fab: str, node_netns: str, idx: int, kind: str, public_ip: str,
                 public_prefixlen: int, wg_port: int, add_ns: Callable[[str], str]) -> NatState:
    """Wire node `idx` (namespace `node_netns`) to the public bridge through a NAT router of `kind`;
    `add_ns(name)` makes (and records) a namespace. Returns the state kept as the node's `nat`."""
    if kind not in NAT_KINDS:
        raise MeshError(f"lab.nat: {kind!r} is not one of {', '.join(NAT_KINDS)}")
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
    nat = NatState(kind=kind, router_ns=rns, table=f"{prefix}nat", inside_ip=node_ip, router_ip=router_ip,
                   public_ip=public_ip, port=cone_port(node_ip) if kind == "cone" else None, rebinds=0)
    _apply_rules(nat, wg_port)
    return nat


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
    nat.kind, nat.port = kind, (cone_port(nat.inside_ip) + nat.rebinds if kind == "cone" else None)
    _apply_rules(nat, wg_port)
    _flush_mappings(nat.router_ns)
    return nat


def cone_port(inside_ip: str) -> int:
    """The external port a cone NAT first gives the node behind it (from the node's inside address)."""
    third_octet = int(ipaddress.ip_address(inside_ip)) >> 8 & 0xFF  # node i sits on 192.168.<i+1>.0/24
    return CONE_PORT_BASE + 100 * (third_octet - 1)
