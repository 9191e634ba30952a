# SPDX-License-Identifier: Apache-2.0
"""The per-node diff of two plans (mesh.plandiff), `plan --diff` and the settings parsing of
`mesh set`: each case names what changes and checks that exactly that is reported."""

from __future__ import annotations

import copy
import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.cli.mesh_settings import changed_settings, parse_assignments
from meshctl.errors import InputError
from meshctl.mesh.model import MeshSettings
from meshctl.mesh.plan import plan_node
from meshctl.mesh.plandiff import FieldChange, diff_node, diff_text, diff_topologies
from meshctl.mesh.records import parse_topology

from .fixtures import CROSS_TWO_SUBNETS, key


def _node(name: str, i: int, internal: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "location": name, "internal_ip": internal, "endpoint": f"203.0.113.{i}:51820",
            "pod_cidr": f"10.42.{i}.0/24", "public_key": key(i), **extra}


BASE: dict[str, Any] = {"mesh": {"granularity": "full", "intra_subnet": "direct"},
                        "nodes": [_node("a", 1, "10.30.0.1/24"), _node("b", 2, "10.31.0.2/24")]}


def _with(**change: Any) -> dict[str, Any]:
    d = copy.deepcopy(BASE)
    d["mesh"].update(change.pop("mesh", {}))
    d["nodes"] += change.pop("nodes", [])
    for n in d["nodes"]:
        n.update(change.pop(n["name"], {}))
    return d


# (case, topology after, what a's diff holds: peers added/removed/changed by name, rungs)
CASES = [
    ("nothing changed", _with(), ([], [], []), []),
    ("a peer added", _with(nodes=[_node("c", 3, "10.32.0.3/24")]), (["c"], [], []), [FieldChange("c", None, "tunnel")]),
    ("a peer's allowed IPs changed", _with(b={"allowed_location_ips": ["172.16.9.0/24"]}), ([], [], ["b"]), []),
    # b joins a's private subnet: reached directly, so no longer a WireGuard peer
    ("a rung change", _with(b={"internal_ip": "10.30.0.2/24"}), ([], ["b"], []),
     [FieldChange("b", "tunnel", "direct")]),
]


@pytest.mark.parametrize(("after", "peers", "rungs"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_node_diff(after: dict[str, Any], peers: tuple[list[str], ...], rungs: list[FieldChange]) -> None:
    t0, t1 = parse_topology(BASE), parse_topology(after)
    d = diff_node("a", plan_node(t0, "a"), plan_node(t1, "a"))
    assert ([p.name for p in d.peers.added], [p.name for p in d.peers.removed],
            [a.name for a, _ in d.peers.changed]) == peers
    assert list(d.rungs) == rungs
    assert d.changed == bool(any(peers) or rungs)


def test_changed_allowed_ips_and_routes_name_the_old_and_new_values() -> None:
    t0, t1 = parse_topology(BASE), parse_topology(_with(b={"allowed_location_ips": ["172.16.9.0/24"]}))
    d = diff_node("a", plan_node(t0, "a"), plan_node(t1, "a"))
    (old, new), = d.peers.changed
    assert set(new.allowed_ips) - set(old.allowed_ips) == {ipaddress.ip_network("172.16.9.0/24")}
    assert [str(r.dst) for r in d.routes.added] == ["172.16.9.0/24"] and not d.routes.removed
    assert "  ~ peer b: allowed_ips " in diff_text(diff_topologies(t0, t1))


def test_a_node_only_on_one_side_is_all_added() -> None:
    t0, t1 = parse_topology(BASE), parse_topology(_with(nodes=[_node("c", 3, "10.32.0.3/24")]))
    d = {n.node: n for n in diff_topologies(t0, t1).nodes}["c"]
    assert d.fields[0] == FieldChange("plan", None, "yes") and not d.peers.removed
    assert [p.name for p in d.peers.added] == ["a", "b"]
    assert diff_text(diff_topologies(t0, t1)).splitlines()[-1] == (
        "total: 3 node(s), 3 changed; peers +4 -0 ~0, routes +8 -0 ~0, fast path +5 -0 ~0, 5 rung(s)")


def run(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def test_plan_diff_between_two_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump(CROSS_TWO_SUBNETS))
    changed = copy.deepcopy(CROSS_TWO_SUBNETS)
    changed["mesh"]["granularity"] = "location"
    b.write_text(yaml.safe_dump(changed))
    r = run("plan", "-f", str(a), "--diff", str(b), "-o", "json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["settings"] == [{"key": "granularity", "before": "cross", "after": "location"}]
    assert [n["node"] for n in out["nodes"]] == ["x1", "x2", "x3", "y1"]
    assert out["total"]["changed"] == sum(n["changed"] for n in out["nodes"]) > 0
    text = run("plan", "-f", str(a), "--diff", str(b), "--node", "x2").stdout.splitlines()
    assert text[0] == "mesh: granularity cross -> location" and text[1].startswith("x2: ")
    assert text[-1].startswith("total: 1 node(s), 1 changed;")
    same = run("plan", "-f", str(a), "--diff", str(a))
    assert same.exit_code == 0 and same.stdout.splitlines()[-1].startswith("total: 4 node(s), 0 changed;")


@pytest.mark.parametrize(("args", "line"), [
    (["granularity"], "error: KEY=VALUE: 'granularity' is not KEY=VALUE"),
    (["granularty=full"], "error: mesh.granularty: is not a known field (did you mean granularity?)"),
    (["port=70000"], "error: mesh.port: '70000' is not a port in 1..65535"),
    (["granularity=full", "granularity=cross"], "error: mesh.granularity: 'granularity=cross' is given twice"),
    (["subnet=10.4.0.1/16"], "error: mesh.subnet: '10.4.0.1/16' has host bits set (the network is 10.4.0.0/16)"),
])
def test_mesh_set_refuses_bad_settings_in_one_line(args: list[str], line: str) -> None:
    r = run("mesh", "set", "--dry-run", "--etcd-endpoints", "http://192.0.2.1:2379", *args)
    assert r.exit_code == 2 and r.stderr.splitlines()[0].startswith(line) and len(r.stderr.splitlines()) == 1, r.stderr


def test_settings_parse_as_a_topology_files_mesh_section() -> None:
    m = changed_settings(MeshSettings(), parse_assignments(["private_networks=10.30.0.0/16,10.31.0.0/16",
                                                            "allow_default_route=true", "port=51821"]))
    assert [str(n) for n in m.private_networks] == ["10.30.0.0/16", "10.31.0.0/16"]
    assert m.allow_default_route and m.port == 51821 and m.granularity == "location"
    with pytest.raises(InputError, match=r"^mesh.intra_subnet: 'vxlan2' is not one of"):
        changed_settings(m, {"intra_subnet": "vxlan2"})
