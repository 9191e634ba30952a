# SPDX-License-Identifier: Apache-2.0
"""`lab.cni: flannel`: each lab node built as flannel's VXLAN backend leaves a node. A
reproduction of flannel's node state, written from its documented behaviour (flannel's
Documentation/backends.md and kube subnet manager), not flannel itself: nothing here resyncs
(the tests play flannel's resync by writing its route again).

On every node, with `public-ip` its internal address (flannel's `--iface` the private NIC):
- `flannel.1`: VXLAN, VNI 1, UDP port 8472, `nolearning`, on the private NIC, its MAC the node's
  VtepMAC, its address the pod CIDR's .0 /32, MTU 1450;
- for every other node: the neighbour entry `<its .0> lladdr <its VtepMAC>` (permanent), the fdb
  entry `<its VtepMAC> dst <its public-ip>`, and the route `<its podcidr> via <its .0> dev flannel.1
  onlink`;
- the `cni0` bridge with the pod CIDR's .1, and the pods on it (the bridge plugin's veths, here
  `veth<k>`; each pod's `eth0` holds its address in the pod CIDR, default via .1);
- the Node annotations flannel's kube subnet manager writes (`node_annotations`).
"""

from __future__ import annotations

import json
from typing import Any

from meshctl.backends.kube.flannel import BACKEND_DATA, BACKEND_TYPE, KUBE_SUBNET_MANAGER, PUBLIC_IP
from meshctl.errors import InputError
from meshctl.lab.namespaces.state import LabState, NodeState, PodState
from meshctl.lab.namespaces.wiring import PRIVATE_NIC, add_ns, pod_entry
from meshctl.lab.rigs import netns
from meshctl.mesh.model import IPNetwork, Node, Topology
from meshctl.node.flannel import FLANNEL_DEV, VXLAN

NAME = "flannel"
VNI = 1
PORT = 8472
MTU = 1450
BRIDGE = "cni0"


def vtep_mac(topo: Topology, node: str) -> str:
    """A node's VtepMAC: locally administered, from its place in the topology (flannel draws one
    at random and publishes it; the lab needs it before the node is built)."""
    i = [n.name for n in topo.nodes].index(node) + 1
    return f"0e:fa:00:00:{i >> 8:02x}:{i & 0xFF:02x}"


def public_ip(n: Node) -> str:
    """flannel's public-ip of a node: its internal address (flannel's --iface is the private NIC)."""
    if n.internal_ip is None:
        raise InputError(f"nodes[{n.name}].internal_ip", "", "is required with lab.cni: flannel (flannel's --iface)")
    return str(n.internal_ip.ip)


def node_annotations(topo: Topology) -> dict[str, dict[str, str]]:
    """The annotations flannel's kube subnet manager writes on each Node, by node name."""
    return {n.name: {BACKEND_TYPE: VXLAN, BACKEND_DATA: json.dumps({"VNI": VNI, "VtepMAC": vtep_mac(topo, n.name)}),
                     PUBLIC_IP: public_ip(n), KUBE_SUBNET_MANAGER: "true"} for n in topo.nodes}


def gateway(pod_cidr: IPNetwork) -> str:
    """flannel's per-node gateway: the pod CIDR's .0 (flannel.1's address, the onlink next hop)."""
    return str(pod_cidr.network_address)


def route_argv(n: Node) -> list[str]:
    """flannel's route to node `n` (`ip route replace` arguments)."""
    return [str(n.pod_cidrs[0]), "via", gateway(n.pod_cidrs[0]), "dev", FLANNEL_DEV, "onlink"]


def seed(topo: Topology) -> list[dict[str, Any]]:
    """None: flannel's kube subnet manager keeps its state in Node annotations (`node_annotations`)."""
    return []


def wire_node(st: LabState, ns: str, topo: Topology, me: Node, pods: int) -> list[PodState]:
    """flannel.1 (over the private NIC) with its neighbours, fdb entries and routes to every other
    node; cni0 with the node's `pods` pods. Call once the private NIC holds the node's internal address."""
    netns.run(ns, ["ip", "link", "add", FLANNEL_DEV, "type", "vxlan", "id", str(VNI), "local", public_ip(me),
                   "dev", PRIVATE_NIC, "dstport", str(PORT), "nolearning"])
    netns.run(ns, ["ip", "link", "set", FLANNEL_DEV, "address", vtep_mac(topo, me.name), "mtu", str(MTU), "up"])
    netns.addr(ns, FLANNEL_DEV, f"{gateway(me.pod_cidrs[0])}/32")
    for n in topo.nodes:
        if n.name == me.name:
            continue
        mac = vtep_mac(topo, n.name)
        netns.run(ns, ["ip", "neigh", "replace", gateway(n.pod_cidrs[0]), "lladdr", mac, "dev", FLANNEL_DEV,
                       "nud", "permanent"])
        netns.run(ns, ["bridge", "fdb", "append", mac, "dev", FLANNEL_DEV, "dst", public_ip(n)])
        netns.run(ns, ["ip", "route", "replace", *route_argv(n)])
    netns.bridge(ns, BRIDGE)
    netns.addr(ns, BRIDGE, f"{me.pod_cidrs[0].network_address + 1}/{me.pod_cidrs[0].prefixlen}")
    return [_pod(st, ns, me.pod_cidrs[0], k) for k in range(pods)]


def _pod(st: LabState, ns: str, pod_cidr: IPNetwork, k: int) -> PodState:
    """Pod `k` on cni0, as the bridge plugin wires it: a veth whose host end is a bridge port."""
    entry = pod_entry(f"{ns}-p{k}", [pod_cidr], k)
    pod = PodState(entry.netns, entry.ip, f"veth{k}")
    add_ns(st, pod.netns)
    netns.veth(ns, pod.host_if, pod.netns, "eth0", mtu=MTU)
    netns.enslave(ns, pod.host_if, BRIDGE)
    netns.addr(pod.netns, "eth0", f"{pod.ip}/{pod_cidr.prefixlen}")
    netns.run(pod.netns, ["ip", "route", "add", "default", "via", str(pod_cidr.network_address + 1), "dev", "eth0"])
    return pod


def cni_state(node: NodeState) -> dict[str, Any]:
    """What flannel owns on a node, to compare before and after the agents: flannel.1 (its VXLAN
    settings, MAC, address), its fdb and neighbour entries, and cni0's address. Not its routes:
    meshctl replaces those to other locations by design (a test compares the ones it keeps)."""
    assert node.netns is not None

    def sh(argv: list[str]) -> str:
        assert node.netns is not None
        return netns.run(node.netns, argv).stdout

    link = json.loads(sh(["ip", "-j", "-d", "link", "show", FLANNEL_DEV]))[0]
    vx = link["linkinfo"]["info_data"]
    return {
        FLANNEL_DEV: (link["address"], link["mtu"], vx["id"], vx["port"], vx.get("learning"), vx.get("local")),
        "addr": sh(["ip", "-o", "addr", "show", "dev", FLANNEL_DEV]).split()[3],
        "fdb": sorted(sh(["bridge", "fdb", "show", "dev", FLANNEL_DEV]).splitlines()),
        "neigh": sorted(sh(["ip", "neigh", "show", "dev", FLANNEL_DEV]).splitlines()),
        BRIDGE: sh(["ip", "-o", "-4", "addr", "show", "dev", BRIDGE]).split()[3],
    }
