# SPDX-License-Identifier: Apache-2.0
"""A command given `--lab` reads that lab's own cluster(s) without `--cluster-name` (a lab whose
cluster is `obs` is not read as `default`), a lab of two clusters is drawn whole, and a cluster
name with no records is one line naming the clusters that have some, exit 2: never an empty
picture with exit 0. Against a real etcd in a namespace of this module, found through a lab
locator that knows only that etcd and the lab's cluster names (no lab is brought up)."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from meshctl.backends.etcd import cluster_prefix, node_key, write_topology
from meshctl.backends.file import load_topology
from meshctl.cli import main, targets
from meshctl.cli.plan import Source
from meshctl.cli.targets import AgentTarget, EtcdTarget, PinTarget
from meshctl.cli.ui import Live
from meshctl.lab.rigs.etcd_process import EtcdServer
from meshctl.mesh.model import Cluster, Topology
from meshctl.mesh.records import node_to_record
from meshctl.setns import in_netns
from tests.plain_etcd import plain_etcd
from tests.ui.helpers import free_port

pytestmark = pytest.mark.root

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    with plain_etcd("cl") as srv:
        yield srv


class OneEtcdLab:
    """A lab locator (cli.targets.LabLocator) whose clusters all live in one etcd."""

    def __init__(self, etcd: EtcdServer, clusters: tuple[str, ...]) -> None:
        self.srv, self.names = etcd, clusters

    def etcd(self, lab: str | None, cluster: str | None) -> EtcdTarget:
        return EtcdTarget((self.srv.url,), None, None, None, self.srv.netns)

    def clusters(self, lab: str | None) -> tuple[str, ...]:
        return self.names

    def agent(self, lab: str | None, node: str) -> AgentTarget:
        raise AssertionError("no agent is asked")

    def pins(self, lab: str | None, node: str) -> PinTarget | None:
        raise AssertionError("no pins are read")

    def nodes(self, lab: str | None) -> tuple[str, ...]:
        return ()

    def pods(self, lab: str | None) -> dict[str, str]:
        return {}


def seed(etcd: EtcdServer, *topos: Topology) -> None:
    """The etcd holds exactly these clusters' records."""
    c = etcd.client()
    try:
        c.delete("/meshctl/", prefix=True)
        for t in topos:
            c.delete(cluster_prefix(t.cluster.name), prefix=True)
            write_topology(c, t.cluster, t.mesh)
            for n in t.nodes:
                c.put(node_key(t.cluster.name, n.name), json.dumps(node_to_record(n)))
    finally:
        c.close()


def example(name: str, cluster: str, cid: int) -> Topology:
    """An example topology as cluster `cluster`, its pod CIDRs moved to 10.<40+cid>.i.0/24 and its
    WireGuard subnet to 10.<cid>.0.0/16, so two clusters' never overlap."""
    t = load_topology(EXAMPLES / name)
    nodes = tuple(replace(n, pod_cidrs=(ipaddress.ip_network(f"10.{40 + cid}.{i}.0/24"),))
                  for i, n in enumerate(t.nodes))
    mesh = replace(t.mesh, subnet=ipaddress.ip_network(f"10.{cid}.0.0/16"))
    return replace(t, cluster=Cluster(cluster, cid), nodes=nodes, mesh=mesh)


@pytest.fixture()
def lab(monkeypatch: pytest.MonkeyPatch, etcd: EtcdServer) -> Iterator[list[str]]:
    """The lab's cluster names (the test sets them); commands run here, nothing forwarded."""
    names: list[str] = []
    monkeypatch.setattr(targets, "_forwarder", [])

    class Lab(OneEtcdLab):
        def clusters(self, lab: str | None) -> tuple[str, ...]:
            return tuple(names)

    monkeypatch.setattr(targets, "_locator", [Lab(etcd, ())])
    yield names


def meshctl(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def test_graph_and_plan_read_the_labs_own_cluster(etcd: EtcdServer, lab: list[str]) -> None:
    obs = example("cross-mesh.yaml", "obs", 1)
    seed(etcd, obs)
    lab[:] = ["obs"]
    res = meshctl("graph", "--backend", "etcd", "--lab", "ob", "-o", "json")
    assert res.exit_code == 0, res.output
    model = json.loads(res.stdout)
    assert model["cluster"] == "obs" and {n["name"] for n in model["nodes"]} == {n.name for n in obs.nodes}
    first = obs.nodes[0].name
    res = meshctl("plan", "--lab", "ob", "--node", first, "-o", "json")
    assert res.exit_code == 0 and json.loads(res.stdout)["node"] == first, res.output
    src = Source(None, None, None, "ob", "", None, None, None, None)
    assert src.clusters == ("obs",)
    assert len(Live(src, "ob").start().nodes) == len(obs.nodes)  # what `meshctl ui --lab ob` serves


def test_a_cluster_without_records_is_one_line_naming_those_with_some(etcd: EtcdServer, lab: list[str]) -> None:
    seed(etcd, example("cross-mesh.yaml", "obs", 1))
    lab[:] = ["obs"]
    for argv in (["graph", "--lab", "ob", "--live", "--cluster-name", "default"],
                 ["plan", "--lab", "ob", "--node", "x", "--cluster-name", "default"],
                 ["mesh", "get", "--lab", "ob", "--cluster-name", "default"],
                 ["node", "list", "--lab", "ob", "--cluster-name", "default"],
                 ["ui", "--lab", "ob", "--cluster-name", "default", "--listen", f"127.0.0.1:{free_port()}"]):
        res = meshctl(*argv)
        assert res.exit_code == 2, (argv, res.output)
        assert res.stderr.splitlines() == [
            "error: --cluster-name: 'default' has no records in this etcd (clusters with records: obs)"], argv
    # an etcd given by its flags, with no lab: the same line for the default cluster
    res = in_netns(etcd.netns, lambda: meshctl("graph", "--backend", "etcd", "--etcd-endpoints", etcd.url))
    assert res.exit_code == 2 and "'default' has no records in this etcd (clusters with records: obs)" in res.stderr


def test_a_lab_of_two_clusters_is_drawn_whole_and_plan_finds_the_nodes_cluster(etcd: EtcdServer,
                                                                                lab: list[str]) -> None:
    one = example("cross-mesh.yaml", "c1", 1)
    two = example("hetzner-private-network.yaml", "c2", 2)
    seed(etcd, one, two)
    lab[:] = ["c1", "c2"]
    res = meshctl("graph", "--lab", "mc", "-o", "json")
    assert res.exit_code == 0 and "rejected" not in res.stderr, res.output
    model = json.loads(res.stdout)
    assert model["clusters"] == ["c1", "c2"]
    assert {n["name"] for n in model["nodes"]} >= {n.name for n in one.nodes} | {f"c2/{n.name}" for n in two.nodes}
    res = meshctl("plan", "--lab", "mc", "--node", two.nodes[0].name, "-o", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["node"] == two.nodes[0].name
    # a command about one cluster's records does not pick one: it asks, naming them
    for argv in (["mesh", "get", "--lab", "mc"], ["mesh", "set", "--lab", "mc", "port=51821"],
                 ["node", "list", "--lab", "mc"]):
        res = meshctl(*argv)
        assert res.exit_code == 2 and res.stderr.splitlines() == [
            "error: --cluster-name: is required: the lab has clusters c1, c2"], (argv, res.output)
    res = meshctl("mesh", "get", "--lab", "mc", "--cluster-name", "c2", "-o", "json")
    assert res.exit_code == 0 and json.loads(res.stdout)["subnet"] == "10.2.0.0/16", res.output
