# SPDX-License-Identifier: Apache-2.0
"""The compiled-object cache: programs compiled once load on another node without bcc, are the
same programs (same tag), and a cached object the kernel refuses falls back to compiling."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from meshctl.datapath import Datapath, layout, libbpf, loader, objcache


def _tags(pin_dir: str) -> dict[str, bytes]:
    out = {}
    for p in loader.PROGRAMS:
        fd = libbpf.obj_get(loader.prog_path(pin_dir, p))
        try:
            out[p] = bytes(libbpf.prog_info(fd).tag)
        finally:
            os.close(fd)
    return out


def _open_without_bcc(node: str, pin_root: str, cache: str, tmp_path) -> list:
    fake = tmp_path / "nobcc" / "bcc"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named bcc (test)')\n")
    code = ("import json,sys; from meshctl.datapath import Datapath; "
            "dp=Datapath.open(sys.argv[1], pin_root=sys.argv[2]); "
            "print(json.dumps([dp.mode, dp.reason, 'bcc' in sys.modules])); dp.close()")
    env = dict(os.environ, PYTHONPATH=str(fake.parent), MESHCTL_BPF_CACHE=cache)
    p = subprocess.run([sys.executable, "-c", code, node, pin_root], capture_output=True, text=True, env=env,
                       check=True, timeout=60)
    return json.loads(p.stdout)


def test_programs_compiled_once_load_elsewhere_without_bcc(pin_root, tmp_path, monkeypatch):
    cache = tmp_path / "objcache"
    monkeypatch.setenv("MESHCTL_BPF_CACHE", str(cache))
    a, b = "oc-a", "oc-b"
    try:
        dp = Datapath.open(a, pin_root=pin_root)
        assert dp.mode == "ebpf", dp.reason
        dp.close()
        entry = cache / f"{loader.object_key()}.json"
        assert entry.exists(), "the compile stored its bytecode"
        doc = json.loads(entry.read_text())
        assert set(doc["programs"]) == set(loader.PROGRAMS)
        assert {m for p in doc["programs"].values() for _, m in p["relocs"]} <= set(doc["maps"])

        mode, reason, bcc_loaded = _open_without_bcc(b, pin_root, str(cache), tmp_path)
        assert (mode, bcc_loaded) == ("ebpf", False), reason
        assert _tags(f"{pin_root}/{b}") == _tags(f"{pin_root}/{a}"), "the same programs, instruction for instruction"
        # node b's programs use node b's maps, not node a's
        for m in ("routes", "config"):
            fa, fb = libbpf.obj_get(f"{pin_root}/{a}/{m}"), libbpf.obj_get(f"{pin_root}/{b}/{m}")
            try:
                assert libbpf.map_info(fa).id != libbpf.map_info(fb).id
            finally:
                os.close(fa)
                os.close(fb)
    finally:
        Datapath.unload(a, pin_root=pin_root)
        Datapath.unload(b, pin_root=pin_root)


def test_a_cached_object_the_kernel_refuses_is_compiled_again(pin_root, tmp_path, monkeypatch):
    cache = tmp_path / "objcache"
    monkeypatch.setenv("MESHCTL_BPF_CACHE", str(cache))
    cache.mkdir()
    entry = cache / f"{loader.object_key()}.json"
    # one instruction, `exit` without setting r0: the verifier refuses it
    bad = {"layout": layout.LAYOUT_VERSION, "key": loader.object_key(), "maps": {},
           "programs": {p: {"insns": "lQAAAAAAAAA=", "relocs": []} for p in loader.PROGRAMS}}
    refused = objcache.refusals()
    entry.write_text(json.dumps(bad))
    try:
        dp = Datapath.open("oc-c", pin_root=pin_root)
        assert dp.mode == "ebpf", dp.reason
        dp.close()
        assert json.loads(entry.read_text()) != bad, "the compile replaced the refused object"
        assert objcache.refusals() == refused, "the kernel refused it, not the layout check"
    finally:
        Datapath.unload("oc-c", pin_root=pin_root)
