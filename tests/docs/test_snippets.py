# SPDX-License-Identifier: Apache-2.0
"""Every Python block of docs/ runs (from the repository's root, as a reader would paste it), and
every meshctl command of a shell block that runs offline against an examples/ topology file exits
0 without an `error:` line: a snippet the code no longer matches fails here."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from meshctl.cli import main, targets

from .snippets import DOCS, ROOT, SHELLS, Block, blocks, meshctl_lines, offline

PYTHON = [b for d in DOCS for b in blocks(d) if b.lang == "python"]
# Commands that do not end by themselves (`ui` serves until Ctrl-C; tests/ui runs it).
LONG_RUNNING = {"ui", "monitor", "agent"}
COMMANDS = [(b, argv) for d in DOCS for b in blocks(d) if b.lang in SHELLS or b.lang == ""
            for argv in meshctl_lines(b) if offline(argv) and argv[0] not in LONG_RUNNING]


def test_the_docs_have_snippets_to_run() -> None:
    assert len(PYTHON) >= 1 and len(COMMANDS) >= 4
    assert any(b.doc.name == "agent.md" for b in PYTHON)


@pytest.mark.parametrize("block", PYTHON, ids=[b.where for b in PYTHON])
def test_python_block_runs(block: Block) -> None:
    p = subprocess.run([sys.executable, "-c", block.text], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, f"{block.where}: {p.stderr.strip().splitlines()[-1:]}"


@pytest.mark.parametrize(("block", "argv"), COMMANDS, ids=[f"{b.where} {' '.join(a)}" for b, a in COMMANDS])
def test_offline_command_runs(block: Block, argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if "--render" in argv and shutil.which("dot") is None:
        pytest.skip("--render needs Graphviz's dot")
    (tmp_path / "examples").symlink_to(ROOT / "examples")  # relative paths as in the docs; outputs land here
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(targets, "_forwarder", [])  # offline: no lab is asked
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 0 and "error:" not in res.stderr, f"{block.where}: meshctl {' '.join(argv)}: {res.output}"
    assert os.listdir(tmp_path)  # the symlink at least: the command ran where the docs say


def api_calls(text: str) -> list[tuple[str, list[str]]]:
    """`Datapath.NAME(...)` and `dp.NAME(...)` calls of a listing: the method and its keywords."""
    calls = []
    for m in re.finditer(r"\b(?:Datapath|dp)\.(\w+)\(([^()]*(?:\([^()]*\)[^()]*)*)\)", text):
        calls.append((m.group(1), re.findall(r"\b(\w+)=", m.group(2))))
    return calls


def test_the_datapath_api_listing_names_real_methods_and_keywords() -> None:
    from meshctl.datapath import Datapath

    [listing] = [b for b in blocks(ROOT / "docs" / "datapath.md") if "Datapath.open(" in b.text]
    calls = api_calls(listing.text)
    assert len(calls) >= 8
    for name, keywords in calls:
        method = getattr(Datapath, name, None)
        assert callable(method), f"{listing.where}: Datapath has no method {name}"
        params = inspect.signature(method).parameters
        extra = set(keywords) - params.keys()
        assert not extra, f"{listing.where}: Datapath.{name} takes no {extra}"
    assert api_calls("dp.sync(x, y); Datapath.open(n, pin_root=p, enabled=True)") == [
        ("sync", []), ("open", ["pin_root", "enabled"])]
