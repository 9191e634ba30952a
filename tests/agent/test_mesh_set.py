# SPDX-License-Identifier: Apache-2.0
"""`meshctl mesh set|get` against an etcd holding the records of the default and fabrics labs (the
lab files' nodes, with keys and public endpoints as the lab's agents publish them; no lab is
brought up): the dry-run diff equals the difference of `meshctl plan` before and after for every
node, and without --dry-run the record is written and read back."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from meshctl.backends.etcd import cluster_prefix, mesh_key, node_key, write_topology
from meshctl.cli import main
from meshctl.lab.namespaces.spec import PUBLIC_NET, load_lab
from meshctl.lab.rigs.etcd_process import EtcdServer
from meshctl.mesh.model import Endpoint
from meshctl.mesh.records import MESH_FIELDS, mesh_to_record, node_to_record, parse_mesh
from meshctl.setns import in_netns
from tests.plain_etcd import plain_etcd

pytestmark = pytest.mark.root

LABS = Path(__file__).resolve().parents[2] / "ctl" / "meshctl" / "lab" / "labs"


@pytest.fixture(scope="module")
def etcd() -> Iterator[EtcdServer]:
    """One plain etcd inside a namespace of this module, for every test here."""
    with plain_etcd("ms") as srv:
        yield srv


def lab_doc(name: str) -> dict[str, Any]:
    """A lab file's cluster as the records its agents publish: placeholder keys, public endpoints."""
    topo = load_lab(LABS / f"{name}.yaml").clusters[0]
    nodes = [replace(n, endpoint=Endpoint(str(PUBLIC_NET.network_address + 10 + i), topo.mesh.port))
             for i, n in enumerate(topo.nodes)]
    return {"cluster": {"name": topo.cluster.name, "id": topo.cluster.id}, "mesh": mesh_to_record(topo.mesh),
            "nodes": [node_to_record(n) for n in nodes]}


def seed(etcd: EtcdServer, doc: dict[str, Any], tmp_path: Path, name: str = "before.yaml") -> str:
    """The store holds exactly `doc`'s records; the same records as a topology file."""
    from meshctl.mesh.records import parse_topology

    topo = parse_topology(doc)
    c = etcd.client()
    try:
        c.delete(cluster_prefix(topo.cluster.name), prefix=True)
        write_topology(c, topo.cluster, topo.mesh)
        for rec in doc["nodes"]:
            c.put(node_key(topo.cluster.name, rec["name"]), json.dumps(rec))
    finally:
        c.close()
    return write(tmp_path, doc, name)


def write(tmp_path: Path, doc: dict[str, Any], name: str) -> str:
    f = tmp_path / name
    f.write_text(yaml.safe_dump(doc))
    return str(f)


def meshctl(etcd: EtcdServer, *args: str) -> Result:
    """`meshctl ARGS --etcd-endpoints URL`, run from the etcd's namespace."""
    return in_netns(etcd.netns, lambda: CliRunner().invoke(main, [*args, "--etcd-endpoints", etcd.url]))


def plan(f: str, node: str) -> tuple[dict[str, Any], dict[str, str]]:
    """`meshctl plan -f F --node N`: its JSON, and the PATHS table of its text (each node's rung)."""
    j = CliRunner().invoke(main, ["plan", "-f", f, "--node", node, "-o", "json"])
    t = CliRunner().invoke(main, ["plan", "-f", f, "--node", node])
    assert j.exit_code == 0 and t.exit_code == 0, j.output + t.output
    rows = t.stdout.split("\nPATHS\n", 1)[1].splitlines()[1:]
    return json.loads(j.stdout), dict(tuple(r.split()) for r in rows)  # type: ignore[misc]


def expected(before: tuple[dict[str, Any], dict[str, str]], after: tuple[dict[str, Any], dict[str, str]]
             ) -> dict[str, Any]:
    """A node's diff worked out from two `plan` outputs alone."""
    out: dict[str, Any] = {}
    for part, key in (("peers", "name"), ("routes", "dst"), ("fastpath", "prefix")):
        old, new = ({x[key]: x for x in p[0][part]} for p in (before, after))
        out[part] = {"added": [v for k, v in new.items() if k not in old],
                     "removed": [v for k, v in old.items() if k not in new],
                     "changed": [{"before": old[k], "after": v} for k, v in new.items() if k in old and old[k] != v]}
    pb, pa = before[1], after[1]
    out["rungs"] = [{"node": n, "before": pb.get(n), "after": pa.get(n)} for n in sorted(pb.keys() | pa.keys())
                    if pb.get(n) != pa.get(n)]
    out["fields"] = [{"key": k, "before": before[0][k], "after": after[0][k]} for k in ("leader", "wireguard_ip")
                     if before[0][k] != after[0][k]]
    return out


CHANGES = {
    "default": [["granularity=full"], ["granularity=cross"], ["intra_subnet=auto"],
                ["granularity=cross", "intra_subnet=wireguard"],
                ["subnet=10.5.0.0/16", "granularity=full"], ["port=51821"],
                ["granularity=full", "intra_subnet=auto", "private_networks=10.10.0.0/16"],
                ["granularity=full", "wireguard_addressing=stable"]],
    "fabrics": [["granularity=location"], ["granularity=cross", "intra_subnet=vxlan"], ["intra_subnet=direct"],
                ["private_networks=10.30.0.0/16"]],
}


# Changes no plan of these labs shows: the records hold their endpoints' ports, and offline every
# rung delivers, so `auto` picks the direct rung the default lab fixes (and in `location`
# granularity intra_subnet only picks among the private rungs of location members).
UNMOVED = [["port=51821"], ["intra_subnet=auto"]]


@pytest.mark.parametrize("lab", sorted(CHANGES))
def test_dry_run_is_the_difference_of_plan_before_and_after(etcd: EtcdServer, tmp_path: Path, lab: str) -> None:
    doc = lab_doc(lab)
    before_file = seed(etcd, doc, tmp_path)
    names = [n["name"] for n in doc["nodes"]]
    before = {n: plan(before_file, n) for n in names}
    for change in CHANGES[lab]:
        r = meshctl(etcd, "mesh", "set", "--dry-run", *change, "-o", "json")
        assert r.exit_code == 0, r.output
        dry = json.loads(r.stdout)
        after_doc = {**doc, "mesh": {**doc["mesh"], **dict(c.split("=", 1) for c in change)}}
        after_file = write(tmp_path, after_doc, "after.yaml")
        assert [n["node"] for n in dry["nodes"]] == sorted(names)
        for got in dry["nodes"]:
            want = expected(before[got["node"]], plan(after_file, got["node"]))
            assert {k: got[k] for k in want} == want, (change, got["node"])
        assert (dry["total"]["changed"] > 0) == (change not in UNMOVED), change
        assert [s["key"] for s in dry["settings"]] == sorted({c.split("=")[0] for c in change},
                                                             key=MESH_FIELDS.index)
        offline = CliRunner().invoke(main, ["plan", "-f", before_file, "--diff", after_file, "-o", "json"])
        assert json.loads(offline.stdout) == dry, change
        text = meshctl(etcd, "mesh", "set", "--dry-run", *change).stdout
        assert text == CliRunner().invoke(main, ["plan", "-f", before_file, "--diff", after_file]).stdout
        assert [ln.split(":")[0] for ln in text.splitlines() if not ln.startswith(("  ", "mesh: "))] == \
            [*sorted(names), "total"], "a summary line per node, then the total"
    c = etcd.client()
    try:
        kv = c.get(mesh_key("default"))
        assert kv is not None and json.loads(kv.value) == doc["mesh"], "a dry run writes nothing"
    finally:
        c.close()


def test_set_writes_the_record_and_get_reads_it_back(etcd: EtcdServer, tmp_path: Path) -> None:
    doc = lab_doc("default")
    seed(etcd, doc, tmp_path)
    text = meshctl(etcd, "mesh", "set", "granularity=full", "private_networks=10.10.0.0/16")
    assert text.exit_code == 0, text.output
    lines = text.stdout.splitlines()
    assert lines[:2] == ["mesh: granularity location -> full", "mesh: private_networks - -> 10.10.0.0/16"]
    assert lines[-1] == "wrote /meshctl/default/mesh" and lines[-2].startswith("total: 5 node(s), 5 changed;")
    c = etcd.client()
    try:
        kv = c.get(mesh_key("default"))
        assert kv is not None
        written = parse_mesh(json.loads(kv.value), "mesh")
    finally:
        c.close()
    assert written.granularity == "full" and [str(n) for n in written.private_networks] == ["10.10.0.0/16"]
    assert written.intra_subnet == "direct" and written.port == 51820  # the settings not given are kept
    got = meshctl(etcd, "mesh", "get", "-o", "json")
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout) == {"granularity": "full", "subnet": "10.4.0.0/16", "subnet6": None, "port": 51820,
                                      "intra_subnet": "direct", "private_networks": ["10.10.0.0/16"],
                                      "allow_default_route": False, "wireguard_addressing": "index",
                                      "global_cidrs": None, "service_cidrs": [],
                                      "leader_hold": 30, "leaders_per_location": 1}
    assert ["granularity", "full"] in [ln.split() for ln in meshctl(etcd, "mesh", "get").stdout.splitlines()]
    after = write(tmp_path, {**doc, "mesh": mesh_to_record(written)}, "after.yaml")
    live = meshctl(etcd, "plan", "--backend", "etcd", "--node", "a2", "-o", "json")
    assert json.loads(live.stdout) == plan(after, "a2")[0], "the agents now plan what the diff said"
    again = meshctl(etcd, "mesh", "set", "granularity=full")
    assert "nothing written" in again.stderr and "changed;" in again.stdout.splitlines()[-1]


def test_settings_that_would_reject_a_node_are_refused(etcd: EtcdServer, tmp_path: Path) -> None:
    seed(etcd, lab_doc("default"), tmp_path)
    r = meshctl(etcd, "mesh", "set", "subnet=10.42.0.0/16")
    assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1, r.output
    assert r.stderr.startswith("error: mesh: 'subnet=10.42.0.0/16' would reject a1: ")
    assert "overlaps the WireGuard subnet" in r.stderr


def test_leader_settings_are_shown_set_and_judged(etcd: EtcdServer, tmp_path: Path) -> None:
    """mesh.leader_hold and mesh.leaders_per_location (docs/mesh.md, "Leaders that do not forward"):
    `mesh get` shows them, `mesh set` writes them (a second leader per location changes peers and
    routes, as the diff says), a bad value is one line naming the key."""
    seed(etcd, lab_doc("default"), tmp_path)
    got = [ln.split() for ln in meshctl(etcd, "mesh", "get").stdout.splitlines()]
    assert ["leader_hold", "30"] in got and ["leaders_per_location", "1"] in got
    r = meshctl(etcd, "mesh", "set", "leader_hold=45", "leaders_per_location=2")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[:2] == ["mesh: leader_hold 30 -> 45", "mesh: leaders_per_location 1 -> 2"]
    assert "~ leader a1 -> a1" not in r.stdout and "wireguard_ip changed" in r.stdout  # a2 now holds loc-a's address
    c = etcd.client()
    try:
        kv = c.get(mesh_key("default"))
        assert kv is not None and json.loads(kv.value)["leader_hold"] == 45
        assert json.loads(kv.value)["leaders_per_location"] == 2
    finally:
        c.close()
    for bad, line in (("leader_hold=0", "error: mesh.leader_hold: '0' is not a number of seconds in 1..3600"),
                      ("leaders_per_location=x", "error: mesh.leaders_per_location: 'x' is not a number of "
                       "leaders in 1..16")):
        r = meshctl(etcd, "mesh", "set", bad)
        assert r.exit_code == 2 and r.stderr.strip() == line, r.output


def test_global_ranges_are_set_with_a_dry_run_diff_and_bad_ones_refused(etcd: EtcdServer, tmp_path: Path) -> None:
    """docs/clustermesh.md, "Clusters whose pod ranges overlap": every node shows the change of what
    it translates its pods to; a range of the wrong size, over the WireGuard subnet or a pod CIDR is
    one line, and nothing is written."""
    doc = lab_doc("default")
    seed(etcd, doc, tmp_path)
    dry = meshctl(etcd, "mesh", "set", "--dry-run", "global_cidrs=10.42.0.0/16=10.142.0.0/16")
    assert dry.exit_code == 0, dry.output
    lines = dry.stdout.splitlines()
    assert lines[0] == "mesh: global_cidrs - -> 10.42.0.0/16=10.142.0.0/16"
    assert "  ~ global_cidrs - -> 10.42.0.0/16=10.142.0.0/16" in lines
    assert lines[-1].startswith("total: 5 node(s), 5 changed;")
    for bad, why in (("10.42.0.0/16=10.142.0.0/17", "is not the size of the pod range 10.42.0.0/16"),
                     ("10.42.0.0/16=10.4.0.0/16", "overlaps the WireGuard subnet 10.4.0.0/16"),
                     ("10.42.0.0/16=10.42.0.0/16", "overlaps the pod range 10.42.0.0/16"),
                     ("10.40.0.0/16=10.42.0.0/16", "would reject a1: nodes[0].pod_cidr: '10.42.1.0/24' overlaps the "
                                                   "global range 10.42.0.0/16 of 10.40.0.0/16")):
        r = meshctl(etcd, "mesh", "set", f"global_cidrs={bad}")
        assert r.exit_code == 2 and len(r.stderr.splitlines()) == 1 and why in r.stderr, (bad, r.output)
    c = etcd.client()
    try:
        kv = c.get(mesh_key("default"))
        assert kv is not None and "global_cidrs" not in json.loads(kv.value), "nothing was written"
    finally:
        c.close()
    assert meshctl(etcd, "mesh", "set", "global_cidrs=10.42.0.0/16=10.142.0.0/16").exit_code == 0
    got = json.loads(meshctl(etcd, "mesh", "get", "-o", "json").stdout)
    assert got["global_cidrs"] == "10.42.0.0/16=10.142.0.0/16"
