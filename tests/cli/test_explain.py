# SPDX-License-Identifier: Apache-2.0
"""`meshctl explain`'s pure builder (agent/explain.py), one case a row: the hops, the rung and why,
the probes, the WireGuard peer, the MTU and the fast-path entries it reads off agent statuses;
and the status blocks it needs reading back to themselves."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from click.testing import CliRunner

from meshctl.agent.explain import explain, format_explanation
from meshctl.agent.status import AgentStatus, ProbeResult
from meshctl.cli import main

NOW = 1_700_000_100.0
MTU = {"direct": 1500, "direct+ipip": 1480, "direct+vxlan": 1450, "wireguard-private": 1420, "tunnel": 1420}


def row(name: str, internal: str | None, pod: str, path: str, *, cluster: str = "c1", source: str = "local",
        location: str = "", fastpath: dict[str, Any] | None = None, **kw: Any) -> dict[str, Any]:
    out = {"name": name, "cluster": cluster, "source": source, "location": location, "internal_ip": internal,
           "endpoint": None, "pod_cidrs": [pod], "wireguard_ip": None, "path": path, "relay": kw.get("relay"),
           "relay_reason": kw.get("relay_reason")}
    if fastpath is not None:
        out["fastpath"] = [{"prefix": pod, "nexthop": None, "encap": None, "outer_src": None, "outer_dst": None,
                            **fastpath}]
    return out


def agent(node: str, rows: list[dict[str, Any]], *, cluster: str = "c1", mesh: dict[str, Any] | None = None,
          peers: list[dict[str, Any]] = (), pairs: dict[str, Any] | None = None, leader: str | None = None,
          **extra: Any) -> AgentStatus:
    doc: dict[str, Any] = {
        "node": node, "cluster": cluster, "backend": "etcd", "ready": True, "reason": "",
        "mesh": {"granularity": "full", "subnet": "10.4.0.0/16", "port": 51820, "intra_subnet": "auto", **(mesh or {})},
        "leader": leader or node, "paths": {r["name"]: r["path"] for r in rows}, "last_reconcile": {"time": NOW},
        "interfaces": {"private": "priv", "wireguard": "kilo0"}, "path_mtu": MTU,
        "datapath": {"mode": "ebpf", "reason": None,
                     "counters": {"direct": [10, 1000], "encap": [5, 700], "tunnel": [7, 900], "local": [3, 300],
                                  "decap": [4, 400]}},
        "path_probe": {"port": 51871, "local_rungs": ["direct", "direct+ipip"], "sent": 1, "received": 1,
                       "cpu_s": 0.0, "pairs": pairs or {}},
        "peers": list(peers), "node_list": rows, **extra,
    }
    return AgentStatus.from_json(doc)


def verdict(up: bool, lost: int = 0, rtt: float | None = 0.2, sent: int = 10, answered: int = 10) -> dict[str, Any]:
    return {"up": up, "lost": lost, "rtt_ms": rtt, "recovering_since": None, "sent": sent, "answered": answered,
            "last_rtt_ms": rtt, "last_reply_age_s": 0.5 if answered else None}


def wg_peer(name: str, allowed: list[str], endpoint: str = "198.51.100.12:51820", age: float = 12.0) -> dict[str, Any]:
    return {"name": name, "kind": "segment", "public_key": "K" + name, "endpoint": endpoint, "allowed_ips": allowed,
            "rx_bytes": 1, "tx_bytes": 2, "last_handshake": NOW - age, "live_endpoint": endpoint,
            "handshake_age_s": age}


L1 = row("l1", "10.30.1.11/24", "10.42.1.0/24", "local", fastpath={"action": "local"})
L2 = row("l2", "10.30.1.12/24", "10.42.2.0/24", "direct", fastpath={"action": "direct"})
H2 = row("h2", "10.0.1.12/16", "10.42.9.0/24", "direct+ipip",
         fastpath={"action": "direct", "encap": "ipip", "outer_src": "10.0.0.11", "outer_dst": "10.0.1.12"})
K2 = row("k2", "10.50.0.12/24", "10.42.11.0/24", "tunnel", fastpath={"action": "tunnel"})
MOVED = {"rung": "tunnel", "ladder": ["direct", "direct+ipip", "direct+vxlan", "wireguard-private", "tunnel"],
         "peer_choice": "tunnel",
         "probes": {"direct": verdict(False, lost=12, rtt=0.2, sent=40, answered=28),
                    "udp": verdict(False, lost=12, sent=20, answered=8), "ipip": verdict(False, lost=12)},
         "history": [{"from": None, "to": "direct", "reason": "first probes", "at": NOW - 60},
                     {"from": "direct", "to": "tunnel", "reason": "direct stopped delivering", "at": NOW - 2}]}


def case_same_subnet() -> tuple[AgentStatus, str, str, dict[str, AgentStatus]]:
    pairs = {"l2": {"rung": "direct", "ladder": ["direct", "tunnel"], "peer_choice": "direct",
                    "probes": {"direct": verdict(True)}}}
    return agent("l1", [L1, L2], pairs=pairs), "10.42.1.5", "10.42.2.7", {
        "c1/l2": agent("l2", [row("l2", "10.30.1.12/24", "10.42.2.0/24", "local", fastpath={"action": "local"})])}


def test_same_subnet_one_direct_hop_with_its_probe_mtu_and_both_ends() -> None:
    src, a, b, others = case_same_subnet()
    e = explain(src, a, b, others)
    assert e.no_path is None and e.wants == ()
    [h] = e.hops
    assert (h.node, h.to, h.interface, h.rung, h.mtu) == ("l1", "l2", "priv", "direct", 1500)
    assert h.reason.startswith("same subnet 10.30.1.0/24") and "cheapest rung whose probes answer" in h.reason
    assert [(p.kind, p.up, p.sent, p.answered) for p in h.probes] == [("direct", True, 10, 10)]
    assert h.fastpath is not None and (h.fastpath.counter, h.fastpath.packets) == ("direct", 10)
    assert e.arrival is not None and e.arrival.entry is not None and e.arrival.entry.action == "local"
    assert e.record == "l2: record from cluster c1's etcd backend (location -, internal 10.30.1.12/24, " \
                       "endpoint -, pod CIDRs 10.42.2.0/24)"
    text = format_explanation(e, NOW)
    assert "hop 1: l1 -> l2 on priv, rung direct, path MTU 1500" in text
    assert "fast path at l1: 10.42.2.0/24 direct; counter direct 10 pkts/1000 B" in text


def test_a_moved_rung_shows_its_move_and_the_lost_probes() -> None:
    src = agent("l1", [L1, {**L2, "path": "tunnel", "fastpath": [{**L2["fastpath"][0], "action": "tunnel"}]}],
                pairs={"l2": MOVED}, peers=[wg_peer("l2", ["10.4.0.2/32", "10.42.2.0/24"])])
    [h] = explain(src, "l1", "l2").hops
    assert (h.rung, h.interface, h.mtu) == ("tunnel", "kilo0", 1420)
    assert h.reason.endswith("probes moved it direct -> tunnel: direct stopped delivering "
                             "(every private probe kind is down)")
    assert [(p.kind, p.up, p.lost) for p in h.probes][0] == ("direct", False, 12)
    assert h.wireguard is not None and (h.wireguard.peer, h.wireguard.handshake_age_s) == ("l2", 12.0)
    text = format_explanation(explain(src, "l1", "l2"), NOW)
    assert "moved direct -> tunnel 2.0 s ago: direct stopped delivering" in text
    assert "probe direct (direct): DOWN, rtt 0.20 ms (last 0.20 ms), lost 12 in a row, 28/40 answered" in text


def test_private_networks_and_an_encapsulated_rung() -> None:
    src = agent("h1", [row("h1", "10.0.0.11/16", "10.42.8.0/24", "local"), H2],
                mesh={"private_networks": ["10.0.0.0/8"]})
    # h1 and h2 share the /16: a same-subnet pair, encapsulated (the fabric routes only node addresses).
    [h] = explain(src, "h1", "10.42.9.3").hops
    assert (h.rung, h.mtu, h.fastpath.counter) == ("direct+ipip", 1480, "encap")  # type: ignore[union-attr]
    assert "outer 10.0.0.11->10.0.1.12" in format_explanation(explain(src, "h1", "10.42.9.3"), NOW)
    far = row("v9", "10.99.0.9/24", "10.42.12.0/24", "direct+vxlan")
    src = agent("h1", [row("h1", "10.0.0.11/16", "10.42.8.0/24", "local"), far],
                mesh={"private_networks": ["10.0.0.0/8"]})
    assert explain(src, "h1", "v9").hops[0].reason.startswith("mesh.private_networks 10.0.0.0/8 holds both")


def test_fixed_intra_subnet_and_no_private_network_take_the_tunnel() -> None:
    src = agent("l1", [L1, K2], mesh={"intra_subnet": "wireguard"}, peers=[wg_peer("k2", ["10.42.11.0/24"])])
    [h] = explain(src, "l1", "k2").hops
    assert h.rung == "tunnel" and "intra_subnet wireguard is fixed" in h.reason
    assert "no private network joins them" in h.reason


def test_via_leader_then_the_leaders_tunnel() -> None:
    a2 = row("a2", "10.10.1.12/24", "10.42.2.0/24", "local", location="loc-a")
    b1 = row("b1", "10.10.2.11/24", "10.42.3.0/24", "via-leader", location="loc-b", fastpath={"action": "direct"})
    member = agent("a2", [a2, b1], mesh={"granularity": "location"}, leader="a1")
    e = explain(member, "a2", "b1")
    assert [(h.node, h.to, h.rung, h.answered_by) for h in e.hops] == [("a2", "a1", "direct", "agent"),
                                                                       ("a1", "b1", "?", "record")]
    assert e.wants == ("c1/a1",) and "leader a1 carries what leaves the location" in e.hops[0].reason
    leader = agent("a1", [row("a1", "10.10.1.11/24", "10.42.1.0/24", "local", location="loc-a"),
                          {**b1, "path": "tunnel", "fastpath": [{**b1["fastpath"][0], "action": "tunnel"}]}],
                   mesh={"granularity": "location"}, peers=[wg_peer("b1", ["10.42.3.0/24"])])
    e = explain(member, "a2", "b1", {"c1/a1": leader})
    assert [(h.node, h.to, h.rung) for h in e.hops] == [("a2", "a1", "direct"), ("a1", "b1", "tunnel")]
    assert e.wants == ("c1/b1",) and e.arrival is None


def test_relay_names_the_relaying_node_and_why() -> None:
    n = row("n1", None, "10.42.20.0/24", "relay", relay="b1", relay_reason="both behind NAT",
            fastpath={"action": "tunnel"})
    src = agent("a1", [row("a1", None, "10.42.1.0/24", "local"), n],
                peers=[wg_peer("b1", ["10.42.3.0/24", "10.42.20.0/24"])])
    [h, rest] = explain(src, "a1", "n1").hops
    assert (h.rung, h.to, h.interface) == ("relay", "b1", "kilo0")
    assert h.reason == "relayed through b1: both behind NAT" and rest.answered_by == "record"


def test_cross_cluster_names_cluster_node_and_the_remote_etcd() -> None:
    g1 = row("c2/g1", "10.60.0.11/24", "10.43.1.0/24", "tunnel", cluster="c2", source="remote",
             fastpath={"action": "tunnel"})
    remotes = {"ready": 1, "total": 1, "clusters": [{"name": "c2", "ready": True, "nodes": 1,
                                                     "endpoints": ["https://10.0.9.1:2379"], "connected": True}]}
    src = agent("a1", [row("a1", "10.30.0.1/24", "10.42.1.0/24", "local"), g1],
                peers=[wg_peer("c2/g1", ["10.43.1.0/24"])], remotes=remotes)
    remote_view = agent("g1", [row("g1", "10.60.0.11/24", "10.43.1.0/24", "local", cluster="c2",
                                   fastpath={"action": "local"})], cluster="c2")
    e = explain(src, "10.42.1.9", "10.43.1.4", {"c2/g1": remote_view})
    assert e.dst is not None and (e.dst.node, e.dst.cluster, e.dst.source) == ("c2/g1", "c2", "remote")
    [h] = e.hops
    assert h.to == "c2/g1" and h.reason.startswith("c2/g1 is a node of cluster c2")
    assert e.record is not None and e.record.startswith("c2/g1: record from cluster c2's etcd https://10.0.9.1:2379 (")
    assert e.arrival is not None and e.arrival.node == "g1" and e.arrival.counter == "local"
    assert explain(src, "a1", "c2/g1").hops[0].to == "c2/g1"


@pytest.mark.parametrize(("dst", "extra", "why"), [
    ("10.99.9.9", {}, "no node of l1's plan owns 10.99.9.9"),
    ("x9", {"rejections": [{"name": "x9", "reason": "overlaps l2"}]}, "x9's record is rejected: overlaps l2"),
    ("l2", {"lapsed": {"l2": 41.6}}, "l2's lease lapsed: its agent is away (its record is kept 42 s more)"),
    ("gone", {}, "no node gone in l1's plan"),
], ids=["unknown address", "rejected record", "lapsed lease", "unknown node"])
def test_no_path_says_why_in_one_line(dst: str, extra: dict[str, Any], why: str) -> None:
    e = explain(agent("l1", [L1, L2], **extra), "l1", dst)
    assert e.hops == () and e.no_path is not None and e.no_path.startswith(why)
    assert format_explanation(e, NOW).count("\n") == 0


def test_a_source_on_another_node_is_left_to_its_agent() -> None:
    e = explain(agent("l1", [L1, L2]), "10.42.2.3", "l1")
    assert e.no_path == "10.42.2.3 is on l2, not l1: l2's agent answers for it"


def test_the_probe_line() -> None:
    src, a, b, others = case_same_subnet()
    e = explain(src, a, b, others)
    import dataclasses

    ok = dataclasses.replace(e, probe=ProbeResult("l2", "direct", "direct", True, 0.31, 0.5))
    lost = dataclasses.replace(e, probe=ProbeResult("l2", "direct", "direct", False, None, 0.5))
    assert "probe now (direct on direct): came back in 0.31 ms" in format_explanation(ok, NOW)
    assert "probe now (direct on direct): LOST (no answer within 0.5 s)" in format_explanation(lost, NOW)
    tunnel = dataclasses.replace(explain(agent("l1", [L1, K2]), "l1", "k2"),
                                 probe=ProbeResult("k2", "direct", "direct", False, None, 0.5))
    assert "probe now (direct on direct, the cheapest private rung: tunnel itself is not probed): LOST" \
        in format_explanation(tunnel, NOW)
    assert ok.to_json()["probe"] == {"peer": "l2", "rung": "direct", "kind": "direct", "answered": True,
                                     "rtt_ms": 0.31, "timeout_s": 0.5}


def test_the_new_status_blocks_read_back_to_themselves() -> None:
    src = agent("l1", [L1, L2], pairs={"l2": MOVED}, peers=[wg_peer("l2", ["10.42.2.0/24"])])
    doc = src.to_json()
    assert AgentStatus.from_json(copy.deepcopy(doc)).to_json() == doc
    assert doc["path_probe"]["pairs"]["l2"]["history"][-1]["to"] == "tunnel"
    assert doc["node_list"][1]["fastpath"][0]["action"] == "direct" and doc["path_mtu"]["direct+vxlan"] == 1450
    assert doc["peers"][0]["handshake_age_s"] == 12.0 and doc["interfaces"] == {"private": "priv",
                                                                                "wireguard": "kilo0"}


@pytest.mark.parametrize(("args", "line"), [
    (["explain", "10.0.0.1", "not_a_name"], "error: DST: 'not_a_name' is not a pod address or a node"),
    (["explain", "a/b/c", "10.0.0.1"], "error: SRC: 'a/b/c' is not a pod address or a node"),
])
def test_bad_input_is_one_line_naming_the_value_exit_2(args: list[str], line: str) -> None:
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and r.output.startswith(line) and r.output.count("\n") == 1, r.output
