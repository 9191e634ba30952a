# SPDX-License-Identifier: Apache-2.0
"""CPU time of `meshctl --help` and `meshctl X --help` (every command, and each group's first
subcommand), each the least of N runs of a child process (user + system, getrusage of the
children), side by side in one run with the named baseline:

    baseline: python -c "import click"   (the interpreter and the CLI library: what no help page
              can go below)

The target is 0.25 s of CPU for every help page; the line of each says its ratio to the baseline
and whether it is within the target. Exit status 1 when one is not.

    .venv/bin/python bench/cli_help.py [--runs 5]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys

import click

from meshctl.cli import main

TARGET_S = 0.25


def cpu(argv: list[str], runs: int) -> float:
    """The least CPU seconds of `argv` over `runs` child runs."""
    best = float("inf")
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        best = min(best, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return best


def pages() -> list[list[str]]:
    ctx = click.Context(main)
    out = [["--help"]]
    for name in main.list_commands(ctx):
        cmd = main.get_command(ctx, name)
        out.append([name, "--help"])
        if isinstance(cmd, click.Group):
            out.append([name, cmd.list_commands(click.Context(cmd))[0], "--help"])
    return out


def run(runs: int) -> int:
    base = cpu([sys.executable, "-c", "import click"], runs)
    print(f"baseline python -c 'import click': {base:.3f} s CPU (least of {runs})")
    slow = 0
    for page in pages():
        spent = cpu([sys.executable, "-m", "meshctl.cli", *page], runs)
        slow += spent > TARGET_S
        print(f"meshctl {' '.join(page):<32} {spent:.3f} s CPU  {spent / base:4.1f}x baseline  "
              f"{'ok' if spent <= TARGET_S else 'OVER'} (target {TARGET_S} s)")
    return 1 if slow else 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    sys.exit(run(ap.parse_args().runs))
