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
    def gateway(self) -> ipaddress.IPv4Address:
        """The router's address in the subnet (its first one)."""
        return ipaddress.IPv4Address(int(self.subnet.network_address) + 1)


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
        if subnet.version != 4:
            raise InputError(path, key, "is IPv6; the lab builds IPv4 networks only")
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
    """Every listed subnet is a nodes' subnet, and no node holds a router's address."""
    for f in fabrics:
        if f.subnet not in subnets:
            raise InputError("lab.fabrics", str(f.subnet), "is not the subnet of any node's internal_ip")
        if f.kind in ROUTED_KINDS and f.gateway in addresses:
            raise InputError(f"nodes.{addresses[f.gateway]}.internal_ip", str(f.gateway),
                             f"is the gateway of the {f.kind} fabric {f.subnet}")


# --- building --------------------------------------------------------------------------------


def networks(fabrics: Sequence[Fabric]) -> list[str]:
    return sorted({f.network for f in fabrics if f.network})


def router_ns(prefix: str, fabrics: Sequence[Fabric], network: str) -> str:
    return f"{prefix}rt{networks(fabrics).index(network)}"


def build_routers(st: LabState, fabrics: Sequence[Fabric], subnets: Sequence[IPNetwork],
                  new_ns: Callable[[str], str]) -> None:
    """One router namespace per network, with a leg on each of its subnets' bridges. Records the
    fabrics and the nodes' addresses of each network in `st.fabrics` (for `change`)."""
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
                sysctl(rns, "net.ipv4.conf.all.send_redirects", "0")
                sysctl(rns, "net.ipv4.conf.default.send_redirects", "0")
            veth(fab, f"rt{i}", rns, f"r{i}")
            run(fab, ["ip", "link", "set", f"rt{i}", "master", f"bpriv{i}"])
            sysctl(rns, f"net.ipv4.conf.r{i}.send_redirects", "0")
            addr(rns, f"r{i}", f"{f.gateway}/{subnet.prefixlen}")
            entry.router = rns
        st.fabrics[str(subnet)] = entry


def node_address(ns: str | None, dev: str, internal_ip: IPInterface, fabrics: Sequence[Fabric]) -> list[str]:
    """Address a node's private NIC as its fabric does; return extra agent flags it needs."""
    f = fabric_of(fabrics, internal_ip.network)
    others = [o for o in fabrics if o.network and o.network == f.network and o.subnet != f.subnet]
    if f.kind == "hetzner":
        addr(ns, dev, f"{internal_ip.ip}/32")
        run(ns, ["ip", "route", "add", str(f.gateway), "dev", dev, "scope", "link"])
        run(ns, ["ip", "route", "add", str(f.subnet), "via", str(f.gateway), "dev", dev])
        for o in others:
            run(ns, ["ip", "route", "add", str(o.subnet), "via", str(f.gateway), "dev", dev])
        # The NIC says /32 (it tells nothing of the network): the record states the subnet.
        return ["--force-internal-ip", str(internal_ip)]
    addr(ns, dev, str(internal_ip))
    for o in others:
        run(ns, ["ip", "route", "add", str(o.subnet), "via", str(f.gateway), "dev", dev])
    return []


def network_addresses(st: LabState, subnet: str) -> list[str]:
    """Node and router addresses of every subnet in `subnet`'s network (or of the subnet alone)."""
    fabs = st.fabrics
    net = fabs[subnet].network
    members = [s for s, e in fabs.items() if s == subnet or (net and e.network == net)]
    out = {str(ipaddress.ip_interface(n.internal_ip).ip) for _, n in st.nodes()
           if n.internal_ip and str(ipaddress.ip_interface(n.internal_ip).network) in members}
    for s in members:
        if fabs[s].router:
            out.add(str(ipaddress.ip_network(s).network_address + 1))
    return sorted(out, key=lambda a: int(ipaddress.IPv4Address(a)))


def _loss_rule(pct: int) -> str:
    return f"numgen random mod 100 < {pct} drop" if pct else ""


def _ip_rules(kind_: str) -> list[str]:
    """What the fabric does to an IPv4 packet (after ARP was let through)."""
    if kind_ == "blackhole":
        return ["drop"]
    if kind_ == "l2":
        return []
    rules = ["ip saddr != @nodes drop", "ip daddr != @nodes drop"]
    if kind_ == "vpc-udp":
        rules.append("meta l4proto != { tcp, udp, icmp } drop")
    return rules


def bridge_rules(entry: FabricState, addresses: Sequence[str], ports: Sequence[str]) -> str:
    """The nft transaction that replaces the bridge table of one subnet (`ports`: its bridge's
    ports; this kernel's nft cannot match the bridge itself)."""
    i, k = entry.index, entry.kind
    table = f"bridge fab{i}"
    port = f"rt{i}"
    names = ", ".join(f'"{p}"' for p in ports) or '"-"'
    body = [f"set nodes {{ type ipv4_addr; {_elements(addresses)} }}",
            "chain fabric {", "type filter hook forward priority 0; policy accept;",
            f"iifname != {{ {names} }} accept"]
    if entry.loss:
        body.append(f'iifname != "{port}" ether type ip {_loss_rule(entry.loss)}')
    if k == "hetzner" or (entry.addressing == "hetzner" and k != "l2"):
        body.append(f'iifname != "{port}" oifname != "{port}" drop')  # nodes meet only at the gateway
    for r in _ip_rules(k):
        body.append(f"ether type ip {r}")
    if k == "blackhole":
        body.append("ether type ip6 drop")
    body.append("}")
    return _replace(table, body)


def router_rules(st: LabState, router: str) -> str:
    """The nft transaction that replaces a router's table: each leg filters as its subnet's kind."""
    fabs = [(s, e) for s, e in st.fabrics.items() if e.router == router]
    addresses = network_addresses(st, fabs[0][0])
    body = [f"set nodes {{ type ipv4_addr; {_elements(addresses)} }}",
            "chain fabric {", "type filter hook forward priority 0; policy accept;"]
    for _, e in fabs:
        leg = f"r{e.index}"
        for r in _ip_rules(e.kind):
            body.append(f'iifname "{leg}" meta nfproto ipv4 {r}')
            body.append(f'oifname "{leg}" meta nfproto ipv4 {r}')
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
    """Turn a running subnet's fabric into `new_kind` with `loss_pct` loss (the tests' fault lever).

    A hetzner subnet keeps its nodes' /32 addressing: it may become blackhole (or hetzner again),
    and no other subnet may become hetzner (its nodes hold their subnet's prefix)."""
    key = str(parse_network(subnet, "SUBNET"))
    fabs = st.fabrics
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
