# SPDX-License-Identifier: Apache-2.0
"""`lab.cni: cilium`: lab nodes left the way Cilium leaves a node in native-routing mode with
cluster-pool IPAM and `endpointRoutes.enabled`, written from Cilium's documented behaviour. A
REPRODUCTION of its node state, not Cilium: no cilium-agent runs and no Cilium program is loaded
(bpf/repro_cilium_lxc.c stands in for its from-container verdicts where a test needs one).

- IPAM: one `CiliumNode` per node (cilium.io/v2, named like the node) with
  `spec.ipam.podCIDRs: [<the node's pod_cidr>]`, made through the lab's API server after its CRD.
- `cilium_host` / `cilium_net`: Cilium's veth pair; `cilium_host` holds the router address (the
  pod CIDR's first address, /32) and the pod CIDR is routed to it (`<cidr> dev cilium_host src
  <router>`; the kernel refuses a local address as the gateway Cilium names).
- Pods: `lxc` + 11 hex digits host ends without an address; with endpoint routes, a /32 per pod
  to its lxc device; inside the pod, the router address as a link-scope route and the default
  gateway. Cilium's programs answer the pod's ARP on lxc*; here the pod holds a permanent
  neighbour entry for the router address (the host end's MAC) instead.
- Routes to other nodes' pod CIDRs: none (Cilium's `autoDirectNodeRoutes` would write them on
  one L2): meshctl writes them, across locations too.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from meshctl.backends.kube.cni_ipam import CILIUM_NODES
from meshctl.lab.namespaces.cni_calico import crd
from meshctl.lab.namespaces.state import LabState, NodeState, PodState
from meshctl.lab.namespaces.wiring import pod_ip, route_pod, veth_pod
from meshctl.lab.rigs import netns
from meshctl.mesh.model import IPNetwork, Node, Topology

CILIUM_HOST = "cilium_host"
CILIUM_NET = "cilium_net"
LXC_PREFIX = "lxc"


def router_ip(pod_cidr: IPNetwork) -> str:
    """cilium_host's address: the pod CIDR's first address (cluster-pool's router IP)."""
    return str(pod_cidr.network_address + 1)


def seed(topo: Topology) -> list[dict[str, Any]]:
    """The CiliumNode CRD, then one CiliumNode per node."""
    out = [crd(CILIUM_NODES)]
    for n in topo.nodes:
        out.append({"apiVersion": f"{CILIUM_NODES.group}/{CILIUM_NODES.version}", "kind": CILIUM_NODES.kind,
                    "metadata": {"name": n.name},
                    "spec": {"ipam": {"podCIDRs": [str(c) for c in n.pod_cidrs]},
                             "addresses": [{"type": "CiliumInternalIP", "ip": router_ip(n.pod_cidrs[0])}]}})
    return out


def veth_name(pod_ns: str) -> str:
    return LXC_PREFIX + hashlib.sha1(pod_ns.encode()).hexdigest()[:11]


def wire_pod(st: LabState, ns: str, pod_ns: str, ip: str, router: str) -> PodState:
    """One pod as Cilium leaves it: an `lxc*` host end, the pod's gateway the node's router
    address, answered by the host end's own MAC."""
    pod = PodState(pod_ns, ip, veth_name(pod_ns))
    veth_pod(st, ns, pod)
    route_pod(ns, pod, router, gateway_mac=_mac(ns, pod.host_if))
    return pod


def _mac(ns: str, dev: str) -> str:
    return str(json.loads(netns.run(ns, ["ip", "-j", "link", "show", dev]).stdout)[0]["address"])


def node_annotations(topo: Topology) -> dict[str, dict[str, str]]:
    """None: this CNI keeps its node state in its own objects (`seed`)."""
    return {}


def wire_node(st: LabState, ns: str, topo: Topology, node: Node, count: int) -> list[PodState]:
    """cilium_host/cilium_net with the router address and the pod CIDR route, then `count` pods."""
    pod_cidr = node.pod_cidrs[0]  # the lab builds pods of one family
    router = router_ip(pod_cidr)
    netns.veth(ns, CILIUM_HOST, ns, CILIUM_NET)
    netns.addr(ns, CILIUM_HOST, f"{router}/32")
    netns.run(ns, ["ip", "route", "add", str(pod_cidr), "dev", CILIUM_HOST, "scope", "link", "src", router])
    return [wire_pod(st, ns, f"{ns}-p{k}", str(pod_ip(pod_cidr, k)), router) for k in range(count)]


def cni_state(node: NodeState) -> dict[str, Any]:
    """What Cilium left on a node: cilium_host's address, the routes to its devices, its devices."""
    assert node.netns is not None
    routes = [r.strip() for r in netns.run(node.netns, ["ip", "-o", "route", "show"]).stdout.splitlines()
              if CILIUM_HOST in r or LXC_PREFIX in r]
    links = sorted(ln.split(":")[1].strip().split("@")[0] for ln in
                   netns.run(node.netns, ["ip", "-o", "link", "show"]).stdout.splitlines()
                   if ln.split(":")[1].strip().startswith((LXC_PREFIX, "cilium_")))
    addrs = netns.run(node.netns, ["ip", "-o", "-4", "addr", "show", "dev", CILIUM_HOST]).stdout.split()
    return {"routes": sorted(routes), "links": links, "cilium_host": [a for a in addrs if "/" in a]}
