# SPDX-License-Identifier: Apache-2.0
"""Cluster mesh convergence and scale on the two-cluster lab (real agents, an etcd with mTLS per
cluster, real WireGuard and fast path).

1. Remote join: a node record appears in cluster2's etcd; time until cluster1's agents have
   installed the route to its pod CIDR (`ip monitor route` in each of their namespaces), with
   nothing done on cluster1. Median and p95 over joins.
2. Scale: 1,000 then 5,000 synthetic remote records in cluster2's etcd; the time of one reconcile
   pass of cluster1's leader (from /status) when a remote record changes without changing the plan
   ("touch") and when one more remote node joins ("join"), and the agent's RSS.

3. With `--cache`: cluster1's `meshctl clustermesh cache` started and its agents restarted with
   `--clustermesh-cache`; the remote joins of 1 again, through the cache (baseline: the direct
   joins of 1, same run).

    .venv/bin/python bench/clustermesh.py [--joins 20] [--sizes 1000,5000] [--cache]

Baseline: the same agent's reconcile with no remote records, measured in the same run.
Targets (issue 5): median remote-join convergence < 1 s; reconcile at 5,000 remote nodes < 0.5 s.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from convergence import measure_joins, passes, pct, rss_mb, synth_record
from meshctl.backends.etcd import node_key
from meshctl.lab.namespaces import build
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.namespaces.state import LabState, NodeState

LAB_FILE = Path(__file__).resolve().parents[1] / "ctl/meshctl/lab/labs/two-clusters.yaml"


def client(st: LabState, name: str):
    return build.etcd_client(st.cluster(name), timeout=30)


def remote_joins(st: LabState, n: int) -> list[float]:
    """Records written to cluster2's etcd, routes watched on every cluster1 agent."""
    return measure_joins(client(st, "cluster2"), "cluster2", st.cluster("cluster1").nodes, n, second_octet=126)


def via_cache(st: LabState, n: int, direct: list[float]) -> None:
    """The remote joins of `remote_joins` again with cluster1's agents following cluster2 through
    the cache, printed against the direct ones (`direct`, this run)."""
    c1 = st.cluster("cluster1").nodes
    build.start_cache(st, "cluster1")
    try:
        for node in c1:
            build.stop_agent(st, node.name)
            build.start_agent(st, node.name, extra_args=("--clustermesh-cache",))
        deadline = time.monotonic() + 120
        while not all(((labcheck.agent_status(x) or {}).get("remotes") or {}).get("via") == "via cache" for x in c1):
            if time.monotonic() > deadline:
                raise SystemExit("cluster1's agents did not follow cluster2 through the cache within 120 s")
            time.sleep(0.2)
        js = remote_joins(st, n)
        print(f"through the cache, over {len(js)} joins: median {1000 * statistics.median(js):.0f} ms "
              f"({statistics.median(js) / statistics.median(direct):.2f}x direct), p95 {1000 * pct(js, 95):.0f} ms "
              f"({pct(js, 95) / pct(direct, 95):.2f}x direct), max {1000 * max(js):.0f} ms")
    finally:
        build.stop_cache(st, "cluster1")


def last_reconcile(node: NodeState) -> dict[str, Any]:
    return (labcheck.agent_status(node, timeout=10) or {}).get("last_reconcile") or {}


def remote_nodes(node: NodeState) -> int:
    s = labcheck.agent_status(node, timeout=10) or {}
    return sum(c.get("nodes", 0) for c in (s.get("remotes") or {}).get("clusters", []))


STEPS: list[dict[str, float]] = [{}]  # steps_ms of the last measured pass
CPU: list[float] = []  # the loop thread's CPU time of each measured pass


def one_reconcile(st: LabState, node: NodeState, write) -> float:
    """Write, wait for the agent's next pass on /metrics (small), then read /status once: polling
    the megabytes of /status at 5,000 nodes would compete with the pass being measured."""
    before = passes(node)
    write()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if passes(node) > before:
            last = last_reconcile(node)
            if last.get("applied"):
                STEPS[0] = {**last.get("steps_ms", {}), "cpu_ms": round(1000 * last.get("cpu_s", 0), 1)}
                CPU.append(last.get("cpu_s", float("nan")))
                return last["duration_s"]
            before = passes(node)
        time.sleep(0.1)
    raise SystemExit("no reconcile within 60 s")


def scale(st: LabState, sizes: list[int]) -> list[dict[str, Any]]:
    kv = client(st, "cluster2")
    leader = next(n for n in st.cluster("cluster1").nodes if n.name == "a1")
    touch_name, touch_rec = "s-touch", dict(synth_record(0)[1], name="s-touch", pod_cidr="10.125.0.0/24")

    def put(name: str, rec: dict[str, Any]) -> None:
        kv.put(node_key("cluster2", name), json.dumps(rec))

    put(touch_name, touch_rec)
    base_remote = 0
    while base_remote != 4:  # g1, g2, g3 and s-touch
        base_remote = remote_nodes(leader)
        time.sleep(0.1)
    rows = []
    written = 0  # synthetic records s0..s{written-1} in cluster2's etcd
    for size in [0, *sizes]:
        t0 = time.monotonic()
        if size > written:
            kv.put_many([(node_key("cluster2", name), json.dumps(rec))
                         for name, rec in (synth_record(i) for i in range(written, size))])
            written = size
        while remote_nodes(leader) != base_remote + written:
            if time.monotonic() - t0 > 300:
                raise SystemExit(f"a1 did not see {written} synthetic remote records")
            time.sleep(0.2)
        converge = time.monotonic() - t0
        time.sleep(1)  # let the passes that followed the bulk write settle
        touch, join, touch_cpu, join_cpu = [], [], [], []
        for k in range(3):
            rec = dict(touch_rec, persistent_keepalive=10 + k + size)
            touch.append(one_reconcile(st, leader, lambda r=rec: put(touch_name, r)))
            touch_cpu.append(CPU[-1])
            name, rec = synth_record(written)
            written += 1
            join.append(one_reconcile(st, leader, lambda n=name, r=rec: put(n, r)))
            join_cpu.append(CPU[-1])
        print(f"  last join pass at {size} remote records (ms): {STEPS[0]}")
        rows.append({"remote_records": size, "first_converge_s": round(converge, 2),
                     "touch_ms": round(1000 * statistics.median(touch), 1),
                     "join_ms": round(1000 * statistics.median(join), 1),
                     "touch_cpu_ms": round(1000 * statistics.median(touch_cpu), 1),
                     "join_cpu_ms": round(1000 * statistics.median(join_cpu), 1),
                     "rss_mb": round(rss_mb(leader.pid), 1)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--joins", type=int, default=20)
    ap.add_argument("--sizes", default="1000,5000")
    ap.add_argument("--prefix", default="mbc-")
    ap.add_argument("--cache", action="store_true", help="also the remote joins through cluster1's cluster-mesh cache")
    args = ap.parse_args()
    doc = copy.deepcopy(yaml.safe_load(LAB_FILE.read_text()))
    doc["lab"].update(lease_ttl=10, prefix=args.prefix)
    t = time.monotonic()
    st = build.up(parse_lab(doc, str(LAB_FILE)), prefix=args.prefix)
    try:
        for _, x in st.nodes():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and \
                    ((labcheck.agent_status(x) or {}).get("datapath") or {}).get("mode") in (None, "loading"):
                time.sleep(0.1)
        js = remote_joins(st, args.joins)
        print(f"remote join -> route on every cluster1 agent, over {len(js)} joins: median "
              f"{1000 * statistics.median(js):.0f} ms, p95 {1000 * pct(js, 95):.0f} ms, max {1000 * max(js):.0f} ms"
              f"   target: median < 1 s")
        rows = scale(st, [int(s) for s in args.sizes.split(",") if s])
        base = rows[0]
        print("wall time (loop-thread CPU time) of a1's pass, medians of 3; all 6 lab agents share 2 cores and")
        print("cluster2's 3 agents reconcile the same change at the same time (with 5,000 local records)")
        print(f"{'remote records':>14} {'first converge':>15} {'touch':>16} {'join':>16} {'join vs 0':>10} {'RSS':>9}")
        for r in rows:
            ratio = r["join_ms"] / max(base["join_ms"], 0.1)
            print(f"{r['remote_records']:>14} {r['first_converge_s']:>13.2f} s "
                  f"{r['touch_ms']:>6.0f} ({r['touch_cpu_ms']:>4.0f}) ms "
                  f"{r['join_ms']:>6.0f} ({r['join_cpu_ms']:>4.0f}) ms "
                  f"{ratio:>9.1f}x {r['rss_mb']:>6.1f} MB")
        last = rows[-1]
        print(f"reconcile of cluster1's leader at {last['remote_records']} remote nodes: "
              f"wall {last['touch_ms']:.0f} ms (no plan change) / {last['join_ms']:.0f} ms (a remote join); "
              f"CPU {last['touch_cpu_ms']:.0f} / "
              f"{last['join_cpu_ms']:.0f} ms; target < 500 ms")
        if args.cache:  # last: the agents are restarted for it
            via_cache(st, args.joins, js)
    finally:
        build.down(st.name)
        print(f"(total {time.monotonic() - t:.0f} s)")


if __name__ == "__main__":
    main()
