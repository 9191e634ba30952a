# SPDX-License-Identifier: Apache-2.0
"""Global ranges benchmark (issue 38): cross-cluster TCP throughput and request/response latency
through the translation against the same pair without it, side by side in one run.

    .venv/bin/python bench/global_ranges.py [--rounds 6] [--seconds 3] [--requests 2000]
                                            [--pair direct|tunnel] [--json out.json]

The two-cluster lab of lab/labs/global-ranges.yaml (real agents, etcd with mTLS per cluster, the
eBPF fast path), IPv4, with cluster2's pods moved to 10.44.0.0/16 so that the two clusters can also
join WITHOUT global ranges: the same pods, nodes and path, only the translation differs. Each round
runs both modes, the order reversing every round; a mode is switched by writing both clusters'
mesh records (with or without `global_cidrs`) and waiting until the pair answers at the address of
that mode (the image, or the pod's own address). Per mode and round: one iperf3 TCP stream pod to
pod (`--seconds`), and `--requests` request/response exchanges of one byte over one TCP connection
(TCP_NODELAY; bench/datapath.py's ping-pong), timed by the client pod; each measurement checks
that the receiver's `translated` counter moved in the translated mode and not in the other.
`--pair direct`: a1 -> g1 (one private subnet: the fast path at both ends, `from_pod` and
`from_private` translate); `--pair tunnel`: b1 -> g3 (wireguard-go between the leaders: the tunnel
device's hooks translate). Prints medians,
min..max and the ratios translated / plain for throughput and plain / translated for latency (both
read "translated as a fraction of plain speed"; the goal: >= 0.95x).

Then the programs' own cost per packet (BPF_PROG_TEST_RUN, one run per call, median of
`--calls`): `from_pod` on a direct packet and `from_private` on an arriving one, a 1,400-byte TCP
segment to another cluster's pod with and without translation, side by side (a run that repeats
would rerun the rewritten packet, which no longer translates). Runs as root; its lab is named
`gnb<pid>` (its pins `/sys/fs/bpf/gnb<pid>`) and is taken down at the end, pass or fail.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import statistics
import subprocess
import sys
import time
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ctl"))

from datapath import PINGPONG_CLIENT, PINGPONG_SERVER, spread  # noqa: E402  (bench/datapath.py)
from dual_stack import iperf_to  # noqa: E402  (bench/dual_stack.py)
from meshctl.backends.etcd import mesh_key  # noqa: E402
from meshctl.datapath import Datapath, loader  # noqa: E402
from meshctl.lab.namespaces import build  # noqa: E402
from meshctl.lab.namespaces import check as labcheck  # noqa: E402
from meshctl.lab.namespaces import state as labstate  # noqa: E402
from meshctl.lab.namespaces.spec import parse_lab  # noqa: E402
from meshctl.lab.namespaces.state import ClusterState, LabState, NodeState  # noqa: E402
from meshctl.lab.rigs import netns  # noqa: E402
from meshctl.lab.rigs.testrun import frame, run, with_checksums  # noqa: E402
from meshctl.mesh.plan import FastPathEntry  # noqa: E402

PAIRS = {"direct": ("a1", "g1"), "tunnel": ("b1", "g3")}
GLOBAL = {"cluster1": {"10.42.0.0/16": "10.142.0.0/16"}, "cluster2": {"10.44.0.0/16": "10.144.0.0/16"}}
IPERF_PORT, RR_PORT = 5311, 5312
MODES = ("translated", "plain")

def lab_doc() -> dict[str, Any]:
    """The global-ranges lab, IPv4 only, cluster2's pods in 10.44.0.0/16 (no overlap, so the clusters
    join with or without global ranges), each cluster with its global range."""
    doc = yaml.safe_load((files("meshctl.lab") / "labs" / "global-ranges.yaml").read_text())
    doc["lab"]["ip_families"] = [4]
    for c in doc["clusters"]:
        name = c["cluster"]["name"]
        c["mesh"]["global_cidrs"] = GLOBAL[name]
        for n in c["nodes"]:
            v4 = n.pop("pod_cidrs")[0]
            n["pod_cidr"] = v4.replace("10.42.", "10.44.") if name == "cluster2" else v4
    return doc


def node(st: LabState, name: str) -> NodeState:
    return next(n for _, n in st.nodes() if n.name == name)


def cluster_of(st: LabState, name: str) -> ClusterState:
    return next(c for c, n in st.nodes() if n.name == name)


def target(st: LabState, src: str, dst: str, mode: str) -> str:
    """What src's pod dials in `mode`: dst's image (translated) or its own address (plain)."""
    addr = node(st, dst).pods[0].ip
    if mode == "plain":
        return addr
    return labcheck.dial_address(cluster_of(st, src), cluster_of(st, dst), addr)


def set_mode(st: LabState, mode: str, pair: tuple[str, str], settle: float) -> float:
    """Both clusters' mesh records with (translated) or without (plain) global ranges; returns how
    long the pair took to answer at that mode's address, both ways (then waits `settle` seconds, so
    the agents' passes after the change do not share the CPUs with the measurement)."""
    for c in st.clusters:
        kv = build.etcd_client(c)
        try:
            got = kv.get(mesh_key(c.name))
            rec = json.loads(got.value) if got is not None else {}
            rec.pop("global_cidrs", None)
            if mode == "translated":
                rec["global_cidrs"] = GLOBAL[c.name]
            kv.put(mesh_key(c.name), json.dumps(rec))
        finally:
            kv.close()
        # the lab check dials what the cluster state says (check.dial_address)
        c.mesh.pop("global_cidrs", None)
        if mode == "translated":
            c.mesh["global_cidrs"] = ",".join(f"{p}={g}" for p, g in GLOBAL[c.name].items())
    t0 = time.monotonic()
    a, b = pair
    while time.monotonic() - t0 < 60:
        there = labcheck.ping(node(st, a).pods[0].netns, target(st, a, b, mode), count=1, wait=0.3)[1]
        back = labcheck.ping(node(st, b).pods[0].netns, target(st, b, a, mode), count=1, wait=0.3)[1]
        if there and back:
            took = time.monotonic() - t0
            time.sleep(settle)
            return took
    raise SystemExit(f"{a} <-> {b} did not answer in mode {mode} within 60 s")


def translated(st: LabState, name: str) -> int:
    view = labcheck.agent_view(node(st, name))
    return view.live.datapath.counters.get("translated", (0, 0))[0] if view else 0


def rr(src: NodeState, address: str, requests: int) -> dict[str, float]:
    """bench/datapath.py's ping-pong over one connection: 1-byte request, 1-byte response."""
    p = netns.run(src.pods[0].netns, [sys.executable, "-c", PINGPONG_CLIENT, address, str(RR_PORT), str(requests)],
                  timeout=120)
    return json.loads(p.stdout)  # type: ignore[no-any-return]


def measure(st: LabState, pair: tuple[str, str], rounds: int, seconds: int, requests: int, settle: float
            ) -> dict[str, Any]:
    a, b = pair
    src, dst = node(st, a), node(st, b)
    netns.run(dst.pods[0].netns, ["iperf3", "-s", "-D", "-p", str(IPERF_PORT)])
    rr_server = subprocess.Popen([*netns.exec_prefix(dst.pods[0].netns), sys.executable, "-c", PINGPONG_SERVER,
                                  str(RR_PORT)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    gbps: dict[str, list[float]] = {m: [] for m in MODES}
    lat: dict[str, list[float]] = {m: [] for m in MODES}
    p99: dict[str, list[float]] = {m: [] for m in MODES}
    switch: list[float] = []
    try:
        time.sleep(0.5)
        for r in range(rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                switch.append(set_mode(st, mode, pair, settle))
                addr = target(st, a, b, mode)
                before = translated(st, b)
                gbps[mode].append(iperf_to(src, addr, seconds, IPERF_PORT))
                res = rr(src, addr, requests)
                lat[mode].append(res["p50_us"])
                p99[mode].append(res["p99_us"])
                moved = translated(st, b) - before
                if (moved > 1000) != (mode == "translated"):
                    raise SystemExit(f"round {r} {mode}: {b}'s translated counter moved by {moved}")
            print(f"round {r + 1}/{rounds}: TCP translated {gbps['translated'][-1]:.2f} plain {gbps['plain'][-1]:.2f} "
                  f"Gbit/s; RR translated {lat['translated'][-1]:.1f} plain {lat['plain'][-1]:.1f} us", file=sys.stderr)
    finally:
        rr_server.kill()
        rr_server.wait()
    t, p = spread(gbps["translated"]), spread(gbps["plain"])
    lt, lp = spread(lat["translated"]), spread(lat["plain"])
    return {"pair": list(pair), "seconds": seconds, "rounds": rounds, "requests": requests,
            "tcp_gbps": {"translated": t, "plain": p}, "rr_median_us": {"translated": lt, "plain": lp},
            "rr_p99_us": {m: spread(p99[m]) for m in MODES},
            "ratio_tcp": t["median"] / p["median"], "ratio_rr": lp["median"] / lt["median"],
            "switch_s": spread(switch), "loadavg": os.getloadavg()}


def program_cost(calls: int) -> dict[str, dict[str, float]]:
    """ns per packet of from_pod (direct) and from_private, translated and plain, side by side."""
    root = f"/sys/fs/bpf/gnb{os.getpid() % 10000}"
    loader.ensure_bpffs(root)
    dp = Datapath.open("unit", pin_root=root)
    if dp.mode != "ebpf":
        raise SystemExit(f"datapath: {dp.reason}")
    try:
        net, addr = ipaddress.ip_network, ipaddress.ip_address
        dp.sync([FastPathEntry(net("10.42.1.0/24"), "local", None),
                 FastPathEntry(net("10.44.1.0/24"), "direct", addr("192.168.0.3")),
                 FastPathEntry(net("10.144.1.0/24"), "direct", addr("192.168.0.3"), None, True)], "lo")
        dp.set_global_ranges([(net("10.42.0.0/16"), net("10.142.0.0/16"))])
        frames = {("from_pod", "plain"): ("10.42.1.5", "10.44.1.7"),
                  ("from_pod", "translated"): ("10.42.1.5", "10.144.1.7"),
                  ("from_private", "plain"): ("10.44.1.7", "10.42.1.5"),
                  ("from_private", "translated"): ("10.144.1.7", "10.142.1.5")}
        out: dict[str, dict[str, float]] = {"from_pod": {}, "from_private": {}}
        for r in range(3):  # the modes side by side, the order reversing each round
            for (prog, mode), (s, d) in (frames.items() if r % 2 == 0 else reversed(frames.items())):
                pkt = with_checksums(frame(s, d, ttl=255, payload=b"x" * 1400))
                ns = statistics.median(run(dp.programs[prog], pkt).ns for _ in range(calls))
                out[prog][mode] = min(out[prog].get(mode, ns), ns)
        return out
    finally:
        dp.close()
        Datapath.unload("unit", pin_root=root)
        os.rmdir(root)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--pair", choices=sorted(PAIRS), default="direct")
    ap.add_argument("--settle", type=float, default=2.0, help="Seconds to wait after a mode switch.")
    ap.add_argument("--calls", type=int, default=3000, help="test runs per program figure")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    prefix = f"gnb{os.getpid() % 10000}-"
    pair = PAIRS[args.pair]
    load_before = os.getloadavg()
    try:
        st = build.up(parse_lab(lab_doc()), prefix=prefix)
        r = labcheck.check(st, pairs=[(f"cluster1/{pair[0]}", f"cluster2/{pair[1]}")])[0]
        if r.path != args.pair:
            raise SystemExit(f"{pair[0]} -> {pair[1]} is on {r.path}, not {args.pair}")
        out = measure(st, pair, args.rounds, args.seconds, args.requests, args.settle)
    finally:
        build.down(labstate.lab_name(prefix))
    t, p = out["tcp_gbps"]["translated"], out["tcp_gbps"]["plain"]
    lt, lp = out["rr_median_us"]["translated"], out["rr_median_us"]["plain"]
    qt, qp = out["rr_p99_us"]["translated"], out["rr_p99_us"]["plain"]
    print(f"{args.pair} cluster1/{pair[0]} -> cluster2/{pair[1]}, {args.rounds} rounds, one TCP stream x "
          f"{args.seconds} s and {args.requests} request/response of 1 byte per mode and round:")
    print(f"  TCP          translated median {t['median']:.2f} Gbit/s ({t['min']:.2f}..{t['max']:.2f})   "
          f"plain {p['median']:.2f} ({p['min']:.2f}..{p['max']:.2f})   translated / plain = {out['ratio_tcp']:.3f}x")
    print(f"  RR latency   translated median {lt['median']:.1f} us ({lt['min']:.1f}..{lt['max']:.1f}), p99 "
          f"{qt['median']:.1f}   plain {lp['median']:.1f} us ({lp['min']:.1f}..{lp['max']:.1f}), p99 {qp['median']:.1f}"
          f"   plain / translated = {out['ratio_rr']:.3f}x")
    print(f"  goal >= 0.95x for both; mode switch (both records written to the pair answering) median "
          f"{out['switch_s']['median']:.2f} s; load average {' '.join(f'{x:.2f}' for x in load_before)} before, "
          f"{' '.join(f'{x:.2f}' for x in out['loadavg'])} after")
    cost = program_cost(args.calls)
    out["program_ns"] = cost
    print(f"  programs, ns per packet (BPF_PROG_TEST_RUN, one run per call, median of {args.calls}, best of 3 "
          "rounds):")
    for prog, by in cost.items():
        print(f"    {prog:<13} translated {by['translated']:.0f}   plain {by['plain']:.0f}   "
              f"+{by['translated'] - by['plain']:.0f} ns")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
