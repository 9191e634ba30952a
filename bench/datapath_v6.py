# SPDX-License-Identifier: Apache-2.0
"""IPv6 underlay and IPv6 pods against their IPv4 baselines, through the eBPF fast path.

    .venv/bin/python bench/datapath_v6.py [--rounds 7] [--seconds 3] [--rungs direct,ipip,vxlan] [--json out.json]

Two two-node testbeds side by side (FabricTestbed on one L2 private network each): one with an
IPv4 private network (u4), one with an IPv6-only one (u6). Pod-to-pod TCP throughput (iperf3, one
stream, a's pod to b's), on each rung in turn (direct: raw, same subnet; ipip: IPIP / 6in4 over
IPv4, 4in6 / 6in6 over IPv6; vxlan), for these series, measured alternating round by round (the
order rotating) so that the machine's drift falls on all of them alike:

    u4 v4pod   IPv4 pod over the IPv4 underlay: the baseline of both ratios
    u6 v4pod   IPv4 pod over the IPv6 underlay           -> ratio "v6 underlay / v4 underlay"
    u4 v6pod   IPv6 pod over the IPv4 underlay (encapsulated rungs only: a raw IPv6 packet cannot
               leave through an IPv4 next hop)            -> ratio "v6 pod / v4 pod"
    u6 v6pod   IPv6 pod over the IPv6 underlay (for the table)

Medians and min..max over the rounds; the ratios are of medians. Goals (issue 22): both ratios
>= 0.95 on the same-subnet (direct) rung for the underlay, and on each encapsulated rung for the pod
family. Runs as root; everything it makes is prefixed mdp6<pid>- and removed at the end.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ctl"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from datapath import iperf, spread  # noqa: E402 - bench/datapath.py
from meshctl.datapath import Datapath, loader  # noqa: E402
from meshctl.lab.rigs import netns  # noqa: E402
from meshctl.lab.rigs.testbed import PODS, FabricTestbed  # noqa: E402
from meshctl.node import discovery  # noqa: E402
from meshctl.setns import in_netns  # noqa: E402

RUN = f"mdp6{os.getpid() % 10000}"
PIN_ROOT = f"/sys/fs/bpf/{RUN}"
B4, B6 = PODS["b"]
GOAL = 0.95
# series -> (underlay, destination pod)
SERIES = {"u4 v4pod": (4, B4), "u6 v4pod": (6, B4), "u4 v6pod": (4, B6), "u6 v6pod": (6, B6)}
RATIOS = {"v6 underlay / v4 underlay (v4 pods)": ("u6 v4pod", "u4 v4pod"),
          "v6 pod / v4 pod (v4 underlay)": ("u4 v6pod", "u4 v4pod")}


def pin_root(underlay: int) -> str:
    return f"{PIN_ROOT}/u{underlay}"


def load(tb: FabricTestbed, underlay: int, kind: str | None) -> None:
    """Both nodes' programs, with entries towards the other on rung `kind` (None: raw direct)."""
    for node in ("a", "b"):
        def one(node: str = node) -> None:
            with Datapath.open(node, pin_root=pin_root(underlay)) as dp:
                if dp.mode != "ebpf":
                    raise SystemExit(f"datapath of {node}: {dp.reason}")
                private = discovery.private_ipv4("eth1") if underlay == 4 else None
                dp.attach("eth1", None, ["vp1"], pods=discovery.pod_routes(["vp1"]), private4=private,
                          private6=None if underlay == 4 else ipaddress.ip_address(tb.private(node)))
                dp.sync(tb.fastpath(node, kind), "eth1")
        in_netns(tb.ns(node), one)
    for pod in ("a-p1", "b-p1"):  # forget path MTUs of another rung
        tb.sh(pod, ["ip", "route", "flush", "cache"])
        tb.sh(pod, ["ip", "-6", "route", "flush", "cache"])


def measure(beds: dict[int, FabricTestbed], rungs: list[str], rounds: int, seconds: int,
            log: Callable[[str], None]) -> dict[str, dict[str, dict[str, float]]]:
    out: dict[str, dict[str, dict[str, float]]] = {}
    for rung in rungs:
        kind = None if rung == "direct" else rung
        for underlay, tb in beds.items():
            load(tb, underlay, kind)
        series = [s for s in SERIES if not (rung == "direct" and SERIES[s] == (4, B6))]
        got: dict[str, list[float]] = {s: [] for s in series}
        for r in range(rounds):
            order = series[r % len(series):] + series[:r % len(series)]
            for s in order:
                underlay, dst = SERIES[s]
                got[s].append(iperf(beds[underlay], seconds, dst))
            log(f"  {rung} round {r + 1}/{rounds}: " + ", ".join(f"{s} {got[s][-1]:.2f}" for s in series))
        out[rung] = {s: spread(v) for s, v in got.items()}
    return out


def report(res: dict) -> str:
    lines = ["pod-to-pod, one TCP stream (iperf3), Gbit/s: median [min..max] over rounds, alternating"]
    lines.append(f"{'rung':<8}" + "".join(f"{s:>26}" for s in SERIES))
    for rung, row in res["traffic"].items():
        cells = [f"{row[s]['median']:>8.2f} [{row[s]['min']:6.2f}..{row[s]['max']:6.2f}]" if s in row else f"{'-':>26}"
                 for s in SERIES]
        lines.append(f"{rung:<8}" + "".join(f"{c:>26}" for c in cells))
    lines.append("")
    lines.append(f"ratios of medians (goal >= {GOAL})")
    for name, (num, den) in RATIOS.items():
        for rung, row in res["traffic"].items():
            if num in row and den in row:
                ratio = row[num]["median"] / row[den]["median"]
                lines.append(f"{name:<40}{rung:<8}{ratio:>6.3f}x  {'ok' if ratio >= GOAL else 'BELOW GOAL'}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--rungs", default="direct,ipip,vxlan")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rungs = [r for r in args.rungs.split(",") if r]
    if not set(rungs) <= {"direct", "ipip", "vxlan"}:
        raise SystemExit(f"--rungs: {args.rungs}: each one of direct, ipip, vxlan")
    loader.ensure_bpffs(PIN_ROOT)
    res: dict = {"load": os.getloadavg(), "command": " ".join(sys.argv)}
    beds = {u: FabricTestbed(f"{RUN}u{u}-", fabric="l2", underlay=u) for u in (4, 6)}
    try:
        for u, tb in beds.items():
            tb.up()
            tb.spawn("b-p1", ["iperf3", "-s", "-p", "5201"])
            for node in ("a", "b"):
                tb.route_pods(node, "raw")
            os.makedirs(pin_root(u), exist_ok=True)
        res["traffic"] = measure(beds, rungs, args.rounds, args.seconds, lambda s: print(s, file=sys.stderr))
    finally:
        for u, tb in beds.items():
            for node in ("a", "b"):
                if netns.exists(tb.ns(node)):
                    in_netns(tb.ns(node), lambda node=node, u=u: Datapath.unload(node, pin_root=pin_root(u)))
            tb.down()
        subprocess.run(["rm", "-rf", PIN_ROOT], check=False)
    res["load_after"] = os.getloadavg()
    print(report(res))
    print(f"load average before/after: {res['load'][0]:.2f} / {res['load_after'][0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
