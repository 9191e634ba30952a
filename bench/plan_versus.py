# SPDX-License-Identifier: Apache-2.0
"""The plan of one node at 10,000 nodes, this tree against another revision, side by side.

Baseline: the same plan, same topology, built by revision REV's code (`git archive REV`), run in
alternating child processes so both see the same machine; prints each granularity's median and
the ratio of this tree to the baseline (below 1.00: this tree is faster).

    .venv/bin/python bench/plan_versus.py [--against REV] [--nodes N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRANULARITIES = ("location", "full", "cross")
# Each tree's own bench/plan_scale.py builds the topology and times the plan, so each revision
# runs with the imports it has.
CHILD = """
import sys
sys.path[:0] = ["ctl", "bench"]
import plan_scale
topo = plan_scale.make_topology({nodes}, 100, "{gran}")
print(plan_scale.timed(topo, "node-00001", repeat=3))
"""


def run_in(tree: Path, nodes: int, gran: str) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD.format(nodes=nodes, gran=gran)], cwd=tree,
                         capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "0"})
    return float(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--against", default="HEAD~1", help="the baseline revision")
    ap.add_argument("--nodes", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="meshctl-bench-") as tmp:
        base = Path(tmp)
        archive = subprocess.run(["git", "archive", args.against, "ctl", "bench"], cwd=ROOT, capture_output=True,
                                 check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        rev = subprocess.run(["git", "rev-parse", "--short", args.against], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        print(f"plan of one node at {args.nodes} nodes in 100 locations, median of {args.rounds} alternating rounds")
        print(f"{'granularity':<12}{'baseline ' + rev:>18}{'this tree':>14}{'ratio':>9}")
        for gran in GRANULARITIES:
            old: list[float] = []
            new: list[float] = []
            for _ in range(args.rounds):
                old.append(run_in(base, args.nodes, gran))
                new.append(run_in(ROOT, args.nodes, gran))
            a, b = statistics.median(old), statistics.median(new)
            print(f"{gran:<12}{a * 1000:>16.1f}ms{b * 1000:>12.1f}ms{b / a:>8.2f}x")


if __name__ == "__main__":
    main()
