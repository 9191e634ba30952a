# SPDX-License-Identifier: Apache-2.0
"""The CLI on a laptop: the package installed with pip into a fresh venv (no system site packages,
so no bcc) or with pipx, by an unprivileged user, runs `plan`, `graph` and `showconf` on an
example. The wheel (and its dependencies, from pip's cache or the index) is built once by the
test's own user; the unprivileged user (nobody, through setpriv, when the test runs as root)
installs it offline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

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


def as_user(home: Path, *argv: str, extra: dict[str, str] | None = None,
            timeout: int = 300) -> subprocess.CompletedProcess[str]:
    """argv as an unprivileged user with HOME=home: nobody when we are root, else ourselves."""
    env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           **(extra or {})}
    prefix = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"] if os.geteuid() == 0 else []
    return subprocess.run([*prefix, *argv], env=env, cwd=home, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheels(home: Path) -> Path:
    """The package's wheel and its dependencies', and pipx with the pip it needs, built or fetched
    by the test's own user, then the whole folder handed to the unprivileged user."""
    wheels, src = home / "wheels", home / "src"
    src.mkdir()
    _checkout_copy(src)
    shutil.copy(ROOT / "examples" / EXAMPLE, home / EXAMPLE)
    for argv in (["wheel", str(src)], ["download", "pipx", "pip>=26.1"]):
        p = subprocess.run([sys.executable, "-m", "pip", argv[0], "-q", "--disable-pip-version-check", *argv[1:],
                            "-d" if argv[0] == "download" else "-w", str(wheels)],
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr
    if os.geteuid() == 0:
        for d, _, names in os.walk(home):
            for n in [".", *names]:
                os.chown(os.path.join(d, n), NOBODY, NOBODY)
    return wheels


def _offline(wheels: Path) -> tuple[str, ...]:
    return ("--no-index", "--find-links", str(wheels))


def _pip_install(home: Path, wheels: Path) -> Path:
    """`python3 -m venv` (no system site packages) and `pip install` of the wheel: the venv's meshctl."""
    r = as_user(home, SYSTEM_PYTHON, "-m", "venv", str(home / "venv"))
    assert r.returncode == 0, r.stderr
    r = as_user(home, str(home / "venv/bin/pip"), "install", "-q", *_offline(wheels),
                str(next(wheels.glob("meshctl-*.whl"))))
    assert r.returncode == 0, r.stderr
    return home / "venv/bin/meshctl"


def _pipx_install(home: Path, wheels: Path) -> Path:
    """pipx (bootstrapped into a venv of its own) installs the wheel: pipx's meshctl."""
    r = as_user(home, SYSTEM_PYTHON, "-m", "venv", str(home / "boot"))
    assert r.returncode == 0, r.stderr
    r = as_user(home, str(home / "boot/bin/pip"), "install", "-q", *_offline(wheels), "pipx")
    assert r.returncode == 0, r.stderr
    r = as_user(home, str(home / "boot/bin/pipx"), "install", str(next(wheels.glob("meshctl-*.whl"))),
                extra={"PIPX_HOME": str(home / "pipx"), "PIPX_BIN_DIR": str(home / "bin"), "PIP_NO_INDEX": "1",
                       "PIP_FIND_LINKS": str(wheels)})
    assert r.returncode == 0, r.stderr
    return home / "bin/meshctl"


@pytest.fixture(scope="module", params=["pip", "pipx"])
def meshctl(request: pytest.FixtureRequest, home: Path, wheels: Path) -> Path:
    return _pip_install(home, wheels) if request.param == "pip" else _pipx_install(home, wheels)


def _python_of(meshctl: Path) -> str:
    """The interpreter of the venv a console script belongs to (pipx links the script from its venv)."""
    return str(meshctl.resolve().parent / "python")


def test_the_user_is_unprivileged_and_bcc_is_not_importable(home: Path, meshctl: Path) -> None:
    r = as_user(home, _python_of(meshctl), "-c",
                "import os, sys, importlib.util; import meshctl.cli; "
                "print(os.geteuid(), importlib.util.find_spec('bcc') is None, 'bcc' in sys.modules)")
    assert r.returncode == 0, r.stderr
    uid, no_bcc, bcc_loaded = r.stdout.split()
    assert uid != "0" and no_bcc == "True" and bcc_loaded == "False"
    if os.geteuid() == 0:
        assert meshctl.stat().st_uid == NOBODY


def test_help_plan_graph_and_showconf_work_without_root(home: Path, meshctl: Path) -> None:
    exe = str(meshctl)
    r = as_user(home, exe, "--help")
    assert r.returncode == 0 and " plan " in r.stdout and " showconf " in r.stdout, r.stderr
    r = as_user(home, exe, "plan", "-f", EXAMPLE, "--node", "fsn1-1", "-o", "json")
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert '"name": "laptop"' in r.stdout and '"preshared_key": "file /etc/meshctl/laptop.psk"' in r.stdout
    svg = home / f"mesh-{meshctl.parent.name}.svg"
    r = as_user(home, exe, "graph", "-f", EXAMPLE, "--render", svg.name)
    assert r.returncode == 0, r.stderr
    assert "<svg" in svg.read_text()
    r = as_user(home, exe, "showconf", "-f", EXAMPLE, "peer", "laptop", "-o", "wg-quick")
    assert r.returncode == 0 and r.stdout.startswith("[Interface]\n") and "\nAddress = 10.5.0.1/32\n" in r.stdout
    r = as_user(home, exe, "showconf", "-f", EXAMPLE, "node", "do-1")
    assert r.returncode == 0 and "[Peer]" in r.stdout, r.stderr


def test_plan_against_a_cluster_api_without_root(home: Path, meshctl: Path, api: Any, kclient: Any) -> None:
    """`--kubeconfig` from the laptop: a kubeconfig as k3s or kubeadm hands one out (the CA and the
    client certificate and key inline) naming the cluster's real API server is all it needs."""
    import base64

    from tests.kube.helpers import create_node, node_obj

    for name, pod, seed, ep in (("n1", "10.42.1.0/24", 1, "198.51.100.1:51820"),
                                ("n2", "10.42.2.0/24", 2, "198.51.100.2:51820")):
        create_node(kclient, node_obj(name, pod, key=seed, endpoint=ep,
                                      labels={"topology.kubernetes.io/region": name}))
    admin = api.cp.admin_identity()

    def inline(f: Path) -> str:
        return base64.b64encode(f.read_bytes()).decode()

    kubeconfig = home / f"kubeconfig-{meshctl.parent.name}"
    fd = os.open(kubeconfig, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # it holds a private key
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "lab",
            "clusters": [{"name": "lab", "cluster": {"server": api.url,
                                                     "certificate-authority-data": inline(admin.ca)}}],
            "users": [{"name": "lab", "user": {"client-certificate-data": inline(admin.cert),
                                               "client-key-data": inline(admin.key)}}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "lab"}}]}, f)
    if os.geteuid() == 0:
        os.chown(kubeconfig, NOBODY, NOBODY)
    r = as_user(home, str(meshctl), "plan", "--kubeconfig", str(kubeconfig), "--node", "n1", "-o", "json")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    assert plan["node"] == "n1" and [p["name"] for p in plan["peers"]] == ["n2"]
    assert plan["peers"][0]["endpoint"] == "198.51.100.2:51820"
