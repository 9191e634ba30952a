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

Then the programs' own cost (BPF_PROG_TEST_RUN, ns per packet, median of single runs taken
alternating): from_pod wrapping and from_private unwrapping each (rung, underlay, pod family).

Medians and min..max over the rounds; each ratio is the median of the per-round ratios of its two
series (a round's series run seconds apart; the machine's load swings between rounds), next to the
ratio of the two medians. Goals (issue 22): both ratios
>= 0.95 on the same-subnet (direct) rung for the underlay, and on each encapsulated rung for the pod
family. Runs as root; everything it makes is prefixed mdp6<pid>- and removed at the end.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ctl"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from datapath import finish, iperf, spread, unload_testbed  # noqa: E402 - bench/datapath.py
from meshctl.datapath import Datapath, loader  # noqa: E402
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
            log: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    """rung -> series -> spread of its Gbit/s, and "ratios" -> ratio name -> spread of the
    per-round ratios."""
    out: dict[str, dict[str, Any]] = {}
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
        out[rung]["ratios"] = {name: spread([a / b for a, b in zip(got[num], got[den], strict=True)])
                               for name, (num, den) in RATIOS.items() if num in got and den in got}
    return out


OUTER = {4: (ipaddress.ip_address("10.30.0.1"), ipaddress.ip_address("10.30.0.2")),
         6: (ipaddress.ip_address("fd30::1"), ipaddress.ip_address("fd30::2"))}
POD_SRC = {4: "10.42.1.5", 6: "fd42:1::5"}


def prog_cost(rounds: int) -> dict[str, dict[str, float]]:
    """ns per packet of encapsulation (from_pod) and decapsulation (from_private), per rung,
    underlay and pod family. Single runs (repeat 1): a rerun would see the wrapped packet."""
    from meshctl.datapath import layout
    from meshctl.lab.rigs.testrun import frame, run
    from meshctl.mesh.plan import Encap, FastPathEntry

    cases: dict[str, tuple[str, str, int, int]] = {}  # name -> (kind, dst, underlay, pod family)
    entries: list[FastPathEntry] = []
    for n, (kind, under, fam) in enumerate((k, u, f) for k in ("ipip", "vxlan") for u in (4, 6) for f in (4, 6)):
        prefix = ipaddress.ip_network(f"10.60.{n}.0/24" if fam == 4 else f"fd60:{n}::/64")
        entries.append(FastPathEntry(prefix, "direct", None, Encap(kind, *OUTER[under])))  # type: ignore[arg-type]
        cases[f"{kind:<5} u{under} v{fam}pod"] = (kind, str(prefix.network_address + 9), under, fam)
    dp = Datapath.open("cost", pin_root=f"{PIN_ROOT}/cost")
    try:
        if dp.maps is None:
            raise SystemExit(f"datapath: {dp.reason}")
        dp.sync(entries, "lo")
        dp.maps.config_set(layout.CFG_PRIVATE4, layout.config_addr(OUTER[4][1]))
        hi, lo = layout.config_addr6(OUTER[6][1])
        dp.maps.config_set(layout.CFG_PRIVATE6, hi)
        dp.maps.config_set(layout.CFG_PRIVATE6 + 1, lo)
        dp.maps.pods.sync({layout.pod_key(ipaddress.ip_address(c[1])): layout.pod_value(1) for c in cases.values()})
        pod, priv = dp.programs["from_pod"], dp.programs["from_private"]
        frames = {name: frame(POD_SRC[fam], dst, ttl=64) for name, (_, dst, _, fam) in cases.items()}
        wires = {name: run(pod, f).out for name, f in frames.items()}
        for name, w in wires.items():
            if run(priv, w).verdict != "redirect":
                raise SystemExit(f"{name}: the wrapped packet was not unwrapped")
        got: dict[str, dict[str, list[int]]] = {"encap": {n: [] for n in cases}, "decap": {n: [] for n in cases}}
        for _ in range(rounds):
            for name in cases:
                got["encap"][name].append(run(pod, frames[name]).ns)
                got["decap"][name].append(run(priv, wires[name]).ns)
        return {what: {n: float(statistics.median(v)) for n, v in per.items()} for what, per in got.items()}
    finally:
        dp.close()
        Datapath.unload("cost", pin_root=f"{PIN_ROOT}/cost")


def report(res: dict) -> str:
    lines = ["pod-to-pod, one TCP stream (iperf3), Gbit/s: median [min..max] over rounds, alternating"]
    lines.append(f"{'rung':<8}" + "".join(f"{s:>26}" for s in SERIES))
    for rung, row in res.get("traffic", {}).items():
        cells = [f"{row[s]['median']:>8.2f} [{row[s]['min']:6.2f}..{row[s]['max']:6.2f}]" if s in row else f"{'-':>26}"
                 for s in SERIES]
        lines.append(f"{rung:<8}" + "".join(f"{c:>26}" for c in cells))
    lines.append("")
    lines.append(f"ratios (goal >= {GOAL}): median of per-round ratios [min..max], and of the medians")
    for name, (num, den) in RATIOS.items():
        for rung, row in res.get("traffic", {}).items():
            if name in row["ratios"]:
                r = row["ratios"][name]
                of_medians = row[num]["median"] / row[den]["median"]
                lines.append(f"{name:<40}{rung:<8}{r['median']:>6.3f}x [{r['min']:.2f}..{r['max']:.2f}]"
                             f"{of_medians:>8.3f}x  {'ok' if r['median'] >= GOAL else 'BELOW GOAL'}")
    if "programs" in res:
        lines.append("")
        lines.append("BPF_PROG_TEST_RUN ns/packet (median of single runs, alternating)")
        lines.append(f"{'case':<20}{'encap (from_pod)':>18}{'decap (from_private)':>22}")
        for name in res["programs"]["encap"]:
            lines.append(f"{name:<20}{res['programs']['encap'][name]:>18.0f}{res['programs']['decap'][name]:>22.0f}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--rungs", default="direct,ipip,vxlan")
    ap.add_argument("--prog-rounds", type=int, default=2000, help="single test runs per program case")
    ap.add_argument("--skip-traffic", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rungs = [r for r in args.rungs.split(",") if r]
    if not set(rungs) <= {"direct", "ipip", "vxlan"}:
        raise SystemExit(f"--rungs: {args.rungs}: each one of direct, ipip, vxlan")
    loader.ensure_bpffs(PIN_ROOT)
    res: dict = {"load": os.getloadavg(), "command": " ".join(sys.argv)}
    beds = {u: FabricTestbed(f"{RUN}u{u}-", fabric="l2", underlay=u) for u in (4, 6)}
    try:
        os.makedirs(f"{PIN_ROOT}/cost", exist_ok=True)
        res["programs"] = prog_cost(args.prog_rounds)
        for u, tb in beds.items():
            if args.skip_traffic:
                break
            tb.up()
            tb.spawn("b-p1", ["iperf3", "-s", "-p", "5201"])
            for node in ("a", "b"):
                tb.route_pods(node, "raw")
            os.makedirs(pin_root(u), exist_ok=True)
        if not args.skip_traffic:
            res["traffic"] = measure(beds, rungs, args.rounds, args.seconds, lambda s: print(s, file=sys.stderr))
    finally:
        for u, tb in beds.items():
            unload_testbed(tb, pin_root(u))
        subprocess.run(["rm", "-rf", PIN_ROOT], check=False)
    finish(res, report(res), args.json)


if __name__ == "__main__":
    main()
