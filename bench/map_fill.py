# SPDX-License-Identifier: Apache-2.0
"""A 100,000-entry plan into an empty routes map, wall time, three ways side by side:

    .venv/bin/python bench/map_fill.py [--rounds 9] [--chunk 8192]
    chrt -f 10 .venv/bin/python bench/map_fill.py   # the threads given the cores on a loaded machine

`one batch after encoding` (the whole plan encoded, duplicates checked, one batch call), `chunks
while encoding` (Map.fill: chunk i written on a thread while chunk i+1 is encoded) and `batch
alone` (the kernel's part: the same keys and values encoded beforehand, one batch call). Rounds
alternate the order; min, median and max over rounds. The overlap helps only where a second core
is free, so on a shared machine run it under SCHED_FIFO (the other work waits for its seconds).

Runs as root; pins under /sys/fs/bpf/mdpf<pid>, removed at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ctl"))

from meshctl.datapath import Datapath, layout, libbpf, loader  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from datapath import big_plan  # noqa: E402

WAYS = ("one batch after encoding", "chunks while encoding", "batch alone")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--chunk", type=int, default=layout.ROUTE_CHUNK)
    args = ap.parse_args()
    root = f"/sys/fs/bpf/mdpf{os.getpid() % 10000}"
    loader.ensure_bpffs(root)
    os.makedirs(root, exist_ok=True)
    load = os.getloadavg()[0]
    dp = Datapath.open("fill", pin_root=root)
    try:
        if dp.maps is None:
            raise SystemExit(f"no datapath: {dp.reason}")
        routes, plan = dp.maps.routes, big_plan(100_000)
        res: dict[str, list[float]] = {w: [] for w in WAYS}
        for r in range(args.rounds):
            for way in WAYS if r % 2 == 0 else WAYS[::-1]:
                assert routes.empty()
                if way == "batch alone":
                    keys, vals = layout.route_rows(plan, 1)
                    kb, vb = b"".join(keys), b"".join(vals)
                    t = time.perf_counter()
                    libbpf.update_batch(routes.fd, kb, vb, len(keys))
                elif way == "one batch after encoding":
                    t = time.perf_counter()
                    keys, vals = layout.route_rows(plan, 1)
                    assert len(set(keys)) == len(keys)
                    libbpf.update_batch(routes.fd, b"".join(keys), b"".join(vals), len(keys))
                else:
                    t = time.perf_counter()
                    keys = routes.fill(layout.route_chunks(plan, 1, args.chunk))[1].keys
                res[way].append(time.perf_counter() - t)
                routes.delete(keys)
        for way, xs in res.items():
            print(f"{way:<28} min {min(xs):.3f}  median {statistics.median(xs):.3f}  max {max(xs):.3f} s")
        print(f"load average before/after: {load:.2f} / {os.getloadavg()[0]:.2f}")
    finally:
        dp.close()
        Datapath.unload("fill", pin_root=root)
        os.rmdir(root)


if __name__ == "__main__":
    main()
