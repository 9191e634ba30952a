# SPDX-License-Identifier: Apache-2.0
"""Agent convergence and scale, on a real lab (namespaces, etcd over mTLS, real agents).

1. Join convergence: a node record appears in etcd; time until EVERY agent has installed the route
   to its pod CIDR (seen by `ip monitor route` in each node namespace). Median and p95 over joins.
2. Scale: 1,000 then 5,000 synthetic records in etcd; per agent, the time of one reconcile pass
   after a single record changes (from /status: wall time and the loop thread's CPU time) and the
   agent's RSS. The bench waits for a pass on /metrics (cheap) and reads /status once after it:
   polling /status (a 1.5 MB JSON at 5,000 nodes) would compete with the pass it measures.

    .venv/bin/python bench/convergence.py [--joins 20] [--sizes 1000,5000] [--samples 5] [--prefix mb-]

Targets: median convergence < 1 s; reconcile at 5,000 records < 0.5 s; RSS < 150 MB.
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import json
import statistics
import subprocess
import threading
import time
from typing import Any

from meshctl.backends.etcd import node_key
from meshctl.etcd import EtcdClient
from meshctl.etcd.nsconn import session
from meshctl.lab.namespaces import build
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.namespaces.state import LabState, NodeState
from meshctl.lab.rigs import netns

LAB = {
    "cluster": {"name": "default", "id": 1},
    "mesh": {"granularity": "location"},
    "nodes": [
        {"name": "a1", "location": "loc-a", "internal_ip": "10.10.1.11/24", "pod_cidr": "10.42.1.0/24", "leader": True},
        {"name": "a2", "location": "loc-a", "internal_ip": "10.10.1.12/24", "pod_cidr": "10.42.2.0/24"},
        {"name": "b1", "location": "loc-b", "internal_ip": "10.10.2.11/24", "pod_cidr": "10.42.3.0/24"},
    ],
    "lab": {"lease_ttl": 10},
}
SYNTH_BASE = int(ipaddress.ip_address("10.128.0.0"))


def synth_record(i: int, locations: int = 50) -> tuple[str, dict[str, Any]]:
    """Node i: pod CIDR 10.128.0.0/9 split in /24s; `locations` locations, each a private /16 of
    100.64.0.0/10 (nothing routes there: WireGuard never sends to these peers)."""
    loc, j = i % locations, i // locations
    rec = {
        "name": f"s{i}", "location": f"synth-{loc}",
        "internal_ip": f"100.{64 + loc}.{j // 250}.{1 + j % 250}/16",
        "pod_cidr": f"{ipaddress.ip_address(SYNTH_BASE + 256 * i)}/24",
        "public_key": base64.b64encode((i + 1000).to_bytes(32, "big")).decode(),
        "endpoint": f"203.0.113.{1 + i % 250}:51820",
    }
    return rec["name"], rec


class RouteWatch:
    """`ip -o monitor route` in a namespace; remembers when each destination was first added."""

    def __init__(self, ns: str) -> None:
        self.seen: dict[str, float] = {}
        # an 8 MiB socket buffer: a renumbered remote cluster changes 10,000 routes at once, which
        # overflow the default one ("netlink receive error No buffer space available")
        self._p = subprocess.Popen([*netns.exec_prefix(ns), "ip", "-rcvbuf", str(8 << 20), "-o", "monitor", "route"],
                                   stdout=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self._p.stdout is not None
        for line in self._p.stdout:
            t = time.monotonic()
            if line.startswith("Deleted"):
                continue
            dst = line.split()[0]
            self.seen.setdefault(dst, t)

    def stop(self) -> None:
        self._p.terminate()
        self._p.wait(5)


def client_for(st: LabState) -> EtcdClient:
    return build.etcd_client(st.clusters[0], timeout=10)


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def joins(st: LabState, n: int) -> list[float]:
    return measure_joins(client_for(st), "default", st.clusters[0].nodes, n)


def measure_joins(c: EtcdClient, cluster: str, watchers: list[NodeState], n: int,
                  second_octet: int = 127, settle: float = 0.2, timeout: float = 10) -> list[float]:
    """Write `n` node records (one at a time) into `cluster`'s etcd; for each, the time until every
    watcher node has the route to its pod CIDR in its kernel table (at most `timeout` s). Each
    record is deleted after, and the next written `settle` s later (the deletion's pass done)."""
    watches = [RouteWatch(x.netns) for x in watchers]
    time.sleep(0.3)
    out = []
    try:
        for i in range(n):
            name, rec = synth_record(900000 + i, locations=1)
            rec.update(location=f"join-{i}", pod_cidr=f"10.{second_octet}.{i}.0/24",
                       internal_ip=f"172.{second_octet - 96}.{i}.1/24")
            t0 = time.monotonic()
            c.put(node_key(cluster, name), json.dumps(rec))
            dst = rec["pod_cidr"]
            deadline = t0 + timeout
            while time.monotonic() < deadline and not all(dst in w.seen for w in watches):
                time.sleep(0.002)
            if not all(dst in w.seen for w in watches):
                raise SystemExit(f"join {i}: not every agent installed {dst} within {timeout:.0f} s")
            out.append(max(w.seen[dst] for w in watches) - t0)
            c.delete(node_key(cluster, name))
            time.sleep(settle)
    finally:
        for w in watches:
            w.stop()
    return out


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def passes(node: NodeState) -> int:
    """The agent's reconcile count, from /metrics (a few hundred bytes; /status is megabytes)."""
    with session(node.netns) as s:
        text = s.get(f"http://{node.metrics_addr}/metrics", timeout=10).text
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
               if line.startswith("meshctl_reconciles_total{"))


def scale(st: LabState, sizes: list[int], samples: int = 5) -> list[dict[str, Any]]:
    c = client_for(st)
    nodes = st.clusters[0].nodes
    written = 0
    rows = []
    for size in sizes:
        items = [synth_record(i) for i in range(written, size)]
        t0 = time.monotonic()
        c.put_many([(node_key("default", name), json.dumps(rec)) for name, rec in items])
        written = size
        want = size + len(nodes)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            sts = [labcheck.agent_status(x, timeout=10) for x in nodes]
            if all(s and s.get("nodes") == want and (s.get("last_reconcile") or {}).get("applied") for s in sts):
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"agents did not converge on {want} nodes")
        converge = time.monotonic() - t0
        # Steady state. "touch": one record changes in a way that leaves every plan as it is
        # (appliers are skipped); "join": one more node (every plan and applier changes by one).
        time.sleep(1)  # let the passes that followed the bulk write settle
        durs: dict[tuple[str, str], list[tuple[float, float]]] = {}
        steps: dict[str, dict[str, float]] = {}
        for kind in ("touch", "join"):
            for k in range(samples):
                if kind == "touch":
                    name, rec = synth_record(k)
                    rec["persistent_keepalive"] = 10 + k + size
                    want = size + len(nodes) + (written - size)
                else:
                    name, rec = synth_record(written)
                    written += 1
                    want = size + len(nodes) + (written - size)
                before = {x.name: passes(x) for x in nodes}
                c.put(node_key("default", name), json.dumps(rec))
                todo = list(nodes)
                deadline = time.monotonic() + 30
                while todo:
                    # Wait until every agent has made a pass, then read their /status: a status read
                    # (megabytes of JSON) must not compete with another agent's pass being measured.
                    while any(passes(x) <= before[x.name] for x in todo):
                        if time.monotonic() > deadline:
                            raise SystemExit(f"no pass for the {kind} of {name} within 30 s")
                        time.sleep(0.1)
                    for x in list(todo):
                        s = labcheck.agent_status(x, timeout=10) or {}
                        last = s.get("last_reconcile") or {}
                        if s.get("nodes") == want and last.get("applied"):
                            cpu = last.get("cpu_s", float("nan"))  # agents before cpu_s have none
                            durs.setdefault((kind, x.name), []).append((last["duration_s"], cpu))
                            if kind == "join":
                                steps[x.name] = last.get("steps_ms", {})
                            todo.remove(x)
                        else:  # that pass was another one (a pod scan, say): wait for the next
                            before[x.name] = passes(x)
                time.sleep(0.3)
        for x in nodes:
            touch, join = durs[("touch", x.name)], durs[("join", x.name)]
            rows.append({"records": size, "node": x.name, "initial_convergence_s": round(converge, 2),
                         "touch_ms": round(1000 * statistics.median(d for d, _ in touch), 1),
                         "touch_cpu_ms": round(1000 * statistics.median(c for _, c in touch), 1),
                         "reconcile_ms": round(1000 * statistics.median(d for d, _ in join), 1),
                         "reconcile_max_ms": round(1000 * max(d for d, _ in join), 1),
                         "reconcile_cpu_ms": round(1000 * statistics.median(c for _, c in join), 1),
                         "rss_mb": round(rss_mb(x.pid), 1), "steps_ms": steps.get(x.name, {})})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--joins", type=int, default=20)
    ap.add_argument("--sizes", default="1000,5000")
    ap.add_argument("--samples", type=int, default=5, help="touches and joins per size (medians reported)")
    ap.add_argument("--prefix", default="mb-")
    ap.add_argument("--no-fastpath", action="store_true", help="agents without eBPF (to see its share of RSS)")
    args = ap.parse_args()
    name = args.prefix.rstrip("-")
    t = time.monotonic()
    lab = {**LAB, "lab": {**LAB["lab"], "fastpath": not args.no_fastpath}}
    st = build.up(parse_lab(lab), prefix=args.prefix)
    try:
        for x in st.clusters[0].nodes:  # let the fast path finish loading first
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and \
                    not ((labcheck.agent_status(x) or {}).get("datapath") or {}).get("mode"):
                time.sleep(0.1)
        js = joins(st, args.joins)
        print(f"join convergence over {len(js)} joins (3 agents): median {1000 * statistics.median(js):.0f} ms, "
              f"p95 {1000 * pct(js, 95):.0f} ms, max {1000 * max(js):.0f} ms   target: median < 1 s")
        sizes = [int(s) for s in args.sizes.split(",") if s]
        rows = scale(st, sizes, args.samples)
        print("medians of", args.samples, "passes; wall time (loop-thread CPU time); join max = slowest join pass")
        print(f"{'records':>8} {'node':>5} {'first converge':>15} {'touch':>17} {'join':>17} {'join max':>9} "
              f"{'RSS':>9}")
        for r in rows:
            print(f"{r['records']:>8} {r['node']:>5} {r['initial_convergence_s']:>13.2f} s "
                  f"{r['touch_ms']:>6.0f} ({r['touch_cpu_ms']:>4.0f}) ms {r['reconcile_ms']:>6.0f} "
                  f"({r['reconcile_cpu_ms']:>4.0f}) ms {r['reconcile_max_ms']:>6.0f} ms {r['rss_mb']:>6.1f} MB")
        for r in rows:
            if r["records"] == max(sizes):
                print(f"last join at {r['records']} on {r['node']} (ms): {r['steps_ms']}")
        worst = max(r["reconcile_ms"] for r in rows if r["records"] == max(sizes))
        touch = max(r["touch_ms"] for r in rows if r["records"] == max(sizes))
        print(f"worst median reconcile at {max(sizes)} records: {touch:.0f} ms when no plan changes, {worst:.0f} ms "
              f"for a join (target < 500 ms); max RSS {max(r['rss_mb'] for r in rows):.0f} MB (target < 150 MB)")
    finally:
        build.down(name)
        print(f"(total {time.monotonic() - t:.0f} s)")


if __name__ == "__main__":
    main()
