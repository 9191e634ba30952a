# SPDX-License-Identifier: Apache-2.0
"""Global ranges (`mesh.global_cidrs`): clusters whose pod ranges overlap, joined one to one.

A cluster with global ranges is seen by every other cluster at the images of its pods in them:
the same host bits under the global range's prefix (10.42.3.7 of 10.42.0.0/16 -> 10.142.3.7 of
10.142.0.0/16). Each record it publishes keeps its own pod CIDRs; a reader maps them (`as_global`)
before admission, so the other clusters route, allow and fast-path the images, never the raw
ranges. The two ends translate (docs/clustermesh.md, "Clusters whose pod ranges overlap"): the
sender's node rewrites its pod's source to its image, the receiving cluster's first node rewrites
the destination back; no connection state, since each pod has an address of its own.

What may join: two clusters whose pod ranges overlap join only when both have global ranges
(else the remote cluster is refused with one line naming both and the ranges), and no global
range overlaps another cluster's global ranges, pod ranges, node (internal) subnets, WireGuard
subnets, private networks or Service ranges (`refusals`). A cluster's own settings are judged
the same way (`settings_problem`).

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from meshctl.mesh.model import (
    IPAddress,
    IPNetwork,
    MeshSettings,
    Node,
    Topology,
    global_image,
    global_net,
    mapped_range,
)

GLOBAL_DOC = "docs/clustermesh.md, 'Clusters whose pod ranges overlap'"

Pair = tuple[IPNetwork, IPNetwork]  # (pod range, global range)


def overlap(a: IPNetwork, b: IPNetwork) -> bool:
    """Two networks of one family that share an address (never two of different families)."""
    return a.version == b.version and a.overlaps(b)


def _first_overlap(net: IPNetwork, named: Iterable[tuple[str, IPNetwork]]) -> tuple[str, IPNetwork] | None:
    return next(((what, n) for what, n in named if overlap(n, net)), None)


def _setting_ranges(mesh: MeshSettings) -> list[tuple[str, IPNetwork]]:
    """The ranges of a cluster's own settings that no global range may overlap, each named."""
    return [*(("WireGuard subnet", s) for s in mesh.subnets),
            *(("private network", n) for n in mesh.private_networks),
            *(("Service range", n) for n in mesh.service_cidrs)]


def settings_problem(mesh: MeshSettings, path: str = "mesh") -> str | None:
    """Why the cluster's global ranges cannot be used with its own settings (one overlaps its
    WireGuard subnet, a private network or a Service range), or None. The setting's own rules
    (same size and family, one per family, no overlap among its ranges) are fields.global_cidrs'."""
    for pod, glob in mesh.global_cidrs:
        hit = _first_overlap(glob, _setting_ranges(mesh))
        if hit is not None:
            return f"{path}.global_cidrs[{pod}]: {str(glob)!r} overlaps the {hit[0]} {hit[1]}"
    for what, net in _setting_ranges(mesh):
        if what != "Service range":
            continue
        pair = next(((p, g) for p, g in mesh.global_cidrs if overlap(p, net)), None)
        if pair is not None:
            return f"{path}.service_cidrs: {str(net)!r} overlaps the pod range {pair[0]} of mesh.global_cidrs"
    return None


def node_problem(n: Node, where: str, mesh: MeshSettings) -> str | None:
    """Why a node of a cluster with global ranges may not join its own cluster: its pod CIDR or its
    internal subnet overlaps one of the global ranges (an address would mean a local pod and a
    remote one), or None."""
    for pod, glob in mesh.global_cidrs:
        for i, c in enumerate(n.pod_cidrs):
            if overlap(c, glob):
                field = "pod_cidr" if len(n.pod_cidrs) == 1 else f"pod_cidrs[{i}]"
                return f"{where}.{field}: {str(c)!r} overlaps the global range {glob} of {pod} (mesh.global_cidrs)"
        for i, ip in enumerate(n.internal_ips):
            if overlap(ip.network, glob):
                field = "internal_ip" if len(n.internal_ips) == 1 else f"internal_ips[{i}]"
                return f"{where}.{field}: {str(ip)!r} overlaps the global range {glob} of {pod} (mesh.global_cidrs)"
    return None


def mapped_families(mesh: MeshSettings) -> frozenset[int]:
    return frozenset(p.version for p, _ in mesh.global_cidrs)


def pod_ranges(topo: Topology, family: int) -> list[tuple[str, IPNetwork]]:
    """The cluster's pod ranges of `family`, each named: its mapped pod range where it has one of
    that family (its nodes' CIDRs lie inside it), else every node's pod CIDR."""
    mapped = [p for p, _ in topo.mesh.global_cidrs if p.version == family]
    if mapped:
        return [("pod range", p) for p in mapped]
    return [(f"node {n.name}'s pod CIDR", c) for n in topo.nodes for c in n.pod_cidrs if c.version == family]


def refusals(local: Topology, remotes: Sequence[Topology]) -> dict[str, str]:
    """Remote cluster name -> why the whole cluster is refused for its global ranges or for pod
    ranges that overlap without them. Only a declared range (a pod range of mesh.global_cidrs)
    refuses a cluster whole: two clusters without global ranges whose records overlap are judged
    record by record, as before (one bad record must not cut a cluster off). Two remote clusters
    whose global ranges overlap are both refused, as two claiming one id are."""
    if not local.mesh.global_cidrs and not any(r.mesh.global_cidrs for r in remotes):
        return {}
    out: dict[str, str] = {}
    for r in remotes:
        problem = pair_problem(local, r)
        if problem is not None:
            out[r.cluster.name] = problem
    for r in remotes:
        for q in remotes:
            if q is r or r.cluster.name in out:
                continue
            for pod, glob in r.mesh.global_cidrs:
                hit = next((g for _, g in q.mesh.global_cidrs if overlap(g, glob)), None)
                if hit is not None:
                    out[r.cluster.name] = (
                        f"cluster {r.cluster.name}: mesh.global_cidrs[{pod}]: {str(glob)!r} overlaps cluster "
                        f"{q.cluster.name}'s global range {hit}: none of the two is admitted until one changes it")
                    break
    return out


def pair_problem(local: Topology, remote: Topology) -> str | None:
    """Why `remote` may not join `local` for its global ranges (or their lack), or None: pod
    ranges that overlap where a side has a declared pod range and not both have global ranges of
    that family; a remote global range over anything of the local cluster's; remote settings a
    cluster could not have set itself."""
    rname, lname = remote.cluster.name, local.cluster.name
    own = settings_problem(remote.mesh, f"cluster {rname}: mesh")
    if own is not None:
        return own
    lmap, rmap = mapped_families(local.mesh), mapped_families(remote.mesh)
    for fam in sorted(lmap | rmap):
        if fam in lmap and fam in rmap:
            continue
        for rwhat, rnet in pod_ranges(remote, fam):
            hit = _first_overlap(rnet, pod_ranges(local, fam))
            if hit is not None:
                lacking = lname if fam not in lmap else rname
                return (f"cluster {rname}'s {rwhat} {rnet} overlaps cluster {lname}'s {hit[0]} {hit[1]}: clusters "
                        f"whose pod ranges overlap join only when both have mesh.global_cidrs ({lacking} has no "
                        f"IPv{fam} global range; {GLOBAL_DOC})")
    local_named = [*((f"global range of {p}", g) for p, g in local.mesh.global_cidrs),
                   *_setting_ranges(local.mesh),
                   *((f"node {n.name}'s internal subnet", ip.network) for n in local.nodes for ip in n.internal_ips)]
    for pod, glob in remote.mesh.global_cidrs:
        hit = _first_overlap(glob, [*local_named, *pod_ranges(local, glob.version)])
        if hit is not None:
            return (f"cluster {rname}: mesh.global_cidrs[{pod}]: {str(glob)!r} overlaps cluster {lname}'s "
                    f"{hit[0]} {hit[1]}")
    return None


def record_overlap(a: Topology, b: Topology) -> str | None:
    """The first pod CIDR of `b`'s records that overlaps one of `a`'s in a family neither cluster
    maps, as one line naming both clusters and the CIDRs, or None: what a file holding both
    clusters refuses (agents reject such records one by one)."""
    both = mapped_families(a.mesh) | mapped_families(b.mesh)
    for m in b.nodes:
        for c in m.pod_cidrs:
            if c.version in both:
                continue
            n, d = next(((n, d) for n in a.nodes for d in n.pod_cidrs if overlap(c, d)), (None, None))
            if n is not None:
                return (f"cluster {b.cluster.name}'s node {m.name}'s pod CIDR {c} overlaps cluster {a.cluster.name}'s "
                        f"node {n.name}'s pod CIDR {d}: clusters whose pod ranges overlap join only when both have "
                        f"mesh.global_cidrs ({GLOBAL_DOC})")
    return None


def as_global(remote: Topology, label: str) -> tuple[Topology, list[tuple[str, str]]]:
    """A remote cluster's records as this cluster sees them: each pod CIDR of a mapped family
    replaced by its image in the cluster's global range; and (qualified name, why) for each record
    whose pod CIDR of a mapped family lies outside the mapped pod range (it has no image: left out)."""
    mapping = remote.mesh.global_cidrs
    if not mapping:
        return remote, []
    fams = mapped_families(remote.mesh)
    nodes: list[Node] = []
    bad: list[tuple[str, str]] = []
    for i, n in enumerate(remote.nodes):
        cidrs: list[IPNetwork] = []
        problem = None
        for j, c in enumerate(n.pod_cidrs):
            if c.version not in fams:
                cidrs.append(c)
                continue
            pair = mapped_range(c, mapping)
            if pair is None:
                pod = next(p for p, _ in mapping if p.version == c.version)
                field = "pod_cidr" if len(n.pod_cidrs) == 1 else f"pod_cidrs[{j}]"
                problem = (f"{label}[{i}].{field}: {str(c)!r} is outside cluster {remote.cluster.name}'s pod range "
                           f"{pod} (mesh.global_cidrs): it has no global image")
                break
            cidrs.append(global_net(c, *pair))
        if problem is not None:
            bad.append((n.qualified_name, problem))
            continue
        nodes.append(replace(n, pod_cidrs=tuple(cidrs)))
    return replace(remote, nodes=tuple(nodes)), bad


def as_text(mapping: Sequence[Pair]) -> str:
    """The setting as `mesh set` and `mesh get` write it: `POD=GLOBAL` pairs, comma-separated
    (fields.global_cidrs reads it back)."""
    return ",".join(f"{pod}={glob}" for pod, glob in mapping)


def dial_address(addr: IPAddress, mapping: Sequence[Pair]) -> IPAddress:
    """What a pod of another cluster dials to reach the pod at `addr` of a cluster with global
    ranges `mapping`: its image, or `addr` itself when no pod range of the mapping holds it."""
    pair = mapped_range(addr, mapping)
    return addr if pair is None else global_image(addr, *pair)


def local_address(addr: IPAddress, mapping: Sequence[Pair]) -> IPAddress:
    """The pod an image in one of `mapping`'s global ranges stands for (`dial_address` undone), or
    `addr` itself when it lies in none."""
    pair = mapped_range(addr, [(g, p) for p, g in mapping])
    return addr if pair is None else global_image(addr, *pair)


def image_of(addr: IPNetwork, mapping: Sequence[Pair]) -> IPNetwork | None:
    """The global image of a network inside one of `mapping`'s pod ranges, else None."""
    pair = mapped_range(addr, mapping)
    return None if pair is None else global_net(addr, *pair)
