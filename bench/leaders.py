# SPDX-License-Identifier: Apache-2.0
"""Leaders that do not forward (issue 37): the time from a leader's break to the traffic through it
flowing again, on a real lab (lab/labs/leaders.yaml: three locations of three nodes, location
granularity, namespaces, etcd over mTLS, real agents).

Pods of a3 (loc-a, led by a1) ping pods of b2 and c2 at 20 pps, through a1, for the whole run.
Each break is timed from the moment it is made to the first reply after the pings it lost (0 when
none was lost), the larger of the two pairs:

1. `forwarding`: `lab forwarding a1 off` (kilo#489's leader: its agent, record and lease healthy),
   `--breaks` times; after each, `on` and a1 back as leader (the hold) before the next.
2. `dead`: a1's agent killed and a1 forwarding nothing (a node that died), `--dead` times.
3. `two`: `forwarding` in the same lab less the x3 nodes (three locations of two members: a1's only
   other member, a2, cannot depose it alone; the other locations' leaders are the second witness),
   a2's pod pinging b2's and c2's, `--two` times.
4. The baseline, side by side: the same dead leader in a lab whose agents run with
   `--no-forwarding-probes`, which is how every release before this one chose leaders: a1 leads
   until its record's lease runs out (the lab's 5 s) and the lapse grace after it (`--lapse-grace`,
   60 s) ends, `--baseline` times.

    .venv/bin/python bench/leaders.py [--breaks 20] [--dead 3] [--two 20] [--baseline 2] [--prefix lb-]

Goal: p95 of `forwarding` and `two` within 5 s.
"""

from __future__ import annotations

import argparse
import copy
import math
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from importlib.resources import files
from typing import Any

from meshctl.backends.file import load_yaml
from meshctl.lab.namespaces import build, faults
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.namespaces.state import LabState
from meshctl.lab.rigs import netns
from meshctl.lab.rigs.waiting import wait_until

INTERVAL = 0.05  # 20 pings a second
_REPLY = re.compile(rb"^\[(\d+\.\d+)\] \d+ bytes from .*icmp_seq=(\d+)", re.M)
STATIC = {"loc-a": ("a1",), "loc-b": ("b1",), "loc-c": ("c1",)}
FORWARDING = "forwarding off (kilo#489)"
TWO = "forwarding off, a location of two"


class Ping:
    """A 20 pps ping from `src`'s pod to `dst`'s, in the background, its replies read as they come."""

    def __init__(self, st: LabState, src_node: str, dst: str, seconds: float) -> None:
        src = st.lookup(src_node)[1].pods[0].netns
        self.out = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
        # stdbuf: a line per reply as it comes (ping's stdout to a file is block-buffered)
        argv = ["stdbuf", "-oL", "ping", "-n", "-D", "-i", str(INTERVAL), "-c", str(math.ceil(seconds / INTERVAL)),
                st.lookup(dst)[1].pods[0].ip]
        self.proc = subprocess.Popen([*netns.exec_prefix(src), *argv], stdout=self.out, stderr=subprocess.STDOUT)

    def replies(self) -> list[tuple[int, float]]:
        import os

        data = os.pread(self.out.fileno(), 1 << 26, 0)
        return sorted((int(seq), float(t)) for t, seq in _REPLY.findall(data))

    def recovered(self, broke: float) -> float | None:
        """Seconds from `broke` to the first reply after the pings the break lost; 0 when the
        replies have kept coming for 3 s since it with none lost; None while the loss goes on."""
        got = self.replies()
        before = [s for s, t in got if t < broke]
        last = max(before, default=0)
        after = [(s, t) for s, t in got if s > last]
        if not after:
            return None
        expected = last + 1
        for s, t in after:
            if s != expected:
                return t - broke  # the first reply after a gap
            expected += 1
        # No gap: the break took nothing from this pair, once replies have kept coming for 3 s.
        now = time.time()
        return 0.0 if now - broke >= 3.0 and now - after[-1][1] < 0.5 else None

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.out.close()


def one_break(st: LabState, pings: list[Ping], brk: Callable[[], None], undo: Callable[[], None],
              timeout: float) -> float:
    """Break, wait for every ping to recover, undo, wait for a1 to lead on every agent again."""
    broke = time.time()
    brk()
    times = wait_until(lambda: (r := [p.recovered(broke) for p in pings]) and all(x is not None for x in r) and r,
                       timeout, "the pings through a1 answering again", step=0.02)
    undo()
    wait_until(lambda: labcheck.leaders_view(st).agreed() == STATIC, 120, "a1 leading again", step=0.2)
    return max(times)


def up(prefix: str, agent_args: list[str], two: bool = False) -> LabState:
    """The leaders lab (`two`: less the x3 nodes), every agent on the documented order."""
    doc: dict[str, Any] = copy.deepcopy(load_yaml(str(files("meshctl") / "lab" / "labs" / "leaders.yaml")))
    doc["lab"]["agent_args"] = agent_args
    if two:
        doc["nodes"] = [n for n in doc["nodes"] if not n["name"].endswith("3")]
    build.down(labstate.lab_name(prefix))
    st = build.up(parse_lab(doc), prefix=prefix, wait=120)
    wait_until(lambda: labcheck.leaders_view(st).agreed() == STATIC, 60, "every agent on the documented order")
    return st


def series(st: LabState, kind: str, n: int, timeout: float, src: str = "a3") -> list[float]:
    a1 = st.lookup("a1")[1]
    out = []
    pings = [Ping(st, src, "b2", 3600), Ping(st, src, "c2", 3600)]
    try:
        wait_until(lambda: all(p.replies() for p in pings), 20, "the pings answering")
        for i in range(n):
            if kind == "forwarding":
                def brk() -> None:
                    faults.forwarding(st.prefix, a1, False)

                def undo() -> None:
                    faults.forwarding(st.prefix, a1, True)
            else:
                def brk() -> None:
                    faults.forwarding(st.prefix, a1, False)
                    build.stop_agent(st, "a1", kill=True)

                def undo() -> None:
                    faults.forwarding(st.prefix, a1, True)
                    build.start_agent(st, "a1")
            t = one_break(st, pings, brk, undo, timeout)
            out.append(t)
            print(f"  {kind} break {i + 1}/{n}: traffic through a1 back after {t:.2f} s", flush=True)
    finally:
        for p in pings:
            p.stop()
    return out


def figures(name: str, xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=20, method="inclusive") if len(xs) > 1 else [xs[0]] * 19
    return f"{name:<34} n={len(xs):<3} p50 {statistics.median(xs):6.2f} s  p95 {q[18]:6.2f} s  max {max(xs):6.2f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--breaks", type=int, default=20)
    ap.add_argument("--dead", type=int, default=3)
    ap.add_argument("--two", type=int, default=20)
    ap.add_argument("--baseline", type=int, default=2)
    ap.add_argument("--prefix", default="lb-")
    args = ap.parse_args()
    results: dict[str, list[float]] = {}
    if args.breaks or args.dead:
        st = up(args.prefix, [])
        try:
            if args.breaks:
                results[FORWARDING] = series(st, "forwarding", args.breaks, 60)
            if args.dead:
                results["node dead (agent killed)"] = series(st, "dead", args.dead, 60)
        finally:
            build.down(st.name)
    if args.two:
        st = up(args.prefix, [], two=True)
        try:
            results[TWO] = series(st, "forwarding", args.two, 60, src="a2")
        finally:
            build.down(st.name)
    if args.baseline:
        st = up(args.prefix, ["--no-forwarding-probes"])
        try:
            results["baseline: node dead, lapse grace"] = series(st, "dead", args.baseline, 180)
        finally:
            build.down(st.name)
    print("\nbreak -> traffic through the leader flowing again (a3's pod, in a location of two a2's, to b2's and "
          "c2's, 20 pps):")
    for name, xs in results.items():
        print(figures(name, xs))
    base = results.get("baseline: node dead, lapse grace")
    if base:
        for name, xs in results.items():
            if xs is not base:
                print(f"{name}: p50 {statistics.median(base) / statistics.median(xs):.0f}x faster than the baseline")
    for name in (FORWARDING, TWO):
        if name in results:
            p95 = figures("", results[name]).split("p95")[1].split("s")[0]
            print(f"goal: p95 of {name} within 5 s: {'met' if float(p95) <= 5 else 'NOT met'}")


if __name__ == "__main__":
    main()
