# SPDX-License-Identifier: Apache-2.0
"""Segment WireGuard addresses (docs/mesh.md, "WireGuard addresses"): `mesh.wireguard_addressing`
`index` (Kilo's, the default: the i-th segment by key takes the subnet's address i+1) and `stable`
(each segment's address from a hash of its key, collisions to the next free address). Stable
addresses are the same in any record order, a join moves no existing segment's address unless it
collides with it, both families hold it, and a remote cluster's addresses follow that cluster's
own published setting, with admission's checks on them unchanged."""

from __future__ import annotations

import copy
import ipaddress
import random
from pathlib import Path
from typing import Any

import pytest

from meshctl.errors import InputError
from meshctl.mesh.admit import admit_remotes
from meshctl.mesh.model import Topology
from meshctl.mesh.plan import plan_node
from meshctl.mesh.records import mesh_to_record, parse_mesh, parse_topology
from meshctl.mesh.segments import segment_offsets, segments

from .fixtures import KILO_CLASSIC, key
from .test_errors_teach import one_error, run, write

V4, V6 = "10.4.0.0/16", "fd04::/64"


def node(i: int, name: str | None = None, **extra: Any) -> dict[str, Any]:
    """Node i (`n<i>` unless named), one pod CIDR per family, a public endpoint."""
    return {"name": name or f"n{i}", "pod_cidrs": [f"10.42.{i}.0/24", f"fd42:0:0:{i}::/64"], "public_key": key(i + 1),
            "endpoint": f"198.51.{100 + i // 250}.{1 + i % 250}:51820", **extra}


def doc(nodes: list[dict[str, Any]], addressing: str | None = "stable", subnet: str = V4,
        subnet6: str | None = V6, granularity: str = "full", cluster: str = "c1", cid: int = 1) -> dict[str, Any]:
    mesh: dict[str, Any] = {"granularity": granularity, "subnet": subnet}
    if subnet6:
        mesh["subnet6"] = subnet6
    if addressing is not None:
        mesh["wireguard_addressing"] = addressing
    return {"cluster": {"name": cluster, "id": cid}, "mesh": mesh, "nodes": nodes}


def addresses(d: dict[str, Any]) -> dict[str, tuple[str, ...]]:
    """Segment key -> its WireGuard addresses (one per family), as every node derives them."""
    return {s.key: tuple(str(a) for a in s.addresses) for s in segments(parse_topology(d))}


def moved(before: dict[str, tuple[str, ...]], after: dict[str, tuple[str, ...]]) -> set[str]:
    return {k for k, a in before.items() if after[k] != a}


def alone(name: str, usable_subnet: str) -> int:
    """The offset a node's segment (full granularity) takes when it is alone: its home + 1."""
    return segment_offsets([f"node:{name}"], "stable", ipaddress.ip_network(usable_subnet))[0]


BASE = [node(i) for i in range(40)]


@pytest.mark.parametrize("addressing", ["stable", "index"])
def test_the_same_records_in_any_order_give_the_same_addresses(addressing: str) -> None:
    want = addresses(doc(BASE, addressing))
    rng = random.Random(23)
    for _ in range(5):
        shuffled = BASE[:]
        rng.shuffle(shuffled)
        assert addresses(doc(shuffled, addressing)) == want
    flat = [a for both in want.values() for a in both]
    assert len(set(flat)) == len(flat), "two segments share an address"


# Joiners named so their keys sort first, in the middle and last among n0..n39.
JOINS = [("sorts first", "a-new"), ("sorts in the middle", "n2-new"), ("sorts last", "zz-new")]


@pytest.mark.parametrize("case, joiner", JOINS, ids=[c for c, _ in JOINS])
def test_a_join_in_stable_mode_moves_no_existing_address(case: str, joiner: str) -> None:
    before = addresses(doc(BASE))
    after = addresses(doc([*BASE, node(40, joiner)]))
    assert moved(before, after) == set(), case
    new = after[f"node:{joiner}"]
    assert new not in before.values()
    assert ipaddress.ip_interface(new[0]).ip in ipaddress.ip_network(V4)
    assert ipaddress.ip_interface(new[1]).ip in ipaddress.ip_network(V6)
    # ... and a leave moves none either
    assert moved(after, before | {f"node:{joiner}": new}) == set()


@pytest.mark.parametrize("case, joiner, moves", [
    ("sorts first: every later segment moves", "a-new", 40),
    ("sorts last: none moves", "zz-new", 0),
], ids=["sorts first", "sorts last"])
def test_index_mode_is_kilos_numbering_unchanged(case: str, joiner: str, moves: int) -> None:
    before = addresses(doc(BASE, addressing=None))
    assert before == addresses(doc(BASE, addressing="index"))
    for i, k in enumerate(sorted(before)):
        assert before[k] == (f"10.4.0.{i + 1}/16", f"fd04::{i + 1:x}/64")
    assert len(moved(before, addresses(doc([*BASE, node(40, joiner)], addressing=None)))) == moves, case


def test_kilo_classic_keeps_its_addresses_by_default() -> None:
    """The default mesh (no wireguard_addressing) is numbered as before this setting existed."""
    got = {s.key: str(s.wireguard_ip) for s in segments(parse_topology(KILO_CLASSIC))}
    assert got == {"location:aws": "10.4.0.1/16", "location:gcp": "10.4.0.2/16", "node:d": "10.4.0.3/16"}


def colliding(subnet: str, taken: list[str], pool: list[str]) -> tuple[str, str]:
    """From `pool`, a name whose home is that of the first of `taken` and that sorts before it
    (a joiner that collides on purpose), and that first name."""
    target = taken[0]
    hit = next(n for n in pool if alone(n, subnet) == alone(target, subnet) and n < target)
    return hit, target


def test_a_colliding_join_moves_only_the_segments_it_collides_with() -> None:
    """A /28 (14 usable addresses) and three nodes with distinct homes far apart: a joiner whose
    home is one node's takes it (it sorts first) and that node moves to the next free address;
    the other two stay."""
    subnet = "10.9.0.0/28"
    pool = [f"p{i}" for i in range(400)]
    homes: dict[int, str] = {}
    for n in pool:
        homes.setdefault(alone(n, subnet), n)
    spread = [homes[h] for h in sorted(homes)][::4][:3]  # three homes at least 4 apart
    assert len(spread) == 3
    joiner, victim = colliding(subnet, spread, [n for n in pool if n not in spread])
    nodes = [node(i, n) for i, n in enumerate(spread)]
    before = addresses(doc(nodes, subnet=subnet, subnet6=None))
    after = addresses(doc([*nodes, node(9, joiner)], subnet=subnet, subnet6=None))
    assert moved(before, after) == {f"node:{victim}"}
    assert after[f"node:{joiner}"] == before[f"node:{victim}"]
    offset = int(ipaddress.ip_interface(after[f"node:{victim}"][0]).ip) - int(ipaddress.ip_network(subnet)[0])
    assert offset == alone(victim, subnet) + 1  # the next free address after its home


def test_a_full_subnet_in_stable_mode_wraps_and_stays_unique() -> None:
    """Every usable address taken (a /29: 6 of them, 6 segments): each address once, none the
    network address or the last one."""
    nodes = [node(i) for i in range(6)]
    got = addresses(doc(nodes, subnet="10.9.0.0/29", subnet6=None))
    assert sorted(got.values()) == [(f"10.9.0.{i}/29",) for i in range(1, 7)]
    with pytest.raises(InputError, match=r"mesh.subnet: '10.9.0.0/29' has no room for 7 segments"):
        addresses(doc([*nodes, node(6)], subnet="10.9.0.0/29", subnet6=None))


def test_location_granularity_hashes_the_location_not_its_nodes() -> None:
    """A node joining an existing location moves nothing; a new location moves nothing."""
    nodes = [node(i, location=f"l{i % 5}", internal_ip=f"10.20.{i % 5}.{i + 1}/24") for i in range(20)]
    before = addresses(doc(nodes, granularity="location"))
    assert set(before) == {f"location:l{i}" for i in range(5)}
    grown = [*nodes, node(20, location="l3", internal_ip="10.20.3.99/24"),
             node(21, location="a-new", internal_ip="10.20.9.1/24")]
    after = addresses(doc(grown, granularity="location"))
    assert moved(before, after) == set() and len(after) == 6


def test_the_plan_names_the_stable_addresses_on_both_ends() -> None:
    """What node a plans for b (b's allowed IPs, the route's gateway) is the address b plans for
    itself, in both families."""
    t = parse_topology(doc(BASE[:6]))
    a, b = plan_node(t, "n0"), plan_node(t, "n1")
    seg = next(s for s in segments(t) if s.key == "node:n1")
    assert b.device_addresses == seg.addresses and len(seg.addresses) == 2
    peer = next(p for p in a.peers if p.name == "n1")
    assert set(seg.hosts) <= set(peer.allowed_ips)
    pods = set(parse_topology(doc(BASE[:6])).nodes[1].pod_cidrs)
    assert {r.via for r in a.routes if r.dst in pods} == {x.ip for x in seg.addresses}


# --- parsing -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value, want", [(None, "index"), ("index", "index"), ("stable", "stable")],
                         ids=["absent", "index", "stable"])
def test_the_setting_parses_and_is_written_only_when_stable(value: str | None, want: str) -> None:
    m = parse_mesh({} if value is None else {"wireguard_addressing": value}, "mesh")
    assert m.wireguard_addressing == want
    rec = mesh_to_record(m)
    assert ("wireguard_addressing" in rec) == (want == "stable")  # agents before the field read index meshes
    assert parse_mesh(rec, "mesh") == m


@pytest.mark.parametrize("value", ["hashed", "", 1, "Stable"])
def test_a_bad_value_is_one_line_naming_the_field(value: Any) -> None:
    with pytest.raises(InputError) as e:
        parse_mesh({"wireguard_addressing": value}, "mesh")
    assert str(e.value).startswith("mesh.wireguard_addressing: ")
    assert "is not one of index, stable" in str(e.value)


def test_plan_command_exits_2_on_a_bad_value(tmp_path: Path) -> None:
    d = copy.deepcopy(KILO_CLASSIC)
    d["mesh"]["wireguard_addressing"] = "hashed"
    line = one_error(run("plan", "-f", write(tmp_path, d), "--node", "a"))
    assert "mesh.wireguard_addressing: 'hashed' is not one of index, stable" in line


# --- remote clusters: their own setting, admission's checks ------------------------------------


def remote(nodes: list[dict[str, Any]], name: str = "c2", cid: int = 2, subnet: str = "10.5.0.0/16",
           addressing: str = "stable") -> Topology:
    return parse_topology(doc(nodes, addressing, subnet=subnet, subnet6=None, cluster=name, cid=cid))


def rnode(i: int, name: str, **extra: Any) -> dict[str, Any]:
    """A remote node: pod CIDRs and keys apart from the local BASE nodes'."""
    return {"name": name, "pod_cidr": f"10.43.{i}.0/24", "public_key": key(500 + i),
            "endpoint": f"203.0.113.{1 + i}:51820", **extra}


def test_a_remote_clusters_addresses_follow_its_own_setting() -> None:
    """The local mesh is `index`, the remote `stable`: the local plan gives each remote peer the
    address the remote node plans for itself."""
    local = parse_topology(doc(BASE[:3], addressing=None, subnet6=None))
    rt = remote([rnode(i, f"r{i}") for i in range(5)])
    remotes, rejected = admit_remotes(local, [rt])
    assert rejected == []
    p = plan_node(local, "n0", remotes)
    for i in range(5):
        own = plan_node(rt, f"r{i}").wireguard_ip
        peer = next(x for x in p.peers if x.name == f"c2/r{i}")
        assert ipaddress.ip_network(f"{own.ip}/32") in peer.allowed_ips
    index_addrs = {str(s.wireguard_ip) for s in segments(remote([rnode(i, f"r{i}") for i in range(5)],
                                                              addressing="index"))}
    assert {str(s.wireguard_ip) for s in segments(rt)} != index_addrs


def test_admission_rejects_a_remote_stable_address_that_is_a_local_internal_address() -> None:
    rt = remote([rnode(i, f"r{i}") for i in range(3)])
    wg = next(s.wireguard_ip for s in segments(rt) if s.key == "node:r1")
    local_nodes = [*BASE[:2], node(2, internal_ip=f"{wg.ip}/24")]
    local = parse_topology(doc(local_nodes, addressing=None, subnet6=None))
    remotes, rejected = admit_remotes(local, [rt])
    assert [r.name for r in rejected] == ["c2/r1"]
    assert f"wireguard_ip: '{wg.ip}' is the internal address of local node n2" in rejected[0].reason
    assert remotes[0].admitted == {"r0", "r2"}


def test_admission_rejects_a_remote_stable_address_another_cluster_holds() -> None:
    """Two remote clusters share a WireGuard subnet (a mistake): a segment whose key is the same
    in both hashes to the same address, so the second cluster's record is turned away."""
    local = parse_topology(doc(BASE[:2], addressing=None, subnet6=None))
    c2 = remote([rnode(1, "same"), rnode(2, "x2")])
    c3 = remote([rnode(3, "same"), rnode(4, "x4")], name="c3", cid=3)
    _, rejected = admit_remotes(local, [c2, c3])
    same = next(s.wireguard_ip for s in segments(c2) if s.key == "node:same")
    assert [r.name for r in rejected] == ["c3/same"]
    assert f"wireguard_ip: '{same.ip}' overlaps cluster c2's WireGuard address" in rejected[0].reason
