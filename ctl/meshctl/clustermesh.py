"""Cluster mesh, the pure part: which of other clusters' records may join this cluster's plan.

A remote cluster can never take over a local route: its records are admitted after all local
ones, against everything the local cluster and the clusters admitted before it hold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from .model import Topology, gc_paused, host_net
from .plan import Remote, segments
from .validate import Claims, Rejection, add_hosts, admit_nodes


def as_remote(topo: Topology) -> Topology:
    """The topology with every node marked as belonging to its cluster (`cluster2/g1`); nodes
    already marked (a remote watcher parses them so) are kept as they are."""
    name = topo.cluster.name
    nodes = topo.nodes if all(n.cluster == name for n in topo.nodes) else \
        tuple(n if n.cluster == name else replace(n, cluster=name) for n in topo.nodes)
    return replace(topo, nodes=nodes, peers=())


def admit_remotes(local: Topology, remotes: Sequence[Topology]) -> tuple[list[Remote], list[Rejection]]:
    """See `_admit_remotes`; the cyclic GC is paused while it runs (see model.gc_paused)."""
    with gc_paused():
        return _admit_remotes(local, remotes)


def _admit_remotes(local: Topology, remotes: Sequence[Topology]) -> tuple[list[Remote], list[Rejection]]:
    """Remote clusters with the records that are safe to install here, and the rejections.

    A whole cluster is refused when its name or id collides with the local one or an earlier
    remote's. A record is rejected when its pod CIDR overlaps a local pod CIDR, the local
    WireGuard subnet or another cluster's records; when its segment's WireGuard address overlaps
    them; when its internal address is a local node's; or when one of its allowed location IPs
    covers any of these, a node's address, or is a default route the local mesh does not allow.
    Sharing a private subnet is fine."""
    claims = Claims()
    internal: dict[object, str] = {}
    hosts: dict[object, str] = {}
    for n in local.nodes:
        claims.add(n.pod_span, ("local node ", n))
        if n.internal_ip is not None:
            internal[n.internal_ip.ip] = f"local node {n.name}"
        for a in n.allowed_location_ips:
            claims.add(a, f"local node {n.name}'s allowed location IP {a}")
    add_hosts(hosts, local.nodes)
    claims.add(local.mesh.subnet, f"the local WireGuard subnet {local.mesh.subnet}")
    ids = {local.cluster.id: local.cluster.name}
    out: list[Remote] = []
    rejected: list[Rejection] = []
    for remote in sorted(remotes, key=lambda t: t.cluster.name):
        cname, cid = remote.cluster.name, remote.cluster.id
        if cname in ids.values():
            rejected.append(Rejection(cname, f"cluster.name: {cname!r} is already used"))
            continue
        if cid in ids:
            rejected.append(Rejection(cname, f"cluster.id: {cid} is already used by cluster {ids[cid]}"))
            continue
        remote = as_remote(remote)
        label = f"{cname}.nodes"
        segs = tuple(segments(remote))
        seg_wg = {m.name: s.wireguard_ip for s in segs for m in s.members}
        candidates = []
        for n in remote.nodes:
            owner = claims.conflict(host_net(seg_wg[n.name]))
            if owner is not None:
                rejected.append(Rejection(n.qualified_name, f"{label}.{n.name}.wireguard_ip: "
                                          f"{str(seg_wg[n.name].ip)!r} overlaps {owner}"))
                continue
            candidates.append(n)
        admitted, rej = admit_nodes(candidates, remote.mesh.subnet, claims=claims, internal_ips=internal,
                                    hosts=hosts, allow_default_route=local.mesh.allow_default_route, label=label)
        rejected += rej
        for n in admitted:
            wg = host_net(seg_wg[n.name])
            if claims.conflict(wg) is None:
                claims.add(wg, f"cluster {cname}'s WireGuard address {wg.network_address}")
        ids[cid] = cname
        out.append(Remote(remote, frozenset(n.name for n in admitted), segs))
    return out, rejected
