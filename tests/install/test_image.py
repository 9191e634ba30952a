# SPDX-License-Identifier: Apache-2.0
"""The cluster's install path: `make image` builds the Dockerfile under the name manifests/ uses
(or IMAGE), says in one line when there is no container engine, the Dockerfile copies files that
exist, and docs/kubernetes.md's commands name the namespace, DaemonSet and image manifests/ ship."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import yaml

from meshctl.cli import main

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"
KUBE_DOC = ROOT / "docs" / "kubernetes.md"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
PODMAN_BUILD = "build --cap-add=CAP_BPF,CAP_PERFMON,CAP_SYS_ADMIN --security-opt seccomp=unconfined"
EXEC = re.compile(r"^kubectl -n (\S+) exec ds/(\S+) -- meshctl ([a-z ]+?)\s+#", re.M)


def make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env=env)


def manifests() -> list[dict]:
    return [d for f in sorted(MANIFESTS.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]


def daemonset() -> dict:
    return next(d for d in manifests() if d["kind"] == "DaemonSet")


def shipped_images() -> set[str]:
    spec = daemonset()["spec"]["template"]["spec"]
    return {c["image"] for c in spec["containers"] + spec.get("initContainers", [])}


def test_make_image_builds_the_dockerfile_under_the_manifests_name() -> None:
    r = make("-n", "image", "ENGINE=docker")
    assert r.returncode == 0, r.stderr
    # the build-objects step creates BPF maps: each engine is given what lets that one step do so
    assert r.stdout.splitlines() == [f"docker buildx build --allow security.insecure -t meshctl/meshctl:{VERSION} ."]
    assert shipped_images() == {f"meshctl/meshctl:{VERSION}"}
    r = make("-n", "image", "ENGINE=podman", "IMAGE=registry.example.com/infra/meshctl:1.2")
    assert r.stdout.splitlines() == [f"podman {PODMAN_BUILD} -t registry.example.com/infra/meshctl:1.2 ."]


def test_make_image_finds_an_engine_on_path(tmp_path: Path) -> None:
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("make", "sh", "sed"):
        (bin_ / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    (bin_ / "podman").write_text("#!/bin/sh\n")
    (bin_ / "podman").chmod(0o755)
    r = make("-n", "image", env={"PATH": str(bin_), "HOME": str(tmp_path)})
    assert r.stdout.splitlines() == [f"podman {PODMAN_BUILD} -t meshctl/meshctl:{VERSION} ."], r.stderr


def test_make_image_without_an_engine_says_so_in_one_line(tmp_path: Path) -> None:
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("make", "sh", "sed"):
        (bin_ / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    r = make("image", env={"PATH": str(bin_), "HOME": str(tmp_path)})
    assert r.returncode != 0 and r.stdout == ""
    (line,) = r.stderr.splitlines()
    assert "make image: no container engine: install docker or podman, or set ENGINE" in line
    r = make("image", "ENGINE=", env={**os.environ})
    assert r.returncode != 0 and len(r.stderr.splitlines()) == 1 and "no container engine" in r.stderr


def test_the_dockerfile_starts_from_an_image_and_copies_files_that_exist() -> None:
    text = (ROOT / "Dockerfile").read_text()
    instructions = [ln.split(None, 1) for ln in text.splitlines() if ln and not ln.startswith((" ", "#"))]
    assert instructions[0][0] == "FROM" and ":" in instructions[0][1]
    copies = [args.split() for op, args in instructions if op == "COPY" and not args.startswith("--from=")]
    assert copies
    for *sources, dest in copies:
        assert sources and dest
        for src in sources:
            assert any(ROOT.glob(src)) if "*" in src else (ROOT / src).exists(), src
    assert ("pyproject.toml" in {s for *srcs, _ in copies for s in srcs}
            and {"ctl", "bpf"} <= {s for *srcs, _ in copies for s in srcs})


def test_the_image_ships_objects_built_for_every_variant_outside_var_lib_meshctl() -> None:
    from meshctl.datapath import objcache

    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, re.M)
    assert [name for _, name in stages] == ["base", "objects", ""], stages
    objects_stage = text.split("FROM base AS objects", 1)[1].split("\nFROM ", 1)[0]
    # the one privileged step builds every variant with the command the tests run outside the image
    (build,) = re.findall(r"^RUN --security=insecure (.*?)(?<!\\)$", objects_stage, re.M | re.S)
    assert "meshctl datapath build-objects --out /objects" in build
    assert "linux-headers-amd64" in objects_stage
    final = text.rsplit("\nFROM ", 1)[1]
    assert f"COPY --from=objects /objects {objcache.SHIPPED_DIR}" in final
    # the DaemonSet mounts the host's /var/lib/meshctl: shipped objects there would be hidden
    assert not objcache.SHIPPED_DIR.startswith("/var/lib/meshctl")
    mounts = {m["mountPath"] for c in daemonset()["spec"]["template"]["spec"]["containers"]
              for m in c.get("volumeMounts", [])}
    assert not [m for m in mounts if objcache.SHIPPED_DIR.startswith(m.rstrip("/") + "/")]


def test_the_docs_push_to_ones_registry_and_set_the_image_with_kustomize() -> None:
    doc = KUBE_DOC.read_text()
    assert "make image IMAGE=registry.example.com/infra/meshctl:" in doc
    block = re.search(r"<<'YAML'\n(.*?)\nYAML\n", doc, re.S)
    assert block, "no kustomization in docs/kubernetes.md"
    k = yaml.safe_load(block.group(1))
    assert k["resources"] == ["../manifests"]
    (img,) = k["images"]
    shipped = {i.rsplit(":", 1)[0] for i in shipped_images()}
    assert shipped == {img["name"]} and str(img["newTag"]) == VERSION
    assert f"docker push {img['newName']}:{img['newTag']}" in doc


def test_troubleshooting_execs_into_the_daemonset_the_manifests_ship() -> None:
    doc = KUBE_DOC.read_text()
    troubleshooting = doc.split("## Troubleshooting\n", 1)[1].split("\n## ", 1)[0]
    found = EXEC.findall(troubleshooting)
    assert {cmd for _, _, cmd in found} == {"status", "node list", "maps dump"}
    assert troubleshooting.index("exec ds/meshctl -- meshctl status") < troubleshooting.index("logs ds/meshctl")
    namespaces = {d["metadata"]["name"] for d in manifests() if d["kind"] == "Namespace"}
    ds = daemonset()
    for ns, name, cmd in found:
        assert ns in namespaces and (ns, name) == (ds["metadata"]["namespace"], ds["metadata"]["name"])
        group, _, sub = cmd.partition(" ")
        command = main.get_command(None, group)
        assert command is not None and (not sub or command.get_command(None, sub) is not None), cmd
    # `kubectl exec ds/...` runs in the pod's first container: the agent's, with meshctl on its PATH.
    first = ds["spec"]["template"]["spec"]["containers"][0]
    assert first["name"] == "agent" and first["image"] in shipped_images()
    assert 'ENTRYPOINT ["meshctl"]' in (ROOT / "Dockerfile").read_text()
    labels = ds["spec"]["template"]["metadata"]["labels"]
    for key, value in re.findall(r"get pods -l (\S+)=(\S+) ", troubleshooting):
        assert labels.get(key) == value
