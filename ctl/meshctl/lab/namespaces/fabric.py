# SPDX-License-Identifier: Apache-2.0
"""The lab's private fabrics: how each private subnet forwards, like the clouds users run on.

`lab.fabrics` maps each private subnet (the network of the nodes' `internal_ip`) to a kind:

    l2         a plain bridge (the default): every frame passes
    vpc        the bridge, and one router namespace per `network` joining its subnets; the fabric
               forwards only packets whose source and destination are node (or router) addresses,
               like the source/destination check of AWS, GCP and DigitalOcean VPCs
    vpc-udp    as vpc, and only TCP, UDP and ICMP pass (Azure): IP-in-IP is dropped
    hetzner    every node holds a /32 and reaches everything through the gateway (.1), which
               forwards only node addresses (Hetzner Cloud networks); nodes cannot reach each other
               on the bridge. The agents' records carry the subnet's prefix (--force-internal-ip)
    blackhole  ARP is answered, no IP packet passes (a firewall rule, a broken peering)

In IPv6 (`lab.ip_families` with 6) every kind does the same: vpc's check holds node addresses
of both families, vpc-udp lets ICMPv6 pass where it lets ICMP, blackhole answers neighbour
solicitations as it answers ARP, and hetzner routes each node's own /64 (its address is the only
one of that /64 on its NIC; it reaches everything else through the gateway, the subnet's ::1).
Neighbour discovery passes every kind as ARP does. A dual-stack subnet's IPv6 side is the subnet
derived from its IPv4 one (namespaces/families.py), filtered by the same kind.

Every kind is nftables rules: one table per subnet in the fabric namespace (bridge family, on the
subnet's bridge) and one per router namespace (inet family). `loss` drops that share of the packets
entering the fabric from a node of the subnet (nft `numgen random`: this kernel has no netem).
`change` rewrites one subnet's rules in one nft transaction while the lab runs (`meshctl lab fabric`).

Layout (prefix P): router of network j is namespace `P rt<j>`; subnet i's bridge `bpriv<i>` in
`P fab` has port `rt<i>` whose peer `r<i>` in the router holds the subnet's first address.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshctl.errors import InputError, MeshError
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.families import own_block, subnet6
from meshctl.lab.namespaces.state import FabricState, LabState
from meshctl.lab.rigs.netns import addr, run, sysctl, veth
from meshctl.mesh.fields import integer, no_unknown_fields
from meshctl.mesh.fields import network as parse_network
from meshctl.mesh.model import IPInterface, IPNetwork

FABRIC_KINDS: tuple[str, ...] = ("l2", "vpc", "vpc-udp", "hetzner", "blackhole")
ROUTED_KINDS: tuple[str, ...] = ("vpc", "vpc-udp", "hetzner")
FABRIC_FIELDS = ("kind", "network", "loss")
_NETWORK_NAME = r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?"


@dataclass(frozen=True)
class Fabric:
    """One private subnet's fabric. `network` joins routed subnets through one router."""

    subnet: IPNetwork
    kind: str = "l2"
    network: str = ""
    loss: int = 0

    @property
    def gateway(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        """The router's address in the subnet (its first one)."""
        return gateway_of(self.subnet)


def gateway_of(subnet: IPNetwork) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """A routed subnet's gateway: its first address (.1, ::1)."""
    return subnet.network_address + 1


def kind(value: Any, path: str) -> str:
    if value not in FABRIC_KINDS:
        raise InputError(path, value, f"is not one of {', '.join(FABRIC_KINDS)}")
    return str(value)


def loss(value: Any, path: str) -> int:
    return integer(value, path, 0, 100, "is not a loss percentage in 0..100")


def parse_fabrics(d: Any, path: str = "lab.fabrics") -> tuple[Fabric, ...]:
    """`{subnet: kind}` or `{subnet: {kind, network, loss}}`."""
    if d is None:
        return ()
    if not isinstance(d, Mapping):
        raise InputError(path, d, "is not a mapping of subnet to fabric kind")
    out: list[Fabric] = []
    for key, val in d.items():
        p = f"{path}.{key}"
        subnet = parse_network(key, path)
        if isinstance(val, str):
            val = {"kind": val}
        if not isinstance(val, Mapping):
            raise InputError(p, val, "is not a fabric kind or a mapping with kind, network, loss")
        no_unknown_fields(val, FABRIC_FIELDS, p)
        k = kind(val.get("kind", "l2"), f"{p}.kind")
        net = val.get("network", "")
        if net and k not in ROUTED_KINDS:
            raise InputError(f"{p}.network", net, f"is for routed kinds ({', '.join(ROUTED_KINDS)})")
        if net and (not isinstance(net, str) or not re.fullmatch(_NETWORK_NAME, net)):
            raise InputError(f"{p}.network", net, "is not a network name (lowercase alnum and '-')")
        if k in ROUTED_KINDS and not net:
            net = f"n{int(subnet.network_address):x}"  # a routed subnet alone gets a router of its own
        out.append(Fabric(subnet, k, net, loss(val.get("loss", 0), f"{p}.loss")))
    for i, a in enumerate(out):
        for b in out[:i]:
            if a.subnet.overlaps(b.subnet):
                raise InputError(path, str(a.subnet), f"overlaps {b.subnet}")
    return tuple(out)


def fabric_of(fabrics: Sequence[Fabric], subnet: IPNetwork) -> Fabric:
    """The fabric of a private subnet (l2 unless listed)."""
    for f in fabrics:
        if f.subnet == subnet:
            return f
    return Fabric(subnet)


def check_nodes(fabrics: Sequence[Fabric], subnets: Sequence[IPNetwork], addresses: Mapping[Any, str]) -> None:
    """Every listed subnet is a nodes' subnet, and no node holds a router's address; in an IPv6
    hetzner fabric every node's /64 is its own (hetzner routes it to that node alone)."""
    for f in fabrics:
        if f.subnet not in subnets:
            raise InputError("lab.fabrics", str(f.subnet), "is not the subnet of any node's internal_ip")
        if f.kind in ROUTED_KINDS and f.gateway in addresses:
            raise InputError(f"nodes.{addresses[f.gateway]}.internal_ip", str(f.gateway),
                             f"is the gateway of the {f.kind} fabric {f.subnet}")
        if f.kind == "hetzner" and f.subnet.version == 6:
            blocks = {own_block(ipaddress.ip_interface(f.gateway)).network: "the gateway"}
            for ip, name in addresses.items():
                if ip.version == 6 and ip in f.subnet:
                    block = own_block(ipaddress.ip_interface(ip)).network
                    if block in blocks:
                        raise InputError(f"nodes.{name}.internal_ip", str(ip), f"is in the /64 of {blocks[block]} "
                                         f"(the hetzner fabric {f.subnet} routes each node a /64 of its own)")
                    blocks[block] = name


# --- building --------------------------------------------------------------------------------


def networks(fabrics: Sequence[Fabric]) -> list[str]:
    return sorted({f.network for f in fabrics if f.network})


def router_ns(prefix: str, fabrics: Sequence[Fabric], network: str) -> str:
    return f"{prefix}rt{networks(fabrics).index(network)}"


def build_routers(st: LabState, fabrics: Sequence[Fabric], subnets: Sequence[IPNetwork],
                  new_ns: Callable[[str], str], subnets6: Mapping[IPNetwork, IPNetwork] | None = None) -> None:
    """One router namespace per network, with a leg on each of its subnets' bridges (holding the
    gateway of the subnet and of its IPv6 side in `subnets6`, a dual-stack lab's). Records the
    fabrics and the nodes' addresses of each network in `st.fabrics` (for `change`)."""
    subnets6 = subnets6 or {}
    prefix, fab = st.prefix, f"{st.prefix}fab"
    st.fabrics = {}
    for i, subnet in enumerate(subnets):
        f = fabric_of(fabrics, subnet)
        entry = FabricState(index=i, kind=f.kind, network=f.network, loss=f.loss, bridge=f"bpriv{i}", router=None,
                            addressing=f.kind)
        if f.network:
            rns = router_ns(prefix, fabrics, f.network)
            if rns not in st.namespaces:
                new_ns(rns)
                sysctl(rns, "net.ipv4.ip_forward", "1")
                sysctl(rns, "net.ipv6.conf.all.forwarding", "1")
                sysctl(rns, "net.ipv4.conf.all.send_redirects", "0")
                sysctl(rns, "net.ipv4.conf.default.send_redirects", "0")
            veth(fab, f"rt{i}", rns, f"r{i}")
            run(fab, ["ip", "link", "set", f"rt{i}", "master", f"bpriv{i}"])
            sysctl(rns, f"net.ipv4.conf.r{i}.send_redirects", "0")
            for net in (subnet, subnets6.get(subnet)):
                if net is not None:
                    add_address(rns, f"r{i}", f"{gateway_of(net)}/{net.prefixlen}")
            entry.router = rns
        if subnet in subnets6:
            entry.subnet6 = str(subnets6[subnet])
        st.fabrics[str(subnet)] = entry


def node_address(ns: str | None, dev: str, internal_ip: IPInterface, fabrics: Sequence[Fabric],
                 internal_ip6: IPInterface | None = None) -> list[str]:
    """Address a node's private NIC as its fabric does (`internal_ip6`: a dual-stack lab's IPv6
    address, filtered by the fabric of `internal_ip`'s subnet); return extra agent flags it needs."""
    f = fabric_of(fabrics, internal_ip.network)
    others = [o for o in fabrics if o.network and o.network == f.network and o.subnet != f.subnet]
    flags: list[str] = []
    for ip, own in ((internal_ip, True), (internal_ip6, False)):
        if ip is None:
            continue
        subnet = ip.network
        gw = gateway_of(subnet)
        nets = [subnet, *(o.subnet if own else subnet6(o.subnet) for o in others)]
        if f.kind == "hetzner":
            # The NIC holds the node's own block (/32, or its /64): it tells nothing of the network.
            add_address(ns, dev, f"{ip.ip}/32" if ip.version == 4 else str(own_block(ip)))
            run(ns, ["ip", "route", "add", str(gw), "dev", dev, "scope", "link"] if ip.version == 4 else
                ["ip", "-6", "route", "add", str(gw), "dev", dev])
            if ip.version == 6:
                sysctl(ns, f"net.ipv6.conf.{dev}.accept_redirects", "0")
            for net in nets:
                run(ns, ["ip", f"-{ip.version}", "route", "add", str(net), "via", str(gw), "dev", dev])
            if own:  # the record states the subnet
                flags = ["--force-internal-ip", str(ip)]
            continue
        add_address(ns, dev, str(ip))
        for net in nets[1:]:
            run(ns, ["ip", f"-{ip.version}", "route", "add", str(net), "via", str(gw), "dev", dev])
    return flags


def add_address(ns: str | None, dev: str, cidr: str) -> None:
    """An address on `dev`; an IPv6 one without duplicate detection (every lab address is unique
    by construction, and a tentative address would hold traffic back for a second)."""
    addr(ns, dev, cidr) if ":" not in cidr else run(ns, ["ip", "-6", "addr", "add", cidr, "dev", dev, "nodad"])


def network_addresses(st: LabState, subnet: str) -> list[str]:
    """Node and router addresses of every subnet in `subnet`'s network (or of the subnet alone), of
    both families (IPv4 first): a dual-stack subnet's nodes and router hold one of each."""
    fabs = st.fabrics
    net = fabs[subnet].network
    members = [s for s, e in fabs.items() if s == subnet or (net and e.network == net)]
    out: set[str] = set()
    for _, n in st.nodes():
        if n.internal_ip and str(ipaddress.ip_interface(n.internal_ip).network) in members:
            out.update(str(ipaddress.ip_interface(a).ip) for a in (n.internal_ip, n.internal_ip6) if a)
    for s in members:
        if fabs[s].router:
            out.update(str(gateway_of(ipaddress.ip_network(x))) for x in (s, fabs[s].subnet6) if x)
    return sorted(out, key=lambda a: (ipaddress.ip_address(a).version, int(ipaddress.ip_address(a))))


def _loss_rule(pct: int) -> str:
    return f"numgen random mod 100 < {pct} drop" if pct else ""


# Neighbour discovery passes every kind, as ARP does (ICMPv6 the fabric itself answers for).
_ND = "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept"


def _ip_rules(kind_: str, family: int = 4) -> list[str]:
    """What the fabric does to an IPv4 or IPv6 packet (ARP, and neighbour discovery, let through)."""
    ip, nodes, icmp = ("ip", "@nodes", "icmp") if family == 4 else ("ip6", "@nodes6", "icmpv6")
    nd = [_ND] if family == 6 else []
    if kind_ == "blackhole":
        return [*nd, "drop"]
    if kind_ == "l2":
        return []
    rules = [*nd, f"{ip} saddr != {nodes} drop", f"{ip} daddr != {nodes} drop"]
    if kind_ == "vpc-udp":
        rules.append(f"meta l4proto != {{ tcp, udp, {icmp} }} drop")
    return rules


def _sets(addresses: Sequence[str]) -> list[str]:
    """The node sets of both families (`nodes`, `nodes6`) from addresses of either."""
    v4 = [a for a in addresses if ":" not in a]
    v6 = [a for a in addresses if ":" in a]
    return [f"set nodes {{ type ipv4_addr; {_elements(v4)} }}", f"set nodes6 {{ type ipv6_addr; {_elements(v6)} }}"]


def bridge_rules(entry: FabricState, addresses: Sequence[str], ports: Sequence[str]) -> str:
    """The nft transaction that replaces the bridge table of one subnet (`ports`: its bridge's
    ports; this kernel's nft cannot match the bridge itself)."""
    i, k = entry.index, entry.kind
    table = f"bridge fab{i}"
    port = f"rt{i}"
    names = ", ".join(f'"{p}"' for p in ports) or '"-"'
    body = [*_sets(addresses), "chain fabric {", "type filter hook forward priority 0; policy accept;",
            f"iifname != {{ {names} }} accept"]
    if entry.loss:
        for ether in ("ip", "ip6"):
            body.append(f'iifname != "{port}" ether type {ether} {_loss_rule(entry.loss)}')
    if k == "hetzner" or (entry.addressing == "hetzner" and k != "l2"):
        body.append(f'iifname != "{port}" oifname != "{port}" drop')  # nodes meet only at the gateway
    for family, ether in ((4, "ip"), (6, "ip6")):
        for r in _ip_rules(k, family):
            body.append(f"ether type {ether} {r}")
    body.append("}")
    return _replace(table, body)


def router_rules(st: LabState, router: str) -> str:
    """The nft transaction that replaces a router's table: each leg filters as its subnet's kind."""
    fabs = [(s, e) for s, e in st.fabrics.items() if e.router == router]
    addresses = network_addresses(st, fabs[0][0])
    body = [*_sets(addresses), "chain fabric {", "type filter hook forward priority 0; policy accept;"]
    for _, e in fabs:
        leg = f"r{e.index}"
        for family in (4, 6):
            for r in _ip_rules(e.kind, family):
                body.append(f'iifname "{leg}" meta nfproto ipv{family} {r}')
                body.append(f'oifname "{leg}" meta nfproto ipv{family} {r}')
    body.append("}")
    return _replace("inet fabric", body)


def _elements(addresses: Sequence[str]) -> str:
    return f"elements = {{ {', '.join(addresses)} }};" if addresses else ""


def _replace(table: str, body: list[str]) -> str:
    # add + delete + define: one atomic transaction whether or not the table exists.
    return "\n".join([f"add table {table}", f"delete table {table}", f"table {table} {{", *body, "}"]) + "\n"


def apply(st: LabState, subnet: str) -> None:
    """Write the rules of one subnet (its bridge, and its router's whole table)."""
    e = st.fabrics[subnet]
    fab = f"{st.prefix}fab"
    out = run(fab, ["ip", "-j", "link", "show", "master", e.bridge]).stdout
    ports = sorted(link["ifname"] for link in json.loads(out or "[]"))
    run(fab, ["nft", "-f", "-"], input=bridge_rules(e, network_addresses(st, subnet), ports))
    if e.router:
        run(e.router, ["nft", "-f", "-"], input=router_rules(st, e.router))


def apply_all(st: LabState) -> None:
    for subnet in st.fabrics:
        apply(st, subnet)


def change(st: LabState, subnet: str, new_kind: str, loss_pct: int = 0) -> FabricState:
    """Turn a running subnet's fabric into `new_kind` with `loss_pct` loss (the tests' fault lever);
    `subnet` is a private subnet of either family (a dual-stack one by either side, both change).

    A hetzner subnet keeps its nodes' /32 addressing: it may become blackhole (or hetzner again),
    and no other subnet may become hetzner (its nodes hold their subnet's prefix)."""
    key = str(parse_network(subnet, "SUBNET"))
    fabs = st.fabrics
    key = next((s for s, e in fabs.items() if e.subnet6 == key), key)  # a dual-stack subnet by its IPv6 side
    if key not in fabs:
        raise InputError("SUBNET", subnet, f"is not a private subnet of lab {st.name} "
                         f"({', '.join(fabs) or 'none'})")
    kind(new_kind, "KIND")
    loss(loss_pct, "--loss")
    e = fabs[key]
    if (e.addressing == "hetzner") != (new_kind == "hetzner") and new_kind != "blackhole":
        raise InputError("KIND", new_kind, f"cannot replace {e.addressing} addressing on a running fabric "
                         f"({key} was built as {e.addressing})")
    e.kind, e.loss = new_kind, loss_pct
    try:
        apply(st, key)
    except MeshError as err:
        raise MeshError(f"lab fabric {key}: {err}") from None
    labstate.save(st)
    return e
