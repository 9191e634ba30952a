# SPDX-License-Identifier: Apache-2.0
"""The CLI on a laptop: the package installed with pip into a fresh venv (no system site packages,
so no bcc) by an unprivileged user runs `plan`, `graph` and `showconf` on an example. The wheel
(and its dependencies, from pip's cache or PyPI) is built once by the test's own user; the
unprivileged user (nobody, through setpriv, when the test runs as root) installs it offline."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534
EXAMPLE = "laptop-peer.yaml"
SYSTEM_PYTHON = "/usr/bin/python3"

pytestmark = pytest.mark.slow


def _checkout_copy(dst: Path) -> None:
    """The files git knows (what a user clones), without this checkout's venv and build leftovers."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for rel in files:
        src = ROOT / rel
        if src.is_file() and not rel.startswith(".venv/"):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel)


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    """A folder the unprivileged user owns (pytest's own tmp folders are root's, mode 0700)."""
    d = Path(tempfile.mkdtemp(prefix="meshctl-laptop-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def as_user(home: Path, *argv: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """argv as an unprivileged user with HOME=home: nobody when we are root, else ourselves."""
    env = {"HOME": str(home), "PATH": f"{home / 'venv' / 'bin'}:/usr/bin:/bin", "LANG": "C.UTF-8",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if os.geteuid() == 0 else []
    return subprocess.run([*prefix, *argv], env=env, cwd=home, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def venv(home: Path) -> Path:
    """A fresh venv of the system Python, owned by the unprivileged user, with the package installed."""
    wheels, src = home / "wheels", home / "src"
    src.mkdir()
    _checkout_copy(src)
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", str(src),
                        "-w", str(wheels)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    if os.geteuid() == 0:
        for d, _, names in os.walk(home):
            for n in [".", *names]:
                os.chown(os.path.join(d, n), NOBODY, NOBODY)
    r = as_user(home, SYSTEM_PYTHON, "-m", "venv", str(home / "venv"))
    assert r.returncode == 0, r.stderr
    wheel = next(wheels.glob("meshctl-*.whl"))
    r = as_user(home, str(home / "venv/bin/pip"), "install", "-q", "--no-index", "--find-links", str(wheels),
                str(wheel))
    assert r.returncode == 0, r.stderr
    shutil.copy(ROOT / "examples" / EXAMPLE, home / EXAMPLE)
    return home / "venv"


def test_the_user_is_unprivileged_and_bcc_is_not_importable(home: Path, venv: Path) -> None:
    r = as_user(home, str(venv / "bin/python"), "-c",
                "import os, sys, importlib.util; import meshctl.cli; "
                "print(os.geteuid(), importlib.util.find_spec('bcc') is None, 'bcc' in sys.modules)")
    assert r.returncode == 0, r.stderr
    uid, no_bcc, bcc_loaded = r.stdout.split()
    assert uid != "0" and no_bcc == "True" and bcc_loaded == "False"
    if os.geteuid() == 0:
        assert venv.stat().st_uid == NOBODY and (venv / "bin/meshctl").stat().st_uid == NOBODY


def test_help_plan_graph_and_showconf_work_without_root(home: Path, venv: Path) -> None:
    meshctl = str(venv / "bin/meshctl")
    r = as_user(home, meshctl, "--help")
    assert r.returncode == 0 and " plan " in r.stdout and " showconf " in r.stdout, r.stderr
    r = as_user(home, meshctl, "plan", "-f", EXAMPLE, "--node", "fsn1-1", "-o", "json")
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert '"name": "laptop"' in r.stdout and '"preshared_key": "file /etc/meshctl/laptop.psk"' in r.stdout
    r = as_user(home, meshctl, "graph", "-f", EXAMPLE, "--render", "mesh.svg")
    assert r.returncode == 0, r.stderr
    assert "<svg" in (home / "mesh.svg").read_text()
    r = as_user(home, meshctl, "showconf", "-f", EXAMPLE, "peer", "laptop", "-o", "wg-quick")
    assert r.returncode == 0 and r.stdout.startswith("[Interface]\n") and "\nAddress = 10.5.0.1/32\n" in r.stdout
    r = as_user(home, meshctl, "showconf", "-f", EXAMPLE, "node", "do-1")
    assert r.returncode == 0 and "[Peer]" in r.stdout, r.stderr
