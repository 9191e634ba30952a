# SPDX-License-Identifier: Apache-2.0
"""Pod CIDRs from a CNI's own IPAM objects (`--cni calico`, `--cni cilium`), read purely.

With Calico's IPAM a node's pods come from several blocks (a /26 by default), each claimed by a
node two ways: a `BlockAffinity` (crd.projectcalico.org/v1: `spec.node`, `spec.cidr`, `spec.state`,
counted once `confirmed`, left out while `pending` or `pendingDeletion`, or with `spec.deleted`
"true") and the block's own `IPAMBlock` (`spec.cidr`, `spec.affinity: host:<node>`, `spec.deleted`).
Blocks move: Calico releases an empty block from one node and another claims it, so the owner is
read on every snapshot, never remembered. A block claimed by two nodes (the two kinds disagree, or
two affinities name different nodes, or two nodes' blocks overlap) is routed for NEITHER: both
claims are rejected, named, counted, and every other block goes on. Routing it to either node
would black-hole the pods the other holds; leaving it out costs only that block until Calico's
records agree again (a move seen half-way lasts one watch event).

With Cilium's cluster-pool IPAM a node's pod CIDRs are `CiliumNode.spec.ipam.podCIDRs`
(cilium.io/v2, named like the node). A CiliumNode whose CIDR overlaps one of an older CiliumNode
(creationTimestamp, then name: admission order) is rejected alone; the older keeps its CIDRs.

Both readers return `PodCidrs`: each node's CIDRs (sorted, a tuple per node) and the rejections.
They never raise for a bad object.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from meshctl.errors import InputError
from meshctl.mesh import fields
from meshctl.mesh.admit import Rejection
from meshctl.mesh.model import IPNetwork


class CrdKind(NamedTuple):
    """A CNI's resource as the API serves it (what backend.KubeBackend watches)."""

    group: str
    version: str
    kind: str
    plural: str

    @property
    def name(self) -> str:
        return f"{self.plural}.{self.group}"


BLOCK_AFFINITIES = CrdKind("crd.projectcalico.org", "v1", "BlockAffinity", "blockaffinities")
IPAM_BLOCKS = CrdKind("crd.projectcalico.org", "v1", "IPAMBlock", "ipamblocks")
CILIUM_NODES = CrdKind("cilium.io", "v2", "CiliumNode", "ciliumnodes")
# The kinds each CNI mode reads its pod CIDRs from (node.cni.CNI_MODES names the modes).
CNI_KINDS: dict[str, tuple[CrdKind, ...]] = {
    "calico": (BLOCK_AFFINITIES, IPAM_BLOCKS),
    "cilium": (CILIUM_NODES,),
}
AFFINITY_CONFIRMED = "confirmed"
HOST_AFFINITY = "host:"

Obj = Mapping[str, Any]


@dataclass(frozen=True)
class PodCidrs:
    """Each node's pod CIDRs as its CNI's IPAM gives them, and the records refused."""

    by_node: Mapping[str, tuple[IPNetwork, ...]]
    rejections: tuple[Rejection, ...] = ()


def _meta(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("name") or ""), str(meta.get("creationTimestamp") or "")


def _spec(obj: Obj, where: str) -> Mapping[str, Any]:
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise InputError(f"{where}: spec", spec, "is not a mapping")
    return spec


def _deleted(spec: Mapping[str, Any]) -> bool:
    # Calico writes `deleted` as a string in BlockAffinity (for old releases) and a bool in IPAMBlock.
    return str(spec.get("deleted", "")).strip().lower() == "true"


@dataclass(frozen=True)
class _Claim:
    node: str
    cidr: IPNetwork
    source: str  # "blockaffinity NAME" / "ipamblock NAME"


def _affinity_claim(obj: Obj) -> _Claim | None:
    name, _ = _meta(obj)
    where = f"blockaffinity {name}"
    spec = _spec(obj, where)
    if _deleted(spec) or spec.get("state") != AFFINITY_CONFIRMED:
        return None
    node = spec.get("node")
    if not isinstance(node, str) or not node:
        raise InputError(f"{where}: spec.node", node, "is not a node name")
    return _Claim(node, fields.network(spec.get("cidr"), f"{where}: spec.cidr"), where)


def _block_claim(obj: Obj) -> _Claim | None:
    name, _ = _meta(obj)
    where = f"ipamblock {name}"
    spec = _spec(obj, where)
    cidr = fields.network(spec.get("cidr"), f"{where}: spec.cidr")
    affinity = spec.get("affinity")
    if _deleted(spec) or affinity is None or affinity == "":
        return None
    if not isinstance(affinity, str) or not affinity.startswith(HOST_AFFINITY) or affinity == HOST_AFFINITY:
        raise InputError(f"{where}: spec.affinity", affinity, f"is not {HOST_AFFINITY}<node>")
    return _Claim(affinity.removeprefix(HOST_AFFINITY), cidr, where)


def _overlapping(claims: list[_Claim]) -> list[list[_Claim]]:
    """Groups of claims whose CIDRs overlap (chains of overlaps join one group), by a sweep over
    the claims sorted by first address: O(n log n) for the thousands of blocks a big cluster has."""
    groups: list[list[_Claim]] = []
    for version in (4, 6):
        ordered = sorted((c for c in claims if c.cidr.version == version),
                         key=lambda c: (int(c.cidr.network_address), c.cidr.prefixlen))
        end = -1
        for c in ordered:
            if int(c.cidr.network_address) <= end:
                groups[-1].append(c)
            else:
                groups.append([c])
            end = max(end, int(c.cidr.broadcast_address))
    return groups


def calico_pod_cidrs(affinities: Iterable[Obj], blocks: Iterable[Obj]) -> PodCidrs:
    """Each node's Calico blocks from BlockAffinity and IPAMBlock objects (module docstring)."""
    claims: list[_Claim] = []
    rejections: list[Rejection] = []
    for reader, objs in ((_affinity_claim, affinities), (_block_claim, blocks)):
        for obj in objs:
            try:
                claim = reader(obj)
            except InputError as e:
                rejections.append(Rejection(_meta(obj)[0], str(e)))
                continue
            if claim is not None:
                claims.append(claim)
    by_node: dict[str, list[IPNetwork]] = {}
    for group in _overlapping(claims):
        nodes = sorted({c.node for c in group})
        if len(nodes) > 1:
            blocks_named = ", ".join(sorted({str(c.cidr) for c in group}))
            said = "; ".join(f"{c.source} says {c.node}" for c in sorted(group, key=lambda c: c.source))
            rejections.append(Rejection(
                f"block {blocks_named}",
                f"calico block {blocks_named}: claimed by nodes {', '.join(nodes)} ({said}); "
                "routed for neither until Calico's records agree"))
            continue
        # One node: the widest CIDRs of the group (an affinity and its block name the same one).
        for c in group:
            have = by_node.setdefault(c.node, [])
            if not any(c.cidr.subnet_of(h) for h in have if h.version == c.cidr.version):  # type: ignore[arg-type]
                have[:] = [h for h in have if h.version != c.cidr.version or not h.subnet_of(c.cidr)]  # type: ignore[arg-type]
                have.append(c.cidr)
    return PodCidrs({n: _sorted(v) for n, v in sorted(by_node.items())}, tuple(rejections))


def _sorted(nets: Iterable[IPNetwork]) -> tuple[IPNetwork, ...]:
    return tuple(sorted(nets, key=lambda n: (n.version, int(n.network_address), n.prefixlen)))


def _cilium_cidrs(obj: Obj) -> tuple[IPNetwork, ...]:
    name, _ = _meta(obj)
    where = f"ciliumnode {name}"
    ipam = _spec(obj, where).get("ipam") or {}
    if not isinstance(ipam, Mapping):
        raise InputError(f"{where}: spec.ipam", ipam, "is not a mapping")
    raw = ipam.get("podCIDRs") or []
    if not isinstance(raw, list):
        raise InputError(f"{where}: spec.ipam.podCIDRs", raw, "is not a list of CIDRs")
    return _sorted(fields.network(v, f"{where}: spec.ipam.podCIDRs[{i}]") for i, v in enumerate(raw))


def cilium_pod_cidrs(cilium_nodes: Iterable[Obj]) -> PodCidrs:
    """Each node's `spec.ipam.podCIDRs` from CiliumNode objects (module docstring). Admission
    order decides an overlap; the sweep of `_overlapping` finds the claims that can clash, so a
    node is checked only against the older owners in its own overlap groups (not all of them:
    this runs on every snapshot of a 5,000-node cluster)."""
    rejections: list[Rejection] = []
    parsed: list[tuple[str, tuple[IPNetwork, ...]]] = []
    for obj in sorted(cilium_nodes, key=lambda o: (_meta(o)[1], _meta(o)[0])):
        name, _ = _meta(obj)
        try:
            cidrs = _cilium_cidrs(obj)
        except InputError as e:
            rejections.append(Rejection(name, str(e)))
            continue
        if cidrs:
            parsed.append((name, cidrs))
    group_of = {(c.node, c.cidr): i for i, group in enumerate(_overlapping(
        [_Claim(name, c, name) for name, cidrs in parsed for c in cidrs])) for c in group}
    owners: dict[int, list[tuple[IPNetwork, str]]] = {}
    by_node: dict[str, tuple[IPNetwork, ...]] = {}
    for name, cidrs in parsed:
        clash = next(((c, owner) for c in cidrs for o, owner in owners.get(group_of[(name, c)], ())
                      if c.overlaps(o)), None)
        if clash is not None:
            c, owner = clash
            rejections.append(Rejection(name, f"ciliumnode {name}: spec.ipam.podCIDRs {str(c)!r} overlaps node "
                                              f"{owner}'s pod CIDR; this CiliumNode is left out"))
            continue
        by_node[name] = cidrs
        for c in cidrs:
            owners.setdefault(group_of[(name, c)], []).append((c, name))
    return PodCidrs(dict(sorted(by_node.items())), tuple(rejections))


def pod_cidrs_for(cni: str, objects: Mapping[str, Iterable[Obj]]) -> PodCidrs | None:
    """The reader of CNI mode `cni` over the watched objects by kind name (CrdKind.name); None
    for a mode that reads pod CIDRs from the Node (`keep`, `install`)."""
    if cni == "calico":
        return calico_pod_cidrs(objects.get(BLOCK_AFFINITIES.name, ()), objects.get(IPAM_BLOCKS.name, ()))
    if cni == "cilium":
        return cilium_pod_cidrs(objects.get(CILIUM_NODES.name, ()))
    return None


def block_name(cidr: IPNetwork) -> str:
    """The object name Calico gives a block's IPAMBlock (`10-42-0-64-26`) and, with the node
    prefixed, its BlockAffinity (`<node>-10-42-0-64-26`)."""
    return str(cidr).replace(".", "-").replace(":", "-").replace("/", "-")
