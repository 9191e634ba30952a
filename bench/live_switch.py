# SPDX-License-Identifier: Apache-2.0
"""Live mesh switches under pings: the default lab's pair types (same subnet, via the leaders,
tunnels, a lone node) pinged at 20 pps while `meshctl mesh set` switches the mesh record, one
switch after another; prints per pair and switch whether the switch moved the pair's path, the
pings it lost (and their seconds at 20 pps) and the ICMP errors ping saw, then a line per switch
and the totals. Which pairs a switch moves comes from its own `mesh set -o json` diff
(tests/live_switching.py).

    .venv/bin/python bench/live_switch.py [--file default|nat] [--lab NAME] [--settle 4] [--switch KEY=VALUE ...]

Without --lab it brings the default lab up under the prefix `mb-` and takes it down after. The
default switches: granularity location -> full -> cross -> location, intra_subnet direct ->
vxlan -> direct, under full with intra_subnet auto a private_networks change (the lab's private
subnets are not routed to each other: the prober must keep those pairs on their tunnels) and back,
then the WireGuard port and back. `--file nat`: the NAT lab's pairs (a relay, tunnels to discovered
endpoints) across the granularity switches and the port change.

Targets (issue 24): 0 ICMP errors; 0 lost on pairs a switch keeps on their path; < 0.5 s (10
pings) lost on a pair it moves. The figures before make before break were measured with this
bench on main's appliers (docs/benchmarks.md, "Live switches").
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "ctl"))
sys.path.insert(0, str(ROOT))

from tests.live_switching import INTERVAL, MOVING_LOSS_MAX, NAT_PAIRS, PAIRS, PPS, Window, run, table  # noqa: E402

from meshctl.lab.namespaces import build  # noqa: E402
from meshctl.lab.namespaces import state as labstate  # noqa: E402
from meshctl.lab.namespaces.spec import load_lab  # noqa: E402

# The same KEY=VALUE twice (granularity=full) is one row of the summary: it sums both windows.
SWITCHES = ["granularity=full", "granularity=cross", "granularity=location", "intra_subnet=vxlan",
            "intra_subnet=direct", "granularity=full", "intra_subnet=auto", "private_networks=10.10.0.0/16",
            "private_networks=", "intra_subnet=direct", "granularity=location", "port=51821", "port=51820"]
NAT_SWITCHES = ["granularity=full", "granularity=cross", "granularity=location", "port=51821", "port=51820"]
PREFIX = "mb-"
LABS = {"default": (PAIRS, SWITCHES), "nat": (NAT_PAIRS, NAT_SWITCHES)}


def summary(switches: list[str], ws: list[Window]) -> str:
    """A line per switch (pairs moved, lost on moved and kept pairs, errors) and the totals."""
    lines = [f"{'switch':<32} {'moved':>5} {'lost moved':>10} {'worst':>5} {'lost kept':>9} {'errors':>6}"]
    for s in ["quiet", *dict.fromkeys(switches)]:
        mine = [w for w in ws if w.switch == s]
        moved = [w for w in mine if w.moving]
        lines.append(f"{s:<32} {len(moved):>5} {sum(w.lost for w in moved):>10} "
                     f"{max((w.lost for w in moved), default=0):>5} {sum(w.lost for w in mine if not w.moving):>9} "
                     f"{sum(len(w.errors) for w in mine):>6}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lab", help="a lab that is up (default: bring the default lab up as mb)")
    ap.add_argument("--settle", type=float, default=4.0, help="seconds after each switch")
    ap.add_argument("--switch", action="append", help="KEY=VALUE for `mesh set`, in order (repeatable)")
    ap.add_argument("--file", choices=sorted(LABS), default="default",
                    help="which shipped lab and its pairs: default, or nat (relays, discovered endpoints)")
    args = ap.parse_args()
    pairs, default_switches = LABS[args.file]
    switches = args.switch or default_switches
    name = args.lab
    if name is None:
        build.up(load_lab(ROOT / "ctl" / "meshctl" / "lab" / "labs" / f"{args.file}.yaml"), prefix=PREFIX)
        name = labstate.lab_name(PREFIX)
    try:
        st = labstate.load(name)
        if st is None:
            print(f"error: lab {name} is not up", file=sys.stderr)
            return 2
        _, results, ws = run(st, switches, settle=args.settle, pairs=pairs)
    finally:
        if args.lab is None:
            build.down(name)
    print(table(ws))
    print()
    print(summary(switches, ws))
    sent = sum(r.sent for r in results.values())
    lost = sum(len(r.lost) for r in results.values())
    errors = sum(len(r.errors) for r in results.values())
    pairs_with_errors = sum(1 for r in results.values() if r.errors)
    kept_lost = sum(w.lost for w in ws if not w.moving)
    worst = max((w.lost for w in ws if w.moving), default=0)
    print("\nlongest gap between replies per pair (ping backs off after an ICMP error: it sends less, and a gap "
          "over 1.5 s hides losses):")
    print(", ".join(f"{label} {r.longest_gap:.2f} s" for label, r in results.items()))
    print(f"\ntotal: {len(results)} pairs at {PPS} pps, {sent} sent, {lost} lost; {errors} ICMP errors on "
          f"{pairs_with_errors} pair(s); kept pairs lost {kept_lost}; worst moving window {worst} "
          f"({worst * INTERVAL:.2f} s; target <= {MOVING_LOSS_MAX})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
