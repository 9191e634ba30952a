# SPDX-License-Identifier: Apache-2.0
"""The agent image deletes the lab package after install (Dockerfile): the CLI must then work
without it, list no `lab` commands, and turn lab-only flags into one clear line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# Makes `import meshctl.lab` fail in the child, as it does in the image.
BLOCK = "import sys; sys.modules['meshctl.lab'] = None; from meshctl.cli import main; main()"


def meshctl_without_lab(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK, *args], capture_output=True, text=True, timeout=60, cwd=tmp)


def test_cli_without_the_lab_has_no_lab_commands(tmp_path: Path) -> None:
    r = meshctl_without_lab("--help", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    assert " plan " in r.stdout and " status " in r.stdout
    assert " lab " not in r.stdout


def test_lab_flags_without_the_lab_fail_in_one_line(tmp_path: Path) -> None:
    r = meshctl_without_lab("status", "--lab-node", "a1", tmp=tmp_path)
    assert r.returncode == 1
    assert r.stderr.strip() == ("error: --lab-node: the lab is not part of this installation "
                                "(the agent image leaves it out)")
    assert "Traceback" not in r.stderr


def test_cli_with_the_lab_lists_it(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "meshctl.cli", "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and " lab " in r.stdout
