# SPDX-License-Identifier: Apache-2.0
"""A two-node namespace testbed for the datapath tests and bench/datapath.py.

    <p>lan            bridge br0: the private network 192.168.77.0/24 (fd77::/64)
    <p>a, <p>b        nodes: eth1 on the private network, ip_forward, a pod each behind veth vp1
    <p>a-p1, <p>b-p1  pods 10.42.1.5 / 10.42.2.5 (fd42:1::5 / fd42:2::5), routed as most CNIs do:
                      a /32 (/128) route to the host veth, the pod's default via the host side
    <p>wan            "another location" behind a's stand-in kilo0 (a veth: no dummy module here),
                      holding 10.42.9.5; optionally a's and b's wg<id> wireguard-go devices

Node a leads location "near" (b shares it); node c (pod CIDR 10.42.9.0/24) is in "far". Routes
and fast-path entries come from meshctl's own plan. Each node has an nftables table counting its
FORWARD traffic, with `ct state invalid drop` as a strict node would.

Everything is named with the caller's prefix and removed by `down()`, pass or fail; processes
started here are tracked by PID and killed by PID.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from meshctl import defaults
from meshctl.datapath.layout import VXLAN_PORT
from meshctl.errors import MeshError
from meshctl.lab.rigs import netns
from meshctl.mesh.model import Endpoint, MeshSettings, Node, Topology
from meshctl.mesh.plan import Encap, FastPathEntry, plan_node
from meshctl.node.encap import EncapApplier, gateway_args
from meshctl.setns import in_netns

WG = defaults.WG_INTERFACE

PODS = {"a": ("10.42.1.5", "fd42:1::5"), "b": ("10.42.2.5", "fd42:2::5")}
PRIVATE = {"a": ("192.168.77.1", "fd77::1"), "b": ("192.168.77.2", "fd77::2")}
FAR_POD = "10.42.9.5"
SERVICE_IP = "10.96.0.10"

NFT_COUNTERS = """
table inet mdpt {
  counter forwarded {}
  counter dropped_invalid {}
  chain forward {
    type filter hook forward priority 0; policy accept;
    ct state invalid counter name "dropped_invalid" drop
    counter name "forwarded"
  }
}
"""


def topology() -> Topology:
    """The plan's view of the testbed: a (leader) and b share location near, c is far away."""
    net, iface = ipaddress.ip_network, ipaddress.ip_interface
    key = "A" * 43 + "="
    return Topology(
        mesh=MeshSettings(granularity="location"),
        nodes=(
            Node("a", (net("10.42.1.0/24"),), key.replace("A", "B", 1), "near", iface("192.168.77.1/24"),
                 Endpoint("203.0.113.1", 51820), leader=True),
            Node("b", (net("10.42.2.0/24"),), key.replace("A", "C", 1), "near", iface("192.168.77.2/24")),
            Node("c", (net("10.42.9.0/24"),), key.replace("A", "D", 1), "far", iface("172.20.0.9/24"),
                 Endpoint("203.0.113.9", 51820)),
        ),
    )



def _ip_of(iface: ipaddress.IPv4Interface | ipaddress.IPv6Interface | None) -> str:
    if iface is None:
        raise MeshError("the testbed plan gave node a no WireGuard address")
    return str(iface.ip)

@dataclass
class Testbed:
    __test__ = False  # not a pytest class

    prefix: str
    namespaces: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)

    def ns(self, name: str) -> str:
        return f"{self.prefix}{name}"

    # --- build ------------------------------------------------------------------------------

    def up(self, *, ipv6: bool = True) -> Testbed:
        """Build the two-node testbed: namespaces, veths, addresses, routes, WireGuard and pods, in
        the order the kernel needs them; one recipe, kept together."""
        p = self.ns
        self.namespaces = [p(n) for n in ("lan", "a", "b", "wan", "a-p1", "b-p1")]
        for n in self.namespaces:
            netns.add(n)
        netns.bridge(p("lan"), "br0")
        plan = {n: plan_node(topology(), n) for n in ("a", "b")}
        for i, node in enumerate(("a", "b"), start=1):
            netns.veth(p(node), "eth1", p("lan"), f"port{i}")
            netns.enslave(p("lan"), f"port{i}", "br0")
            netns.addr(p(node), "eth1", f"{PRIVATE[node][0]}/24")
            if ipv6:
                netns.run(p(node), ["ip", "addr", "add", f"{PRIVATE[node][1]}/64", "dev", "eth1", "nodad"])
            self._node_and_pod(node, i, ipv6=ipv6)
        other = {"a": "b", "b": "a"}
        if ipv6:
            for node, i in (("a", 1), ("b", 2)):
                j = 3 - i
                netns.run(p(node), ["ip", "-6", "route", "add", f"fd42:{j}::/64", "via", PRIVATE[other[node]][1],
                                    "dev", "eth1"])
        # a's stand-in kilo0 towards the far location, at the plan's WireGuard addresses
        # (a leads "near": 10.4.0.2; "far" is 10.4.0.1).
        netns.veth(p("a"), WG, p("wan"), "wan0")
        # IPv4 only, like a WireGuard device: no IPv6 autoconf chatter in kilo0's counters.
        netns.sysctl(p("a"), f"net.ipv6.conf.{WG}.disable_ipv6", "1")
        netns.sysctl(p("wan"), "net.ipv6.conf.wan0.disable_ipv6", "1")
        netns.addr(p("a"), WG, f"{plan['a'].wireguard_ip}")
        netns.addr(p("wan"), "wan0", "10.4.0.1/16")
        netns.addr(p("wan"), "lo", f"{FAR_POD}/32")
        netns.run(p("wan"), ["ip", "route", "add", "10.42.0.0/16", "via", str(_ip_of(plan["a"].wireguard_ip))])
        netns.sysctl(p("wan"), "net.ipv4.conf.all.rp_filter", "0")
        # The plan's routes: kernel routes stay the source of truth, the programs only accelerate.
        for node in ("a", "b"):
            for r in plan[node].routes:
                dev = "eth1" if r.dev == "private" else WG
                via = ["via", str(r.via)] if r.via is not None else []
                netns.run(p(node), ["ip", "route", "replace", str(r.dst), *via, "dev", dev, "onlink"])
        self.plans = plan
        return self

    def _node_and_pod(self, node: str, i: int, *, ipv6: bool) -> None:
        """Node `node`'s forwarding settings, its pod <node>-p1 behind veth vp1 (10.42.<i>.5,
        fd42:<i>::5) routed as most CNIs do, and its FORWARD counters."""
        ns, pod = self.ns(node), self.ns(f"{node}-p1")
        for key, val in (("net.ipv4.ip_forward", "1"), ("net.ipv4.conf.all.rp_filter", "0"),
                         ("net.ipv4.conf.default.rp_filter", "0"), ("net.ipv6.conf.all.forwarding", "1")):
            netns.sysctl(ns, key, val)
        netns.veth(ns, "vp1", pod, "eth0")
        v4, v6 = PODS[node]
        netns.addr(ns, "vp1", f"10.42.{i}.1/32")
        netns.addr(pod, "eth0", f"{v4}/32")
        netns.run(pod, ["ip", "route", "add", f"10.42.{i}.1", "dev", "eth0"])
        netns.run(pod, ["ip", "route", "add", "default", "via", f"10.42.{i}.1", "dev", "eth0"])
        netns.run(ns, ["ip", "route", "add", f"{v4}/32", "dev", "vp1"])
        if ipv6:
            netns.run(ns, ["ip", "addr", "add", f"fd42:{i}::1/128", "dev", "vp1", "nodad"])
            netns.run(pod, ["ip", "addr", "add", f"{v6}/128", "dev", "eth0", "nodad"])
            netns.run(pod, ["ip", "-6", "route", "add", f"fd42:{i}::1", "dev", "eth0"])
            netns.run(pod, ["ip", "-6", "route", "add", "default", "via", f"fd42:{i}::1", "dev", "eth0"])
            netns.run(ns, ["ip", "-6", "route", "add", f"{v6}/128", "dev", "vp1"])
        netns.run(ns, ["nft", "-f", "-"], input=NFT_COUNTERS)

    def down(self) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.pids.clear()
        for n in reversed(self.namespaces):
            netns.delete(n)

    # --- use --------------------------------------------------------------------------------

    def fastpath(self, node: str) -> tuple[FastPathEntry, ...]:
        """The plan's fast-path entries of `node` (plus the IPv6 pod prefixes of the testbed)."""
        extra = []
        if node == "a":
            extra = [FastPathEntry(ipaddress.ip_network("fd42:1::/64"), "local", None),
                     FastPathEntry(ipaddress.ip_network("fd42:2::/64"), "direct", ipaddress.ip_address("fd77::2"))]
        else:
            extra = [FastPathEntry(ipaddress.ip_network("fd42:2::/64"), "local", None),
                     FastPathEntry(ipaddress.ip_network("fd42:1::/64"), "direct", ipaddress.ip_address("fd77::1"))]
        return tuple(self.plans[node].fastpath) + tuple(extra)

    def sh(self, name: str, args: list[str], *, check: bool = True, timeout: float = 30
           ) -> subprocess.CompletedProcess[str]:
        return netns.run(self.ns(name), args, check=check, timeout=timeout)

    def spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        """A background process in namespace `name`, killed by PID at down()."""
        proc = subprocess.Popen([*netns.exec_prefix(self.ns(name)), *args], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        self.pids.append(proc.pid)
        return proc

    def wireguard_go(self, devs: dict[str, str], addrs: dict[str, str], allowed: dict[str, str],
                     endpoints: dict[str, str], port: int, keydir: Path) -> dict[str, str]:
        """A wireguard-go device `devs[node]` on each of the two nodes (processes killed at down()),
        at address `addrs[node]`/24, peered with the other node: allowed its address and
        `allowed[other]`, reached at `endpoints[other]`:port. Returns each node's public key (for
        `wg set DEV peer KEY endpoint ...`). Private keys go to `keydir`, mode 0600."""
        keys: dict[str, tuple[Path, str]] = {}
        for node in devs:
            priv = keydir / f"{node}.key"
            fd = os.open(priv, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(subprocess.run(["wg", "genkey"], capture_output=True, text=True, check=True).stdout)
            pub = subprocess.run(["wg", "pubkey"], input=priv.read_text(), capture_output=True, text=True,
                                 check=True).stdout.strip()
            keys[node] = (priv, pub)
        for node, other in zip(devs, reversed(list(devs)), strict=True):
            env = ["env", "WG_PROCESS_FOREGROUND=1", "WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD=1"]
            proc = self.spawn(node, [*env, "wireguard-go", "-f", devs[node]])
            sock = Path(f"/run/wireguard/{devs[node]}.sock")
            deadline = time.monotonic() + 5
            while not sock.exists():
                if time.monotonic() > deadline:
                    raise MeshError(f"wireguard-go {devs[node]} did not start (pid {proc.pid})")
                time.sleep(0.05)
            self.sh(node, ["wg", "set", devs[node], "private-key", str(keys[node][0]), "listen-port", str(port),
                           "peer", keys[other][1], "allowed-ips", f"{addrs[other]}/32,{allowed[other]}",
                           "endpoint", f"{endpoints[other]}:{port}"])
            self.sh(node, ["ip", "addr", "add", f"{addrs[node]}/24", "dev", devs[node]])
            self.sh(node, ["ip", "link", "set", devs[node], "up"])
        return {node: k[1] for node, k in keys.items()}

    def wireguard_down(self, devs: dict[str, str]) -> None:
        for node, dev in devs.items():
            self.sh(node, ["ip", "link", "del", dev], check=False)
            Path(f"/run/wireguard/{dev}.sock").unlink(missing_ok=True)

    def ping(self, src_pod: str, dst: str, count: int = 3) -> bool:
        p = self.sh(src_pod, ["ping", "-c", str(count), "-i", "0.2", "-W", "2", dst], check=False)
        return p.returncode == 0

    def fwd_packets(self, node: str) -> tuple[int, int]:
        """(forwarded, invalid-dropped) packets counted by the node's FORWARD chain."""
        out = []
        for c in ("forwarded", "dropped_invalid"):
            j = json.loads(self.sh(node, ["nft", "-j", "list", "counter", "inet", "mdpt", c]).stdout)
            out.append(next(x["counter"]["packets"] for x in j["nftables"] if "counter" in x))
        return out[0], out[1]

    def tx_packets(self, node: str, dev: str) -> int:
        j = json.loads(self.sh(node, ["ip", "-s", "-j", "link", "show", "dev", dev]).stdout)
        return int(j[0]["stats64"]["tx"]["packets"])

    def add_service(self, node: str = "a", port: int = 80, backend: str = "10.42.2.5", backend_port: int = 8080
                    ) -> None:
        """A kube-proxy style ClusterIP: DNAT in the node's prerouting."""
        rules = (f"table ip mdpsvc {{\n chain pre {{\n  type nat hook prerouting priority -100;\n"
                 f"  ip daddr {SERVICE_IP} tcp dport {port} dnat to {backend}:{backend_port}\n }}\n}}\n")
        netns.run(self.ns(node), ["nft", "-f", "-"], input=rules)

    def wait_port(self, pod: str, host: str, port: int, timeout: float = 5) -> None:
        deadline = time.monotonic() + timeout
        code = f"import socket;socket.create_connection(('{host}',{port}),timeout=1).close()"
        while time.monotonic() < deadline:
            if self.sh(pod, ["python3", "-c", code], check=False).returncode == 0:
                return
            time.sleep(0.1)
        raise TimeoutError(f"{host}:{port} not reachable from {pod}")


# --- two nodes on a private fabric: L2, or routed like a VPC ----------------------------------

# The private addresses per underlay family (4: IPv4, 6: an IPv6-only private network).
FABRIC_PRIVATE = {"l2": {"a": "10.30.1.1", "b": "10.30.1.2"}, "vpc": {"a": "10.30.2.1", "b": "10.30.3.1"}}
VPC_GATEWAY = {"a": "10.30.2.254", "b": "10.30.3.254"}
FABRIC_PRIVATE6 = {"l2": {"a": "fd30:1::1", "b": "fd30:1::2"}, "vpc": {"a": "fd30:2::1", "b": "fd30:3::1"}}
VPC_GATEWAY6 = {"a": "fd30:2::fe", "b": "fd30:3::fe"}

# The router of a VPC: forwards only packets whose source and destination are node addresses (what
# AWS's source/destination check, GCP and DigitalOcean do), counting what passes by kind. `ip` is
# the underlay's nftables family word (ip, ip6) and `proto` its protocol match.
NFT_VPC = """
table inet vpc {{
  set nodes {{ type {addr_type}; elements = {{ {nodes} }} }}
  counter vxlan {{}}
  counter ipip {{}}
  counter node_to_node {{}}
  counter dropped {{}}
  chain forward {{
    type filter hook forward priority 0; policy drop;
    {ip} saddr @nodes {ip} daddr @nodes udp dport {vxlan_port} counter name "vxlan"
    {ip} saddr @nodes {ip} daddr @nodes {proto} {{ 4, 41 }} counter name "ipip"
    {ip} saddr @nodes {ip} daddr @nodes counter name "node_to_node" accept
    counter name "dropped" drop
  }}
}}
"""
NFT_FAMILY = {4: {"addr_type": "ipv4_addr", "ip": "ip", "proto": "ip protocol"},
              6: {"addr_type": "ipv6_addr", "ip": "ip6", "proto": "ip6 nexthdr"}}


@dataclass
class FabricTestbed(Testbed):
    """Nodes a and b (pods as in Testbed, no far location) on a private fabric of kind `fabric`:

        l2    bridge <p>lan, 10.30.1.0/24: raw pod packets pass
        vpc   router <p>rtr between 10.30.2.0/24 (a) and 10.30.3.0/24 (b), forwarding only
              node-to-node packets (NFT_VPC): raw pod packets are dropped, encapsulated ones pass

    `underlay` 6: the private network is IPv6 only (fd30:1::/64; fd30:2::/64 and fd30:3::/64), the
    pods keep both families (an IPv4 pod's next hop is an IPv6 address).

    Kernel routes to the other node's pods: `route_pods("raw")` via the private network (what the
    fabric may drop), `route_pods("vxlan")` through meshctl.node.encap's VXLAN device."""

    fabric: str = "vpc"
    underlay: int = 4

    def _private_addrs(self) -> dict[str, str]:
        return (FABRIC_PRIVATE6 if self.underlay == 6 else FABRIC_PRIVATE)[self.fabric]

    def _gateway(self, node: str) -> str:
        return (VPC_GATEWAY6 if self.underlay == 6 else VPC_GATEWAY)[node]

    def up(self, *, ipv6: bool = True) -> FabricTestbed:
        p = self.ns
        addr = self._private_addrs()
        plen = 64 if self.underlay == 6 else 24
        hub = "lan" if self.fabric == "l2" else "rtr"
        self.namespaces = [p(n) for n in (hub, "a", "b", "a-p1", "b-p1")]
        for n in self.namespaces:
            netns.add(n)
        if self.fabric == "l2":
            netns.bridge(p("lan"), "br0")
        else:
            netns.sysctl(p("rtr"), "net.ipv4.ip_forward", "1")
            netns.sysctl(p("rtr"), "net.ipv6.conf.all.forwarding", "1")
            netns.sysctl(p("rtr"), "net.ipv4.conf.all.rp_filter", "0")
            netns.sysctl(p("rtr"), "net.ipv4.conf.default.rp_filter", "0")
        for i, node in enumerate(("a", "b"), start=1):
            netns.veth(p(node), "eth1", p(hub), f"port{i}")
            self._address(node, "eth1", f"{addr[node]}/{plen}")
            if self.fabric == "l2":
                netns.enslave(p("lan"), f"port{i}", "br0")
            else:
                self._address("rtr", f"port{i}", f"{self._gateway(node)}/{plen}")
                other = "b" if node == "a" else "a"
                net = ipaddress.ip_network(f"{addr[other]}/{plen}", strict=False)
                netns.run(p(node), ["ip", "route", "add", str(net), "via", self._gateway(node), "dev", "eth1"])
                # The router knows the way to the pods (a route table entry of the VPC), so what stops
                # raw pod packets is the source/destination check below, as in a cloud.
                # (IPv6 routes take no IPv4 gateway: over IPv4 the router routes IPv4 pods only)
                gw = ipaddress.ip_address(addr[node])
                for pods in [f"10.42.{i}.0/24"] + ([f"fd42:{i}::/64"] if self.underlay == 6 else []):
                    netns.run(p("rtr"), ["ip", "route", "add", pods, *gateway_args(gw, ipaddress.ip_network(pods))])
            self._node_and_pod(node, i, ipv6=ipv6)
        if self.fabric == "vpc":
            netns.run(p("rtr"), ["nft", "-f", "-"], input=NFT_VPC.format(
                nodes=", ".join(addr.values()), vxlan_port=VXLAN_PORT, **NFT_FAMILY[self.underlay]))
        return self

    def _address(self, name: str, dev: str, cidr: str) -> None:
        """An address of the underlay's family (IPv6: no duplicate detection to wait for)."""
        if self.underlay == 6:
            netns.run(self.ns(name), ["ip", "addr", "add", cidr, "dev", dev, "nodad"])
        else:
            netns.addr(self.ns(name), dev, cidr)

    def private(self, node: str) -> str:
        """Node `node`'s private address (of the underlay's family)."""
        return self._private_addrs()[node]

    def fastpath(self, node: str, kind: str | None = None) -> tuple[FastPathEntry, ...]:
        """Node `node`'s entries: its own pod CIDRs local, the other's direct, encapsulated as
        `kind` ("vxlan", "ipip") between the two private addresses, or raw (None)."""
        other = "b" if node == "a" else "a"
        i, j = (1, 2) if node == "a" else (2, 1)
        net = ipaddress.ip_network
        me, peer = ipaddress.ip_address(self.private(node)), ipaddress.ip_address(self.private(other))
        enc = Encap(kind, me, peer) if kind else None  # type: ignore[arg-type]
        # Raw: on-link to the peer on L2; through the kernel's route (the VPC gateway) otherwise.
        # Over IPv6 both pod families take the peer's IPv6 address as next hop.
        nh = peer if kind is None and self.fabric == "l2" else None
        nh6 = nh if self.underlay == 6 else None
        return (FastPathEntry(net(f"10.42.{i}.0/24"), "local", None),
                FastPathEntry(net(f"fd42:{i}::/64"), "local", None),
                FastPathEntry(net(f"10.42.{j}.0/24"), "direct", nh, enc),
                FastPathEntry(net(f"fd42:{j}::/64"), "direct", nh6, enc))

    def route_pods(self, node: str, how: str) -> None:
        """The kernel's route to the other node's IPv4 pods (over an IPv6 underlay: both pod
        families): "raw" over the private network, or "vxlan" through the kernel fallback's VXLAN
        device (meshctl.node.encap)."""
        other = "b" if node == "a" else "a"
        j = 2 if node == "a" else 1
        gw = ipaddress.ip_address(self._gateway(node) if self.fabric == "vpc" else self.private(other))
        ns = self.ns(node)
        pods = [f"10.42.{j}.0/24"] + ([f"fd42:{j}::/64"] if self.underlay == 6 else [])
        if how == "raw":
            in_netns(ns, lambda: EncapApplier("eth1").sync([]))
            for dst in pods:
                via = gateway_args(gw, ipaddress.ip_network(dst))
                netns.run(ns, ["ip", "route", "replace", dst, *via, "dev", "eth1"])
            return
        for dst in pods:
            netns.run(ns, ["ip", "route", "del", dst, "dev", "eth1"], check=False)
        entries = [e for e in self.fastpath(node, how) if e.prefix.version == 4 or self.underlay == 6]
        diff = in_netns(ns, lambda: EncapApplier("eth1").sync(entries))
        if diff.unavailable:
            raise RuntimeError(f"{node}: {diff.unavailable}")

    def vpc_counters(self) -> dict[str, int]:
        """Packets the VPC router counted: vxlan / ipip (node-addressed outer headers),
        node_to_node (all it forwarded) and dropped."""
        j = json.loads(self.sh("rtr", ["nft", "-j", "list", "counters", "table", "inet", "vpc"]).stdout)
        return {x["counter"]["name"]: x["counter"]["packets"] for x in j["nftables"] if "counter" in x}
