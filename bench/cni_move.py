# SPDX-License-Identifier: Apache-2.0
"""A Calico block moving between nodes under meshctl (the `calico.yaml` namespace lab, Kubernetes
API server and all): the block of a1's first pod moves to a2 and back, `--moves` times. For each
move: how long the kernel part took (the pod re-made on its new node: the baseline, measured in the
same run), then from the Calico objects changing until the old node's route to the pod follows
(`ip route get` there, read every 10 ms) and until b1's pod reaches the pod again.

    .venv/bin/python bench/cni_move.py [--moves 6] [--prefix mbm]

Goal (issue 21): the route follows within 1 s of the objects. tests/lab/test_cni_labs.py holds the
behaviour (the route follows, the pod is reached again)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import statistics
import time
from pathlib import Path

from meshctl.lab.namespaces import build, cni_calico
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.spec import load_lab
from meshctl.lab.namespaces.state import LabState
from meshctl.lab.namespaces.wiring import quiet
from meshctl.lab.rigs import netns

LAB = Path(__file__).resolve().parents[1] / "ctl" / "meshctl" / "lab" / "labs" / "calico.yaml"
BLOCK = ipaddress.ip_network("10.42.1.0/26")  # a1's first block, with its pod 0
LIMIT_S = 60.0


def until(cond, what: str) -> float:
    """Monotonic time at which `cond()` first held (read every 10 ms)."""
    deadline = time.monotonic() + LIMIT_S
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {LIMIT_S:.0f} s")
        time.sleep(0.01)
    return time.monotonic()


def move(st: LabState, pod_ip: str, src: str, dst: str) -> tuple[float, float, float]:
    """(kernel part, route followed, reached again), seconds; the last two from the objects changing."""
    by = {n.name: n for _, n in st.nodes()}
    dst_priv = str(ipaddress.ip_interface(by[dst].internal_ip or "").ip)
    t0 = time.monotonic()
    cni_calico.move_block(st, BLOCK, src, dst)
    t_api = time.monotonic()
    kernel = t_api - t0  # the pod re-made on dst, then the objects: move_block's order
    old = by[src].netns or ""
    followed = until(lambda: f"via {dst_priv} dev priv" in netns.run(old, ["ip", "-o", "route", "get", pod_ip],
                                                                     check=False).stdout, "the route")
    b1 = by["b1"].pods[0].netns
    reached = until(lambda: labcheck.ping(b1, pod_ip, count=1, wait=0.2)[1] == 1, "b1's pod reaching it")
    return kernel, followed - t_api, reached - t_api


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--moves", type=int, default=6)
    ap.add_argument("--prefix", default="mbm")
    args = ap.parse_args()
    prefix = f"{args.prefix}{os.getpid() % 1000}-"
    st = build.up(load_lab(LAB), prefix=prefix)
    try:
        build.wait_converged(st, quiet, 120)
        pod_ip = next(n for _, n in st.nodes() if n.name == "a1").pods[0].ip
        rows = []
        for i in range(args.moves):
            src, dst = ("a1", "a2") if i % 2 == 0 else ("a2", "a1")
            rows.append(move(st, pod_ip, src, dst))
            st = labstate.load(st.name) or st
            print(f"move {i + 1} {src} -> {dst}: kernel {rows[-1][0]:.3f} s, route followed {rows[-1][1]:.3f} s, "
                  f"reached again {rows[-1][2]:.3f} s", flush=True)
        kernel, follow, reach = (statistics.median(r[k] for r in rows) for k in range(3))
        print(f"medians of {len(rows)} moves (load {os.getloadavg()[0]:.1f}): kernel part {kernel:.3f} s (baseline); "
              f"route followed {follow:.3f} s ({follow / kernel:.2f}x), max {max(r[1] for r in rows):.3f} s "
              f"(goal < 1 s); reached again {reach:.3f} s ({reach / kernel:.2f}x)")
    finally:
        build.down(st.name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
