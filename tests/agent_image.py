# SPDX-License-Identifier: Apache-2.0
"""The agent image, built once per test session with `make image` (scripts/image.sh: podman here,
its layers cached after the first build), for the tests that run it: the install tests and the
labs whose agents run from it (`lab.agent: image`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
IMAGE = f"meshctl/meshctl:{VERSION}"
BUILD_TIMEOUT = 1200.0  # s: a cold build fetches Debian's packages and PyPI's (about 2 minutes here)


@pytest.fixture(scope="session")
def agent_image() -> str:
    """The image `make image` builds (its default tag), built or brought up to date now."""
    if os.geteuid() != 0 or shutil.which("podman") is None:
        pytest.skip("the agent image needs root and podman (make setup installs it)")
    p = subprocess.run(["bash", "scripts/image.sh", "build"], cwd=ROOT, capture_output=True, text=True,
                       timeout=BUILD_TIMEOUT, env=dict(os.environ, IMAGE=IMAGE, ENGINE="podman"))
    assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
    return IMAGE


def podman_run(image: str, *args: str, entrypoint: str | None = None, opts: tuple[str, ...] = (),
               timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    """A throwaway container of `image` with no network, as the lab runs podman here (lab/podman.py)."""
    from meshctl.lab.namespaces import podman

    argv = [*podman.run_prefix(), "--rm", "--network=none", *opts]
    if entrypoint is not None:
        argv += ["--entrypoint", entrypoint]
    return subprocess.run([*argv, image, *args], capture_output=True, text=True, timeout=timeout)
