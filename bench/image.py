# SPDX-License-Identifier: Apache-2.0
"""The agent image (`make image`, podman here): its size, each layer's size and what it holds,
and the time of `make image` with every layer cached (and, with --cold, with none). Side by side,
same run, the baseline: the image's `objects` stage (`<image>-objects`), the runtime with bcc, LLVM,
clang and Debian's kernel headers: what the agent image carried before it shipped compiled objects
alone (issue 36: 676 MB).

    .venv/bin/python bench/image.py [--cold] [--image meshctl/meshctl:0.1.0]

--cold builds with --no-cache after making the offline base again (mmdebstrap): Debian's and
PyPI's packages are downloaded again (through this machine's proxy: the time depends on it)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
VERSION = next(line.split('"')[1] for line in (ROOT / "pyproject.toml").read_text().splitlines()
               if line.startswith("version = "))
MB = 1e6


def make_image(image: str, *, cold: bool) -> float:
    """Seconds `scripts/image.sh build` took (podman)."""
    env = dict(os.environ, IMAGE=image, ENGINE="podman")
    if cold:
        subprocess.run(["bash", "scripts/image.sh", "base"], cwd=ROOT, env=env, check=True, capture_output=True)
        env["NO_CACHE"] = "1"
    t0 = time.monotonic()
    p = subprocess.run(["bash", "scripts/image.sh", "build"], cwd=ROOT, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"make image failed: {p.stderr.strip().splitlines()[-1:]}")
    return time.monotonic() - t0


def image_size(image: str) -> int:
    out = subprocess.run(["podman", "image", "inspect", "--format", "{{.Size}}", image], capture_output=True,
                         text=True, check=True).stdout
    return int(out.strip())


def history(image: str) -> list[tuple[int, str]]:
    """(size, created by) of each layer that adds files, oldest first."""
    out = subprocess.run(["podman", "history", "--no-trunc", "--format", "json", image], capture_output=True,
                         text=True, check=True).stdout
    rows = [(int(h.get("size") or h.get("Size") or 0), h.get("CreatedBy") or h.get("createdBy") or "")
            for h in json.loads(out)]
    return [r for r in reversed(rows) if r[0] > 0]


def what(created_by: str) -> str:
    """A layer's instruction in a few words."""
    text = " ".join(created_by.replace("/bin/sh -c #(nop) ", "").split())
    if "apt-get install" in text:
        pkgs = text.split("--no-install-recommends", 1)[1].split("&&", 1)[0].split()
        return "apt: " + " ".join(pkgs)
    if text.startswith("ADD file:"):
        return "base image"
    if text.startswith("COPY "):
        return f"COPY into {text.rsplit(' in ', 1)[-1]}"
    return text[:70]


def layers(image: str) -> list[tuple[int, Counter[str]]]:
    """Each layer of `image` (oldest first): its unpacked bytes and bytes per top folder (3 deep)."""
    out = []
    with tempfile.TemporaryDirectory() as d:
        archive = Path(d) / "image.tar"
        subprocess.run(["podman", "save", "--format", "docker-archive", "-o", str(archive), image], check=True,
                       capture_output=True)
        with tarfile.open(archive) as outer:
            manifest = json.load(outer.extractfile("manifest.json"))  # type: ignore[arg-type]
            for name in manifest[0]["Layers"]:
                by: Counter[str] = Counter()
                with tarfile.open(fileobj=outer.extractfile(name)) as t:
                    for m in t.getmembers():
                        if m.isfile():
                            parts = PurePosixPath(m.name).parts
                            by["/" + "/".join(parts[:3] if parts[0] == "usr" else parts[:2])] += m.size
                out.append((sum(by.values()), by))
    return out


def top(by: Counter[str], n: int = 4) -> str:
    return ", ".join(f"{k} {v / MB:.1f}" for k, v in by.most_common(n))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", default=f"meshctl/meshctl:{VERSION}")
    ap.add_argument("--cold", action="store_true", help="also time a build with no cached layer")
    a = ap.parse_args()
    cold = make_image(a.image, cold=True) if a.cold else None
    first = make_image(a.image, cold=False)  # brings it up to date (cached when nothing changed)
    cached = make_image(a.image, cold=False)
    baseline = f"{a.image}-objects"
    size, base_size = image_size(a.image), image_size(baseline)
    label = subprocess.run(["podman", "image", "inspect", "--format",
                            '{{index .Labels "org.opencontainers.image.base.name"}}', a.image],
                           capture_output=True, text=True).stdout.strip()
    print(f"image {a.image} from {label}: {size / MB:.1f} MB; baseline {baseline} (bcc, LLVM, clang, "
          f"kernel headers): {base_size / MB:.1f} MB; ratio {size / base_size:.2f}x")
    print(f"make image: {cached:.1f} s with every layer cached (the run before it: {first:.1f} s)"
          + (f"; {cold:.0f} s with none (--cold: base from mmdebstrap, packages downloaded)" if cold else ""))
    print()
    print("| layer | size (MB) | what | largest folders (MB) |")
    print("|---|---:|---|---|")
    for i, ((lsize, by), (_, created)) in enumerate(zip(layers(a.image), history(a.image), strict=False), 1):
        print(f"| {i} | {lsize / MB:.1f} | {what(created)} | {top(by)} |")


if __name__ == "__main__":
    main()
