# SPDX-License-Identifier: Apache-2.0
"""Path-probing benchmark: what probing costs one node with N eligible neighbours.

    .venv/bin/python bench/probe.py [--peers 100] [--seconds 20] [--json out.json]

Node A (namespace pbpr<pid>-a) probes N peers on every private rung of an L2 pair (direct, udp,
ipip kinds) and answers their probes; the N peers are N probers, each in a namespace of its own
(pbpr<pid>-p<i>) on one bridge with A (the private network), hosted by a few other processes
(PEERS_PER_PROCESS each: agents of their own would not share A's interpreter lock), each probing A. The
figure is the CPU time of A's prober thread (both roles: its own probes and its answers) per
second of wall time, in % of one core, measured over `--seconds` of steady state after the first
verdicts. Side by side in the same run: the same node with 10 peers, so the per-peer cost shows.
The goal (issue 10): < 1 % of one core at 100 neighbours.

Runs as root; everything it makes is prefixed pbpr<pid>- and removed at the end, pass or fail.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ctl"))

from meshctl.lab.rigs import netns
from meshctl.mesh.model import RUNGS
from meshctl.node.prober import Prober, Target
from meshctl.setns import in_netns

RUN = f"pbpr{os.getpid() % 10000}"
LADDER = RUNGS  # an L2 pair: every rung
A_IP = ipaddress.IPv4Address("10.77.0.1")
A_PROBE = ipaddress.IPv4Address("10.199.0.1")
PEERS_PER_PROCESS = 10


def peer_ips(i: int) -> tuple[ipaddress.IPv4Address, ipaddress.IPv4Address]:
    return ipaddress.IPv4Address(int(A_IP) + 1 + i), ipaddress.IPv4Address(f"10.200.{i // 250}.{i % 250 + 1}")


def peer_ns(i: int, run: str = RUN) -> str:
    return f"{run}-p{i}"


def measure(peers: int, seconds: float) -> dict[str, float]:
    a, br = f"{RUN}-a", f"{RUN}-br"
    spaces = [a, br, *(peer_ns(i) for i in range(peers))]
    probers: list[Prober] = []
    hosts: list[subprocess.Popen[str]] = []
    try:
        for ns in spaces:
            netns.add(ns)
        netns.bridge(br, "br0")
        netns.veth(br, "pa", a, "priv")
        netns.enslave(br, "pa", "br0")
        netns.addr(a, "priv", f"{A_IP}/16")
        for i in range(peers):
            netns.veth(br, f"p{i}", peer_ns(i), "priv")
            netns.enslave(br, f"p{i}", "br0")
            netns.addr(peer_ns(i), "priv", f"{peer_ips(i)[0]}/16")
        node = Prober("priv", A_IP, A_PROBE, LADDER[:-1])
        in_netns(a, node.start)
        probers.append(node)
        node.set_targets([Target(f"p{i}", *peer_ips(i), LADDER) for i in range(peers)])
        hosts = [subprocess.Popen([sys.executable, __file__, "--peer-host",
                                   f"{RUN}:{first}:{min(peers, first + PEERS_PER_PROCESS)}"],
                                  stdin=subprocess.PIPE, text=True)
                 for first in range(0, peers, PEERS_PER_PROCESS)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len([n for n in node.chooser.pairs.values() if n.rung]) < peers:
            time.sleep(0.2)
        ready = sum(1 for n in node.chooser.pairs.values() if n.rung == "direct")
        time.sleep(2)  # past the first verdicts' fast probing
        cpu0, sent0, recv0, t0 = node.cpu_s, node.sent, node.received, time.monotonic()
        time.sleep(seconds)
        dt = time.monotonic() - t0
        cpu, sent, recv = node.cpu_s - cpu0, node.sent - sent0, node.received - recv0
        return {"peers": peers, "on_direct": ready, "seconds": round(dt, 2), "cpu_s": round(cpu, 4),
                "core_pct": round(100 * cpu / dt, 3), "probes_per_s": round(sent / dt, 1),
                "packets_in_per_s": round(recv / dt, 1), "us_per_packet": round(1e6 * cpu / max(1, sent + recv), 1)}
    finally:
        for p in probers:
            p.stop()
        for h in hosts:
            h.communicate(timeout=30)  # closing its stdin ends it
        for ns in spaces:
            netns.delete(ns)


def peer_host(span: str) -> None:
    """Peers `run:first:end`, each in its own namespace, in this process until stdin closes."""
    run, first_s, end_s = span.split(":")
    first, end = int(first_s), int(end_s)
    probers = []
    for i in range(first, end):
        ip, probe_ip = peer_ips(i)
        p = Prober("priv", ip, probe_ip, LADDER[:-1])
        in_netns(peer_ns(i, run), p.start)
        p.set_targets([Target("a", A_IP, A_PROBE, LADDER)])
        probers.append(p)
    sys.stdin.read()
    for p in probers:
        p.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-host", default="", help=argparse.SUPPRESS)
    ap.add_argument("--peers", type=int, default=100)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.peer_host:
        peer_host(args.peer_host)
        return
    small = measure(10, args.seconds)
    big = measure(args.peers, args.seconds)
    for r in (small, big):
        print(f"{r['peers']:>4} peers ({r['on_direct']} on direct): {r['core_pct']:.3f} % of one core "
              f"({r['cpu_s']:.3f} s CPU in {r['seconds']} s), {r['probes_per_s']} probes/s out, "
              f"{r['packets_in_per_s']} probe packets/s in, {r['us_per_packet']} us per packet")
    ratio = big["core_pct"] / small["core_pct"] if small["core_pct"] else float("nan")
    print(f"{args.peers} vs 10 peers: {ratio:.1f}x the CPU; goal < 1 % of one core at {args.peers}: "
          f"{'met' if big['core_pct'] < 1.0 else 'NOT met'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"small": small, "big": big}, indent=1))


if __name__ == "__main__":
    main()
