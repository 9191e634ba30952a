# SPDX-License-Identifier: Apache-2.0
"""Cluster mesh at 10 clusters x 5,000 nodes (issue 23, part 4). Three figures, each beside the
baseline it names, measured in the same run:

1. plan: admission of the remote clusters (`mesh.admit.admit_remotes`) and the plan of one node
   (`mesh.plan.plan_node`), the pure functions the agent runs on every pass with remote clusters,
   on synthetic records parsed as the etcd backend parses them, at 5,000 / 10,000 / 20,000 / 50,000
   nodes as 10 clusters x N/10 (location granularity, 50 locations per cluster). "cold": nothing
   memoised; "join": the pass after one remote node joined an existing location (what an agent
   does: the remote segments it did not touch are memoised). Baseline: 5,000 nodes; growth to
   50,000 against n log n (12.7x). Goal: < 1 s at 50,000.
2. agent: the same records in real etcds (the lab's two-cluster lab, etcd with mTLS; cluster1's
   and cluster2's records in their own etcds, cluster3..cluster10 in cluster2's etcd process: 2
   etcd processes for 10 clusters), one real agent (cluster1's a1, fast path off) following the 9
   remote clusters directly; time from writing one new remote record (convergence.measure_joins: a
   node in a location of its own, in cluster5) until its route is in a1's
   kernel table (`ip monitor route`), the pass's own time, and a1's RSS. Baseline: 10 x 500.
   Goal at 50,000: < 1 s wall, < 500 MB RSS.
3. watch load: watch traffic one remote etcd (cluster2's, loopback, mTLS) serves during 1,000
   joins written to it, with K real watchers (`RemoteClusters`, as agents run them) connected
   directly, versus through the cache (`ClusterMeshCache` watching it once, the K watchers on
   cluster1's etcd). Counted by that etcd's /metrics (events: `etcd_debugging_mvcc_events_total`,
   bytes: `etcd_network_client_grpc_sent_bytes_total`, streams:
   `etcd_debugging_mvcc_watch_stream_total`) and by `ss` (connections to its client port).

    .venv/bin/python bench/clustermesh_scale.py [--parts plan,agent,watch] [--prefix sc-] [--addressing index|stable]

A fourth part, `routes` (not in the default), times the route applier alone at the plan's size
(100,000 routes in a namespace `<prefix>rt`): a sync of the same plan, one route added, and the
full pass every resync interval (forget, dump, compare).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import ipaddress
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from convergence import SYNTH_BASE, measure_joins, passes, rss_mb, synth_record
from meshctl.mesh import records
from meshctl.mesh.admit import admit_local
from meshctl.mesh.admit_memo import RemoteAdmission
from meshctl.mesh.model import WIREGUARD_ADDRESSINGS, Cluster, MeshSettings, Topology, WireGuardAddressing
from meshctl.mesh.plan import PlanCache, plan_node
from meshctl.process import gc_paused

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = 10
MAX_PER = 5000  # nodes per cluster at most (50,000 /25s fit in 10.128.0.0/9 with room for joiners)
LOCATIONS = 50
ME = "s0"  # cluster1's first synthetic node: the first by name of its location, so its leader


def cluster_name(k: int) -> str:
    return f"cluster{k + 1}"


def mesh_of(k: int, addressing: WireGuardAddressing = "index") -> MeshSettings:
    """cluster1 and cluster2 keep the two-cluster lab's subnets; the others get one each."""
    subnet = {0: "10.4.0.0/16", 1: "10.5.0.0/16"}.get(k, f"10.{60 + k}.0.0/16")
    return MeshSettings(granularity="location", subnet=ipaddress.ip_network(subnet), wireguard_addressing=addressing)


def record(k: int, i: int, g: int | None = None) -> tuple[str, dict[str, Any]]:
    """Node i of cluster k: convergence.synth_record's node of the global index `g` (k * MAX_PER + i
    by default: the same record at every size), with a /25 pod CIDR (50,000 /24s do not fit in 10.128.0.0/9) and
    a private /24 per location and cluster (no two clusters' nodes are private neighbours)."""
    assert i < MAX_PER or g is not None
    g = k * MAX_PER + i if g is None else g
    name, rec = synth_record(g, LOCATIONS)
    loc, j = i % LOCATIONS, i // LOCATIONS
    rec.update(location=f"synth-{loc}", internal_ip=f"100.{64 + loc}.{k}.{1 + j}/24",
               pod_cidr=f"{ipaddress.ip_address(SYNTH_BASE + 128 * g)}/25")
    return name, rec


def joiner(k: int, per: int, n: int) -> tuple[str, dict[str, Any]]:
    """The n-th extra node of cluster k, in an existing location (synth-7), past every index used."""
    return record(k, per + n * LOCATIONS + 7, g=CLUSTERS * MAX_PER + 100 * k + n)


def topology(k: int, per: int, extra: int = 0, addressing: WireGuardAddressing = "index") -> Topology:
    """Cluster k as the agent sees it: local records as the local backend parses them, remote ones
    marked with their cluster (backends.clustermesh sets record_cluster)."""
    mark = "" if k == 0 else cluster_name(k)
    nodes = [records.parse_node(rec, f"/meshctl/{cluster_name(k)}/nodes/{name}", cluster=mark)
             for name, rec in [*(record(k, i) for i in range(per)), *(joiner(k, per, n) for n in range(extra))]]
    return Topology(cluster=Cluster(cluster_name(k), k + 1), mesh=mesh_of(k, addressing), nodes=tuple(nodes))


def joined(topo: Topology, k: int, per: int, n: int) -> Topology:
    """`topo` (cluster k) with its n-th joiner added last, its other records the same objects: the
    backend's parse cache hands out the same Node for an unchanged record, newer records last."""
    name, rec = joiner(k, per, n)
    new = records.parse_node(rec, f"/meshctl/{cluster_name(k)}/nodes/{name}", cluster=cluster_name(k))
    return replace(topo, nodes=(*topo.nodes, new))


def one_pass(local: Topology, remotes: list[Topology], memo: RemoteAdmission, cache: PlanCache
             ) -> tuple[float, float, int]:
    """The pure work of an agent's pass with remote clusters: admission (through the agent's
    per-cluster memo; a new one for a cold pass), then the plan with the agent's plan cache (a
    new one for a cold pass; gc paused, as the agent runs both). Seconds of each, and the plan's
    routes."""
    with gc_paused():
        t0 = time.perf_counter()
        admitted, rejected = memo.admit(local, remotes)
        t1 = time.perf_counter()
        plan = plan_node(local, ME, admitted, cache=cache)
        t2 = time.perf_counter()
    assert not rejected, rejected[:3]
    return t1 - t0, t2 - t1, len(plan.routes)


def bench_plan(sizes: list[int], repeat: int, profile: bool, addressing: WireGuardAddressing) -> None:
    print(f"1. plan of {ME} in cluster1, 10 clusters x N/10 nodes, {LOCATIONS} locations each "
          f"(median of {repeat}; CPU shared with other runs)")
    print(f"{'nodes':>7} {'cold admit+plan':>22} {'join admit+plan':>22} {'routes':>7} {'join vs 5k':>10} "
          f"{'n log n':>8}")
    rows = []
    for n in sizes:
        per = n // CLUSTERS
        local, _ = admit_local(topology(0, per, addressing=addressing))
        remotes = [topology(k, per, addressing=addressing) for k in range(1, CLUSTERS)]
        cold = []
        for _ in range(repeat):
            cold.append(one_pass(local, remotes, RemoteAdmission(), PlanCache()))
        joins = []
        memo, cache = RemoteAdmission(), PlanCache()
        for j in range(repeat):
            one_pass(local, remotes, memo, cache)  # the pass before: memo and cache as an agent has them
            remotes[4] = joined(remotes[4], 5, per, j)  # one node more in cluster6
            joins.append(one_pass(local, remotes, memo, cache))
        med = [statistics.median(x) for x in zip(*cold, strict=True)]
        jmed = [statistics.median(x) for x in zip(*joins, strict=True)]
        rows.append((n, med, jmed))
        base_n, _, base_j = rows[0]
        growth = (jmed[0] + jmed[1]) / (base_j[0] + base_j[1])
        nlogn = n * math.log(n) / (base_n * math.log(base_n))
        print(f"{n:>7} {1000 * med[0]:>8.0f} + {1000 * med[1]:>5.0f} ms {1000 * (med[0] + med[1]):>4.0f} "
              f"{1000 * jmed[0]:>7.0f} + {1000 * jmed[1]:>5.0f} ms {1000 * (jmed[0] + jmed[1]):>4.0f} "
              f"{int(jmed[2]):>7} {growth:>9.1f}x {nlogn:>7.1f}x")
    n, med, jmed = rows[-1]
    print(f"at {n:,} nodes: {1000 * (jmed[0] + jmed[1]):.0f} ms after a join, {1000 * (med[0] + med[1]):.0f} ms "
          f"cold (goal < 1 s; growth from {rows[0][0]:,}: at most n log n)")
    if profile:
        import cProfile
        import pstats

        per = n // CLUSTERS
        local, _ = admit_local(topology(0, per, addressing=addressing))
        remotes = [topology(k, per, addressing=addressing) for k in range(1, CLUSTERS)]
        memo, cache = RemoteAdmission(), PlanCache()
        one_pass(local, remotes, memo, cache)
        remotes[4] = joined(remotes[4], 5, per, repeat)
        prof = cProfile.Profile()
        prof.enable()
        one_pass(local, remotes, memo, cache)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)


# --- 2. one real agent following 9 remote clusters -------------------------------------------

LAB_DOC = {
    "clusters": [
        {"cluster": {"name": "cluster1", "id": 1}, "mesh": {"granularity": "location", "subnet": "10.4.0.0/16"},
         "nodes": [{"name": "a1", "location": "loc-a", "internal_ip": "10.10.1.11/24", "pod_cidr": "10.42.1.0/24",
                    "leader": True}]},
        {"cluster": {"name": "cluster2", "id": 2}, "mesh": {"granularity": "location", "subnet": "10.5.0.0/16"},
         "nodes": [{"name": "g1", "location": "gpu-a", "internal_ip": "10.10.1.21/24", "pod_cidr": "10.43.1.0/24",
                    "leader": True}]},
    ],
    "lab": {"pods_per_node": 1, "lease_ttl": 10, "fastpath": False},
}


def has_route(ns: str, cidr: str) -> bool:
    import subprocess

    from meshctl.lab.rigs import netns

    out = subprocess.run([*netns.exec_prefix(ns), "ip", "-o", "route", "show", "table", "all", "exact", cidr],
                         capture_output=True, text=True).stdout
    return bool(out.strip())


def bench_agent(sizes: list[int], joins: int, prefix: str, addressing: WireGuardAddressing,
                keep_log: str | None = None) -> None:
    """The two-cluster lab with one agent per cluster; cluster3..cluster10 added in cluster2's etcd
    (readable by cluster1 as its remote user), one clustermesh file each beside cluster2's.
    `keep_log`: where a1's log is copied before the lab goes (its passes, with timestamps)."""
    from meshctl.backends.etcd import node_key, write_topology
    from meshctl.backends.etcd_identity import AuthAdmin, reader_grants
    from meshctl.lab.namespaces import build
    from meshctl.lab.namespaces import check as labcheck
    from meshctl.lab.namespaces.spec import parse_lab

    print(f"2. one agent (cluster1's a1, fast path off) after one remote join, 10 clusters x N/10 in 2 etcd "
          f"processes (cluster1's; cluster2's holding cluster2..cluster10), {joins} joins each")
    doc = copy.deepcopy(LAB_DOC)
    doc["lab"]["prefix"] = prefix
    for c in doc["clusters"]:
        c["mesh"]["wireguard_addressing"] = addressing
    t = time.monotonic()
    st = build.up(parse_lab(doc, "clustermesh_scale"), prefix=prefix)
    rows = []
    try:
        c1, c2 = st.cluster("cluster1"), st.cluster("cluster2")
        a1 = c1.nodes[0]
        kv1, kv2 = build.etcd_client(c1, timeout=60), build.etcd_client(c2, timeout=60)
        admin = AuthAdmin(kv2)
        cm = Path(c1.clustermesh_dir or "")
        for k in range(2, CLUSTERS):
            admin.role("remote", reader_grants(cluster_name(k)))
            write_topology(kv2, Cluster(cluster_name(k), k + 1), mesh_of(k, addressing))
            (cm / cluster_name(k)).write_text((cm / "cluster2").read_text())
        print(f"   lab up in {time.monotonic() - t:.0f} s; a1 pid {a1.pid}")
        written = 0
        for n in sizes:
            per = n // CLUSTERS
            t0 = time.monotonic()
            for k in range(CLUSTERS):
                kv = kv1 if k == 0 else kv2
                kv.put_many([(node_key(cluster_name(k), name), json.dumps(rec))
                             for name, rec in (record(k, i) for i in range(written, per))])
            written = per
            lasts = [record(k, per - 1)[1]["pod_cidr"] for k in range(CLUSTERS)]
            wait_until(lambda lasts=lasts: all(has_route(a1.netns, c) for c in lasts), f"a1 routes at {n}", 900)
            converge = time.monotonic() - t0
            print(f"   {n}: converged in {converge:.1f} s; joining at {time.time():.3f}", flush=True)
            time.sleep(3)
            js = measure_joins(kv2, "cluster5", [a1], joins, settle=max(1.0, 2 * converge / 10), timeout=180)
            rss_quiet = rss_mb(a1.pid)  # before /metrics and /status
            t1 = time.monotonic()
            passes(a1)  # one /metrics scrape, as Prometheus makes (the view changed since any before)
            scrape, rss_scraped = time.monotonic() - t1, rss_mb(a1.pid)
            s = labcheck.agent_status(a1, timeout=60) or {}
            last = s.get("last_reconcile") or {}
            rows.append({"nodes": n, "converge": converge, "join_ms": 1000 * statistics.median(js),
                         "join_max_ms": 1000 * max(js), "pass_ms": 1000 * last.get("duration_s", float("nan")),
                         "cpu_ms": 1000 * last.get("cpu_s", float("nan")), "steps": last.get("steps_ms", {}),
                         "rss": rss_mb(a1.pid), "rss_quiet": rss_quiet,
                         "remote": sum(c.get("nodes", 0) for c in (s.get("remotes") or {}).get("clusters", []))})
            print(f"   {n}: first converge {converge:.1f} s; last pass steps (ms) {last.get('steps_ms')}")
            print(f"   {n}: each join -> route (ms) {[round(1000 * j) for j in js]}")
            print(f"   {n}: RSS {rss_quiet:.0f} MB quiet, {rss_scraped:.0f} MB after a /metrics scrape "
                  f"({1000 * scrape:.0f} ms), {rows[-1]['rss']:.0f} MB after /status")
    finally:
        if keep_log:
            with contextlib.suppress(OSError, NameError):
                shutil.copyfile(Path(a1.dir) / "agent.log", keep_log)
        build.down(st.name)
    print(f"{'nodes':>7} {'remote seen':>11} {'first converge':>15} {'join->route':>12} {'max':>7} {'last pass':>10} "
          f"{'(CPU)':>7} {'RSS':>9} {'vs 5k':>6}")
    for r in rows:
        print(f"{r['nodes']:>7} {r['remote']:>11} {r['converge']:>13.1f} s {r['join_ms']:>9.0f} ms "
              f"{r['join_max_ms']:>4.0f} ms {r['pass_ms']:>7.0f} ms {r['cpu_ms']:>5.0f} {r['rss']:>6.0f} MB "
              f"{r['join_ms'] / rows[0]['join_ms']:>5.1f}x")
    print(f"(part 2 total {time.monotonic() - t:.0f} s; goal at 50,000: join -> route < 1 s, RSS < 500 MB)")


# --- routes: the route applier at 100,000 routes --------------------------------------------


def bench_routes(n: int, prefix: str) -> None:
    """The route step's work at the plan size of 50,000 nodes, in a namespace of its own: the
    first sync, a sync of the same plan, one route added, and the full pass (forget, dump,
    compare), twice (the second reads destinations the first dump already parsed)."""
    import os
    import subprocess

    from meshctl.mesh.plan import Route
    from meshctl.node.routes import RouteApplier
    from meshctl.setns import in_netns

    ns = f"{prefix}rt"
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        for cmd in (["link", "add", "pv", "type", "veth", "peer", "name", "wg"], ["link", "set", "pv", "up"],
                    ["link", "set", "wg", "up"], ["addr", "add", "10.20.0.1/24", "dev", "pv"],
                    ["addr", "add", "10.4.0.1/16", "dev", "wg"]):
            subprocess.run(["ip", "-n", ns, *cmd], check=True)
        gw = ipaddress.ip_address("10.4.0.5")
        plan = [Route(ipaddress.ip_network((SYNTH_BASE + 128 * i, 25)), gw, "wireguard") for i in range(n)]
        grown = [*plan, Route(ipaddress.ip_network("10.127.0.0/24"), gw, "wireguard")]

        def timed(what: str, fn: Any) -> None:
            t = time.perf_counter()
            fn()
            print(f"   {what:<44} {1000 * (time.perf_counter() - t):>7.0f} ms")

        def run() -> None:
            ra = RouteApplier("pv", "wg")
            timed("first sync", lambda: ra.sync(plan))
            timed("the same plan", lambda: ra.sync(plan))
            timed("one route added", lambda: ra.sync(grown))
            for what in ("full pass (forget, dump, compare)", "full pass again"):
                ra.forget()
                timed(what, lambda: ra.sync(grown))

        print(f"routes: {n:,} routes through the stand-in wg device of {ns} (pid {os.getpid()})")
        in_netns(ns, run)
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


# --- 3. watch load on one remote etcd -------------------------------------------------------

WATCH_METRICS = ("etcd_debugging_mvcc_events_total", "etcd_network_client_grpc_sent_bytes_total",
                 "etcd_debugging_mvcc_watch_stream_total", "etcd_debugging_mvcc_watcher_total")


def etcd_metrics(lab: Any) -> dict[str, float]:
    """The remote etcd's own counters (its /metrics, over the same mTLS as its clients)."""
    import requests

    cert = lab.remote.client_cert
    text = requests.get(f"{lab.remote.etcd.url}/metrics", cert=(str(cert.cert), str(cert.key)),
                        verify=str(cert.ca), timeout=10).text
    out = dict.fromkeys(WATCH_METRICS, 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def watch_run(lab: Any, watchers: list[Any], joins: int, tag: str) -> dict[str, float]:
    """Write `joins` node records to cluster2's etcd one by one; until every watcher's view holds
    the last: the remote etcd's events, bytes and streams, its TCP connections, and elapsed time."""
    from tests.plan.fixtures import key

    from meshctl.backends.etcd import node_key

    def holds(rc: Any, k: str) -> bool:
        return any(k in recs for recs in rc.records().values())

    m0, t0 = etcd_metrics(lab), time.monotonic()
    last = ""
    for i in range(joins):
        name = f"{tag}{i}"
        last = node_key("cluster2", name)
        lab.remote.kv.put(last, json.dumps({"name": name, "pod_cidr": f"10.{44 + i // 250}.{i % 250}.0/24",
                                            "public_key": key(300 + i)}))
    while not all(holds(rc, last) for rc in watchers):
        if time.monotonic() - t0 > 300:
            raise SystemExit(f"{tag}: a watcher did not see {last} within 300 s")
        time.sleep(0.05)
    dt = time.monotonic() - t0
    m1 = etcd_metrics(lab)
    out = {k: m1[k] - m0[k] for k in WATCH_METRICS[:2]}
    out.update(streams=m1[WATCH_METRICS[2]], watchers=m1[WATCH_METRICS[3]], seconds=dt,
               connections=lab.remote_connections())
    lab.remote.kv.delete(f"/meshctl/cluster2/nodes/{tag}", prefix=True)
    return out


def bench_watch(k: int, joins: int) -> None:
    """Direct, then through the cache, on one pair of loopback etcds (tests.clustermesh.test_cache.Lab:
    cluster2's etcd is the remote one; the cache runs in this process, as the tests run it)."""
    sys.path.insert(0, str(ROOT))
    from tests.clustermesh.test_cache import Lab

    from meshctl.backends.clustermesh import RemoteClusters
    from meshctl.backends.clustermesh_cache import cache_health

    print(f"3. watch load on cluster2's etcd during {joins} joins written to it, K = {k} watchers "
          f"(RemoteClusters, as agents run them)")
    with tempfile.TemporaryDirectory(prefix="sc-watch-") as d:
        lab = Lab(Path(d))
        rows: dict[str, dict[str, float]] = {}
        try:
            direct = [RemoteClusters(lab.dir, Cluster("cluster1", 1), lambda: None, poll=0.1) for _ in range(k)]
            for rc in direct:
                rc.start()
            wait_until(lambda: all(rc.records().get("cluster2") for rc in direct), "direct watchers synced")
            rows["direct"] = watch_run(lab, direct, joins, "d")
            for rc in direct:
                rc.stop()
            time.sleep(1)
            idle = lab.remote_connections()  # the bench's own client(s), no watcher running
            lab.start_cache()
            wait_until(lambda: cache_health(lab.cache_status(), time.time(), "cluster2") == "", "cache healthy")
            agents = [lab.agent(i) for i in range(k)]
            wait_until(lambda: all(rc.status().get("via") == "via cache" and not rc._remotes for rc in agents),
                       "watchers via the cache")
            rows["cache"] = watch_run(lab, agents, joins, "c")
        finally:
            lab.close()
    print(f"{'':>7} {'events':>8} {'events/s':>9} {'sent bytes':>11} {'bytes/s':>10} {'watch streams':>14} "
          f"{'connections':>12} {'seconds':>8}")
    for how, r in rows.items():
        print(f"{how:>7} {r['etcd_debugging_mvcc_events_total']:>8.0f} "
              f"{r['etcd_debugging_mvcc_events_total'] / r['seconds']:>9.0f} "
              f"{r['etcd_network_client_grpc_sent_bytes_total']:>11.0f} "
              f"{r['etcd_network_client_grpc_sent_bytes_total'] / r['seconds']:>10.0f} {r['streams']:>14.0f} "
              f"{r['connections']:>12} {r['seconds']:>8.1f}")
    a, b = rows["direct"], rows["cache"]
    ev, sent = WATCH_METRICS[0], WATCH_METRICS[1]
    print(f"through the cache: {b[ev] / max(a[ev], 1):.2f}x the events and {b[sent] / max(a[sent], 1):.2f}"
          f"x the bytes of {k} direct watchers; connections to its client port counted by ss, {idle} of them the "
          f"bench's own client with no watcher running")


def wait_until(cond: Any, what: str, timeout: float = 60) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="plan,agent,watch")
    ap.add_argument("--sizes", default="5000,10000,20000,50000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile of the join pass at the largest size")
    ap.add_argument("--prefix", default="sc-")
    ap.add_argument("--watchers", type=int, default=3, help="K, the watchers of part 3")
    ap.add_argument("--joins", type=int, default=1000, help="the joins of part 3")
    ap.add_argument("--agent-sizes", default="5000,50000")
    ap.add_argument("--agent-joins", type=int, default=5, help="the joins of part 2, per size")
    ap.add_argument("--routes", type=int, default=100000, help="the routes of part `routes`")
    ap.add_argument("--addressing", choices=WIREGUARD_ADDRESSINGS, default="index",
                    help="every cluster's mesh.wireguard_addressing (parts plan and agent)")
    ap.add_argument("--keep-log", help="part agent: copy a1's agent.log here before the lab goes")
    args = ap.parse_args()
    parts = args.parts.split(",")
    t = time.monotonic()
    if "plan" in parts:
        bench_plan([int(s) for s in args.sizes.split(",")], args.repeat, args.profile, args.addressing)
    if "agent" in parts:
        bench_agent([int(s) for s in args.agent_sizes.split(",")], args.agent_joins, args.prefix, args.addressing,
                    args.keep_log)
    if "watch" in parts:
        bench_watch(args.watchers, args.joins)
    if "routes" in parts:
        bench_routes(args.routes, args.prefix)
    print(f"(total {time.monotonic() - t:.0f} s)")


if __name__ == "__main__":
    main()
