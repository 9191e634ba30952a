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
   remote clusters directly; time from writing one new remote record until its route is in a1's
   kernel table (`ip monitor route`), the pass's own time, and a1's RSS. Baseline: 10 x 500.
   Goal at 50,000: < 1 s wall, < 500 MB RSS.
3. watch load: watch traffic one remote etcd (cluster2's, loopback, mTLS) serves during 1,000
   joins written to it, with K real watchers (`RemoteClusters`, as agents run them) connected
   directly, versus through the cache (`ClusterMeshCache` watching it once, the K watchers on
   cluster1's etcd). Counted by that etcd's /metrics (`etcd_network_client_grpc_sent_bytes_total`,
   `etcd_debugging_mvcc_watch_stream_total`) and by `ss` (connections to its client port); events
   delivered from the watchers' own counts (the mirror's revision steps).

    .venv/bin/python bench/clustermesh_scale.py [--parts plan,agent,watch] [--prefix sc-]
"""

from __future__ import annotations

import argparse
import ipaddress
import math
import statistics
import time
from pathlib import Path
from typing import Any

from convergence import SYNTH_BASE, synth_record
from meshctl.mesh import records
from meshctl.mesh.admit import admit_local, admit_remotes
from meshctl.mesh.model import Cluster, MeshSettings, Topology
from meshctl.mesh.plan import _remote_segment, plan_node
from meshctl.process import gc_paused

ROOT = Path(__file__).resolve().parents[1]
CLUSTERS = 10
LOCATIONS = 50
ME = "s0"  # cluster1's first synthetic node: the first by name of its location, so its leader


def cluster_name(k: int) -> str:
    return f"cluster{k + 1}"


def mesh_of(k: int) -> MeshSettings:
    """cluster1 and cluster2 keep the two-cluster lab's subnets; the others get one each."""
    subnet = {0: "10.4.0.0/16", 1: "10.5.0.0/16"}.get(k, f"10.{60 + k}.0.0/16")
    return MeshSettings(granularity="location", subnet=ipaddress.ip_network(subnet))


def record(k: int, i: int, per: int, g: int | None = None) -> tuple[str, dict[str, Any]]:
    """Node i of cluster k (of `per` nodes each): convergence.synth_record's node of the global index
    `g` (k * per + i by default), with a /25 pod CIDR (50,000 /24s do not fit in 10.128.0.0/9) and
    a private /24 per location and cluster (no two clusters' nodes are private neighbours)."""
    g = k * per + i if g is None else g
    name, rec = synth_record(g, LOCATIONS)
    loc, j = i % LOCATIONS, i // LOCATIONS
    rec.update(location=f"synth-{loc}", internal_ip=f"100.{64 + loc}.{k}.{1 + j}/24",
               pod_cidr=f"{ipaddress.ip_address(SYNTH_BASE + 128 * g)}/25")
    return name, rec


def joiner(k: int, per: int, n: int) -> tuple[str, dict[str, Any]]:
    """The n-th extra node of cluster k, in an existing location (synth-7), past every index used."""
    return record(k, per + n * LOCATIONS + 7, per, g=CLUSTERS * per + 100 * k + n)


def topology(k: int, per: int, extra: int = 0) -> Topology:
    """Cluster k as the agent sees it: local records as the local backend parses them, remote ones
    marked with their cluster (backends.clustermesh sets record_cluster)."""
    mark = "" if k == 0 else cluster_name(k)
    nodes = [records.parse_node(rec, f"/meshctl/{cluster_name(k)}/nodes/{name}", cluster=mark)
             for name, rec in [*(record(k, i, per) for i in range(per)), *(joiner(k, per, n) for n in range(extra))]]
    return Topology(cluster=Cluster(cluster_name(k), k + 1), mesh=mesh_of(k), nodes=tuple(nodes))


def one_pass(local: Topology, remotes: list[Topology]) -> tuple[float, float, int]:
    """The pure work of an agent's pass with remote clusters: admission, then the plan (gc paused,
    as the agent runs both). Seconds of each, and the plan's routes."""
    with gc_paused():
        t0 = time.perf_counter()
        admitted, rejected = admit_remotes(local, remotes)
        t1 = time.perf_counter()
        plan = plan_node(local, ME, admitted)
        t2 = time.perf_counter()
    assert not rejected, rejected[:3]
    return t1 - t0, t2 - t1, len(plan.routes)


def bench_plan(sizes: list[int], repeat: int, profile: bool) -> None:
    print(f"1. plan of {ME} in cluster1, 10 clusters x N/10 nodes, {LOCATIONS} locations each "
          f"(median of {repeat}; CPU shared with other runs)")
    print(f"{'nodes':>7} {'cold admit+plan':>22} {'join admit+plan':>22} {'routes':>7} {'join vs 5k':>10} "
          f"{'n log n':>8}")
    rows = []
    for n in sizes:
        per = n // CLUSTERS
        local, _ = admit_local(topology(0, per))
        remotes = [topology(k, per) for k in range(1, CLUSTERS)]
        cold = []
        for _ in range(repeat):
            _remote_segment.cache_clear()
            cold.append(one_pass(local, remotes))
        joins = []
        for j in range(repeat):
            one_pass(local, remotes)  # the pass before: memo as an agent has it
            remotes[4] = topology(5, per, extra=j + 1)  # one node more in cluster6
            joins.append(one_pass(local, remotes))
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
        local, _ = admit_local(topology(0, per))
        remotes = [topology(k, per) for k in range(1, CLUSTERS)]
        one_pass(local, remotes)
        remotes[4] = topology(5, per, extra=repeat + 1)
        prof = cProfile.Profile()
        prof.enable()
        one_pass(local, remotes)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(12)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parts", default="plan,agent,watch")
    ap.add_argument("--sizes", default="5000,10000,20000,50000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", action="store_true", help="cProfile of the join pass at the largest size")
    ap.add_argument("--prefix", default="sc-")
    args = ap.parse_args()
    parts = args.parts.split(",")
    t = time.monotonic()
    if "plan" in parts:
        bench_plan([int(s) for s in args.sizes.split(",")], args.repeat, args.profile)
    print(f"(total {time.monotonic() - t:.0f} s)")


if __name__ == "__main__":
    main()
