# SPDX-License-Identifier: Apache-2.0
"""What the agent serves for `meshctl explain`: each pair's last rung moves in wall-clock time,
the path MTU by rung, the plan's fast-path entries by pod CIDR, and `/probe?peer=NAME`."""

from __future__ import annotations

import ipaddress

import requests

from meshctl.agent.path_probing import HISTORY_MOVES, with_history
from meshctl.agent.reporting import rung_mtus
from meshctl.agent.server import StatusServer, fetch_probe
from meshctl.agent.status import AgentStatus, LiveStatus, ProbeResult
from meshctl.mesh.chooser import Change, PairProbe, ProbeStatus
from meshctl.mesh.plan import Encap, FastPathEntry
from meshctl.mesh.render import fastpath_rows
from tests.agent.test_local_agent import free_port


def test_history_keeps_each_pairs_last_moves_in_wall_clock_time() -> None:
    st = ProbeStatus(1, (), 0, 0, 0.0, {"a": PairProbe("tunnel", ("direct", "tunnel"), None, {}),
                                        "b": PairProbe("direct", ("direct", "tunnel"), None, {})})
    changes = [Change("a", None, "direct", "first probes", 10.0), Change("b", None, "direct", "first probes", 11.0),
               *[Change("a", "direct", "tunnel", f"move {i}", 20.0 + i) for i in range(5)],
               Change("gone", None, "direct", "first probes", 12.0)]
    out = with_history(st, changes, 1000.0)
    assert [(m.reason, m.at) for m in out.pairs["a"].history] == [("move 2", 1022.0), ("move 3", 1023.0),
                                                                   ("move 4", 1024.0)]
    assert len(out.pairs["a"].history) == HISTORY_MOVES and [m.old for m in out.pairs["b"].history] == [None]
    assert "gone" not in out.pairs


def test_the_path_mtu_of_each_rung() -> None:
    assert rung_mtus(9000) == {"direct": 9000, "direct+ipip": 8980, "direct+vxlan": 8950,
                               "wireguard-private": 8920, "tunnel": 8920}
    assert rung_mtus(None) == {"wireguard-private": 1420, "tunnel": 1420}
    # Over an IPv6 underlay the outer header is 40 bytes: IP-in-IPv6 takes 40, VXLAN over IPv6 70.
    assert rung_mtus(9000, 6) == {"direct": 9000, "direct+ipip": 8960, "direct+vxlan": 8930,
                                  "wireguard-private": 8920, "tunnel": 8920}


def test_fast_path_rows_by_pod_cidr() -> None:
    net = ipaddress.ip_network
    rows = fastpath_rows([FastPathEntry(net("10.42.2.0/24"), "direct", ipaddress.ip_address("10.30.1.12")),
                          FastPathEntry(net("10.42.4.0/24"), "direct", None,
                                        Encap("ipip", ipaddress.ip_address("10.30.2.11"),
                                              ipaddress.ip_address("10.30.2.12")))])
    assert rows["10.42.2.0/24"].nexthop == "10.30.1.12" and rows["10.42.2.0/24"].rung == "direct"
    assert rows["10.42.4.0/24"].rung == "direct+ipip" and rows["10.42.4.0/24"].outer_dst == "10.30.2.12"


def test_the_probe_endpoint_answers_one_probe_and_refuses_a_missing_peer() -> None:
    asked: list[str] = []

    def probe(peer: str) -> ProbeResult:
        asked.append(peer)
        return ProbeResult(peer, "direct", "direct", True, 0.25, 0.5)

    def status(node_list: bool = True, fresh: bool = False) -> AgentStatus:
        return AgentStatus("a1", True, "", None, LiveStatus.from_json({}))

    srv = StatusServer(f"127.0.0.1:{free_port()}", status, lambda: True, probe=probe)
    srv.start()
    try:
        addr = f"127.0.0.1:{srv.address[1]}"
        assert fetch_probe(addr, "c2/g1") == ProbeResult("c2/g1", "direct", "direct", True, 0.25, 0.5)
        assert asked == ["c2/g1"]
        r = requests.get(f"http://{addr}/probe", timeout=3)
        assert r.status_code == 400 and "peer: missing" in r.json()["error"]
    finally:
        srv.stop()
    plain = StatusServer(f"127.0.0.1:{free_port()}", status, lambda: True)
    plain.start()
    try:
        assert requests.get(f"http://127.0.0.1:{plain.address[1]}/probe?peer=x", timeout=3).status_code == 404
    finally:
        plain.stop()


def test_metrics_ask_for_the_status_without_the_node_list() -> None:
    asked: list[bool] = []
    row = {"name": "a1", "cluster": "c1", "source": "local", "location": "", "internal_ip": None, "endpoint": None,
           "pod_cidrs": [], "wireguard_ip": None, "path": "local", "relay": None, "relay_reason": None}

    def status(node_list: bool = True, fresh: bool = False) -> AgentStatus:
        asked.append(node_list)
        return AgentStatus("a1", True, "", None, LiveStatus.from_json({"node_list": [row]} if node_list else {}))

    srv = StatusServer(f"127.0.0.1:{free_port()}", status, lambda: True)
    srv.start()
    try:
        base = f"http://127.0.0.1:{srv.address[1]}"
        assert "meshctl_peers 0.0" in requests.get(f"{base}/metrics", timeout=3).text
        assert asked == [False]
        assert requests.get(f"{base}/status", timeout=3).json()["node_list"] == [row]
        assert asked == [False, True]
    finally:
        srv.stop()
