# SPDX-License-Identifier: Apache-2.0
"""The /status document is a published interface: AgentStatus reads back every document an agent
serves (`from_json(x).to_json() == x`), with exactly the keys the agent has always served, and
the metrics and `meshctl status` read it by attribute."""

from __future__ import annotations

import copy
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from meshctl.agent.server import AgentCollector
from meshctl.agent.status import AgentStatus
from meshctl.cli.agent import format_status
from meshctl.mesh.render import FastPathRow, NodeRow

PROBE = {"port": 51821, "local_rungs": ["direct", "direct+vxlan", "wireguard-private"], "sent": 10, "received": 9,
         "cpu_s": 0.012, "pairs": {"a2": {"rung": "direct", "ladder": ["direct", "wireguard-private"],
                                          "peer_choice": None,
                                          "probes": {"direct": {"up": True, "lost": 0, "rtt_ms": 0.123,
                                                                "recovering_since": None}}}}}

# Every key an agent serves, with values of the types it serves them in (one node, etcd backend,
# a cluster mesh, the eBPF datapath, the prober running).
FULL: dict[str, Any] = {
    "node": "a1", "cluster": "c1", "backend": "etcd", "ready": True, "reason": "", "revision": 42, "records": 3,
    "granularity": "location", "mesh": {"granularity": "location", "subnet": "10.4.0.0/16", "port": 51820,
                                        "intra_subnet": "auto"},
    "leader": "a1", "is_leader": True, "wireguard_ip": "10.4.0.1/16", "nodes": 3, "routes": 4,
    "paths": {"a1": "local", "a2": "direct", "b1": "tunnel", "c2/g1": "relay"},
    "relays": {"c2/g1": {"via": "b1", "reason": "unreached"}},
    "discovered_endpoints": {"b1": "198.51.100.7:51820"}, "unreached_peers": ["b2"],
    "rejections": [{"name": "x9", "reason": "overlaps a1"}], "rejections_total": 1, "pod_interfaces": ["veth1"],
    "warnings": ["b1: never starts"],
    "last_reconcile": {"time": 1700000000.5, "duration_s": 0.0012, "cpu_s": 0.001, "applied": True, "full": False,
                       "reused": ["admission", "plan"], "errors": {"nat": "boom"},
                       "steps_ms": {"snapshot": 0.1, "wireguard": 0.0}},
    "reconcile": {"ok_total": 5, "failed_total": 1, "full_total": 2}, "errors_total": {"nat": 1}, "pid": 1234,
    "remotes": {"ready": 1, "total": 1, "clusters": [{
        "name": "c2", "ready": True, "reason": None, "nodes": 2, "endpoints": ["https://10.0.0.1:2379"],
        "connected": True, "last_change": 1700000000.0, "reconnects": 0, "last_sync_age": 0.0, "rejected": 1,
        "rejections": [{"name": "c2/bad", "reason": "no pod CIDR"}]}],
        "services": [{"namespace": "default", "name": "web", "shared": True, "affinity": "none",
                      "local_endpoints": 2, "remote_endpoints": {"c2": 3}}],
        "service_rejections": [{"name": "c2/services/default/web/10.99.0.5", "reason": "in no pod CIDR"}],
        "services_leader": "a1"},
    "datapath": {"mode": "ebpf", "reason": None, "counters": {"direct": [10, 1000], "pass": [3, 300]},
                 "route_cache_fills": 7, "synced": True, "attach": "tcx", "fallbacks": [], "objects": "shipped",
                 "objects_refused": 1},
    "path_probe": PROBE,
    "path_changes": [{"from": "none", "to": "direct", "reason": "direct became available", "count": 1}],
    "wireguard_mode": "wireguard-go",
    "pods": {"source": "netlink", "found": ["veth1"], "fastpath": ["veth1"]},
    "cni": {"mode": "keep", "warning": "kilo's config is still installed"},
    "peers": [{"name": "b1", "kind": "segment", "public_key": "K1", "endpoint": "198.51.100.7:51820",
               "allowed_ips": ["10.4.0.2/32", "10.42.2.0/24"], "rx_bytes": 10, "tx_bytes": 20,
               "last_handshake": 1700000000.0, "live_endpoint": "198.51.100.7:51820"},
              {"name": "b2", "kind": "segment", "public_key": "K2", "endpoint": None, "allowed_ips": []}],
    "node_list": [{"name": "a1", "cluster": "c1", "source": "local", "location": "loc-a", "internal_ip": "10.30.0.1/16",
                   "endpoint": "10.30.0.1:51820", "pod_cidrs": ["10.42.1.0/24"], "wireguard_ip": "10.4.0.1/16",
                   "path": "local", "relay": None, "relay_reason": None}],
    "own_record": {"restored_total": 1, "last_restored": "2026-01-01T00:00:00Z deleted"},
    "lapsed": {"a3": 12.5},
}

# The keys the agent's one status literal and its live parts have always served.
PASS_KEYS = {"node", "cluster", "backend", "ready", "reason", "revision", "records", "granularity", "mesh", "leader",
             "is_leader", "wireguard_ip", "nodes", "routes", "paths", "relays", "discovered_endpoints",
             "unreached_peers", "rejections", "rejections_total", "pod_interfaces", "warnings", "last_reconcile",
             "reconcile", "errors_total", "pid"}
LIVE_KEYS = {"datapath", "path_probe", "path_changes", "wireguard_mode", "pods", "cni", "peers"}


def test_every_served_document_reads_back_to_itself() -> None:
    assert AgentStatus.from_json(copy.deepcopy(FULL)).to_json() == FULL
    assert set(FULL) == PASS_KEYS | LIVE_KEYS | {"remotes", "node_list", "own_record", "lapsed"}
    starting = {"node": "a1", "ready": False, "reason": "starting",
                "datapath": {"mode": None, "reason": "loading", "counters": {}}, "path_probe": None,
                "path_changes": [], "wireguard_mode": None,
                "pods": {"source": "netlink", "found": ["veth1"], "fastpath": [],
                         "warning": "1 pod interface(s) on this node and none carry the fast path: the fast path "
                                    "is not loaded"},
                "cni": {"mode": "keep"}, "peers": []}
    assert AgentStatus.from_json(copy.deepcopy(starting)).to_json() == starting
    kube = {**starting, "kvstore": {"writing": True, "writer": "a1", "lease": 7, "puts": 3, "deletes": 0, "errors": 0,
                                    "takeovers": 1}}
    assert AgentStatus.from_json(copy.deepcopy(kube)).to_json() == kube
    broken = {**starting, "backend_error": "etcd away", "remotes": {"error": "no such directory"}}
    broken = {**broken, **{k: FULL[k] for k in PASS_KEYS if k not in broken}}
    assert AgentStatus.from_json(copy.deepcopy(broken)).to_json() == broken


def test_the_metrics_read_the_status() -> None:
    st = AgentStatus.from_json(copy.deepcopy(FULL))
    reg = CollectorRegistry()
    reg.register(AgentCollector(lambda: st))
    text = generate_latest(reg).decode()
    for line in ('meshctl_nodes 3.0', 'meshctl_peers 2.0', 'meshctl_leader 1.0', 'meshctl_backend_ready 1.0',
                 'meshctl_rejected_records 1.0', 'meshctl_routes 4.0', 'meshctl_pod_interfaces{state="fastpath"} 1.0',
                 'meshctl_reconciles_total{result="failed"} 1.0', 'meshctl_errors_total{part="nat"} 1.0',
                 'meshctl_rejections_total 1.0', 'meshctl_datapath_packets_total{action="direct"} 10.0',
                 'meshctl_datapath_mode{mode="ebpf"} 1.0', 'meshctl_datapath_objects_refused_total 1.0',
                 'meshctl_datapath_route_cache_fills_total 7.0',
                 'meshctl_wireguard_peer_receive_bytes_total{peer="b1"} 10.0',
                 'meshctl_wireguard_peer_handshake_age_seconds{peer="b2"} -1.0',
                 'meshctl_own_record_restored_total 1.0',
                 'meshctl_lapsed_records 1.0', 'meshctl_clustermesh_remote_rejected_records{cluster="c2"} 1.0',
                 'meshctl_path_pairs{rung="tunnel"} 1.0', 'meshctl_path_probe_up{kind="direct",peer="a2"} 1.0',
                 'meshctl_path_changes_total{from="none",reason="direct became available",to="direct"} 1.0'):
        assert line in text, line
    empty = AgentStatus.from_json({"node": "a1", "ready": False, "reason": "starting"})
    reg = CollectorRegistry()
    reg.register(AgentCollector(lambda: empty))
    assert "meshctl_nodes 0.0" in generate_latest(reg).decode()


def test_meshctl_status_formats_the_status() -> None:
    out = format_status(AgentStatus.from_json(copy.deepcopy(FULL))).splitlines()
    assert out[0] == "node a1  cluster c1  backend etcd: ready  revision 42"
    assert out[1] == ("granularity location  leader this node  wireguard ip 10.4.0.1/16 (wireguard-go)  nodes 3  "
                      "routes 4")
    assert out[2] == "datapath ebpf [tcx]  direct 10 pkts/1000 B  pass 3 pkts/300 B"
    assert out[3] == "objects: shipped (1 refused for their map layout version)"
    for line in ("pod interfaces: 1 carry the fast path, 1 found (netlink): veth1",
                 "WARNING: kilo's config is still installed", "WARNING: b1: never starts", "peers (2):",
                 "  a2  direct  probes: direct up 0.12 ms", "relay: c2/g1 through b1 (unreached)",
                 "discovered endpoints: b1 198.51.100.7:51820", "unreached peers: b2",
                 "rejected records (1):", "  x9: overlaps a1",
                 "own record restored: 1 time(s), last 2026-01-01T00:00:00Z deleted",
                 "lapsed records kept: a3 (12 s left)", "ClusterMesh: 1/1 remote clusters ready, 1 global-services",
                 "  rejected service c2/services/default/web/10.99.0.5: in no pod CIDR",
                 "    rejected c2/bad: no pod CIDR"):
        assert line in out, line
    assert not any("global services" in x for x in out)
    verbose = format_status(AgentStatus.from_json(copy.deepcopy(FULL)), verbose=True).splitlines()
    assert verbose[-2:] == ["  global services (published by a1):",
                            "    default/web  local 2  remote c2 3  affinity none"]
    assert any(x.startswith("last reconcile ") and x.endswith(", applied, errors: nat: boom") for x in out)
    starting = format_status(AgentStatus.from_json({"node": "a1", "ready": False, "reason": "starting"}))
    assert starting.splitlines()[0] == "node a1  cluster None  backend None: NOT READY (starting)  revision None"
    assert not [x for x in starting.splitlines() if x.startswith("objects:")], "no outcome before the datapath opens"
    routes = copy.deepcopy(FULL)
    routes["datapath"] = {"mode": "kernel-routes", "reason": "no kernel headers", "counters": {},
                          "objects": "kernel routes: no kernel headers", "objects_refused": 0}
    assert "objects: kernel routes: no kernel headers" in format_status(AgentStatus.from_json(routes)).splitlines()


def test_status_counts_exports_and_imports_where_the_cluster_serves_the_mcs_api() -> None:
    doc = copy.deepcopy(FULL)
    doc["remotes"]["clusterset"] = {
        "exports": 2, "remote_exports": {"c2": 3},
        "imports": [{"namespace": "default", "name": "db", "type": "Headless", "ips": [],
                     "endpoints": {"c1": ["10.42.1.5"], "c2": ["10.43.1.5", "10.43.2.5"]}}]}
    st = AgentStatus.from_json(doc)
    assert AgentStatus.from_json(st.to_json()) == st  # the block round-trips
    out = format_status(st, verbose=True).splitlines()
    assert "ClusterMesh: 1/1 remote clusters ready, 1 global-services, 2 exports, 1 imports" in out
    assert any(x.startswith("  c2  ready  nodes 2  rejected 1  exports 3  endpoints ") for x in out), out
    assert out[-2:] == ["  service imports (clusterset.local):", "    default/db  Headless -  endpoints c1 1, c2 2"]
    # An agent whose cluster does not serve the API (or an older agent): no counts, no column.
    plain = format_status(AgentStatus.from_json(copy.deepcopy(FULL))).splitlines()
    assert "ClusterMesh: 1/1 remote clusters ready, 1 global-services" in plain
    assert not any(" exports " in x for x in plain)


def test_a_node_rows_fast_path_entries_are_the_plans_for_its_pod_cidrs() -> None:
    row = {**FULL["node_list"][0], "pod_cidrs": ["10.42.1.0/24", "10.42.9.0/24"],
           "fastpath": [{"prefix": "10.42.1.0/24", "action": "drop", "nexthop": None}]}
    ours = FastPathRow("10.42.1.0/24", "direct", "10.30.0.1")
    other = FastPathRow("10.42.2.0/24", "direct", "10.30.0.2")
    assert NodeRow.from_json(row, {"10.42.2.0/24": other, "10.42.1.0/24": ours}).fastpath == (ours,)
    assert NodeRow.from_json(row, {}).fastpath == ()
    assert NodeRow.from_json(row).fastpath == (FastPathRow("10.42.1.0/24", "drop", None),)


def test_meshctl_status_says_what_a_peer_without_allowed_ips_is() -> None:
    doc = copy.deepcopy(FULL)
    doc["peers"].append({"name": "a0", "kind": "standby", "public_key": "K0", "endpoint": "198.51.100.9:51820",
                         "allowed_ips": []})
    out = format_status(AgentStatus.from_json(doc)).splitlines()
    assert any(x.startswith("  a0  endpoint 198.51.100.9:51820  allowed - (standby: kept for a leader's return)")
               for x in out), out
    assert any(x.startswith("  b2  endpoint -  allowed -  rx") for x in out), out
