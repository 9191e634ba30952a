# SPDX-License-Identifier: Apache-2.0
"""This machine's kubectl (1.31+) against an API server: a kubeconfig and a discovery cache of the
test's own, so runs never share cached discovery."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass
class Result:
    rc: int
    out: str
    err: str


class Kubectl:
    """`k("get", "nodes")` runs kubectl with the kubeconfig `config`; `check=True` fails the test on a
    non-zero exit."""

    def __init__(self, config: Path | str, folder: Path) -> None:
        exe = shutil.which("kubectl")
        if exe is None:
            pytest.fail("kubectl is not installed (this machine kind ships /usr/bin/kubectl)")
        self.exe = exe
        self.config = Path(config)
        self.cache = folder / "kubectl-cache"

    def run(self, *args: str, stdin: str | None = None, check: bool = True) -> Result:
        p = subprocess.run([self.exe, "--kubeconfig", str(self.config), "--cache-dir", str(self.cache), *args],
                           input=stdin, capture_output=True, text=True, timeout=60, check=False)
        if check and p.returncode != 0:
            pytest.fail(f"kubectl {' '.join(args)} exited {p.returncode}: {p.stderr.strip()}")
        return Result(p.returncode, p.stdout, p.stderr)

    def __call__(self, *args: str, stdin: str | None = None) -> str:
        return self.run(*args, stdin=stdin).out

    def json(self, *args: str) -> dict:
        return json.loads(self(*args, "-o", "json"))


def lab_kubeconfig(lab: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`meshctl lab kubeconfig --lab LAB ARGS...`."""
    return subprocess.run([sys.executable, "-m", "meshctl.cli", "lab", "kubeconfig", "--lab", lab, *args],
                          capture_output=True, text=True, timeout=60, check=False)


def lab_kubectl(lab: str, folder: Path, *args: str) -> Kubectl:
    """This machine's kubectl against a lab's API server from the host, through the kubeconfig
    `meshctl lab kubeconfig` prints (ARGS: `--cluster-name C`)."""
    r = lab_kubeconfig(lab, *args)
    assert r.returncode == 0, r.stderr
    return Kubectl(Path(r.stdout.strip()), folder)


def table(text: str) -> list[dict[str, str]]:
    """kubectl's table output as rows by column header (columns split at the header's starts)."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = lines[0]
    starts = [i for i, c in enumerate(header) if c != " " and (i == 0 or header[i - 1] == " " and
                                                               (i < 2 or header[i - 2] == " "))]
    names = [header[s:e].strip() for s, e in zip(starts, [*starts[1:], None], strict=True)]
    return [{n: line[s:e].strip() for n, s, e in zip(names, starts, [*starts[1:], None], strict=True)}
            for line in lines[1:]]
