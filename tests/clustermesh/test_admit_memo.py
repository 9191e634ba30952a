# SPDX-License-Identifier: Apache-2.0
"""Remote admission memoised per cluster (mesh.admit_memo) against admission from scratch
(mesh.admit.admit_remotes): the same remotes and rejections after every change, over random
join/leave/change sequences with claims that conflict across clusters; and only the clusters a
change can affect are admitted again."""

from __future__ import annotations

import ipaddress
import random
from dataclasses import replace

import pytest

from meshctl.mesh.admit import admit_local, admit_remotes
from meshctl.mesh.admit_memo import RemoteAdmission
from meshctl.mesh.model import Cluster, Endpoint, MeshSettings, Node, Topology, WireGuardAddressing
from tests.plan.fixtures import key

LOCAL_MESH = MeshSettings(subnet=ipaddress.ip_network("10.4.0.0/16"))


def node(name: str, pod: str, k: int, *, cluster: str = "", location: str = "", internal: str | None = None,
         endpoint: str | None = None, location_ips: tuple[str, ...] = ()) -> Node:
    return Node(name=name, pod_cidrs=(ipaddress.ip_network(pod),), public_key=key(k), location=location,
                internal_ip=ipaddress.ip_interface(internal) if internal else None,
                endpoint=Endpoint(endpoint, 51820) if endpoint else None,
                allowed_location_ips=tuple(ipaddress.ip_network(a) for a in location_ips), cluster=cluster)


def local_topo(*nodes: Node, mesh: MeshSettings = LOCAL_MESH) -> Topology:
    topo, _ = admit_local(Topology(cluster=Cluster("cluster1", 1), mesh=mesh, nodes=nodes))
    return topo


def remote(name: str, cid: int, *nodes: Node, addressing: WireGuardAddressing = "index") -> Topology:
    subnet = ipaddress.ip_network(f"10.{4 + cid}.0.0/16")
    return Topology(cluster=Cluster(name, cid), mesh=MeshSettings(subnet=subnet, wireguard_addressing=addressing),
                    nodes=tuple(replace(n, cluster=name) for n in nodes))


def same_as_scratch(memo: RemoteAdmission, local: Topology, remotes: list[Topology]) -> None:
    got = memo.admit(local, remotes)
    want = admit_remotes(local, remotes)
    assert got[1] == want[1]
    assert [(r.topology, r.admitted, r.segments) for r in got[0]] == \
        [(r.topology, r.admitted, r.segments) for r in want[0]]


# --- random sequences -------------------------------------------------------------------------

PODS = [f"10.44.{i}.0/24" for i in range(12)] + ["10.44.0.0/23", "10.44.8.0/22", "10.4.3.0/24"]
LOCATION_IPS = ["192.168.1.0/24", "192.168.0.0/23", "10.44.4.0/24", "10.10.0.7/32", "0.0.0.0/0", "10.6.0.1/32"]


def random_node(rng: random.Random, name: str) -> Node:
    """A record drawn from small pools, so pod CIDRs, keys, internal addresses, endpoints and
    location IPs often collide across clusters (and with the local one)."""
    return node(name, rng.choice(PODS), rng.randrange(1, 25), location=rng.choice(["a", "b", "c", ""]),
                internal=rng.choice([None, f"10.10.0.{rng.randrange(1, 12)}/24", "10.4.0.9/24"]),
                endpoint=rng.choice([None, f"203.0.113.{rng.randrange(1, 6)}"]),
                location_ips=tuple(rng.sample(LOCATION_IPS, rng.choice([0, 0, 0, 1, 2]))))


def step(rng: random.Random, clusters: dict[str, tuple[int, list[Node]]], n: int) -> str:
    """One change to the remote clusters: a join, a leave, a changed record, a cluster that comes
    or goes, or a cluster id that collides with another's (then none of the claimants is admitted)."""
    what = rng.choice(["join", "join", "leave", "change", "change", "cluster", "id"])
    name = rng.choice(sorted(clusters)) if clusters else ""
    if what == "cluster" or not clusters:
        c = f"cluster{rng.randrange(2, 7)}"
        if c in clusters:
            del clusters[c]
            return f"{c} goes"
        clusters[c] = (int(c[7:]), [random_node(rng, f"n{n}")])
        return f"{c} comes"
    cid, nodes = clusters[name]
    if what == "id":
        clusters[name] = (rng.choice([int(name[7:]), 2, 3]), nodes)
        return f"{name} id {clusters[name][0]}"
    if what == "leave" and nodes:
        nodes.pop(rng.randrange(len(nodes)))
        return f"{name} leave"
    if what == "change" and nodes:
        i = rng.randrange(len(nodes))
        nodes[i] = random_node(rng, nodes[i].name)
        return f"{name} change"
    nodes.insert(rng.randrange(len(nodes) + 1), random_node(rng, f"n{n}"))
    return f"{name} join"


@pytest.mark.parametrize("seed", range(12), ids=[f"sequence {i}" for i in range(12)])
def test_memoised_admission_equals_scratch_over_random_changes(seed: int) -> None:
    rng = random.Random(seed)
    local_nodes = [node("l1", "10.44.1.0/24", 3, location="a", internal="10.10.0.3/24"),
                   node("l2", "10.42.0.0/24", 30, endpoint="203.0.113.2", location_ips=("192.168.1.0/24",))]
    local = local_topo(*local_nodes)
    clusters: dict[str, tuple[int, list[Node]]] = {}
    memo = RemoteAdmission()
    views: dict[str, Topology] = {}
    for n in range(60):
        if rng.random() < 0.1:  # a local change: the local layer differs
            local_nodes.append(random_node(rng, f"l{n}"))
            local = local_topo(*local_nodes, mesh=replace(LOCAL_MESH, allow_default_route=rng.random() < 0.5))
        else:
            step(rng, clusters, n)
        # Unchanged clusters keep their view objects, as the watcher hands them out.
        for c, (cid, nodes) in clusters.items():
            # Remote clusters of both addressings (each its own mesh.wireguard_addressing).
            new = remote(c, cid, *nodes, addressing="stable" if (cid + seed) % 2 else "index")
            if views.get(c) != new:
                views[c] = new
        views = {c: v for c, v in views.items() if c in clusters}
        same_as_scratch(memo, local, list(views.values()))


# --- named cases ------------------------------------------------------------------------------

C2 = [node("g1", "10.43.1.0/24", 11, location="x", internal="10.20.0.1/24"),
      node("g2", "10.43.2.0/24", 12, location="x", internal="10.20.0.2/24")]
C3 = [node("h1", "10.45.1.0/24", 21, location="y", internal="10.30.0.1/24")]
C4 = [node("k1", "10.46.1.0/24", 31, endpoint="203.0.113.40")]
LOCAL = [node("a1", "10.42.1.0/24", 1, location="loc", internal="10.10.1.11/24")]


def joined(nodes: list[Node], *more: Node) -> list[Node]:
    return [*nodes, *more]


# (name, remote clusters before, after, clusters admitted anew, rejections after (name, text in reason))
CASES = [
    ("a join in the last cluster re-admits only it",
     {"cluster2": C2, "cluster3": C3, "cluster4": C4},
     {"cluster2": C2, "cluster3": C3, "cluster4": joined(C4, node("k2", "10.46.2.0/24", 32))},
     ["cluster4"], []),
    ("a join in the first cluster re-admits only it",
     {"cluster2": C2, "cluster3": C3, "cluster4": C4},
     {"cluster2": joined(C2, node("g3", "10.43.3.0/24", 13, location="x", internal="10.20.0.3/24")),
      "cluster3": C3, "cluster4": C4},
     ["cluster2"], []),
    ("a leave re-admits only its cluster",
     {"cluster2": C2, "cluster3": C3}, {"cluster2": C2[:1], "cluster3": C3}, ["cluster2"], []),
    ("nothing changed: nothing admitted anew",
     {"cluster2": C2, "cluster3": C3}, {"cluster2": C2, "cluster3": C3}, [], []),
    ("a pod CIDR claimed across two clusters: the later cluster's record is rejected",
     {"cluster2": C2, "cluster3": C3},
     {"cluster2": C2, "cluster3": joined(C3, node("h2", "10.43.1.0/24", 22))},
     ["cluster3"], [("cluster3/h2", "cluster2/g1's pod CIDR 10.43.1.0/24")]),
    ("the earlier cluster takes a pod CIDR the later one holds: the later one's record goes",
     {"cluster2": C2, "cluster3": joined(C3, node("h2", "10.43.9.0/24", 22))},
     {"cluster2": joined(C2, node("g9", "10.43.9.0/24", 19)), "cluster3": joined(C3, node("h2", "10.43.9.0/24", 22))},
     ["cluster2", "cluster3"], [("cluster3/h2", "cluster2/g9's pod CIDR 10.43.9.0/24")]),
    ("a key claimed across two clusters: the later record is rejected",
     {"cluster2": C2, "cluster3": C3},
     {"cluster2": C2, "cluster3": joined(C3, node("h2", "10.45.2.0/24", 11))},
     ["cluster3"], [("cluster3/h2", "already the key of node cluster2/g1")]),
    ("the holder of a conflicting claim leaves: the other cluster's record is admitted again",
     {"cluster2": joined(C2, node("g9", "10.43.9.0/24", 19)), "cluster3": joined(C3, node("h2", "10.43.9.0/24", 22))},
     {"cluster2": C2, "cluster3": joined(C3, node("h2", "10.43.9.0/24", 22))},
     ["cluster2", "cluster3"], []),
    ("a location IP covering another cluster's endpoint is rejected",
     {"cluster2": C2, "cluster4": C4},
     {"cluster2": C2, "cluster4": joined(C4, node("k2", "10.46.2.0/24", 32, location_ips=("203.0.113.0/24",)))},
     ["cluster4"], [("cluster4/k2", "covers cluster4/k1's endpoint")]),
    ("a cluster that goes frees its claims for a later cluster",
     {"cluster2": joined(C2, node("g9", "10.43.9.0/24", 19)), "cluster3": joined(C3, node("h2", "10.43.9.0/24", 22)),
      "cluster4": C4},
     {"cluster3": joined(C3, node("h2", "10.43.9.0/24", 22)), "cluster4": C4},
     ["cluster3"], []),
]


@pytest.mark.parametrize("name,before,after,readmitted,rejected", CASES, ids=[c[0] for c in CASES])
def test_memo_readmits_only_what_a_change_can_affect(name: str, before: dict[str, list[Node]],
                                                     after: dict[str, list[Node]], readmitted: list[str],
                                                     rejected: list[tuple[str, str]]) -> None:
    local = local_topo(*LOCAL)
    ids = {"cluster2": 2, "cluster3": 3, "cluster4": 4}
    views = {c: remote(c, ids[c], *nodes) for c, nodes in before.items()}
    memo = RemoteAdmission()
    same_as_scratch(memo, local, list(views.values()))
    # A cluster whose records did not change keeps its view object (as the watcher's snapshot does).
    views = {c: views[c] if c in views and before[c] == nodes else remote(c, ids[c], *nodes)
             for c, nodes in after.items()}
    same_as_scratch(memo, local, list(views.values()))
    assert memo.readmitted == readmitted
    got = memo.admit(local, list(views.values()))[1]
    assert len(got) == len(rejected), got
    for (want_name, text), r in zip(rejected, got, strict=True):
        assert r.name == want_name and text in r.reason, r


def test_a_local_change_readmits_only_the_clusters_it_touches() -> None:
    memo = RemoteAdmission()
    views = [remote("cluster2", 2, *C2), remote("cluster3", 3, *C3)]
    same_as_scratch(memo, local_topo(*LOCAL), views)
    # A new local node holding cluster3's pod CIDR: cluster3's record is rejected, cluster2 reused.
    local = local_topo(*LOCAL, node("a2", "10.45.1.0/24", 2))
    same_as_scratch(memo, local, views)
    assert memo.readmitted == ["cluster3"]
