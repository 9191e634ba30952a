# SPDX-License-Identifier: Apache-2.0
"""`lab.cni: calico`: lab nodes left the way Calico leaves a node, written from Calico's documented
behaviour. A REPRODUCTION of its node state, not Calico: no Felix, no BIRD, no IPAM plugin runs.

- IPAM: each node's pods come from BLOCKS_PER_NODE /26 blocks carved from the node's `pod_cidr`
  in the lab file; each block is a `BlockAffinity` (`<node>-<block>`, state confirmed) and an
  `IPAMBlock` (`spec.affinity: host:<node>`) made through the lab's API server, after their CRDs.
- Routing (Calico's IP pool with `encapsulation: None` and BGP off, so meshctl routes between
  nodes): a `blackhole` route per local block (Felix's, so an address of a local block that has
  no pod is dropped here, not sent away), and a /32 route per pod to its `cali*` veth.
- Pod interfaces: routed veths named `cali` + 11 hex digits, no bridge; the host end has no
  address, answers ARP by proxy_arp and has the MAC ee:ee:ee:ee:ee:ee; inside the pod the gateway
  is 169.254.1.1 (a link-scope route and the default route). The lab node namespace has no
  default route for proxy ARP to answer through, so the pod holds a permanent neighbour entry for
  169.254.1.1 instead (what proxy ARP would have answered).

`move_block` moves a block with its pods to another node as Calico would after the pods were
rescheduled: the kernel state first (pods re-made on the new node, blackholes swapped), then the
two objects, so the agents see the move through their watches.
"""

from __future__ import annotations

import hashlib
import ipaddress
from typing import Any

from meshctl.backends.kube.cni_ipam import BLOCK_AFFINITIES, IPAM_BLOCKS, CrdKind, block_name
from meshctl.errors import MeshError
from meshctl.lab.namespaces import kube_api
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.state import KubeAccess, LabState, NodeState, PodState
from meshctl.lab.namespaces.wiring import POD_GW, route_pod, veth_pod
from meshctl.lab.rigs import netns
from meshctl.mesh.model import IPNetwork, Node, Topology

BLOCK_PREFIX = 26  # Calico's default blockSize for IPv4
BLOCKS_PER_NODE = 2
CALI_MAC = "ee:ee:ee:ee:ee:ee"
CALI_PREFIX = "cali"
FELIX_PROTO = "80"  # the routing protocol number Felix's routes carry (`proto 80`)


def crd(kind: CrdKind) -> dict[str, Any]:
    """A cluster-scoped CRD for `kind`, schema left open (what the lab's API server needs)."""
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": kind.name},
            "spec": {"group": kind.group, "scope": "Cluster",
                     "names": {"kind": kind.kind, "plural": kind.plural, "singular": kind.kind.lower(),
                               "listKind": f"{kind.kind}List"},
                     "versions": [{"name": kind.version, "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": {"type": "object",
                                                                  "x-kubernetes-preserve-unknown-fields": True}}}]}}


def node_blocks(pod_cidr: IPNetwork) -> tuple[IPNetwork, ...]:
    """The blocks a lab node starts with: the first BLOCKS_PER_NODE /26 of its pod CIDR."""
    if pod_cidr.prefixlen >= BLOCK_PREFIX:
        return (pod_cidr,)
    subnets: list[IPNetwork] = list(pod_cidr.subnets(new_prefix=BLOCK_PREFIX))
    return tuple(subnets[:BLOCKS_PER_NODE])


def pod_address(blocks: tuple[IPNetwork, ...], k: int) -> str:
    """Pod `k`'s address: pods alternate between the node's blocks (pod 0 and 1 in different ones)."""
    block = blocks[k % len(blocks)]
    return str(block.network_address + 2 + k // len(blocks))


def affinity_object(node: str, block: IPNetwork) -> dict[str, Any]:
    return {"apiVersion": f"{BLOCK_AFFINITIES.group}/{BLOCK_AFFINITIES.version}", "kind": BLOCK_AFFINITIES.kind,
            "metadata": {"name": f"{node}-{block_name(block)}"},
            "spec": {"node": node, "cidr": str(block), "state": "confirmed", "deleted": "false"}}


def block_object(node: str, block: IPNetwork) -> dict[str, Any]:
    return {"apiVersion": f"{IPAM_BLOCKS.group}/{IPAM_BLOCKS.version}", "kind": IPAM_BLOCKS.kind,
            "metadata": {"name": block_name(block)},
            "spec": {"cidr": str(block), "affinity": f"host:{node}", "strictAffinity": False, "deleted": False,
                     "allocations": [], "unallocated": [], "attributes": []}}


def seed(topo: Topology) -> list[dict[str, Any]]:
    """The CRDs, then every node's block affinities and blocks."""
    out = [crd(BLOCK_AFFINITIES), crd(IPAM_BLOCKS)]
    for n in topo.nodes:
        for b in node_blocks(n.pod_cidrs[0]):
            out += [affinity_object(n.name, b), block_object(n.name, b)]
    return out


def veth_name(pod_ns: str) -> str:
    """`cali` + 11 hex digits, from the pod's identity, as Calico names a workload's host end."""
    return CALI_PREFIX + hashlib.sha1(pod_ns.encode()).hexdigest()[:11]


def wire_pod(st: LabState, ns: str, pod_ns: str, ip: str) -> PodState:
    """One pod as Calico's CNI plugin leaves it: the host end `cali*` with Calico's fixed MAC and
    proxy ARP (it answers for the pods' gateway), routed with Felix's protocol."""
    pod = PodState(pod_ns, ip, veth_name(pod_ns))
    veth_pod(st, ns, pod)
    netns.run(ns, ["ip", "link", "set", pod.host_if, "address", CALI_MAC])
    netns.sysctl(ns, f"net.ipv4.conf.{pod.host_if}.proxy_arp", "1")
    netns.sysctl(ns, f"net.ipv4.neigh.{pod.host_if}.proxy_delay", "0")
    route_pod(ns, pod, POD_GW, gateway_mac=CALI_MAC, proto=FELIX_PROTO)
    return pod


def node_annotations(topo: Topology) -> dict[str, dict[str, str]]:
    """None: this CNI keeps its node state in its own objects (`seed`)."""
    return {}


def wire_node(st: LabState, ns: str, topo: Topology, node: Node, count: int) -> list[PodState]:
    """A node's blackhole routes (one per block) and `count` pods across its blocks."""
    pod_cidr = node.pod_cidrs[0]  # the lab builds pods of one family
    blocks = node_blocks(pod_cidr)
    for b in blocks:
        netns.run(ns, ["ip", "route", "add", "blackhole", str(b), "proto", FELIX_PROTO])
    return [wire_pod(st, ns, f"{ns}-p{k}", pod_address(blocks, k)) for k in range(count)]


def api(kube: KubeAccess, method: str, path: str, body: Any = None) -> Any:
    """One request to the lab's API server as its admin; the decoded answer."""
    ctype = "application/merge-patch+json" if method == "PATCH" else "application/json"
    return kube_api.request(kube, method, path, body, content_type=ctype)


def _path(kind: CrdKind, name: str = "") -> str:
    return f"/apis/{kind.group}/{kind.version}/{kind.plural}" + (f"/{name}" if name else "")


def claim_block(kube: KubeAccess, node: str, block: IPNetwork) -> None:
    """`node` claims `block` as Calico's IPAM does: a confirmed affinity, and the block's affinity."""
    api(kube, "POST", _path(BLOCK_AFFINITIES), affinity_object(node, block))
    api(kube, "PATCH", _path(IPAM_BLOCKS, block_name(block)), {"spec": {"affinity": f"host:{node}"}})


def move_block(st: LabState, block: IPNetwork, src: str, dst: str) -> list[PodState]:
    """Move `block` with its pods from node `src` to node `dst` (module docstring); returns the
    pods as re-made on `dst`. The kernel first, then the objects: the moment the objects say `dst`,
    its pods are there."""
    cst, a = st.lookup(src)
    _, b = st.lookup(dst)
    kube = cst.kube
    if kube is None or a.netns is None or b.netns is None:
        raise MeshError("move_block needs a namespace lab with lab.backend: kubernetes")
    moving = [p for p in a.pods if ipaddress.ip_address(p.ip) in block]
    moved = []
    for p in moving:
        netns.delete(p.netns)
        a.pods.remove(p)
        new = wire_pod(st, b.netns, p.netns, p.ip)  # same pod name and address, now on dst
        b.pods.append(new)
        moved.append(new)
    netns.run(a.netns, ["ip", "route", "del", "blackhole", str(block)])
    # `replace`: dst routes the block to src until now (meshctl's route, proto 109), as Felix replaces it.
    netns.run(b.netns, ["ip", "route", "replace", "blackhole", str(block), "proto", FELIX_PROTO])
    labstate.save(st)
    # Calico's order: the old affinity goes, the block is released, then the new node claims it.
    api(kube, "DELETE", _path(BLOCK_AFFINITIES, f"{src}-{block_name(block)}"))
    claim_block(kube, dst, block)
    return moved


def cni_state(node: NodeState) -> dict[str, Any]:
    """What Calico left on a node, to compare before and after the agents: its routes (blackholes
    and /32s, proto 80) and its cali* devices."""
    assert node.netns is not None
    routes = netns.run(node.netns, ["ip", "-o", "route", "show", "proto", FELIX_PROTO]).stdout.split("\n")
    links = [ln.split(":")[1].strip().split("@")[0] for ln in
             netns.run(node.netns, ["ip", "-o", "link", "show"]).stdout.splitlines()
             if ln.split(":")[1].strip().startswith(CALI_PREFIX)]
    return {"routes": sorted(r.strip() for r in routes if r.strip()), "links": sorted(links)}
