# SPDX-License-Identifier: Apache-2.0
"""A node's pod CIDRs (`pod_cidrs`, one per family; `pod_cidr`, its one-element form) as a topology
file and an etcd backend give them: what plans, and the one line a bad one gets. A file's bad
record stops `meshctl plan -f` (exit 2); a backend's is rejected alone and counted, the rest of the
mesh goes on. An etcd record may hold any number of one family (a CNI's IPAM blocks): each is
routed, allowed and gets its fast-path entry."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from meshctl.backends.etcd import EtcdBackend, node_key
from meshctl.etcd.client import KeyValue
from meshctl.mesh.model import Cluster, Topology
from meshctl.mesh.plan import plan_node
from meshctl.mesh.records import parse_topology

from .fixtures import KILO_CLASSIC, key
from .test_cli_plan import run, write

V4, V6 = "10.2.4.0/24", "fd00:2:4::/64"


def with_d(**fields: Any) -> dict[str, Any]:
    """KILO_CLASSIC with node d's (nodes[3]) pod CIDR fields replaced by `fields`."""
    doc = copy.deepcopy(KILO_CLASSIC)
    d = doc["nodes"][3]
    d.pop("pod_cidr")
    d.update(fields)
    return doc


def plan_of(tmp_path: Path, doc: dict[str, Any], node: str = "a") -> dict[str, Any]:
    r = run("plan", "-f", write(tmp_path, doc), "--node", node, "-o", "json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def towards_d(plan: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """a's routes, the allowed IPs of its WireGuard peer d, and its fast-path prefixes, inside d's CIDRs."""
    def ours(c: str) -> bool:
        return c.startswith(("10.2.4.", "10.2.5.", "fd00:2:4:"))
    peer = next(p for p in plan["peers"] if p["name"] == "d")
    return (sorted(r["dst"] for r in plan["routes"] if ours(r["dst"])),
            sorted(a for a in peer["allowed_ips"] if ours(a)),
            sorted(e["prefix"] for e in plan["fastpath"] if ours(e["prefix"])))


@pytest.mark.parametrize("fields, want", [
    pytest.param({"pod_cidrs": [V4, V6]}, [V4, V6], id="pod_cidrs in both families"),
    pytest.param({"pod_cidrs": [V6, V4]}, [V4, V6], id="pod_cidrs in both families, v6 first"),
    pytest.param({"pod_cidr": V4}, [V4], id="pod_cidr alone"),
    pytest.param({"pod_cidrs": [V4]}, [V4], id="pod_cidrs of one"),
    pytest.param({"pod_cidrs": f"{V4},{V6}"}, [V4, V6], id="pod_cidrs as a comma-separated string"),
])
def test_file_pod_cidrs_are_each_routed_allowed_and_fast_pathed(tmp_path: Path, fields: dict[str, Any],
                                                                want: list[str]) -> None:
    routes, allowed, fastpath = towards_d(plan_of(tmp_path, with_d(**fields)))
    assert routes == want and allowed == want and fastpath == want


def test_pod_cidr_is_the_one_element_form_of_pod_cidrs(tmp_path: Path) -> None:
    assert plan_of(tmp_path, with_d(pod_cidr=V4)) == plan_of(tmp_path, with_d(pod_cidrs=[V4]))


# (fields of node d, the one line); for a file, exit 2 with `error: topo.yaml: <line>`.
BAD: list[Any] = [
    pytest.param({"pod_cidr": V4, "pod_cidrs": [V4, V6]},
                 f"nodes[3].pod_cidr: '{V4}' is given with pod_cidrs: write one of them", id="both keys given"),
    pytest.param({"pod_cidrs": [V4, "10.2.5.0/24"]},
                 f"nodes[3].pod_cidrs[1]: '10.2.5.0/24' is a second IPv4 pod CIDR (after {V4}): one per family",
                 id="two CIDRs of one family"),
    pytest.param({"pod_cidrs": [V4, "fd00:2:4::/129"]}, "nodes[3].pod_cidrs[1]: 'fd00:2:4::/129' is not a CIDR",
                 id="a /129"),
    pytest.param({"pod_cidr": "fd00:2:4::/129"}, "nodes[3].pod_cidr: 'fd00:2:4::/129' is not a CIDR",
                 id="a /129 as pod_cidr"),
    pytest.param({"pod_cidrs": [V4, "fd00:2:4::%eth0/64"]},
                 "nodes[3].pod_cidrs[1]: 'fd00:2:4::%eth0/64' has a zone index (%...): write the address without it",
                 id="a zone index in a pod CIDR"),
    pytest.param({"pod_cidr": V4, "internal_ip": "fe80::4%eth0/64"},
                 "nodes[3].internal_ip: 'fe80::4%eth0/64' has a zone index (%...): write the address without it",
                 id="a zone index in an internal address"),
    pytest.param({"pod_cidrs": []}, "nodes[3].pod_cidrs: [] is empty (a node needs a pod CIDR)", id="no pod CIDR"),
    pytest.param({}, "nodes[3].pod_cidrs: is required", id="neither key"),
]


@pytest.mark.parametrize("fields, line", BAD)
def test_file_bad_pod_cidrs_are_one_line_exit_2(tmp_path: Path, fields: dict[str, Any], line: str) -> None:
    r = run("plan", "-f", write(tmp_path, with_d(**fields)), "--node", "a")
    assert r.exit_code == 2, r.output
    assert r.stderr == f"error: topo.yaml: {line}\n"
    assert "Traceback" not in r.output


# --- the etcd backend -------------------------------------------------------------------------

class ListedEtcd:
    """An etcd's keys for one consistent list (all EtcdBackend.load_once reads)."""

    def __init__(self, records: dict[str, Any]) -> None:
        self.kvs = [KeyValue(k, (v if isinstance(v, str) else json.dumps(v)).encode(), i + 1, i + 1)
                    for i, (k, v) in enumerate(records.items())]

    def range(self, key: str, *, prefix: bool = False, keys_only: bool = False) -> tuple[list[KeyValue], int]:
        return [kv for kv in self.kvs if kv.key.startswith(key) if prefix or kv.key == key], len(self.kvs)

    def close(self) -> None:
        pass


def etcd_records(extra: dict[str, Any]) -> dict[str, Any]:
    """KILO_CLASSIC's nodes as their agents publish them into cluster1's etcd, node d's record
    replaced by `extra`'s fields."""
    out: dict[str, Any] = {}
    for n in KILO_CLASSIC["nodes"]:
        rec = dict(n)
        if n["name"] == "d":
            rec.pop("pod_cidr")
            rec.update(extra)
        out[node_key("cluster1", n["name"])] = rec
    return out


def etcd_state(extra: dict[str, Any]):
    be = EtcdBackend(ListedEtcd(etcd_records(extra)), Cluster("cluster1", 1))  # type: ignore[arg-type]
    return be.load_once()


def etcd_line(line: str) -> str:
    """BAD's line as an etcd record's rejection names it: the key for the path."""
    return line.replace("nodes[3].", f"{node_key('cluster1', 'd')}.", 1)


@pytest.mark.parametrize("fields, line", [p for p in BAD if p.id != "two CIDRs of one family"])
def test_etcd_bad_pod_cidrs_reject_the_record_alone(fields: dict[str, Any], line: str) -> None:
    st = etcd_state(fields)
    assert [(r.name, r.reason) for r in st.rejections] == [("d", etcd_line(line))]
    assert [n.name for n in st.nodes] == ["a", "b", "c"]  # the rest of the mesh goes on


def test_etcd_record_with_two_ipv4_blocks_routes_both() -> None:
    """A CNI's IPAM gives a node two IPv4 blocks (Calico): the etcd record holds both, and every
    other node routes, allows and fast-paths each one."""
    blocks = ["10.2.4.0/26", "10.2.4.64/26"]
    st = etcd_state({"pod_cidrs": blocks})
    assert st.rejections == ()
    d = next(n for n in st.nodes if n.name == "d")
    assert [str(c) for c in d.pod_cidrs] == blocks
    doc = copy.deepcopy(KILO_CLASSIC)
    topo: Topology = parse_topology(doc)
    topo = Topology(topo.cluster, topo.mesh, st.nodes, topo.peers)
    for me in ("a", "c"):
        plan = plan_node(topo, me)
        assert [str(r.dst) for r in plan.routes if str(r.dst).startswith("10.2.4.")] == blocks, me
        peer = next(p for p in plan.peers if p.public_key == key(4))
        assert [str(a) for a in peer.allowed_ips if str(a).startswith("10.2.4.")] == blocks, me
        assert [str(e.prefix) for e in plan.fastpath if str(e.prefix).startswith("10.2.4.")] == blocks, me


def test_etcd_record_in_both_families_is_admitted_with_both() -> None:
    st = etcd_state({"pod_cidrs": [V4, V6]})
    assert st.rejections == ()
    assert [str(c) for c in next(n for n in st.nodes if n.name == "d").pod_cidrs] == [V4, V6]
