# SPDX-License-Identifier: Apache-2.0
"""`meshctl --help` and `meshctl X --help` are answered here, cheaply: never forwarded into a
lab's VM, importing neither the agent, netlink (pyroute2), the Kubernetes client nor the lab
builder, and within a generous bound of CPU time (the figure itself is bench/cli_help.py's).
Usage errors are the project's one line, never click's `Usage:`/`Error:` block."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from meshctl.cli import main, targets

from .grammar import subcommands

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "cross-mesh.yaml")

# What a help page must not import: the agent, netlink, the Kubernetes client, the lab's builders.
HEAVY = ("meshctl.agent", "pyroute2", "lightkube", "meshctl.lab.namespaces.build", "meshctl.lab.vms", "bcc",
         "meshctl.node.wireguard", "meshctl.backends.kube")
# A generous bound: help costs about 0.1 s of CPU here (0.5-0.7 s before commands loaded lazily).
HELP_CPU_S = 0.4

# One child run: the command, then which modules it imported (a JSON list on the last line).
CHILD = ("import sys, json, contextlib, io\n"
         "from meshctl.cli import main\n"
         "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
         "    main(sys.argv[1:], standalone_mode=False)\n"
         "print(json.dumps(sorted(sys.modules)))\n")


def help_commands() -> list[list[str]]:
    """`--help` of meshctl, of every command and of every group's first subcommand."""
    out = [["--help"]]
    for name, cmd in subcommands(main).items():
        out.append([name, "--help"])
        if isinstance(cmd, click.Group):
            first = next(iter(subcommands(cmd)))
            out.append([name, first, "--help"])
    return out


def imported_by(argv: list[str]) -> list[str]:
    p = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return list(json.loads(p.stdout.splitlines()[-1]))


@pytest.mark.parametrize("argv", help_commands(), ids=" ".join)
def test_help_imports_nothing_heavy(argv: list[str]) -> None:
    heavy = [m for m in imported_by(argv) if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert heavy == [], f"meshctl {' '.join(argv)} imports {heavy[:5]}"


def test_the_check_sees_a_command_that_runs_import_the_agent() -> None:
    """`meshctl status` run (no agent answers at port 1) reads the agent's status type: the check
    above would see it."""
    assert "meshctl.agent.status" in imported_by(["status", "--addr", "127.0.0.1:1"])


def cpu_of(argv: list[str]) -> float:
    """CPU seconds (user + system) of `meshctl ARGV` run as a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([sys.executable, "-m", "meshctl.cli", *argv], capture_output=True, text=True, timeout=60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert p.returncode == 0, p.stderr
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


@pytest.mark.parametrize("argv", [["--help"], ["status", "--help"], ["graph", "--help"], ["lab", "up", "--help"],
                                  ["agent", "--help"]], ids=" ".join)
def test_help_takes_little_cpu(argv: list[str]) -> None:
    spent = min(cpu_of(argv) for _ in range(3))  # the least of three: a busy machine only adds
    assert spent < HELP_CPU_S, f"meshctl {' '.join(argv)}: {spent:.2f} s of CPU"


def test_help_is_never_forwarded_into_a_lab(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[str]] = []

    class Forwarder:
        def forward(self, argv: list[str]) -> int | None:
            asked.append(argv)
            return 7  # "ran in the VM"

    monkeypatch.setattr(targets, "_forwarder", [Forwarder()])
    res = CliRunner().invoke(main, ["status", "--lab", "x", "--help"])
    assert res.exit_code == 0 and "--lab-node" in res.stdout and asked == []
    res = CliRunner().invoke(main, ["status", "--lab", "x"])
    assert res.exit_code == 7 and asked == [["status", "--lab", "x"]]
    # after `--`, `--help` is an argument of the command (etcdctl's), not a request for help
    res = CliRunner().invoke(main, ["lab", "etcdctl", "--", "--help"])
    assert res.exit_code == 7 and asked[-1] == ["lab", "etcdctl", "--", "--help"]


@pytest.mark.parametrize(("argv", "line"), [
    (["plan", "-f", EXAMPLE, "--node", "rack-1", "--granularity", "mesh"],
     "error: --granularity: 'mesh' is not one of 'location', 'full', 'cross'"),
    (["plan", "-f", str(Path(EXAMPLE).parent), "--node", "rack-1"],
     f"error: --file: File '{Path(EXAMPLE).parent}' is a directory"),
    (["graph", "-f", EXAMPLE, "-o", "table"], "error: --output: 'table' is not one of 'dot', 'text', 'json'"),
    (["plan", "--bogus"], "error: --bogus: no such option of meshctl plan"),
    (["status", "--lab-nod", "a1"],
     "error: --lab-nod: no such option of meshctl status (did you mean --lab, --lab-node?)"),
    (["plan", "-f", EXAMPLE, "--node"], "error: --node: needs a value"),
    (["explain", "10.0.0.1"], "error: DST: is required (an argument of meshctl explain)"),
    (["datapath", "unload"], "error: --node: is required (an option of meshctl datapath unload)"),
    (["no-such-command"], "error: meshctl: no such command 'no-such-command'"),
    (["plan", "-f", EXAMPLE, "--node", "rack-1", "extra"],
     "error: meshctl plan: got unexpected extra argument (extra)"),
])
def test_a_usage_error_is_one_line(monkeypatch: pytest.MonkeyPatch, argv: list[str], line: str) -> None:
    monkeypatch.setattr(targets, "_forwarder", [])  # nothing to forward to: no lab state read
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 2, res.output
    assert res.stderr.splitlines() == [line]
    assert "Usage:" not in res.output and "Try " not in res.output


def test_a_bare_group_still_shows_its_help() -> None:
    res = CliRunner().invoke(main, ["mesh"])
    assert "Usage: meshctl mesh" in res.output and "get" in res.output
