# SPDX-License-Identifier: Apache-2.0
"""The kernel-route fallback of encapsulated direct entries: the kernel's own encapsulation devices
(VXLAN, IP-in-IP), for a node whose eBPF fast path is not loaded (or a peer that sends through its
kernel). One device per encapsulation and underlay family (the family of the private addresses, the outer header's):

    direct+vxlan over IPv4   meshvx0    vxlan, local <private IPv4>
    direct+vxlan over IPv6   meshvx6    vxlan, local <private IPv6>, udp6zerocsumrx
    direct+ipip over IPv4    meshipip0  ipip external (IPv4 pods only: protocol 4)
    direct+ipip over IPv6    meship6    ip6tnl external mode any (next header 4 and 41: both pods)

`direct+vxlan`: a VXLAN device (the mesh's VNI and port, the node's private address as source,
learning off) whose MAC is the node's VTEP MAC (datapath.layout.vtep_mac: 02:6d + the last four
bytes of its private address), so the programs of a peer and this device speak the same frames. Per
peer pod CIDR (either pod family over either underlay): a permanent fdb entry (peer VTEP MAC ->
peer private address), a permanent neighbour (gateway -> peer VTEP MAC) on the device, and a route
`<pod cidr> via [inet6] <gateway> dev <device>`: the gateway is the peer's private IPv4 for an IPv4
pod CIDR over IPv4 (`onlink`), else a link-local address made from its VTEP MAC (`vtep_gateway`:
the kernel refuses an IPv6 gateway its routes reach through the private NIC, and IPv4 gateways of
IPv6 routes). The kernel sets the
device's MTU to the private NIC's minus 50 (IPv4) or 70 (IPv6), so it answers oversize DF packets
with "fragmentation needed" (path MTU discovery keeps working). Over IPv6 the programs send a zero
UDP checksum (RFC 6935, as the kernel's own `udp6zerocsumtx`); the IPv6 device is made with
`udp6zerocsumrx` to accept it, and sends checksums itself (accepted by every receiver).

`direct+ipip`: a kernel without an ipip (ip6tnl) device (this machine's has neither) cannot carry
it: such entries are reported unavailable, never routed raw. Where the kernel has one, one
collect-metadata device carries them through lightweight-tunnel routes (`encap ip dst <peer>`,
`encap ip6 dst <peer>`); an IPv6 pod over an IPv4 underlay (6in4, protocol 41) is not one an ipip
device carries. On a node whose programs carry the pair (`sync(..., fastpath=True)`), the kernel
only routes what the programs hand it (replies of kernel-tracked flows such as NodePort and service
traffic, oversize packets without DF, TTL 1): there an ipip entry the kernel cannot carry is
carried over the VXLAN device of its underlay instead, since every receiver accepts every rung
(`EncapDiff.substituted`).

Make before break: `stage` creates devices and adds or replaces fdb entries, neighbours and routes;
the removals it finds (entries, routes, a device no entry needs) wait for `retire`, which the agent
calls once every other applier has staged too (`sync` does both).

The applier compares desired with actual (read from the kernel with `ip -j`/`bridge -j`) and
changes only what differs. Its routes carry RT_PROTO_ENCAP, not RT_PROTO: the route applier
owns RT_PROTO routes, this one the routes through its own devices.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from meshctl.datapath.layout import VXLAN_PORT, VXLAN_VNI, overhead, vtep_mac
from meshctl.datapath.links import ifindex_or_none
from meshctl.datapath.links import mtu as device_mtu
from meshctl.errors import MeshError
from meshctl.mesh.model import IPAddress, IPNetwork, sort_key_net
from meshctl.mesh.plan import FastPathEntry
from meshctl.node.shell import sh

log = logging.getLogger(__name__)

# Routes through this applier's devices carry this protocol number (node.routes.RT_PROTO is the
# route applier's): neither applier ever touches the other's routes.
RT_PROTO_ENCAP = 0x6E  # 110, unassigned in /etc/iproute2/rt_protos

VXLAN_DEV = "meshvx0"
VXLAN6_DEV = "meshvx6"
IPIP_DEV = "meshipip0"
IPIP6_DEV = "meship6"
# The kernel's device kind of each (encapsulation, underlay family).
DEVICE_KIND = {("vxlan", 4): "vxlan", ("vxlan", 6): "vxlan", ("ipip", 4): "ipip", ("ipip", 6): "ip6tnl"}


@dataclass
class EncapDiff:
    added: list[str] = field(default_factory=list)      # "<kind> <prefix> -> <peer>"
    removed: list[str] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)  # "<kind> <prefix>: reason"
    substituted: list[str] = field(default_factory=list)  # "ipip <prefix>: over vxlan (reason)"

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


@dataclass(frozen=True)
class _Peer:
    prefix: IPNetwork
    remote: IPAddress


def _json(args: list[str]) -> list[dict]:
    p = sh(args, check=False)
    return json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else []


def kernel_has(kind: str) -> bool:
    """Whether this kernel can create a `kind` encapsulation device ("vxlan", "ipip", "ip6tnl"; tried in
    the current namespace with a throwaway device: module lists say nothing about built-in
    drivers). A device of that kind that exists already answers yes: our own `external` one (a
    second is refused, EEXIST, so the probe would say no to a kernel that has it), or the driver's
    fallback device (`tunl0`, `ip6tnl0`)."""
    # (`ip -j link show type K` prints `[{}]` for a kind the kernel does not know: look for names)
    if any(link.get("ifname") for link in _json(["ip", "-j", "link", "show", "type", kind])):
        return True
    probe = f"meshprobe{kind}"[:15]
    p = sh(["ip", "link", "add", probe, "type", kind, "external"], check=False)
    if p.returncode != 0:
        return False
    sh(["ip", "link", "del", probe], check=False)
    return True


def vtep_gateway(remote: IPAddress, prefix: IPNetwork) -> IPAddress:
    """The gateway a VXLAN device's route to `prefix` names for the peer at private address
    `remote`: an IPv4 pod CIDR over IPv4, the address itself (`onlink`); otherwise a link-local
    address made from the peer's VTEP MAC (modified EUI-64), since the kernel refuses an IPv6
    gateway that its routes reach through another device (the private NIC's prefix), `onlink` or
    not, and an IPv6 route cannot name an IPv4 gateway at all."""
    if remote.version == 4 and prefix.version == 4:
        return remote
    mac = bytes.fromhex(vtep_mac(remote).replace(":", ""))
    eui = bytes([mac[0] ^ 0x02]) + mac[1:3] + b"\xff\xfe" + mac[3:]
    return ipaddress.IPv6Address(b"\xfe\x80" + bytes(6) + eui)


def gateway_args(gateway: IPAddress, prefix: IPNetwork) -> list[str]:
    """`via` to `gateway` for a route to `prefix`: a gateway of the other family is named with it."""
    if gateway.version == prefix.version:
        return ["via", str(gateway)]
    return ["via", "inet6" if gateway.version == 6 else "inet", str(gateway)]


class EncapApplier:
    """Keeps the encapsulation devices, fdb/neighbour entries and routes equal to the encapsulated entries
    of the plan (see the module docstring). `sync` never raises for one bad entry: it is skipped
    with a reason in `EncapDiff.unavailable`."""

    name = "encap"

    def __init__(self, private_if: str, *, vxlan_dev: str = VXLAN_DEV, ipip_dev: str = IPIP_DEV,
                 vxlan6_dev: str = VXLAN6_DEV, ipip6_dev: str = IPIP6_DEV) -> None:
        self.private_if = private_if
        self.vxlan_dev = vxlan_dev
        self.ipip_dev = ipip_dev
        # (encapsulation, underlay family) -> the device that carries it
        self.devices = {("vxlan", 4): vxlan_dev, ("vxlan", 6): vxlan6_dev, ("ipip", 4): ipip_dev,
                        ("ipip", 6): ipip6_dev}
        self._has: dict[str, bool] = {}
        self._reported: frozenset[str] = frozenset()
        # What the last stage found to remove: (command, what it removes), for retire.
        self._retiring: list[tuple[list[str], str | None]] = []

    def forget(self) -> None:
        """Nothing is remembered between passes but which device kinds the kernel has."""
        self._has = {}

    def available(self, kind: str, underlay: int = 4) -> bool:
        """Whether this node can carry `kind` ("vxlan", "ipip") through its kernel over an underlay
        of IP version `underlay` (ipip over IPv6 needs ip6tnl)."""
        dev_kind = DEVICE_KIND[(kind, underlay)]
        if dev_kind not in self._has:
            self._has[dev_kind] = kernel_has(dev_kind)
        return self._has[dev_kind]

    # --- desired ---------------------------------------------------------------------------

    def sync(self, entries: Sequence[FastPathEntry], *, fastpath: bool = False) -> EncapDiff:
        """`stage`, then `retire`: one diff of both."""
        diff = self.stage(entries, fastpath=fastpath)
        diff.removed += self.retire().removed
        return diff

    def retire(self) -> EncapDiff:
        """Remove what the last `stage` found the entries no longer need (nothing twice)."""
        diff = EncapDiff()
        todo, self._retiring = self._retiring, []
        for argv, what in todo:
            sh(argv, check=False)
            if what is not None:
                diff.removed.append(what)
        if diff:
            log.info("encap: removed %d", len(diff.removed))
        return diff

    def _retire(self, argv: list[str], what: str | None = None) -> None:
        self._retiring.append((argv, what))

    def _why_not(self, kind: str, underlay: int, prefix: IPNetwork) -> str | None:
        """Why this kernel cannot carry `prefix` on `kind` over `underlay`; None when it can."""
        if kind == "ipip" and underlay == 4 and prefix.version == 6:
            return "an ipip device carries IPv4 pods only"
        if not self.available(kind, underlay):
            return f"this kernel has no {DEVICE_KIND[(kind, underlay)]} device"
        return None

    def stage(self, entries: Sequence[FastPathEntry], *, fastpath: bool = False) -> EncapDiff:
        """Add what the entries need; `fastpath`: the node's programs carry these entries (see the
        module docstring)."""
        diff = EncapDiff()
        self._retiring = []
        want: dict[tuple[str, int], dict[IPNetwork, _Peer]] = {key: {} for key in self.devices}
        local: dict[tuple[str, int], IPAddress] = {}
        for e in entries:
            if e.encap is None or e.action != "direct":
                continue
            kind, under = e.encap.kind, e.encap.local.version
            if e.encap.remote.version != under:
                diff.unavailable.append(f"{kind} {e.prefix}: outer addresses of two families")
                continue
            why = self._why_not(kind, under, e.prefix)
            if why is not None:
                if not (fastpath and kind == "ipip" and self.available("vxlan", under)):
                    diff.unavailable.append(f"{kind} {e.prefix}: {why}")
                    continue
                diff.substituted.append(f"{kind} {e.prefix}: over vxlan ({why})")
                kind = "vxlan"
            key = (kind, under)
            if local.setdefault(key, e.encap.local) != e.encap.local:
                diff.unavailable.append(f"{kind} {e.prefix}: a second local address {e.encap.local}")
                continue
            want[key][e.prefix] = _Peer(e.prefix, e.encap.remote)
        for under in (4, 6):
            self._sync_vxlan(self.devices[("vxlan", under)], want[("vxlan", under)], local.get(("vxlan", under)),
                             diff)
            if self._has.get(DEVICE_KIND[("ipip", under)]) or want[("ipip", under)]:
                self._sync_ipip(self.devices[("ipip", under)], want[("ipip", under)], local.get(("ipip", under)),
                                diff)
        if diff:
            log.info("encap: added %d", len(diff.added))
        reported = frozenset(diff.unavailable + diff.substituted)
        for u in sorted(reported - self._reported):  # once per change, not every pass
            log.warning("encap: %s", u)
        self._reported = reported
        return diff

    def flush(self) -> None:
        """Remove every device (their fdb, neighbours and routes go with them)."""
        for dev in self.devices.values():
            sh(["ip", "link", "del", dev], check=False)

    # --- vxlan -----------------------------------------------------------------------------

    def _vxlan_ok(self, dev: str, local: IPAddress) -> bool:
        links = _json(["ip", "-j", "-d", "link", "show", "dev", dev])
        if not links:
            return False
        link = links[0]
        data = link.get("linkinfo", {}).get("info_data", {})
        v6 = local.version == 6
        return (link.get("linkinfo", {}).get("info_kind") == "vxlan" and data.get("id") == VXLAN_VNI
                and data.get("port") == VXLAN_PORT and data.get("local6" if v6 else "local") == str(local)
                and (not v6 or data.get("udp_zero_csum6_rx") is True)
                and link.get("address") == vtep_mac(local) and "UP" in link.get("flags", []))

    def _sync_vxlan(self, dev: str, peers: dict[IPNetwork, _Peer], local: IPAddress | None, diff: EncapDiff) -> None:
        if not peers or local is None:
            if ifindex_or_none(dev) is not None:
                self._retire(["ip", "link", "del", dev], f"vxlan device {dev}")
            return
        if not self._vxlan_ok(dev, local):
            sh(["ip", "link", "del", dev], check=False)
            # Over IPv6: accept the programs' zero UDP checksums (RFC 6935); send real ones.
            zero_csum = ["udp6zerocsumrx"] if local.version == 6 else []
            try:
                sh(["ip", "link", "add", dev, "type", "vxlan", "id", str(VXLAN_VNI), "dstport", str(VXLAN_PORT),
                    "local", str(local), "dev", self.private_if, "nolearning", *zero_csum])
                sh(["ip", "link", "set", dev, "address", vtep_mac(local), "up"])
            except MeshError as e:  # e.g. another VXLAN device holds the port
                sh(["ip", "link", "del", dev], check=False)
                diff.unavailable += [f"vxlan {p}: device {dev}: {e}" for p in sorted(peers, key=sort_key_net)]
                return
            sh(["sysctl", "-qw", f"net.ipv4.conf.{dev}.rp_filter=0"], check=False)
            diff.added.append(f"vxlan device {dev}")
        remotes = {p.remote for p in peers.values()}
        fdb = {(str(e["mac"]), str(e["dst"])) for e in _json(["bridge", "-j", "fdb", "show", "dev", dev])
               if e.get("dst") and e.get("state") == "permanent"}
        want_fdb = {(vtep_mac(r), str(r)) for r in remotes}
        for mac, dst in sorted(want_fdb - fdb):
            sh(["bridge", "fdb", "replace", mac, "dev", dev, "dst", dst, "self", "permanent"])
        for mac, dst in sorted(fdb - want_fdb):
            self._retire(["bridge", "fdb", "del", mac, "dev", dev, "dst", dst])
        gateway = {p.prefix: vtep_gateway(p.remote, p.prefix) for p in peers.values()}
        neigh = {(str(n["dst"]), str(n.get("lladdr"))) for fam in ("-4", "-6")
                 for n in _json(["ip", "-j", fam, "neigh", "show", "dev", dev]) if "PERMANENT" in n.get("state", [])}
        want_neigh = {(str(gateway[p.prefix]), vtep_mac(p.remote)) for p in peers.values()}
        for ip, mac in sorted(want_neigh - neigh):
            sh(["ip", "neigh", "replace", ip, "lladdr", mac, "dev", dev, "nud", "permanent"])
        for ip in sorted({ip for ip, _ in neigh - want_neigh} - {ip for ip, _ in want_neigh}):
            self._retire(["ip", "neigh", "del", ip, "dev", dev])
        self._sync_routes(dev, {p: [*gateway_args(gw, p), "dev", dev, *(["onlink"] if gw.version == 4 else [])]
                                for p, gw in gateway.items()},
                          "vxlan", {p.prefix: p.remote for p in peers.values()}, gateway, diff)

    # --- ipip (kernels that have it) -------------------------------------------------------

    def _sync_ipip(self, dev: str, peers: dict[IPNetwork, _Peer], local: IPAddress | None, diff: EncapDiff) -> None:
        exists = ifindex_or_none(dev) is not None
        if not peers or local is None:
            if exists:
                self._retire(["ip", "link", "del", dev], f"ipip device {dev}")
            return
        v6 = local.version == 6
        if not exists:
            # ip6tnl `mode any`: IPv4 (next header 4) and IPv6 (41) pods, as the programs send them.
            sh(["ip", "link", "add", dev, "type", "ip6tnl", "external", "mode", "any"] if v6 else
               ["ip", "link", "add", dev, "type", "ipip", "external"])
            mtu = _mtu(self.private_if) - overhead("ipip", local.version)
            sh(["ip", "link", "set", dev, "mtu", str(mtu), "up"])
            sh(["sysctl", "-qw", f"net.ipv4.conf.{dev}.rp_filter=0"], check=False)
            diff.added.append(f"ipip device {dev}")
        encap = ["encap", "ip6", "id", "0", "hoplimit", "64"] if v6 else ["encap", "ip", "id", "0"]
        self._sync_routes(dev, {p.prefix: [*encap, "dst", str(p.remote), "src", str(local), "dev", dev]
                                for p in peers.values()},
                          "ipip", {p.prefix: p.remote for p in peers.values()},
                          {p.prefix: p.remote for p in peers.values()}, diff)

    # --- routes through our devices ----------------------------------------------------------

    def _sync_routes(self, dev: str, want: dict[IPNetwork, list[str]], kind: str, remote: dict[IPNetwork, IPAddress],
                     gateway: dict[IPNetwork, IPAddress], diff: EncapDiff) -> None:
        """Routes `want` (prefix -> its `ip route` arguments) through `dev`; a route whose gateway
        (`via`, or the ipip encap's dst) is already `gateway[prefix]` is left alone."""
        have = _encap_routes(dev)
        for dst in sorted(have.keys() - want.keys(), key=sort_key_net):
            self._retire(["ip", "route", "del", str(dst), "dev", dev, "proto", str(RT_PROTO_ENCAP)], f"{kind} {dst}")
        for dst in sorted(want, key=sort_key_net):
            if have.get(dst) == str(gateway[dst]):
                continue
            try:
                sh(["ip", "route", "replace", str(dst), *want[dst], "proto", str(RT_PROTO_ENCAP)])
            except MeshError as e:
                diff.unavailable.append(f"{kind} {dst}: {e}")
                continue
            diff.added.append(f"{kind} {dst} -> {remote[dst]}")


_VIA = re.compile(r"\bvia (?:inet6? )?(\S+)")
_ENCAP_DST = re.compile(r"\bencap ip6?\b.*?\bdst (\S+)")


def _encap_routes(dev: str) -> dict[IPNetwork, str | None]:
    """Our routes through `dev`, both pod families: prefix -> the peer they go to (`via`, possibly
    of the other family, for VXLAN; the `encap ip`/`ip6` dst for ipip). Read as text: `ip -j`
    prints a lightweight tunnel's `encap` twice (its type as a string, then its fields), and which
    one a JSON reader keeps depends on the iproute2 version."""
    have: dict[IPNetwork, str | None] = {}
    for fam in ("-4", "-6"):
        p = sh(["ip", fam, "route", "show", "dev", dev, "proto", str(RT_PROTO_ENCAP)], check=False)
        for line in p.stdout.splitlines() if p.returncode == 0 else []:
            words = line.split()
            if not words:
                continue
            m = _VIA.search(line) or _ENCAP_DST.search(line)
            have[ipaddress.ip_network(words[0])] = m.group(1) if m else None
    return have


def _mtu(dev: str) -> int:
    try:
        return device_mtu(dev)
    except MeshError:
        return 1500
