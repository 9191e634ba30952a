# SPDX-License-Identifier: Apache-2.0
"""The cluster's install path: `make image` builds the Dockerfile under the name manifests/ uses
(or IMAGE), says in one line when there is no container engine, the Dockerfile copies files that
exist, and docs/kubernetes.md's commands name the namespace, DaemonSet and image manifests/ ship."""

from __future__ import annotations

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


def image_sh(tmp_path: Path, tools: dict[str, str], *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """scripts/image.sh with only `tools` (name -> shell script body) and the basics on PATH."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    for tool in ("bash", "sh", "sed", "cat", "grep", "tail", "timeout", "basename", "dirname", "mkdir", "cp", "cmp",
                 "mv", "rm", "ls", "date", "mktemp"):
        if not (bin_ / tool).exists():
            (bin_ / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
    for name, body in tools.items():
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    return subprocess.run(["bash", str(ROOT / "scripts" / "image.sh"), *args], capture_output=True, text=True,
                          timeout=60, env={"PATH": str(bin_), "HOME": str(tmp_path), **env})


NO_DAEMON = 'echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock." >&2; exit 1'
DAEMON = 'if [ "$1" = buildx ] && [ -z "$BUILDX" ]; then exit 1; fi; echo 27.0'


def test_make_image_runs_the_image_script() -> None:
    r = make("-n", "image", "IMAGE=registry.example.com/infra/meshctl:1.2", "ENGINE=podman")
    assert r.returncode == 0, r.stderr
    (line,) = r.stdout.splitlines()
    assert "IMAGE='registry.example.com/infra/meshctl:1.2' ENGINE='podman'" in line
    assert line.endswith("bash scripts/image.sh build")
    assert shipped_images() == {f"meshctl/meshctl:{VERSION}"}


def test_a_docker_cli_without_a_daemon_is_not_an_engine(tmp_path: Path) -> None:
    r = image_sh(tmp_path, {"docker": NO_DAEMON, "podman": "exit 0"}, "engine")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("podman: podman build --network=host"), r.stdout
    r = image_sh(tmp_path, {"docker": NO_DAEMON, "podman": "exit 0"}, "engine", ENGINE="docker")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == ["make image: ENGINE=docker cannot build here: its daemon does not answer "
                                     "(Cannot connect to the Docker daemon at unix:///var/run/docker.sock.)"]


def test_docker_with_a_daemon_builds_with_buildx_only_where_it_is(tmp_path: Path) -> None:
    r = image_sh(tmp_path, {"docker": DAEMON, "podman": "exit 0"}, "engine", BUILDX="1")
    assert r.stdout.splitlines() == ["docker: docker buildx build --load"], r.stderr
    r = image_sh(tmp_path, {"docker": DAEMON, "podman": "exit 0"}, "engine")
    assert r.stdout.splitlines() == ["docker: docker build"], r.stderr


def test_podman_builds_on_the_host_network_within_the_hosts_limits(tmp_path: Path) -> None:
    r = image_sh(tmp_path, {"podman": "exit 0", "runc": "exit 0"}, "engine")
    import resource

    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 1048576)
    words = r.stdout.split()
    assert words[:4] == ["podman:", "podman", "build", "--network=host"], r.stdout
    assert "--runtime runc" in r.stdout and f"--ulimit nofile={nofile}:{nofile}" in r.stdout


def test_without_an_engine_that_can_build_says_so_in_one_line(tmp_path: Path) -> None:
    r = image_sh(tmp_path, {}, "build")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.splitlines() == ["make image: no container engine: install docker or podman, or set ENGINE"]
    r = image_sh(tmp_path, {"docker": NO_DAEMON}, "build")
    assert r.returncode == 2
    (line,) = r.stderr.splitlines()
    assert line.startswith("make image: no container engine can build here: docker's daemon does not answer (")


def test_the_build_compiles_the_objects_in_a_privileged_container_then_builds(tmp_path: Path) -> None:
    """The dry run with podman: the objects stage as its own image, run privileged with no network
    into build/image/objects, then the image, both from the base picked (here the offline one)."""
    # podman's inspect prints the image's id (image.sh reads it); here only the offline base exists
    has = 'if [ "$1 $2" = "image inspect" ]; then for a; do last=$a; done; ' \
          '[ "$last" = localhost/meshctl/debian:bookworm-slim ] && echo sha256:0b && exit 0; exit 1; fi; exit 0'
    r = image_sh(tmp_path, {"podman": has}, "build", DRY_RUN="1", IMAGE="ex/meshctl:1", CA_BUNDLE="none")
    assert r.returncode == 0, r.stderr
    context, build_stage, build_objects, compile_, build = r.stdout.splitlines()
    assert context == "# context: build/image/ca.pem from nothing"  # a dry run writes nothing
    base = "--build-arg BASE=localhost/meshctl/debian:bookworm-slim"
    assert build_stage.endswith(f"--target build {base} -t ex/meshctl:1-build .")
    assert build_objects.endswith(f"--target objects {base} -t ex/meshctl:1-objects .")
    assert compile_.startswith("podman run --rm") and "--network=none --privileged" in compile_
    assert compile_.endswith(f"-v {ROOT}/build/image/objects:/out ex/meshctl:1-objects /out")
    assert build.endswith(f"{base} -t ex/meshctl:1 .")
    r = image_sh(tmp_path, {"podman": has}, "build", DRY_RUN="1", CA_BUNDLE=str(tmp_path / "nope.pem"))
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f"make image: CA_BUNDLE={tmp_path / 'nope.pem'} is not a file"]


def test_the_dockerfile_uses_what_every_engine_reads_and_copies_files_that_exist() -> None:
    text = (ROOT / "Dockerfile").read_text()
    lines = text.splitlines()
    assert not lines[0].startswith("# syntax") and not [ln for ln in lines if ln.startswith("RUN --")]
    instructions = [ln.split(None, 1) for ln in text.splitlines() if ln and not ln.startswith((" ", "#"))]
    assert instructions[0] == ["ARG", "BASE=debian:bookworm-slim"] and instructions[1][0] == "FROM"
    copies = [args.split() for op, args in instructions if op == "COPY" and not args.startswith("--from=")]
    assert copies
    made = ("build/image/ca.pem", "build/image/objects")  # scripts/image.sh writes them before the build
    for *sources, dest in copies:
        assert sources and dest
        for src in sources:
            assert src in made or (any(ROOT.glob(src)) if "*" in src else (ROOT / src).exists()), src
    assert ("pyproject.toml" in {s for *srcs, _ in copies for s in srcs}
            and {"ctl", "bpf"} <= {s for *srcs, _ in copies for s in srcs})
    ignored = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignored[ignored.index("*"):][:1] == ["*"]
    assert {f"!{p}" for p in ("ctl", "bpf", "build/image", "scripts/container")} <= set(ignored)


def test_the_runtime_image_ships_the_objects_and_no_compiler() -> None:
    from meshctl.datapath import objcache

    text = (ROOT / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, re.M)
    assert [name for _, name in stages] == ["base", "build", "objects", ""], stages
    final = text.rsplit("\nFROM ", 1)[1]
    assert final.startswith("base\n")
    assert f"COPY build/image/objects {objcache.SHIPPED_DIR}" in final
    base_stage = text.split("AS base\n", 1)[1].split("\nFROM ", 1)[0]
    for compiler in ("bpfcc", "clang", "llvm", "linux-headers", "python3-pip"):
        assert compiler not in base_stage and compiler not in final
    objects = text.split("AS objects\n", 1)[1].split("\nFROM ", 1)[0]
    assert "python3-bpfcc linux-headers-amd64" in objects
    assert 'ENTRYPOINT ["/usr/local/bin/meshctl-build-objects"]' in objects
    assert "exec meshctl datapath build-objects --out" in (ROOT / "scripts/container/meshctl-build-objects").read_text()
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
