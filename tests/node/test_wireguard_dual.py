# SPDX-License-Identifier: Apache-2.0
"""The agent's WireGuard step on a dual-stack mesh (docs/mesh.md, "Dual stack"): kilo0
(wireguard-go, in a namespace of this test's own) gets every address of the plan's
`wireguard_ips`, one per WireGuard subnet; when the mesh drops `subnet6` the IPv6 address leaves
on the retire, after the sync kept it (make before break), and the IPv4 one is never touched."""

from __future__ import annotations

import copy
import json
from typing import Any

from meshctl.agent.config import AgentConfig
from meshctl.agent.steps import PassInput, WireGuardStep
from meshctl.mesh.plan import plan_node
from meshctl.mesh.records import parse_topology
from meshctl.node.keys import generate_private_key, public_key

from .conftest import NodeLab, in_ns

KEYS = [generate_private_key() for _ in range(2)]


def doc(subnet6: bool) -> dict[str, Any]:
    mesh: dict[str, Any] = {"granularity": "full", "subnet": "10.4.0.0/16"}
    if subnet6:
        mesh["subnet6"] = "fd04::/64"
    nodes = [{"name": f"n{i}", "pod_cidrs": [f"10.42.{i}.0/24", f"fd42:0:0:{i}::/64"], "public_key": public_key(k),
              "internal_ips": [f"10.0.0.{i + 1}/24", f"fd10::{i + 1}/64"],
              "endpoints": [f"198.51.100.{i + 1}:51820", f"[2001:db8::{i + 1}]:51820"]}
             for i, k in enumerate(KEYS)]
    return {"cluster": {"name": "dual", "id": 1}, "mesh": mesh, "nodes": nodes}


def pass_input(subnet6: bool) -> PassInput:
    topo = parse_topology(copy.deepcopy(doc(subnet6)))
    me = topo.node("n0")
    assert me is not None
    return PassInput(plan=plan_node(topo, "n0"), topo=topo, me=me, mesh_cidrs=frozenset(), pod_ifs=())


def addresses(lab: NodeLab, ns: str) -> set[str]:
    out = json.loads(lab.sh(ns, "ip", "-j", "addr", "show", "dev", "kilo0", "scope", "global").stdout)
    return {f"{a['local']}/{a['prefixlen']}" for a in out[0]["addr_info"] if a}


def test_the_wireguard_step_installs_one_address_per_subnet_and_retires_the_one_that_leaves(lab: NodeLab):
    ns = lab.ns("wgd")
    cfg = AgentConfig(node_name="n0", pod_cidrs=(), wg_interface="kilo0", wg_run_dir=lab.run_dir("wgd"))
    step = WireGuardStep(cfg, KEYS[0])
    both = pass_input(subnet6=True)
    assert [str(a) for a in both.plan.device_addresses] == ["10.4.0.1/16", "fd04::1/64"]
    in_ns(ns, step.sync, both)
    in_ns(ns, step.retire, both)
    assert addresses(lab, ns) == {"10.4.0.1/16", "fd04::1/64"}
    peers = {p.public_key: p for p in in_ns(ns, step.peers_now) or []}
    assert set(peers) == {public_key(KEYS[1])}

    v4 = pass_input(subnet6=False)
    fresh = WireGuardStep(cfg, KEYS[0])  # (a step still watching new peers' handshakes runs every pass)
    assert fresh.inputs(v4) != fresh.inputs(both)  # the runner sees the change and runs the step
    in_ns(ns, step.sync, v4)
    assert addresses(lab, ns) == {"10.4.0.1/16", "fd04::1/64"}  # made before broken
    in_ns(ns, step.retire, v4)
    assert addresses(lab, ns) == {"10.4.0.1/16"}

    in_ns(ns, step.sync, both)  # and back: the IPv6 address returns beside the IPv4 one
    in_ns(ns, step.retire, both)
    assert addresses(lab, ns) == {"10.4.0.1/16", "fd04::1/64"}
