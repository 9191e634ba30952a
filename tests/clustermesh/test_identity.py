# SPDX-License-Identifier: Apache-2.0
"""Cluster identities: which remote clusters are refused for a colliding name or id, and which
changes of the local identity an agent refuses at start."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from meshctl.agent.identity import IDENTITY_FILE, check_identity, identity_change, load_identity
from meshctl.errors import InputError
from meshctl.etcd import KeyValue
from meshctl.mesh.admit import admit_remotes, identity_refusals
from meshctl.mesh.model import Cluster
from meshctl.mesh.records import parse_topology
from tests.plan.fixtures import key

from .fixtures import CLUSTER1, CLUSTER2

LOCAL = Cluster("cluster1", 1)


@pytest.mark.parametrize(("remotes", "refused"), [
    pytest.param([Cluster("cluster2", 2), Cluster("cluster3", 3)], {}, id="distinct"),
    pytest.param([Cluster("cluster2", 1)], {"cluster2": "cluster.id: 1 is already used by cluster cluster1"},
                 id="local-id"),
    pytest.param([Cluster("cluster1", 7)], {"cluster1": "cluster.name: 'cluster1' is the local cluster's name"},
                 id="local-name"),
    pytest.param([Cluster("cluster2", 5), Cluster("cluster3", 5), Cluster("cluster4", 4)],
                 {"cluster2": "cluster.id: 5 is claimed by cluster2 and cluster3: none is admitted",
                  "cluster3": "cluster.id: 5 is claimed by cluster2 and cluster3: none is admitted"},
                 id="two-remotes-one-id"),
    pytest.param([Cluster("cluster2", 5), Cluster("cluster2", 6)],
                 {"cluster2": "cluster.name: 'cluster2' is claimed by 2 clusters (ids 5, 6): none is admitted"},
                 id="two-remotes-one-name"),
])
def test_identity_refusals(remotes: list[Cluster], refused: dict[str, str]) -> None:
    got = identity_refusals(LOCAL, remotes)
    assert set(got) == set(refused)
    for name, start in refused.items():
        assert got[name].startswith(start), got[name]


def test_two_remotes_with_one_id_are_both_refused_and_admitted_again_once_one_changes() -> None:
    c3 = copy.deepcopy(CLUSTER2)
    c3["cluster"] = {"name": "cluster3", "id": 2}
    c3["mesh"]["subnet"] = "10.6.0.0/16"
    for i, n in enumerate(c3["nodes"]):
        n["internal_ip"], n["pod_cidr"] = f"10.30.0.{i + 1}/24", f"10.44.{i + 1}.0/24"
        n.pop("endpoint", None)
        n["public_key"] = key(30 + i)
    local = parse_topology(CLUSTER1)
    remotes, rejected = admit_remotes(local, [parse_topology(CLUSTER2), parse_topology(c3)])
    assert remotes == []
    assert {r.name for r in rejected} == {"cluster2", "cluster3"}
    assert all("claimed by cluster2 and cluster3" in r.reason for r in rejected)
    c3["cluster"]["id"] = 3   # resolved: the next admission takes both, nothing remembered
    remotes, rejected = admit_remotes(local, [parse_topology(CLUSTER2), parse_topology(c3)])
    assert sorted(r.topology.cluster.name for r in remotes) == ["cluster2", "cluster3"] and rejected == []


@pytest.mark.parametrize(("want", "ran_under", "published", "line"), [
    pytest.param(Cluster("cluster1", 1), None, None, None, id="first-start"),
    pytest.param(Cluster("cluster1", 1), Cluster("cluster1", 1), 1, None, id="same"),
    pytest.param(Cluster("cluster1", 1), None, 1, None, id="first-start-on-this-node"),
    pytest.param(Cluster("cluster1", 9), Cluster("cluster1", 1), 1,
                 "cluster_id: 9 differs from 1, the id cluster 'cluster1' runs under", id="id-vs-published"),
    pytest.param(Cluster("cluster1", 9), None, 1,
                 "cluster_id: 9 differs from 1, the id cluster 'cluster1' runs under", id="new-node-wrong-id"),
    pytest.param(Cluster("cluster1", 9), Cluster("cluster1", 1), None,
                 "cluster_id: 9 differs from 1, the id this node's agent ran cluster 'cluster1' under",
                 id="id-vs-saved"),
    pytest.param(Cluster("cluster9", 1), Cluster("cluster1", 1), None,
                 "cluster name: 'cluster9' differs from 'cluster1', the name this node's agent ran under",
                 id="name"),
])
def test_identity_change(want: Cluster, ran_under: Cluster | None, published: int | None, line: str | None) -> None:
    err = identity_change(want, ran_under, published)
    if line is None:
        assert err is None
        return
    assert err is not None
    assert str(err).startswith(line), str(err)
    assert "docs/clustermesh.md, 'Changing a cluster's name or id'" in str(err)
    assert "\n" not in str(err)


class Records:
    """An etcd's keys, for the one read the check makes."""

    def __init__(self, kvs: dict[str, str]) -> None:
        self.kvs = kvs

    def get(self, key: str) -> KeyValue | None:
        v = self.kvs.get(key)
        return None if v is None else KeyValue(key, v.encode(), 1, 1)


def test_check_identity_saves_then_refuses_a_change(tmp_path: Path) -> None:
    etcd = Records({"/meshctl/cluster1/cluster": json.dumps({"name": "cluster1", "id": 1, "subnet": "10.4.0.0/16"})})
    check_identity(tmp_path, Cluster("cluster1", 1), etcd, "/meshctl/cluster1/cluster")
    assert load_identity(tmp_path) == Cluster("cluster1", 1)
    with pytest.raises(InputError, match=r"^cluster_id: 2 differs from 1"):
        check_identity(tmp_path, Cluster("cluster1", 2), etcd, "/meshctl/cluster1/cluster")
    with pytest.raises(InputError, match=r"^cluster name: 'renamed' differs from 'cluster1'"):
        check_identity(tmp_path, Cluster("renamed", 1), Records({}), "/meshctl/renamed/cluster")
    assert load_identity(tmp_path) == Cluster("cluster1", 1)  # a refused start saves nothing
    (tmp_path / IDENTITY_FILE).write_text("not json")
    check_identity(tmp_path, Cluster("cluster1", 1), etcd, "/meshctl/cluster1/cluster")  # unreadable: as new
    assert load_identity(tmp_path) == Cluster("cluster1", 1)
