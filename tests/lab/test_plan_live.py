# SPDX-License-Identifier: Apache-2.0
"""`meshctl plan --backend etcd` against a running lab equals `meshctl plan -f` on the same
topology, with keys and endpoints as the agents published them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from meshctl.lab.namespaces import build
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.spec import parse_lab

from .conftest import topo

pytestmark = [pytest.mark.root, pytest.mark.slow]


def meshctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshctl.cli", *args], capture_output=True, text=True, timeout=60)


def test_plan_from_etcd_equals_plan_from_the_file(tmp_path: Path) -> None:
    prefix = f"k8{os.getpid() % 10000}p-"
    name = labstate.lab_name(prefix)
    doc = topo(fastpath=False)
    try:
        build.up(parse_lab(doc), prefix=prefix)
        nl = meshctl("node", "list", "--lab", name, "-o", "json")
        assert nl.returncode == 0, nl.stderr
        rows = json.loads(nl.stdout)
        assert [r["status"] for r in rows] == ["admitted"] * 3
        published = [{k: v for k, v in r.items() if k != "status"} for r in rows]
        assert all(r["public_key"] and r["endpoint"] for r in published)  # what the agents made and found
        f = tmp_path / "topo.yaml"
        f.write_text(yaml.safe_dump({"cluster": doc["cluster"], "mesh": doc["mesh"], "nodes": published}))
        for node in ("a1", "a2", "b1"):
            live = meshctl("plan", "--backend", "etcd", "--lab", name, "--node", node, "-o", "json")
            assert live.returncode == 0, live.stderr
            offline = meshctl("plan", "-f", str(f), "--node", node, "-o", "json")
            assert offline.returncode == 0, offline.stderr
            assert json.loads(live.stdout) == json.loads(offline.stdout)
        assert json.loads(live.stdout)["peers"], "b1 has WireGuard peers: the comparison covers keys and endpoints"
        sc = meshctl("showconf", "--backend", "etcd", "--lab", name, "node", "a1")
        assert sc.returncode == 0 and sc.stdout == meshctl("showconf", "-f", str(f), "node", "a1").stdout
    finally:
        build.down(name)
