# SPDX-License-Identifier: Apache-2.0
"""Nothing the user wrote is dropped in silence: over generated topologies, every field of the
input shows in the plans or in a warning naming it (mesh.checks). Fields a location member keeps
for when it leads (its endpoint, its keepalive) are standbys and not counted; docs/mesh.md says so."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from meshctl.mesh.checks import plan_warnings, topology_warnings
from meshctl.mesh.plan import NodePlan, plan_node
from meshctl.mesh.records import parse_topology
from meshctl.mesh.segments import segments

from .fixtures import key
from .test_plan_symmetry import nat_topologies


@st.composite
def written_topologies(draw: Any) -> dict[str, Any]:
    """nat_topologies with what else a user writes: WireGuard addresses, extra peers whose
    endpoints may lie inside a node's location IPs, reports naming nodes that are not there."""
    doc = draw(nat_topologies())
    for node in doc["nodes"]:
        if draw(st.integers(0, 4)) == 0:
            node["wireguard_ip"] = f"10.4.0.{draw(st.integers(1, 4))}/16"
        if draw(st.integers(0, 6)) == 0:
            node["unreached_peers"] = ["ghost"]
    peers = []
    for j in range(draw(st.integers(0, 2))):
        p: dict[str, Any] = {"name": f"p{j}", "public_key": key(1000 + j), "allowed_ips": [f"10.5.{j}.0/24"]}
        where = draw(st.sampled_from(["none", "public", "location"]))
        if where == "public":
            p["endpoint"] = f"192.0.2.{j + 1}:51820"
        elif where == "location":
            p["endpoint"] = f"192.168.{draw(st.integers(0, len(doc['nodes']) - 1))}.7:51820"
        peers.append(p)
    doc["peers"] = peers
    return doc


def _warned(warnings: list[str], field: str) -> bool:
    return any(w.startswith(f"{field}: ") for w in warnings)


def _check_node_fields(doc: dict[str, Any], plans: dict[str, NodePlan], warnings: list[str]) -> None:
    t = parse_topology(doc)
    lead = {s.leader.name: s for s in segments(t)}
    for i, n in enumerate(t.nodes):
        f = f"nodes[{i}]"
        others = [p for name, p in plans.items() if name != n.name]
        assert all(any(e.prefix == c for e in p.fastpath) for p in others for c in n.pod_cidrs), f"{f}.pod_cidrs"
        for j, a in enumerate(n.allowed_location_ips):
            local = [p for p in others if t.mesh.granularity == "location" and n.internal_ip is not None
                     and p.leader == plans[n.name].leader]  # a location reaches its own networks natively
            assert all(any(r.dst == a for r in p.routes) for p in others if p not in local) or \
                _warned(warnings, f"{f}.allowed_location_ips[{j}]"), f"{f}.allowed_location_ips[{j}]"
        if n.name in lead and n.endpoint is not None:
            for p in others:
                peer = next((x for x in p.peers if x.name == n.qualified_name), None)
                assert peer is None or peer.endpoint is not None or _warned(warnings, f"{f}.endpoint"), f"{f}.endpoint"
        if n.name in lead:
            assert all(x.persistent_keepalive == n.persistent_keepalive for x in plans[n.name].peers)
        if n.location and t.mesh.granularity == "location":
            # alone in its location, a node is that location's segment with or without internal_ip
            alone = sum(1 for m in t.nodes if m.location == n.location) == 1
            assert n.internal_ip is not None or alone or _warned(warnings, f"{f}.location"), f"{f}.location"
        if n.leader and t.mesh.granularity == "location":
            assert plans[n.name].leader == n.name or _warned(warnings, f"{f}.leader"), f"{f}.leader"
        if n.wireguard_ip is not None:
            assert plans[n.name].wireguard_ip == n.wireguard_ip or _warned(warnings, f"{f}.wireguard_ip")
        for x in n.unreached_peers:
            assert t.node(x) is not None or _warned(warnings, f"{f}.unreached_peers")


def _check_peer_fields(doc: dict[str, Any], plans: dict[str, NodePlan], warnings: list[str]) -> None:
    t = parse_topology(doc)
    leaders = [plans[s.leader.name] for s in segments(t)]
    for k, q in enumerate(t.peers):
        for p in leaders:
            assert all(any(r.dst == a for r in p.routes) for a in q.allowed_ips), f"peers[{k}].allowed_ips"
            mine = next(x for x in p.peers if x.name == q.name)
            if q.endpoint is not None:
                assert mine.endpoint == str(q.endpoint) or _warned(warnings, f"peers[{k}].endpoint")


@settings(max_examples=120, deadline=None)
@given(written_topologies())
def test_every_field_shows_in_the_plan_or_in_a_warning(doc: dict[str, Any]) -> None:
    t = parse_topology(doc)
    plans = {n.name: plan_node(t, n.name) for n in t.nodes}
    warnings = topology_warnings(t, doc) + [w for p in plans.values() for w in plan_warnings(t, p)]
    _check_node_fields(doc, plans, warnings)
    _check_peer_fields(doc, plans, warnings)
