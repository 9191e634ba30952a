# SPDX-License-Identifier: Apache-2.0
"""Where the tests' real Kubernetes control plane comes from: `kube-apiserver` and
`kube-controller-manager` of one pinned version, found the way controller-runtime's envtest finds
its assets and unpacked once.

The order, first hit wins:
1. `$MESHCTL_KUBE_BINARIES`: a directory holding the two binaries, unpacked or as `.xz`;
2. what an earlier run unpacked under `/var/lib/meshctl/kube/<version>/`;
3. a `shared/tools/kubernetes/` folder beside the checkout (or beside one of its parents): the
   `.xz` archives with their `SHA256SUMS`;
4. the official release binaries (dl.k8s.io), checked against their published SHA-256, where the
   machine is online.

Whatever is found is unpacked (or copied) into the cache directory and checked with `--version`
before it is used. When none can be had, `find` raises one MeshError naming every place it looked,
so a missing control plane fails the Kubernetes tests with that line instead of skipping them.
`python -m meshctl.lab.rigs.kube_binaries` does the same from the shell (scripts/setup.sh).
"""

from __future__ import annotations

import hashlib
import lzma
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

from meshctl.errors import MeshError

VERSION = "v1.32.6"
NAMES = ("kube-apiserver", "kube-controller-manager")
ENV = "MESHCTL_KUBE_BINARIES"
CACHE_ROOT = Path("/var/lib/meshctl/kube")
RELEASE_URL = "https://dl.k8s.io/release/{version}/bin/linux/{arch}/{name}"
_CHECKOUT = Path(__file__).resolve().parents[4]
_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}


def cache_dir(version: str = VERSION) -> Path:
    return CACHE_ROOT / version


def find(version: str = VERSION, *, env: dict[str, str] | None = None, download: bool = True) -> Path:
    """The directory holding both binaries of `version`, unpacked and executable."""
    env = dict(os.environ) if env is None else env
    looked: list[str] = []
    cache = cache_dir(version)
    given = env.get(ENV, "")
    if given:
        looked.append(f"${ENV}={given}")
        src = Path(given)
        if _has_all(src, plain_or_xz=True):
            return _install_from(src, cache, version)
        raise MeshError(f"${ENV}={given} does not hold {' and '.join(NAMES)} (plain or .xz)")
    looked.append(str(cache))
    if _usable(cache, version):
        return cache
    for shared in _shared_dirs():
        looked.append(str(shared))
        if _has_all(shared, plain_or_xz=True):
            return _install_from(shared, cache, version)
    if download:
        arch = _ARCH.get(platform.machine(), platform.machine())
        url = RELEASE_URL.format(version=version, arch=arch, name="{name}")
        looked.append(url)
        try:
            return _download(url, cache, version)
        except (OSError, MeshError) as e:
            looked[-1] += f" ({e})"
    raise MeshError(f"no kube-apiserver/kube-controller-manager {version} found; looked in: " + "; ".join(looked))


def _shared_dirs() -> list[Path]:
    """`shared/tools/kubernetes` beside the checkout and beside each of its parents."""
    out = []
    for d in (_CHECKOUT, *_CHECKOUT.parents):
        p = d.parent / "shared" / "tools" / "kubernetes"
        if p not in out:
            out.append(p)
    return out


def _has_all(d: Path, *, plain_or_xz: bool) -> bool:
    return all((d / n).is_file() or (plain_or_xz and (d / f"{n}.xz").is_file()) for n in NAMES)


def _usable(d: Path, version: str) -> bool:
    return all(_version_ok(d / n, version) for n in NAMES)


def _version_ok(exe: Path, version: str) -> bool:
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        return False
    try:
        p = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return False
    return p.stdout.strip().endswith(version)


def _checksums(src: Path) -> dict[str, str]:
    sums = src / "SHA256SUMS"
    if not sums.is_file():
        return {}
    out = {}
    for line in sums.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[1].lstrip("*")] = parts[0]
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _install_from(src: Path, cache: Path, version: str) -> Path:
    """Copy or unpack the binaries of `src` into `cache` (checked against `src`'s SHA256SUMS when
    it has one), each through a temporary file renamed into place, so a reader never sees half."""
    sums = _checksums(src)
    cache.mkdir(parents=True, exist_ok=True)
    for n in NAMES:
        dst = cache / n
        if _version_ok(dst, version):
            continue
        plain, packed = src / n, src / f"{n}.xz"
        origin = plain if plain.is_file() else packed
        want = sums.get(origin.name)
        if want and _sha256(origin) != want:
            raise MeshError(f"{origin}: SHA-256 does not match {src / 'SHA256SUMS'}")
        with tempfile.NamedTemporaryFile(dir=cache, prefix=f".{n}.", delete=False) as out:
            tmp = Path(out.name)
            try:
                if origin is packed:
                    with lzma.open(origin) as f:
                        shutil.copyfileobj(f, out, 1 << 20)
                else:
                    with open(origin, "rb") as f:
                        shutil.copyfileobj(f, out, 1 << 20)
            except (OSError, lzma.LZMAError) as e:
                tmp.unlink(missing_ok=True)
                raise MeshError(f"unpacking {origin}: {e}") from None
        tmp.chmod(0o755)
        tmp.replace(dst)
        if not _version_ok(dst, version):
            raise MeshError(f"{dst} (from {origin}) does not report Kubernetes {version}")
    return cache


def _download(url: str, cache: Path, version: str) -> Path:
    """Fetch each binary and its published `.sha256`, check, and install."""
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        for n in NAMES:
            if _version_ok(cache / n, version):
                continue
            u = url.format(name=n)
            with urllib.request.urlopen(u + ".sha256", timeout=30) as r:
                want = r.read().decode().split()[0]
            path = Path(tmp) / n
            with urllib.request.urlopen(u, timeout=300) as r, open(path, "wb") as out:
                shutil.copyfileobj(r, out, 1 << 20)
            if _sha256(path) != want:
                raise MeshError(f"{u}: SHA-256 does not match the published {u}.sha256")
        return _install_from(Path(tmp), cache, version) if any(Path(tmp).iterdir()) else cache


def main() -> int:
    try:
        d = find()
    except MeshError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if "-v" in sys.argv[1:]:
        print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
