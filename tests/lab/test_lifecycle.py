# SPDX-License-Identifier: Apache-2.0
"""Must show: a node joining (every pod reaches it), leaving after the lease and the grace,
restarts losing no packet, etcd outages, bad records. Each test in its own lab. How fast a join
converges is bench/convergence.py's figure (docs/benchmarks.md), not a bound here."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from meshctl.backends.etcd import mesh_key, node_key
from meshctl.etcd import EtcdClient
from meshctl.etcd.nsconn import session
from meshctl.lab.namespaces import build
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces.state import LabState
from meshctl.lab.rigs import netns
from tests.pinging import PodPing, node_log_lines
from tests.waiting import wait_until

from .conftest import node_of, pair, status, topo, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]


def etcd(st: LabState) -> EtcdClient:
    return build.etcd_client(st.clusters[0])


def reach(st: LabState, src: str, dst: str) -> bool:
    s, d = node_of(st, src), node_of(st, dst)
    p = netns.run(s.pods[0].netns, ["ping", "-n", "-q", "-c", "1", "-W", "0.2", d.pods[0].ip], check=False)
    return p.returncode == 0


GRACE = 2  # --lapse-grace of this lab: a dead node leaves after its lease and this grace
JOIN_WAIT_S = 60  # a join on a loaded 2-CPU machine (an agent's start included); bench/convergence.py times it


def test_join_and_leave_after_lease_and_grace(make_lab):
    st = make_lab(topo("location", agent_args=["--lapse-grace", str(GRACE)]), hold=("b1",))
    assert status(st, "a1")["nodes"] == 2
    t0 = time.monotonic()
    build.start_agent(st, "b1")
    pending = {(a, b) for a in ("a1", "a2", "b1") for b in ("a1", "a2", "b1") if a != b}

    def joined() -> bool:
        pending.difference_update({p for p in pending if reach(st, *p)})
        return not pending

    wait_until(joined, JOIN_WAIT_S, f"b1's pairs reachable (still not: {pending})")
    print(f"\nb1 reachable from every pod {time.monotonic() - t0:.2f} s after its agent was started")

    # The agent dies (no goodbye): its record goes with the lease, and with it from every plan once
    # the lapse grace is over (a restarting agent would have come back by then).
    build.stop_agent(st, "b1", kill=True)
    t1 = time.monotonic()
    assert wait_for(lambda: all(status(st, n)["nodes"] == 2 and "b1" not in status(st, n)["paths"]
                                for n in ("a1", "a2")), timeout=st.lease_ttl + GRACE + 30)
    gone = time.monotonic() - t1
    assert gone >= st.lease_ttl + GRACE - 1.5, f"gone after {gone:.1f} s, before lease and grace could expire"
    assert etcd(st).get(node_key("default", "b1")) is None

    # `meshctl cleanup` removes what the agent made on b1.
    b1 = node_of(st, "b1")
    cmd = [sys.executable, "-m", "meshctl.cli", "cleanup", "--node", "b1", "--wg-run-dir", b1.wg_run_dir,
           "--private-interface", "priv", "--bpf-pin-root", f"{st.pin_root}/default",
           "--nat-prefix", f"{st.prefix}nat"]
    p = netns.run(b1.netns, cmd, check=False, timeout=60)
    assert p.returncode == 0, p.stderr
    links = netns.run(b1.netns, ["ip", "-o", "link"]).stdout
    assert "kilo0" not in links
    assert "proto 109" not in netns.run(b1.netns, ["ip", "route"]).stdout


def test_agent_restart_under_ping_loses_nothing(make_lab):
    st = make_lab(topo("location"))
    assert wait_for(lambda: all(status(st, n)["datapath"]["mode"] for n in ("a1", "a2", "b1")), timeout=20)
    assert pair(st, "a2", "a1").path == "direct" and pair(st, "a1", "b1").path == "tunnel"
    direct = PodPing(st, "a2", "a1", 6).answered()
    tunnel = PodPing(st, "a1", "b1", 6).answered()
    for n in ("a1", "a2", "b1"):
        build.stop_agent(st, n)            # SIGTERM: routes, WireGuard and maps stay
        build.start_agent(st, n)
    assert wait_for(lambda: all(((labcheck.agent_status(node_of(st, n)) or {}).get("last_reconcile") or {})
                                .get("applied") for n in ("a1", "a2", "b1")), timeout=10)
    for name, p in (("a2 -> a1 direct", direct), ("a1 -> b1 tunnel", tunnel)):
        got = p.result()
        if got.lost:  # what the three agents (and the leaders' wireguard-go) logged around the loss
            logs = node_log_lines(st, ("a1", "a2", "b1"), min(got.lost_at) - 1, max(got.lost_at) + 1)
            raise AssertionError("\n".join([f"{name} lost {got.lost}", *logs]))
        assert got.elapsed >= 6 and got.covered, (name, got)
    # Every agent holds all three nodes: the restarted agents took over their predecessors' leases, and
    # a record that lapsed meanwhile (a restart slower than the lab's 3 s lease) was kept through its grace.
    assert all(status(st, n)["nodes"] == 3 for n in ("a1", "a2", "b1"))


def test_etcd_outage_keeps_routes_and_resyncs(make_lab):
    st = make_lab(topo("location"))
    build.stop_etcd(st, "default")
    assert wait_for(lambda: all(not status(st, n)["ready"] for n in ("a1", "a2", "b1")), timeout=10)
    s = status(st, "a2")
    assert s["reason"] and s["nodes"] == 3
    # Routes and tunnels stay: traffic keeps flowing while etcd is away.
    assert pair(st, "a2", "b1").ok and pair(st, "a1", "b1").path == "tunnel"
    build.start_etcd(st, "default")
    assert wait_for(lambda: all((labcheck.agent_status(node_of(st, n)) or {}).get("ready") for n in ("a1", "a2", "b1")),
                    timeout=15)
    etcd(st).put(mesh_key("default"), json.dumps({"granularity": "cross"}))
    assert wait_for(lambda: all(status(st, n)["granularity"] == "cross" for n in ("a1", "a2", "b1")), timeout=10)
    assert wait_for(lambda: pair(st, "a2", "b1", count=3).path == "tunnel")
    assert all(etcd(st).get(node_key("default", n)) is not None for n in ("a1", "a2", "b1"))


def test_bad_records_are_rejected_and_named(make_lab):
    import base64

    st = make_lab(topo("location"))
    c = etcd(st)
    k = base64.b64encode(bytes(range(32))).decode()
    c.put(node_key("default", "junk"), "{garbage")
    c.put(node_key("default", "badcidr"), json.dumps({"name": "badcidr", "pod_cidr": "10.42.7.0/33",
                                                      "public_key": k}))
    c.put(node_key("default", "overlap"), json.dumps({"name": "overlap", "pod_cidr": "10.42.1.128/25",
                                                      "public_key": k, "location": "x"}))
    c.put(node_key("default", "dupip"), json.dumps({"name": "dupip", "pod_cidr": "10.42.8.0/24", "public_key": k,
                                                    "internal_ip": "10.10.1.11/24", "location": "loc-a"}))
    want = {"junk", "badcidr", "overlap", "dupip"}
    assert wait_for(lambda: all({r["name"] for r in status(st, n)["rejections"]} == want
                                for n in ("a1", "a2", "b1")), timeout=5)
    reasons = {r["name"]: r["reason"] for r in status(st, "a2")["rejections"]}
    assert "is not JSON" in reasons["junk"]
    assert "10.42.7.0/33" in reasons["badcidr"]
    assert "overlaps a1's pod CIDR 10.42.1.0/24" in reasons["overlap"]
    assert "already used by a1" in reasons["dupip"]
    assert status(st, "a2")["nodes"] == 3
    # Everything else keeps flowing.
    for src, dst in (("a2", "b1"), ("a2", "a1"), ("b1", "a1")):
        assert pair(st, src, dst).ok
    # The CLI names them; the metrics count them.
    a2 = node_of(st, "a2")
    p = subprocess.run([sys.executable, "-m", "meshctl.cli", "status", "--lab", st.name, "--lab-node", "a2"],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert "rejected records (4)" in p.stdout and "overlap:" in p.stdout and "is not JSON" in p.stdout
    with session(a2.netns) as s:
        metrics = s.get(f"http://{a2.metrics_addr}/metrics", timeout=3).text
        assert s.get(f"http://{a2.metrics_addr}/healthz", timeout=3).status_code == 200
    assert "meshctl_rejected_records 4.0" in metrics
    assert re.search(r"meshctl_rejections_total [4-9]", metrics)
    assert 'meshctl_reconciles_total{result="ok"}' in metrics
    assert "meshctl_reconcile_duration_seconds_count" in metrics
    assert "meshctl_nodes 3.0" in metrics
