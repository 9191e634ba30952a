# SPDX-License-Identifier: Apache-2.0
"""Lab files: a topology file (cluster, mesh, nodes, peers) plus an optional `lab:` block, or
several clusters under `clusters: [<topology>, ...]` sharing one `lab:` block.

Keys and endpoints in the file are ignored (the agents make and discover their own), so any
topology `meshctl plan` accepts can be run; a missing public_key is filled with a placeholder
before validation for the same reason.
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from meshctl.backends.file import load_yaml
from meshctl.errors import InputError
from meshctl.lab.namespaces.cni_install import NAME as CNI_INSTALL
from meshctl.lab.namespaces.cni_labs import CNI_LABS
from meshctl.lab.namespaces.fabric import Fabric, check_nodes, parse_fabrics
from meshctl.lab.namespaces.families import (
    DEFAULT_IP_FAMILIES,
    PUBLIC_NET,
    parse_ip_families,
    pod_cidr6,
    private6,
    subnet6,
)
from meshctl.lab.namespaces.nat_router import FIREWALL6, NAT_KINDS, nat_fits
from meshctl.lab.rigs.kernels import KERNEL_SERIES
from meshctl.mesh import global_ranges
from meshctl.mesh.fields import integer, no_unknown_fields
from meshctl.mesh.model import IPInterface, IPNetwork, Node, Topology
from meshctl.mesh.records import node_pod_cidrs, parse_topology


def _placeholder_key(i: int) -> str:
    """A distinct stand-in key per node (agents make the real ones; admission refuses shared keys)."""
    return base64.b64encode((i + 1).to_bytes(32, "big")).decode()


LAB_FIELDS = ("pods_per_node", "lease_ttl", "prefix", "fastpath", "agent_args", "backend", "fabrics", "clustermesh",
              "nat", "vms", "cni", "ip_families", "agent")
# How a node's agent runs: a process of this checkout's venv, or the agent image's containers as the
# DaemonSet runs them (namespaces/image_agents.py).
AGENTS = ("process", "image")
MULTI_CLUSTER_FIELDS = ("clusters", "lab")  # a lab file of several clusters: nothing else at the top
DEFAULT_NODE_KERNEL = "6.1"  # a VM node without `kernel`: Debian 12's
DEFAULT_LEASE_TTL = 5  # the agents' --lease-ttl where the lab file sets none (lab.lease_ttl)

__all__ = ["PUBLIC_NET", "LabOptions", "LabSpec", "load_lab", "parse_lab"]


@dataclass(frozen=True)
class LabOptions:
    pods_per_node: int = 1
    lease_ttl: int | None = None  # None: the file leaves it to the lab (DEFAULT_LEASE_TTL, longer under TCG)
    prefix: str = "ml-"
    fastpath: bool = True
    agent_args: tuple[str, ...] = ()
    backend: str = "etcd"  # or "kubernetes": a real control plane per cluster (namespaces/kube_cluster.py)
    fabrics: tuple[Fabric, ...] = ()  # how each private subnet forwards (namespaces/fabric.py); l2 if unlisted
    # Several clusters: join them through each other's etcd (--clustermesh-dir); false leaves them
    # apart, to be joined by hand (Kilo's way: each cluster's nodes as Peers of the other).
    clustermesh: bool = True
    # (node, cone|symmetric|firewall6): nodes behind a NAT router or an IPv6 firewall (namespaces/nat_router.py)
    nat: tuple[tuple[str, str], ...] = ()
    # Every node its own VM (lab/vms/vmnodes.py), booting the Debian kernel its `kernel` names.
    vms: bool = False
    kernels: tuple[tuple[str, str], ...] = ()  # ("<cluster>/<node>", series) from nodes[].kernel
    # A reproduction of a CNI's node state (namespaces/cni_labs.py); "" wires pods the lab's way.
    cni: str = ""
    # The underlay's IP families (namespaces/families.py): (4,), (6,) or (4, 6).
    ip_families: tuple[int, ...] = DEFAULT_IP_FAMILIES
    # ("<cluster>/<node>", families) from nodes[].ip_families: a node whose NICs speak fewer
    # families than the lab (an IPv4-only or IPv6-only node of a dual-stack lab).
    node_families: tuple[tuple[str, tuple[int, ...]], ...] = ()
    agent: str = "process"  # one of AGENTS
    image: str = ""  # with agent image: the image (`lab up --image`; "" the DaemonSet's)

    def nat_kind(self, node: str) -> str | None:
        return dict(self.nat).get(node)

    def families_of(self, node: str, cluster: str) -> tuple[int, ...]:
        """The IP families of a node's private and public NICs: its own `ip_families`, else the lab's."""
        return dict(self.node_families).get(f"{cluster}/{node}", self.ip_families)

    def kernel_of(self, node: str, cluster: str) -> str:
        return dict(self.kernels).get(f"{cluster}/{node}", DEFAULT_NODE_KERNEL)


@dataclass(frozen=True)
class LabSpec:
    clusters: tuple[Topology, ...]
    options: LabOptions = field(default_factory=LabOptions)
    source: str = ""

    @property
    def multi(self) -> bool:
        return len(self.clusters) > 1

    def private_subnets(self) -> list[IPNetwork]:
        """One fabric bridge per private subnet, shared by every cluster's nodes in it."""
        nets = {n.internal_ip.network for t in self.clusters for n in t.nodes if n.internal_ip is not None}
        return sorted(nets, key=lambda n: (n.version, int(n.network_address), n.prefixlen))

    def private_address6(self, node: Node, cluster: str) -> IPInterface | None:
        """A node's IPv6 private address: its internal_ip on an IPv6-only node, derived from the
        IPv4 one on a dual-stack one (namespaces/families.py), None on an IPv4-only one."""
        ip = node.internal_ip
        if ip is None or 6 not in self.options.families_of(node.name, cluster):
            return None
        return ip if ip.version == 6 else private6(ip, f"nodes.{node.name}.internal_ip")


def _kernel(value: Any, path: str) -> str:
    """A node's kernel series. YAML reads 6.1 and 6.12 as numbers (accepted) and 5.10 as 5.1 (refused,
    with the fix)."""
    text = value if isinstance(value, str) else repr(value) if isinstance(value, float) else None
    if text in KERNEL_SERIES:
        return text
    if text == "5.1":
        raise InputError(path, value, 'is 5.1 as YAML reads 5.10: quote the series ("5.10")')
    raise InputError(path, value, f"is not a kernel series of the lab ({', '.join(KERNEL_SERIES)})")


def _topology(doc: Any, path: str, kernels: dict[str, str] | None = None,
              families: tuple[int, ...] = DEFAULT_IP_FAMILIES,
              node_families: dict[str, tuple[int, ...]] | None = None) -> Topology:
    """One cluster's topology; lab-only node fields go to `kernels` (`kernel`) and `node_families`
    (`ip_families`) by `<cluster>/<node>`. With IPv6 in the lab's `families`, a node without an
    IPv6 pod CIDR gets one derived from its IPv4 one (pods are dual stack on every node)."""
    if not isinstance(doc, dict):
        raise InputError(path, doc, "is not a topology (a mapping with cluster, mesh, nodes, peers)")
    doc = dict(doc)
    doc.pop("lab", None)
    nodes = doc.get("nodes") or []
    found: dict[str, str] = {}
    own: dict[str, tuple[int, ...]] = {}
    if isinstance(nodes, list):
        fixed = []
        for i, n in enumerate(nodes):
            if isinstance(n, dict):
                n = dict(n)
                n["public_key"] = _placeholder_key(i)
                n.pop("endpoint", None)
                if "kernel" in n:
                    where = f"{path}{'.' if path else ''}nodes[{i}].kernel"
                    found[str(n.get("name"))] = _kernel(n.pop("kernel"), where)
                if "ip_families" in n:
                    where = f"{path}{'.' if path else ''}nodes[{i}].ip_families"
                    own[str(n.get("name"))] = _node_families(n.pop("ip_families"), where, families)
                if 6 in families:
                    n = _with_pod_cidr6(n, doc.get("cluster"), f"{path}{'.' if path else ''}nodes[{i}].")
            fixed.append(n)
        doc["nodes"] = fixed
    try:
        topo = parse_topology(doc)
    except InputError as e:
        raise e.prefixed(f"{path}." if path else "") from None
    if kernels is not None:
        kernels.update({f"{topo.cluster.name}/{k}": v for k, v in found.items()})
    if node_families is not None:
        node_families.update({f"{topo.cluster.name}/{k}": v for k, v in own.items()})
    return topo


def _node_families(value: Any, path: str, lab: tuple[int, ...]) -> tuple[int, ...]:
    """A node's own `ip_families`: [4], [6] or [4, 6], within the lab's (whose public segment and
    etcd speak the lab's families only)."""
    fams = parse_ip_families(value, path)
    if not set(fams) <= set(lab):
        raise InputError(path, value, f"is not within lab.ip_families {list(lab)} (a node speaks families "
                         "of the lab's public segment; write lab.ip_families: [4, 6] for a mixed mesh)")
    return fams


def _with_pod_cidr6(n: dict[str, Any], cluster: Any, path: str) -> dict[str, Any]:
    """Node `n` with an IPv6 pod CIDR: as written, or derived from its IPv4 one (and the cluster
    id) when it has none. A node that has neither is left for admission to name."""
    try:
        cidrs = node_pod_cidrs(n, path)
    except InputError:
        return n  # admission says what is wrong with it
    if any(c.version == 6 for c in cidrs) or not cidrs:
        return n
    cid = cluster.get("id", 1) if isinstance(cluster, dict) else 1
    n = {k: v for k, v in n.items() if k not in ("pod_cidr", "pod_cidrs")}
    n["pod_cidrs"] = [*(str(c) for c in cidrs), str(pod_cidr6(cidrs[0], cid if isinstance(cid, int) else 1))]
    return n


def _options(d: Any) -> LabOptions:
    if d is None:
        return LabOptions()
    if not isinstance(d, dict):
        raise InputError("lab", d, "is not a mapping")
    no_unknown_fields(d, LAB_FIELDS, "lab")
    pods = integer(d.get("pods_per_node", 1), "lab.pods_per_node", 1, 8, "is not a number in 1..8")
    ttl = None if d.get("lease_ttl") is None else integer(d["lease_ttl"], "lab.lease_ttl", 2, 3600,
                                                             "is not seconds in 2..3600")
    prefix = d.get("prefix", "ml-")
    check_prefix(prefix, "lab.prefix")
    args = d.get("agent_args") or []
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise InputError("lab.agent_args", args, "is not a list of strings")
    fast = d.get("fastpath", True)
    if not isinstance(fast, bool):
        raise InputError("lab.fastpath", fast, "is not true or false")
    backend = d.get("backend", "etcd")
    if backend not in ("etcd", "kubernetes"):
        raise InputError("lab.backend", backend, "is not etcd or kubernetes")
    cm = d.get("clustermesh", True)
    if not isinstance(cm, bool):
        raise InputError("lab.clustermesh", cm, "is not true or false")
    vms = d.get("vms", False)
    if not isinstance(vms, bool):
        raise InputError("lab.vms", vms, "is not true or false")
    if vms and backend != "etcd":
        raise InputError("lab.backend", backend, "is not available with lab.vms (VM nodes use etcd)")
    if vms and d.get("nat"):
        raise InputError("lab.nat", d["nat"], "is not available with lab.vms (NAT routers are namespace-lab only)")
    cni = d.get("cni", "")
    if cni:
        if cni not in (*CNI_LABS, CNI_INSTALL):
            raise InputError("lab.cni", cni, f"is not one of {', '.join((*CNI_LABS, CNI_INSTALL))}")
        if cni != CNI_INSTALL and backend != "kubernetes":
            raise InputError("lab.cni", cni, "needs lab.backend: kubernetes (the CNI's objects live in its API)")
        args = [*args, "--cni", cni]
    families = parse_ip_families(d.get("ip_families", list(DEFAULT_IP_FAMILIES)))
    if families == (6,) and backend != "etcd":
        raise InputError("lab.backend", backend, "is not available with lab.ip_families [6] (the lab's API server "
                         "listens on IPv4)")
    if families != DEFAULT_IP_FAMILIES and (vms or cni):
        key = "lab.vms" if vms else "lab.cni"
        raise InputError(key, d[key.split(".")[1]], f"is not available with lab.ip_families {list(families)} "
                         "(the lab builds IPv6 for its own namespace nodes only)")
    agent = d.get("agent", "process")
    if agent not in AGENTS:
        raise InputError("lab.agent", agent, f"is not one of {', '.join(AGENTS)}")
    if agent == "image":
        check_image_agents(vms)
    return LabOptions(pods_per_node=pods, lease_ttl=ttl, prefix=prefix, fastpath=fast, agent_args=tuple(args),
                      backend=backend, fabrics=parse_fabrics(d.get("fabrics")), clustermesh=cm, nat=_nat(d.get("nat")),
                      vms=vms, cni=cni, ip_families=families, agent=agent)


def check_image_agents(vms: bool, key: str = "lab.agent", value: str = "image") -> None:
    """What agents from the image (lab.agent image, `lab up --image`) run on: namespace nodes,
    with either backend."""
    if vms:
        raise InputError(key, value, "is not available with lab.vms (a VM node's agent runs in its VM)")


def with_image(spec: LabSpec, image: str) -> LabSpec:
    """`lab up --image IMAGE`: the lab's agents from that image (lab.agent image)."""
    check_image_agents(spec.options.vms, "--image", image)
    return replace(spec, options=replace(spec.options, agent="image", image=image))


def _nat(d: Any) -> tuple[tuple[str, str], ...]:
    """`lab.nat: {NODE: cone|symmetric|firewall6}` (node names, and whether the kind fits the
    node's IP family, are checked against the nodes later)."""
    if d is None:
        return ()
    if not isinstance(d, dict):
        raise InputError("lab.nat", d, f"is not a mapping of node name to {'|'.join(NAT_KINDS)}")
    for node, kind in d.items():
        if kind not in NAT_KINDS:
            raise InputError(f"lab.nat.{node}", kind, f"is not one of {', '.join(NAT_KINDS)}")
    return tuple(sorted((str(k), v) for k, v in d.items()))


def check_prefix(prefix: Any, path: str) -> str:
    """Names are `<prefix><node>`: keep the prefix short, plain and ending in '-'."""
    if not isinstance(prefix, str) or not re.fullmatch(r"[a-z][a-z0-9]{0,9}-", prefix):
        raise InputError(path, prefix, "is not a lab prefix (a letter, up to 9 more letters/digits, then '-')")
    return prefix


def parse_lab(doc: Any, source: str = "") -> LabSpec:
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise InputError("", doc, "is not a lab file (a topology, or clusters: [...], plus lab:)")
    opts = _options(doc.get("lab"))
    kernels: dict[str, str] = {}
    own: dict[str, tuple[int, ...]] = {}
    if "clusters" in doc:
        no_unknown_fields(doc, MULTI_CLUSTER_FIELDS, "")
        raw = doc["clusters"]
        if not isinstance(raw, list) or not raw:
            raise InputError("clusters", raw, "is not a non-empty list of topologies")
        clusters = tuple(_topology(c, f"clusters[{i}]", kernels, opts.ip_families, own) for i, c in enumerate(raw))
    else:
        clusters = (_topology(doc, "", kernels, opts.ip_families, own),)
    if kernels and not opts.vms:
        where = next(iter(kernels))
        raise InputError(f"nodes.{where.split('/', 1)[1]}.kernel", kernels[where],
                         "is for VM labs (lab.vms: true); `lab up --kernel` runs a whole lab in one VM")
    opts = replace(opts, kernels=tuple(sorted(kernels.items())), node_families=tuple(sorted(own.items())))
    names = [c.cluster.name for c in clusters]
    for i, cname in enumerate(names):
        if cname in names[:i]:
            raise InputError(f"clusters[{i}].cluster.name", cname, "is used by another cluster of the lab")
    all_names = {n.name for c in clusters for n in c.nodes} | {f"{c.cluster.name}/{n.name}" for c in clusters
                                                                for n in c.nodes}
    for node, _ in opts.nat:
        if node not in all_names:
            raise InputError(f"lab.nat.{node}", node, "is not a node of the lab")
    total = sum(len(c.nodes) for c in clusters)
    if total == 0:
        raise InputError("nodes", [], "is empty: a lab needs at least one node")
    if total > 200:
        raise InputError("nodes", total, "is more nodes than a lab takes (200)")
    seen: dict[Any, str] = {}
    for c in clusters:
        for n in c.nodes:
            if n.internal_ip is not None:
                if n.internal_ip.ip in seen:
                    raise InputError(f"{c.cluster.name}.nodes.{n.name}.internal_ip", str(n.internal_ip),
                                     f"is also {seen[n.internal_ip.ip]}'s")
                seen[n.internal_ip.ip] = n.name
                _check_family(n.internal_ip, f"{c.cluster.name}.nodes.{n.name}.internal_ip",
                              opts.families_of(n.name, c.cluster.name),
                              "ip_families" if f"{c.cluster.name}/{n.name}" in dict(opts.node_families) else "")
    _check_node_families(opts, clusters)
    if opts.clustermesh:
        _check_cluster_ranges(clusters)
    spec = LabSpec(clusters=clusters, options=opts, source=source)
    check_nodes(opts.fabrics, spec.private_subnets(), seen)
    for c in clusters:
        for n in c.nodes:
            spec.private_address6(n, c.cluster.name)  # a derived address that cannot be made says so now
    return spec


def _check_cluster_ranges(clusters: tuple[Topology, ...]) -> None:
    """Clusters the lab joins whose pod ranges overlap must all have global ranges, and no global
    range may overlap the other clusters' (mesh.global_ranges): the first conflict, as the agents
    would name it, refuses the file."""
    for i, a in enumerate(clusters):
        for j, b in enumerate(clusters):
            if i == j:
                continue
            problem = global_ranges.pair_problem(a, b) or (global_ranges.record_overlap(a, b) if i < j else None)
            if problem is not None:
                raise InputError.from_line(f"clusters[{j}]: {problem}")


def _check_node_families(opts: LabOptions, clusters: tuple[Topology, ...]) -> None:
    """What a node's families cannot work with: an IPv6-only node where the lab's API server
    listens on IPv4 only, a NAT kind of another family than the node's (namespaces/nat_router.py),
    and an IPv6-only node's private subnet inside a dual-stack subnet's derived IPv6 side (two
    bridges for one subnet)."""
    dual6 = {subnet6(n.internal_ip.network): n.internal_ip.network for c in clusters for n in c.nodes
             if n.internal_ip is not None and opts.families_of(n.name, c.cluster.name) == (4, 6)}
    for c in clusters:
        for n in c.nodes:
            fams = opts.families_of(n.name, c.cluster.name)
            if fams == (6,) and opts.backend != "etcd":
                raise InputError(f"nodes.{n.name}.ip_families", list(fams), f"is not available with lab.backend "
                                 f"{opts.backend} (the lab's API server listens on IPv4)")
            kind = opts.nat_kind(n.name) or opts.nat_kind(f"{c.cluster.name}/{n.name}")
            if kind is not None and not nat_fits(kind, fams):
                want = 6 if kind == FIREWALL6 else 4
                fix = f"give the node ip_families: [{want}]" if want in opts.ip_families else \
                    f"lab.ip_families {list(opts.ip_families)} has no IPv{want}"
                which = "IPv6-only nodes" if want == 6 else "IPv4-only and dual-stack nodes"
                raise InputError(f"lab.nat.{n.name}", kind, f"is for {which} and {n.name} speaks {list(fams)} ({fix})")
            ip = n.internal_ip
            if fams == (6,) and ip is not None and ip.version == 6:
                inside = next((v4 for v6, v4 in dual6.items() if ip.network.overlaps(v6)), None)
                if inside is not None:
                    raise InputError(f"nodes.{n.name}.internal_ip", str(ip), f"is in {subnet6(inside)}, the IPv6 "
                                     f"side of dual-stack subnet {inside}: give the node an IPv4 internal_ip there, "
                                     "or an IPv6 subnet of its own")


def _check_family(ip: IPInterface, path: str, families: tuple[int, ...], own: str = "") -> None:
    """A node's internal_ip is IPv4 on an IPv4-only or dual-stack node (the lab derives the IPv6
    one) and IPv6 on an IPv6-only node; `own` names the node's own key when it set its families."""
    want = 6 if families == (6,) else 4
    if ip.version != want:
        key = f"the node's {own}" if own else "lab.ip_families"
        raise InputError(path, str(ip), f"is IPv{ip.version}; with {key} {list(families)} the lab "
                         f"builds its private networks from IPv{want} internal addresses"
                         + (" (and derives the IPv6 ones)" if families == (4, 6) else ""))


def load_lab(path: str | Path) -> LabSpec:
    doc = load_yaml(path)
    try:
        return parse_lab(doc, str(Path(path).resolve()))
    except InputError as e:
        raise e.prefixed(f"{Path(path).name}: ") from None
