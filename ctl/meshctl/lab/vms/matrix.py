# SPDX-License-Identifier: Apache-2.0
"""`make vmtest`: the test suites inside each kernel of the matrix, one VM at a time, and a table.

`python -m meshctl.lab.vms.matrix [--kernels 5.10,6.1,6.12] [--suites datapath,node,lab,paths] [--timeout S]`

Each kernel boots once (vms/vm.py); each suite runs in it as `pytest -q tests/<suite>` from this
checkout (the guest sees it read-only); the compiled-object cache is warmed on the host first so
the guest never compiles the programs under emulation. The table gives, per kernel and suite,
passed/failed/skipped and seconds; the exit status is 1 when any cell failed or timed out. Each
suite's whole output is kept in --logs (/tmp/meshctl-vmtest/<kernel>-<suite>.log).
"""

from __future__ import annotations

import argparse
import re
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from meshctl.datapath.loader import COMPILE_TIMEOUT_ENV
from meshctl.errors import MeshError
from meshctl.lab.rigs.kernels import KERNEL_SERIES
from meshctl.lab.vms import vm

REPO = Path(__file__).resolve().parents[4]
SUITES = ("datapath", "node", "lab", "paths")  # paths: the path ladder and the fabrics
SUITE_TIMEOUT = 3600.0  # seconds one suite may run under emulation
GUEST_COMPILE_TIMEOUT = 900
LOG_DIR = Path("/tmp/meshctl-vmtest")
SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|error|errors|xfailed|xpassed|deselected)")


@dataclass
class Cell:
    """One suite on one kernel."""

    rc: int | None = None
    counts: dict[str, int] | None = None
    seconds: float = 0.0
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.rc in (0, 5) and not self.note

    def text(self) -> str:
        if self.note:
            return self.note
        c = self.counts or {}
        parts = [f"{c[k]} {k}" for k in ("passed", "failed", "errors", "error", "skipped") if c.get(k)]
        return f"{', '.join(parts) or 'no tests'} ({self.seconds:.0f} s)"


def parse_summary(output: str) -> dict[str, int]:
    """pytest's closing line ("3 passed, 1 failed in 9.1s") as counts."""
    lines = [ln for ln in output.strip().splitlines() if " in " in ln and SUMMARY.search(ln)]
    if not lines:
        return {}
    return {kind: int(n) for n, kind in SUMMARY.findall(lines[-1])}


def run_suite(machine: vm.VM, suite: str, timeout: float, echo: bool, log: Path | None = None) -> Cell:
    path = REPO / "tests" / suite
    if not path.is_dir():
        return Cell(note="no such suite")
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"tests/{suite}"]
    t0 = time.monotonic()
    try:
        # the suites that test compiling itself run bcc in the guest: minutes under emulation
        res = machine.run(argv, timeout=timeout, cwd=str(REPO),
                          env={"PYTHONDONTWRITEBYTECODE": "1", COMPILE_TIMEOUT_ENV: str(GUEST_COMPILE_TIMEOUT)},
                          on_output=vm.echo if echo else None)
    except MeshError as e:
        return Cell(seconds=time.monotonic() - t0, note=f"error: {e}")
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(res.stdout + res.stderr)
    cell = Cell(rc=res.rc, counts=parse_summary(res.stdout), seconds=time.monotonic() - t0)
    if res.rc not in (0, 1, 5):
        cell.note = f"exit {res.rc}: {(res.stdout + res.stderr).strip().splitlines()[-1:] or ['']}"[:80]
    return cell


def table(kernels: list[str], suites: list[str], cells: dict[tuple[str, str], Cell], boots: dict[str, str]) -> str:
    width = max(28, *(len(c.text()) + 2 for c in cells.values()))
    head = f"{'KERNEL':<24}" + "".join(f"{s:<{width}}" for s in suites)
    rows = [head]
    for k in kernels:
        rows.append(f"{boots.get(k, k):<24}" + "".join(f"{cells[k, s].text():<{width}}" for s in suites))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m meshctl.lab.vms.matrix")
    ap.add_argument("--kernels", default=",".join(KERNEL_SERIES))
    ap.add_argument("--suites", default=",".join(SUITES))
    ap.add_argument("--timeout", type=float, default=SUITE_TIMEOUT, help="seconds per suite")
    ap.add_argument("-v", "--verbose", action="store_true", help="echo the suites' output")
    ap.add_argument("--logs", default=str(LOG_DIR), help="where each suite's output is kept (<kernel>-<suite>.log)")
    args = ap.parse_args(argv)
    # SIGTERM ends the run like ^C: the `finally` below stops the VM that is up
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    kernels = [k for k in args.kernels.split(",") if k]
    suites = [s for s in args.suites.split(",") if s]
    try:
        found = [vm.kernel(k) for k in kernels]
    except MeshError as e:
        print(str(e), file=sys.stderr)
        return 2
    warmed = vm.warm_bpf_cache()
    print(f"vmtest: {vm.accel(found[0])}; compiled-object cache {'warm' if warmed else 'cold (guests compile)'}",
          file=sys.stderr)
    cells: dict[tuple[str, str], Cell] = {}
    boots: dict[str, str] = {}
    for k in found:
        machine = vm.VM(k, f"vm-matrix-{k.series}")
        try:
            machine.start()
            boots[k.series] = f"{k.series} (boot {machine.boot_seconds:.0f} s)"
            print(f"vmtest: {k.series} ({k.version}) booted in {machine.boot_seconds:.1f} s", file=sys.stderr)
            for s in suites:
                cells[k.series, s] = run_suite(machine, s, args.timeout, args.verbose,
                                               Path(args.logs) / f"{k.series}-{s}.log")
                print(f"vmtest: {k.series} {s}: {cells[k.series, s].text()}", file=sys.stderr)
        except MeshError as e:
            for s in suites:
                cells.setdefault((k.series, s), Cell(note=f"no VM: {e}"[:60]))
        finally:
            machine.stop()
    print(table(kernels, suites, cells, boots))
    return 0 if all(c.ok for c in cells.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
