# SPDX-License-Identifier: Apache-2.0
"""VM benchmark: how long each kernel of the matrix takes to boot here, and what the compiled-object
cache saves a node inside it.

    .venv/bin/python bench/vm.py [--kernels 5.10,6.1,6.12] [--rounds 2]

Per kernel, one VM at a time (2 vCPUs, 3 GB, the accelerator lab/vms/vm.py picks: TCG here):
1. boot: from starting vng to the guest's command server answering (median of --rounds boots);
2. inside one guest, side by side and alternating: loading the node's programs with bcc
   (`python -m meshctl.datapath.compile`, the baseline: what every agent did before the cache)
   against loading them from the compiled-object cache (`meshctl.datapath.objcache`), each into a
   fresh pin directory; medians and the ratio baseline/cached.
Runs as root; the VMs are stopped by PID, the guests' pins vanish with them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ctl"))

from meshctl.lab.rigs.kernels import KERNEL_SERIES  # noqa: E402
from meshctl.lab.vms import vm  # noqa: E402

GUEST = r"""
import json, subprocess, sys, time
from meshctl.datapath import loader, objcache
rounds = int(sys.argv[1])
out = {"bcc": [], "cache": []}
for r in range(rounds):
    for how in ("bcc", "cache") if r % 2 == 0 else ("cache", "bcc"):
        pin = f"/sys/fs/bpf/vmb-{how}-{r}"
        subprocess.run(["mkdir", "-p", pin], check=True)
        t0 = time.monotonic()
        if how == "bcc":
            subprocess.run([sys.executable, "-m", "meshctl.datapath.compile", pin], check=True)
        else:
            paths = {p: loader.prog_path(pin, p) for p in loader.PROGRAMS}
            assert objcache.load_and_pin(loader.object_key(), pin, paths)
        out[how].append(time.monotonic() - t0)
print(json.dumps(out))
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kernels", default=",".join(KERNEL_SERIES))
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if not vm.warm_bpf_cache():
        print("cannot compile the programs on the host: no cache to measure", file=sys.stderr)
        return 1
    rows = []
    for series in args.kernels.split(","):
        k = vm.kernel(series)
        boots = []
        loads: dict[str, list[float]] = {}
        for r in range(args.rounds):
            machine = vm.VM(k, f"vm-bench-{series}")
            try:
                machine.start()
                boots.append(machine.boot_seconds or 0.0)
                if r == 0:
                    res = machine.run([sys.executable, "-c", GUEST, str(args.rounds)], timeout=900)
                    if res.rc != 0:
                        print(res.stderr, file=sys.stderr)
                        return 1
                    loads = json.loads(res.stdout.strip().splitlines()[-1])
            finally:
                machine.stop()
        bcc, cache = statistics.median(loads["bcc"]), statistics.median(loads["cache"])
        rows.append((series, k.version, machine.accel, statistics.median(boots), bcc, cache))
        print(f"{series} ({k.version}, {machine.accel}): boot {statistics.median(boots):.1f} s "
              f"(min {min(boots):.1f}, max {max(boots):.1f}); programs with bcc {bcc:.1f} s, from the cache "
              f"{cache * 1000:.0f} ms: {bcc / cache:.0f}x", flush=True)
    print()
    print(f"{'KERNEL':<8} {'VERSION':<22} {'ACCEL':<6} {'BOOT s':>7} {'BCC s':>7} {'CACHE ms':>9} RATIO")
    for series, version, accel, boot, bcc, cache in rows:
        ratio = f"{bcc / cache:.0f}x"
        print(f"{series:<8} {version:<22} {accel:<6} {boot:>7.1f} {bcc:>7.1f} {cache * 1000:>9.0f} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
