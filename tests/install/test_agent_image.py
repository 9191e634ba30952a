# SPDX-License-Identifier: Apache-2.0
"""The agent image built for real (`make image` with podman, once per session): it runs, carries no
compiler, loads its shipped objects on this kernel without bcc, and holds nothing of the CA bundle
handed to its build; `build-objects` where no bpffs can be written says so in one line."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from meshctl.datapath import loader
from tests.agent_image import ROOT, VERSION, podman_run

pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="needs root"), pytest.mark.slow]

PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\r?\n(.*?)-----END CERTIFICATE-----", re.S)


def test_the_image_runs_meshctl(agent_image: str) -> None:
    r = podman_run(agent_image, "--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"meshctl, version {VERSION}"


def test_the_image_carries_no_compiler(agent_image: str) -> None:
    r = podman_run(agent_image, "-c",
                   "import importlib.util as u; print(u.find_spec('bcc'), u.find_spec('meshctl.lab'))",
                   entrypoint="python3")
    assert r.stdout.split() == ["None", "None"], r.stderr
    r = podman_run(agent_image, "-c", "ls /usr/lib/x86_64-linux-gnu | grep -ci -e llvm -e clang -e libbcc || true",
                   entrypoint="sh")
    assert r.stdout.strip() == "0", r.stdout


LOAD = """
from meshctl.datapath import features, loader, objcache
shipped = sorted(p.name for p in objcache.shipped_dir().iterdir())
with loader.build_pin_dir("/sys/fs/bpf/meshctl") as d:
    why = objcache.load_and_pin(loader.shipped_path(), loader.shipped_key(), d,
                                {p: loader.prog_path(d, p) for p in loader.PROGRAMS})
print(len(shipped), len(features.variants()), features.variant_name(features.probe().variant()), why)
"""


def test_the_shipped_objects_load_on_this_kernel_without_bcc(agent_image: str) -> None:
    """The variant this kernel's probes select loads from the image's objects with libbpf alone
    (a private bpffs: the container sees none)."""
    r = podman_run(agent_image, "-c", LOAD, entrypoint="python3", opts=("--privileged",))
    assert r.returncode == 0, r.stderr
    shipped, variants, variant, why = r.stdout.split()
    assert shipped == variants and why == "None", r.stdout
    assert variant != "base", "this 6.18 kernel has every optional helper"


def _extra_certificates(bundle: bytes, image_bundle: bytes) -> list[bytes]:
    """The certificates of `bundle` that the image's own CA store does not hold (a proxy's)."""
    own = {b"".join(m.split()) for m in PEM.findall(image_bundle)}
    return [body for body in PEM.findall(bundle) if b"".join(body.split()) not in own]


def _layer_files(archive: Path) -> list[tuple[str, str, bytes]]:
    """(layer, path, content) of every regular file of every layer of a `podman save` archive."""
    out = []
    with tarfile.open(archive) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
        for layer in manifest[0]["Layers"]:
            with tarfile.open(fileobj=outer.extractfile(layer)) as t:
                for m in t.getmembers():
                    f = t.extractfile(m) if m.isfile() else None
                    if f is not None:
                        out.append((layer, m.name, f.read()))
    return out


def test_the_ca_handed_to_the_build_is_in_no_layer_of_the_image(agent_image: str, tmp_path: Path) -> None:
    """The build stages trusted the host's CA bundle (pip went through this machine's proxy with
    it); no layer of the final image holds that file, or any certificate of it the image's own CA
    store lacks (the proxy's), while the build stage's image does: the search finds it where it is."""
    handed = (ROOT / "build" / "image" / "ca.pem").read_bytes()
    assert handed, "make image handed the build no CA bundle"
    files = _layer_files(_save(agent_image, tmp_path / "image.tar"))
    image_bundle = next(c for _, p, c in files if p == "etc/ssl/certs/ca-certificates.crt")
    extra = _extra_certificates(handed, image_bundle)
    found = [(layer, p) for layer, p, c in files if handed in c or p.endswith("build-ca.pem")
             or any(body in c for body in extra)]
    assert found == []
    # The build stage holds it (make image tags that stage `<image>-build`), and the search finds it there.
    stage = _layer_files(_save(f"{agent_image}-build", tmp_path / "build.tar"))
    assert [p for _, p, c in stage if handed in c] == ["tmp/build-ca.pem"]


def _save(image: str, archive: Path) -> Path:
    subprocess.run(["podman", "save", "--format", "docker-archive", "-o", str(archive), image], check=True,
                   capture_output=True, timeout=300)
    return archive


def test_build_objects_without_a_writable_bpffs_says_so_in_one_line(tmp_path: Path) -> None:
    """A read-only bpffs (a chroot build binds the host's /sys read-only): a private one is mounted
    for the build; without CAP_SYS_ADMIN to mount it, one line, exit 1, no traceback."""
    ro = tmp_path / "ro-bpffs"
    ro.mkdir()
    subprocess.run(["mount", "-t", "bpf", "-o", "ro", "bpf", str(ro)], check=True)
    try:
        # with CAP_SYS_ADMIN the build gets a private bpffs of its own instead, removed after
        with loader.build_pin_dir(str(ro)) as d:
            assert not d.startswith(str(ro)) and loader.bpffs_mounted(d)
            os.mkdir(f"{d}/maps")
        assert not Path(d).exists()
        meshctl = shutil.which("meshctl", path=str(Path(os.sys.executable).parent))
        assert meshctl
        for pin_root, why in ((str(ro), f"{ro} is not writable (Read-only file system)"),
                              (str(tmp_path / "none"), f"{tmp_path / 'none'} is not on a bpf filesystem")):
            r = subprocess.run(["setpriv", "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin", meshctl,
                                "datapath", "build-objects", "--out", str(tmp_path / "out"),
                                "--bpf-pin-root", pin_root],
                               capture_output=True, text=True, timeout=120)
            assert r.returncode == 1 and r.stdout == "", r.stderr
            (line,) = r.stderr.splitlines()
            assert line.startswith(f"error: no writable bpffs: {why}, and mounting a private one on "), line
            assert line.endswith("failed (Operation not permitted); build-objects needs CAP_SYS_ADMIN and CAP_BPF")
    finally:
        subprocess.run(["umount", str(ro)], check=True)
