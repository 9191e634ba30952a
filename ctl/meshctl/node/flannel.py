# SPDX-License-Identifier: Apache-2.0
"""`--cni flannel`: meshctl as an add-on beside flannel (Kilo's `--compatibility=flannel`).

flannel stays the CNI: its VXLAN backend leaves on every node a `flannel.1` device (VNI 1, port
8472, nolearning), for each other node an onlink route `<podcidr> via <podcidr's .0> dev flannel.1
onlink` with a neighbour entry (that .0 -> the node's VtepMAC) and an fdb entry (VtepMAC -> the
node's public-ip), and the `cni0` bridge holding the .1 of the node's pod CIDR; its host-gw
backend leaves `<podcidr> via <public-ip>` instead. meshctl never changes `flannel.1`, `cni0`,
or flannel's routes, neighbours and fdb entries to the nodes of its own location; it routes the
other nodes itself, replacing flannel's routes to them.

"Own location" follows the granularity (`carried`): `full` makes every node its own location (all
of flannel's routes are replaced); `location` and `cross` leave flannel the nodes of the same
location, as Kilo does. When a node becomes flannel's again (a live change of granularity),
flannel does not re-add its route until its own resync, so `FlannelApplier` writes it back in
flannel's form from the node's annotations: that gap is what broke Kilo's users moving from `full`
to `cross`.

The decision is pure: the planner leaves flannel's nodes to it (mesh/flannel.py, `plan_node(...,
flannel=True)`), and `plan_flannel` gives the routes flannel must keep from the plan and the
leases; the applier reads the kernel and changes only what differs. flannel re-adding a route
meshctl replaced is noticed by `rewritten` (the agent asks every second) and replaced again by
the route applier.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from meshctl.mesh.flannel import FlannelLease, carried
from meshctl.mesh.model import IPAddress, IPNetwork, Topology, sort_key_net
from meshctl.mesh.plan import NodePlan
from meshctl.node.shell import sh

log = logging.getLogger("meshctl.flannel")

FLANNEL_DEV = "flannel.1"  # flannel's VXLAN device (VNI 1)
FLANNEL_PROTO = "boot"  # flannel's routes: netlink's default protocol (RTPROT_BOOT)
VXLAN = "vxlan"
HOST_GW = "host-gw"
# Backends whose route to a node meshctl can write back in flannel's form.
RESTORABLE = (VXLAN, HOST_GW)


@dataclass(frozen=True)
class FlannelRoute:
    """A route in flannel's form: VXLAN `dst via <dst's .0> dev flannel.1 onlink`; host-gw
    `dst via <public-ip>` (dev None: the kernel picks the device that reaches it)."""

    dst: IPNetwork
    via: IPAddress
    dev: str | None
    onlink: bool

    def argv(self) -> list[str]:
        out = [str(self.dst), "via", str(self.via)]
        if self.dev is not None:
            out += ["dev", self.dev]
        return out + (["onlink"] if self.onlink else [])


@dataclass(frozen=True)
class FlannelPlan:
    """What the flannel applier keeps: `own`, flannel's routes to the nodes it carries (written
    back only where missing or meshctl's); `takeover`, the pod CIDRs meshctl routes itself, whose
    flannel routes the route applier replaces."""

    own: tuple[FlannelRoute, ...]
    takeover: frozenset[IPNetwork]


def flannel_route(dst: IPNetwork, lease: FlannelLease) -> FlannelRoute | None:
    """flannel's route to a node's pod CIDR, from its lease (None: a backend meshctl cannot write,
    or a CIDR of the family the lease does not describe: the annotations read here are flannel's
    IPv4 ones, its IPv6 routes on `flannel-v6.1` stay flannel's own)."""
    if dst.version != lease.public_ip.version:
        return None
    if lease.backend_type == VXLAN:
        return FlannelRoute(dst, dst.network_address, FLANNEL_DEV, True)
    if lease.backend_type == HOST_GW:
        return FlannelRoute(dst, lease.public_ip, None, False)
    return None


def plan_flannel(plan: NodePlan, topo: Topology, leases: Mapping[str, FlannelLease]) -> FlannelPlan:
    """The flannel applier's share of a handed-over plan (pure)."""
    names = carried(topo, plan.node, plan.granularity)
    own: list[FlannelRoute] = []
    for n in sorted(topo.nodes, key=lambda n: n.name):
        lease = leases.get(n.name)
        if n.name in names and lease is not None:
            own += [fr for c in n.pod_cidrs if (fr := flannel_route(c, lease)) is not None]
    others = {c for n in topo.nodes if n.name != plan.node and n.name not in names for c in n.pod_cidrs}
    return FlannelPlan(tuple(sorted(own, key=lambda r: sort_key_net(r.dst))),
                       frozenset(r.dst for r in plan.routes if r.dst in others))


@dataclass(frozen=True)
class KernelRoute:
    """A main-table route as the kernel holds it: gateway, device, onlink flag, protocol."""

    via: str | None
    dev: str | None
    onlink: bool
    proto: str


def kernel_routes(dsts: Iterable[IPNetwork], proto: str | None = None) -> dict[IPNetwork, KernelRoute]:
    """The main table's unicast routes for exactly `dsts` (one dump per IP version in use; only
    those of protocol `proto` when given: the kernel filters, so a table of meshctl's thousands of
    routes is not printed and parsed every second)."""
    want = set(dsts)
    out: dict[IPNetwork, KernelRoute] = {}
    only = ["proto", proto] if proto is not None else []
    for family, version in (("-4", 4), ("-6", 6)):
        if not any(d.version == version for d in want):
            continue
        p = sh(["ip", "-j", family, "route", "show", "table", "main", *only], check=False)
        for r in json.loads(p.stdout or "[]"):
            if r.get("type", "unicast") != "unicast" or r.get("dst", "default") == "default":
                continue
            dst = ipaddress.ip_network(r["dst"], strict=False)
            if dst in want:
                out[dst] = KernelRoute(r.get("gateway"), r.get("dev"), "onlink" in r.get("flags", ()),
                                       str(r.get("protocol", "boot")))
    return out


def _is_form(have: KernelRoute, fr: FlannelRoute) -> bool:
    return have.via == str(fr.via) and (fr.dev is None or have.dev == fr.dev)


class FlannelApplier:
    """Keeps flannel's routes to the nodes it carries, and says where flannel rewrote a route
    meshctl routes. `ours` is the route applier's protocol name as `ip -j` prints it (a number)."""

    def __init__(self, ours: str) -> None:
        self.ours = ours

    def restore(self, fp: FlannelPlan) -> list[str]:
        """Write flannel's form back where its route is missing or is meshctl's (one `replace`
        each: never a gap); a route in any other form is flannel's and left alone. Returns the
        destinations written."""
        have = kernel_routes(r.dst for r in fp.own)
        done: list[str] = []
        for fr in fp.own:
            h = have.get(fr.dst)
            if h is not None and (h.proto != self.ours or _is_form(h, fr)):
                continue
            p = sh(["ip", "route", "replace", *fr.argv()], check=False)
            if p.returncode != 0:
                log.warning("flannel: route %s not restored: %s", fr.dst, (p.stderr or "").strip())
                continue
            done.append(str(fr.dst))
        if done:
            log.info("flannel: handed back to flannel: %s", ", ".join(done))
        return done

    def rewritten(self, takeover: Iterable[IPNetwork]) -> list[IPNetwork]:
        """The pod CIDRs meshctl routes whose route is flannel's again (flannel's resync re-adds
        it, protocol boot): the route applier must replace them."""
        dsts = sorted(takeover, key=sort_key_net)
        if not dsts:
            return []
        have = kernel_routes(dsts, FLANNEL_PROTO)
        return [d for d in dsts if d in have]
