# SPDX-License-Identifier: Apache-2.0
"""Dual-stack benchmark (issue 22): IPv6 pods over the IPv4 underlay against IPv4 pods, side by side
in one run, in the namespace lab.

    .venv/bin/python bench/dual_stack.py [--rounds 8] [--seconds 3] [--rung direct+vxlan|tunnel] [--json out.json]

The dual-stack lab (lab/labs/dual-stack.yaml: real agents, etcd, the eBPF fast path) with
`intra_subnet: vxlan`, so a1 and a2 (one private subnet) pair on `direct+vxlan`: the fast path
wraps either pod family in VXLAN between the nodes' IPv4 private addresses. `--rung tunnel` measures
a1 -> b1 instead (wireguard-go over the IPv4 public network). One iperf3 TCP stream pod to pod per
measurement, the families alternating round by round (the order reverses every round); medians,
min..max, and the ratio IPv6 / IPv4 (the goal: >= 0.95x). Each measurement checks the pair moved
the counter of its rung (the fast path's `encap`, or kilo0's TX). Runs as root; its lab is named
`db<pid>` and is taken down at the end, pass or fail.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from importlib.resources import files
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ctl"))

from meshctl.lab.namespaces import build  # noqa: E402
from meshctl.lab.namespaces import check as labcheck  # noqa: E402
from meshctl.lab.namespaces import state as labstate  # noqa: E402
from meshctl.lab.namespaces.spec import parse_lab  # noqa: E402
from meshctl.lab.namespaces.state import LabState, NodeState  # noqa: E402
from meshctl.lab.rigs import netns  # noqa: E402

PAIRS = {"direct+vxlan": ("a1", "a2"), "tunnel": ("a1", "b1")}
PORT = 5201


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def node(st: LabState, name: str) -> NodeState:
    return next(n for _, n in st.nodes() if n.name == name)


def moved(st: LabState, src: NodeState, rung: str) -> int:
    """The counter that proves the rung carried the traffic: the fast path's encap packets, or kilo0's TX."""
    if rung == "tunnel":
        return labcheck.link_tx(src).get(labcheck.WG, 0)
    view = labcheck.agent_view(src)
    return view.live.datapath.counters.get("encap", (0, 0))[0] if view else 0


def iperf(src: NodeState, dst: NodeState, family: int, seconds: int) -> float:
    """One stream's received Gbit/s from src's first pod to dst's."""
    address = dst.pods[0].address(family)
    assert address is not None, f"{dst.name}'s pod has no IPv{family} address"
    return iperf_to(src, address, seconds, PORT, family)


def iperf_to(src: NodeState, address: str, seconds: int, port: int, family: int = 4) -> float:
    """One stream's received Gbit/s from src's first pod to `address` (retried twice on a dropped
    control connection)."""
    for attempt in range(3):
        p = netns.run(src.pods[0].netns, ["iperf3", f"-{family}", "-c", address, "-p", str(port), "-t", str(seconds),
                                          "-J"], check=False, timeout=seconds + 30)
        out = json.loads(p.stdout or "{}")
        if "end" in out and "error" not in out:
            return float(out["end"]["sum_received"]["bits_per_second"]) / 1e9
        print(f"  iperf3: {out.get('error', 'no result')} (attempt {attempt + 1})", file=sys.stderr)
        time.sleep(1)
    raise SystemExit("iperf3 failed three times")


def measure(st: LabState, rung: str, rounds: int, seconds: int) -> dict[str, Any]:
    a, b = (node(st, n) for n in PAIRS[rung])
    server = netns.run(b.pods[0].netns, ["iperf3", "-s", "-D", "-p", str(PORT)], check=False)
    if server.returncode != 0:
        raise SystemExit(f"iperf3 server: {server.stderr.strip()}")
    results: dict[int, list[float]] = {4: [], 6: []}
    for r in range(rounds):
        for family in (4, 6) if r % 2 == 0 else (6, 4):
            before = moved(st, a, rung)
            results[family].append(iperf(a, b, family, seconds))
            if moved(st, a, rung) - before < 1000:
                raise SystemExit(f"IPv{family} round {r}: the {rung} counter did not move: not on the rung")
        print(f"round {r + 1}/{rounds}: IPv4 {results[4][-1]:.2f}  IPv6 {results[6][-1]:.2f} Gbit/s", file=sys.stderr)
    v4, v6 = spread(results[4]), spread(results[6])
    return {"rung": rung, "pair": list(PAIRS[rung]), "seconds": seconds, "rounds": rounds, "ipv4_gbps": v4,
            "ipv6_gbps": v6, "ratio_v6_over_v4": v6["median"] / v4["median"], "loadavg": os.getloadavg()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--rung", choices=sorted(PAIRS), default="direct+vxlan")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    doc = yaml.safe_load((files("meshctl.lab") / "labs" / "dual-stack.yaml").read_text())
    doc["mesh"]["intra_subnet"] = "vxlan"
    prefix = f"db{os.getpid() % 10000}-"
    try:
        st = build.up(parse_lab(doc), prefix=prefix)
        pair = PAIRS[args.rung]
        for family in (4, 6):
            r = labcheck.check(st, pairs=[pair], families=(family,))[0]
            if r.path != args.rung:
                raise SystemExit(f"IPv{family} {pair[0]} -> {pair[1]} is on {r.path}, not {args.rung}")
        out = measure(st, args.rung, args.rounds, args.seconds)
    finally:
        build.down(labstate.lab_name(prefix))
    v4, v6 = out["ipv4_gbps"], out["ipv6_gbps"]
    print(f"{args.rung} {out['pair'][0]} -> {out['pair'][1]}, {args.rounds} rounds x {args.seconds} s, one TCP stream:")
    print(f"  IPv4 pods  median {v4['median']:.2f} Gbit/s  ({v4['min']:.2f}..{v4['max']:.2f})")
    print(f"  IPv6 pods  median {v6['median']:.2f} Gbit/s  ({v6['min']:.2f}..{v6['max']:.2f})")
    print(f"  IPv6 / IPv4 = {out['ratio_v6_over_v4']:.3f}x (goal >= 0.95x); load average "
          f"{' '.join(f'{x:.2f}' for x in out['loadavg'])}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
