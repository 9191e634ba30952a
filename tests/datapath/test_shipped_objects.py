# SPDX-License-Identifier: Apache-2.0
"""No kernel headers needed on a node: `meshctl datapath build-objects` compiles every variant the
feature probes can select into the object cache's format; a node whose headers are hidden loads
the one its kernel selects (without bcc); an object of another map layout version is refused
loudly and counted, and the loader takes its next source (a bcc compile where headers exist, else
kernel routes); `datapath status` says which of the three happened."""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.datapath import Datapath, features, layout, libbpf, loader, objcache

pytestmark = pytest.mark.slow

CALL = 0x85


@pytest.fixture(scope="module")
def shipped(pin_root, tmp_path_factory) -> Path:
    """Every variant built once, as the image's build step builds them."""
    out = tmp_path_factory.mktemp("objects")
    r = CliRunner().invoke(main, ["datapath", "build-objects", "--out", str(out), "--bpf-pin-root", pin_root])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[-1] == f"{len(features.variants())} variants built into {out}"
    assert not [n for n in os.listdir(pin_root) if n.startswith("build-")], "the build's throwaway maps are gone"
    return out


@pytest.fixture
def no_headers(tmp_path, monkeypatch, shipped) -> Path:
    """This process sees no kernel headers (an empty headers folder), no node cache, and the shipped objects."""
    empty = tmp_path / "no-headers"
    empty.mkdir()
    monkeypatch.setenv(objcache.HEADERS_ENV, str(empty))
    monkeypatch.setenv(objcache.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv(objcache.SHIPPED_ENV, str(shipped))
    return empty


def _helper_calls(doc: dict, prog: str) -> set[int]:
    code = base64.b64decode(doc["programs"][prog]["insns"])
    calls = set()
    for i in range(0, len(code), libbpf.INSN.size):
        op, regs, _, imm = libbpf.INSN.unpack_from(code, i)
        if op == CALL and (regs >> 4) == 0:  # a helper call (not a BPF-to-BPF one)
            calls.add(imm)
    return calls


def test_build_objects_writes_every_variant_with_its_key_and_layout(shipped):
    variants = features.variants()
    assert len(variants) == 2 ** len(features.OPTIONAL) and len(set(variants)) == len(variants)
    assert sorted(p.name for p in shipped.iterdir()) == sorted(f"{features.variant_name(v)}.json" for v in variants)
    for v in variants:
        doc = json.loads(loader.shipped_path(v, shipped).read_text())
        assert (doc["layout"], doc["key"]) == (layout.LAYOUT_VERSION, loader.shipped_key(v))
        assert set(doc["programs"]) == set(loader.PROGRAMS)
        assert {m for p in doc["programs"].values() for _, m in p["relocs"]} <= set(doc["maps"])
        # each variant is compiled with its own settings: bpf_check_mtu is called only where the variant has it
        calls = set().union(*(_helper_calls(doc, p) for p in loader.PROGRAMS))
        assert (features.HELPERS["check_mtu"] in calls) == ("check_mtu" in v), features.variant_name(v)
    keys = {loader.shipped_key(v) for v in variants}
    assert len(keys) == len(variants), "variants do not share a key"
    assert loader.shipped_key(variants[0]) != loader.object_key(variants[0]), "a node's compile keys its headers too"


def _tags(pin_dir: str) -> tuple[bytes, ...]:
    """The kernel's tags (instruction hashes) of the programs pinned in `pin_dir`."""
    out = []
    for p in loader.PROGRAMS:
        fd = libbpf.obj_get(loader.prog_path(pin_dir, p))
        try:
            out.append(bytes(libbpf.prog_info(fd).tag))
        finally:
            os.close(fd)
    return tuple(out)


def _open_in_child(node: str, pin_root: str, env: dict[str, str], tmp_path: Path) -> dict:
    """Datapath.open in a fresh process (its own feature probe) where bcc cannot be imported."""
    fake = tmp_path / "nobcc" / "bcc"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named bcc (test)')\n")
    code = ("import json,sys; from meshctl.datapath import Datapath, loader; "
            "dp=Datapath.open(sys.argv[1], pin_root=sys.argv[2]); "
            "print(json.dumps({'mode': dp.mode, 'reason': dp.reason, 'objects': dp.objects, "
            "'bcc': 'bcc' in sys.modules, 'file': str(loader.shipped_path())})); dp.close()")
    p = subprocess.run([sys.executable, "-c", code, node, pin_root], capture_output=True, text=True, timeout=120,
                       env={**os.environ, **env, "PYTHONPATH": str(fake.parent)}, check=True)
    return json.loads(p.stdout)


def test_every_variant_loads_here_with_headers_and_bcc_hidden(pin_root, shipped, tmp_path):
    empty = tmp_path / "no-headers"
    empty.mkdir()
    env = {objcache.HEADERS_ENV: str(empty), objcache.CACHE_ENV: str(tmp_path / "cache"),
           objcache.SHIPPED_ENV: str(shipped)}
    tags: dict[str, tuple[bytes, ...]] = {}
    here = features.probe().variant()  # a kernel loads the variants of the features it has (5.10: base alone)
    for i, v in enumerate(v for v in features.variants() if v <= here):
        node = f"oh-v{i}"
        without = ",".join(sorted(set(features.OPTIONAL) - v))
        try:
            got = _open_in_child(node, pin_root, {**env, features.WITHOUT_ENV: without}, tmp_path)
            assert (got["mode"], got["objects"], got["bcc"]) == ("ebpf", loader.OBJECTS_SHIPPED, False), got
            assert got["file"] == str(loader.shipped_path(v, shipped))
            tags[features.variant_name(v)] = _tags(f"{pin_root}/{node}")
        finally:
            Datapath.unload(node, pin_root=pin_root)
    assert "base" in tags
    if "check_mtu" in tags:
        assert tags["base"] != tags["check_mtu"], "the variant loaded is the one its probe selects"
    assert not os.path.exists(tmp_path / "cache"), "nothing was compiled"


def test_a_node_without_headers_loads_the_shipped_objects_and_says_so(pin_root, no_headers):
    assert not objcache.have_headers()
    node = "oh-shipped"
    try:
        dp = Datapath.open(node, pin_root=pin_root)
        assert (dp.mode, dp.objects) == ("ebpf", "shipped"), dp.reason
        assert dp.status()["objects"] == "shipped"
        dp.close()
        r = CliRunner().invoke(main, ["datapath", "status", "--node", node, "--bpf-pin-root", pin_root])
        assert r.exit_code == 0, r.output
        assert "  objects: shipped" in r.output.splitlines()
        # a restarted agent reopens the pins: the record of where they came from stays with them
        dp = Datapath.open(node, pin_root=pin_root)
        assert (dp.objects, dp.status()["compiled"]) == ("shipped", False)
        dp.close()
    finally:
        Datapath.unload(node, pin_root=pin_root)


def _rewrite(shipped: Path, tmp_path: Path, change: Callable[[dict], None]) -> Path:
    """A copy of the shipped objects with this kernel's variant changed by `change(doc)`."""
    out = tmp_path / "altered"
    shutil.copytree(shipped, out)
    path = loader.shipped_path(directory=out)
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    return out


# (case, the object's layout version, headers visible, the outcome)
LAYOUT_CASES = [
    ("older layout, no headers: kernel routes", layout.LAYOUT_VERSION - 1, False, "kernel routes"),
    ("newer layout, headers: compiled by bcc", layout.LAYOUT_VERSION + 1, True, loader.OBJECTS_COMPILED),
    ("no layout recorded, no headers: kernel routes", None, False, "kernel routes"),
]


@pytest.mark.parametrize(("case", "version", "headers", "outcome"), LAYOUT_CASES, ids=[c[0] for c in LAYOUT_CASES])
def test_an_object_of_another_layout_version_is_refused_loudly_and_the_next_source_taken(
        case, version, headers, outcome, pin_root, shipped, no_headers, tmp_path, monkeypatch, caplog):
    def set_layout(doc: dict) -> None:
        if version is None:
            del doc["layout"]
        else:
            doc["layout"] = version

    altered = _rewrite(shipped, tmp_path, set_layout)
    monkeypatch.setenv(objcache.SHIPPED_ENV, str(altered))
    if headers:
        monkeypatch.delenv(objcache.HEADERS_ENV)
    node = "oh-layout"
    before = objcache.refusals()
    try:
        with caplog.at_level(logging.ERROR, logger="meshctl.datapath"):
            dp = Datapath.open(node, pin_root=pin_root)
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        path = loader.shipped_path(directory=altered)
        assert errors == [f"datapath: refused compiled object {path}: map layout version {version}, "
                          f"this meshctl's is {layout.LAYOUT_VERSION}"]
        assert objcache.refusals() == before + 1
        assert dp.objects.startswith(outcome), dp.objects
        if outcome == "kernel routes":
            assert dp.mode == "kernel-routes"
            assert f"{path} has map layout version {version}, this meshctl's is {layout.LAYOUT_VERSION}" in dp.reason
            assert f"no kernel headers at {no_headers}" in dp.reason
        else:
            assert dp.mode == "ebpf", dp.reason
        dp.close()
        r = CliRunner().invoke(main, ["datapath", "status", "--node", node, "--bpf-pin-root", pin_root])
        assert r.exit_code == 0, r.output
        line = next(ln.strip() for ln in r.output.splitlines() if ln.strip().startswith("objects: "))
        assert line.startswith(f"objects: {outcome}"), r.output
    finally:
        Datapath.unload(node, pin_root=pin_root)
    assert objcache.refusals() == before + 1


# (case, headers visible, the outcome)
REFUSED_CASES = [
    ("headers: compiled by bcc", True, loader.OBJECTS_COMPILED),
    ("no headers: kernel routes", False, "kernel routes"),
]


@pytest.mark.parametrize(("case", "headers", "outcome"), REFUSED_CASES, ids=[c[0] for c in REFUSED_CASES])
def test_a_shipped_object_the_kernel_refuses_is_compiled_for_where_headers_exist(
        case, headers, outcome, pin_root, shipped, no_headers, tmp_path, monkeypatch):
    exit_only = struct.pack("<BBhi", 0x95, 0, 0, 0)  # `exit` without setting r0: the verifier refuses it

    def break_programs(doc: dict) -> None:
        for spec in doc["programs"].values():
            spec["insns"], spec["relocs"] = base64.b64encode(exit_only).decode(), []

    monkeypatch.setenv(objcache.SHIPPED_ENV, str(_rewrite(shipped, tmp_path, break_programs)))
    if headers:
        monkeypatch.delenv(objcache.HEADERS_ENV)
    node = "oh-refused"
    before = objcache.refusals()
    try:
        dp = Datapath.open(node, pin_root=pin_root)
        assert dp.objects.startswith(outcome), dp.objects
        assert objcache.refusals() == before, "a kernel's refusal is not a layout refusal"
        if not headers:
            assert "the kernel refused" in dp.reason and "no kernel headers" in dp.reason, dp.reason
        dp.close()
    finally:
        Datapath.unload(node, pin_root=pin_root)
