# SPDX-License-Identifier: Apache-2.0
"""The shipped default lab through the command line, as `make lab` runs it, and a two-cluster lab."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib.resources import files
from pathlib import Path

import pytest
import yaml

from meshctl.errors import InputError
from meshctl.lab.namespaces import build
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.rigs import netns
from tests.names import unique

from .conftest import BASE, status, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]


def meshctl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshctl.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_default_lab_up_check_json_down():
    prefix = unique("mtc") + "-"
    name = prefix.rstrip("-")
    try:
        up = meshctl("lab", "up", "--prefix", prefix)
        assert up.returncode == 0, up.stderr
        assert "etcd default" in up.stderr and "lab " + name + " up in" in up.stderr  # progress lines
        chk = meshctl("lab", "check", "--lab", name, "-o", "json")
        assert chk.returncode == 0, chk.stdout + chk.stderr
        rows = json.loads(chk.stdout)
        assert len(rows) == 20 and all(set(r) == {"src", "dst", "family", "ok", "path", "rtt_ms"} for r in rows)
        assert {r["family"] for r in rows} == {4}  # the default lab's pods are IPv4 only
        assert all(r["ok"] for r in rows)
        path = {(r["src"], r["dst"]): r["path"] for r in rows}
        assert path[("a1", "a2")] == "direct" and path[("a1", "b1")] == "tunnel"
        assert path[("a2", "c1")] == "via-leader" and path[("c1", "b2")] == "tunnel"
        text = meshctl("lab", "status", "--lab", name)
        assert text.returncode == 0 and "a1" in text.stdout and "location" in text.stdout
        nl = meshctl("node", "list", "--lab", name)
        assert nl.returncode == 0 and nl.stdout.count("admitted") == 5, nl.stdout + nl.stderr
    finally:
        down = meshctl("lab", "down", "--lab", name)
    assert down.returncode == 0, down.stderr
    assert not netns.list_prefixed(prefix)
    assert not Path(f"/run/meshctl-lab/{name}").exists()
    assert not Path(f"/sys/fs/bpf/{prefix}lab").exists()


def test_lab_down_by_prefix_after_a_crash():
    """No state file (a crash before it was written): the prefix scan still removes namespaces."""
    prefix = unique("mtk") + "-"
    netns.add(f"{prefix}fab")
    netns.add(f"{prefix}x1")
    r = meshctl("lab", "down", "--prefix", prefix)
    assert r.returncode == 0, r.stderr
    assert not netns.list_prefixed(prefix)


def test_sigterm_to_lab_up_removes_what_it_built():
    """SIGTERM while the lab is being built (its first namespaces exist): `lab up` tears down what
    it made, exits 143 and leaves no namespace, pin directory or state behind."""
    prefix = unique("mts") + "-"
    name = prefix.rstrip("-")
    up = subprocess.Popen([sys.executable, "-m", "meshctl.cli", "lab", "up", "--prefix", prefix],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: netns.list_prefixed(prefix) or up.poll() is not None, timeout=60, step=0.05)
        up.terminate()
        _, err = up.communicate(timeout=120)
        left = [*netns.list_prefixed(prefix), *(str(p) for p in (Path(f"/run/meshctl-lab/{name}"),
                                                                 Path(f"/sys/fs/bpf/{prefix}lab")) if p.exists())]
    finally:
        if up.poll() is None:
            up.kill()
        meshctl("lab", "down", "--lab", name)  # only what the test itself left, should it fail
    assert up.returncode == 143, err[-2000:]
    assert "removing what was built" in err and "Traceback" not in err, err[-2000:]
    assert not left, left


def test_an_agent_that_cannot_start_fails_lab_up_with_its_error(tmp_path):
    """An agent flag that does not exist: `lab up` fails in seconds, naming the agent and the last
    lines of its log (click's error), and removes what it built."""
    prefix = unique("mtf") + "-"
    spec = yaml.safe_load((files("meshctl.lab") / "labs" / "default.yaml").read_text())
    spec["nodes"] = spec["nodes"][:2]
    spec["lab"]["agent_args"] = ["--no-such-flag"]
    f = tmp_path / "broken.yaml"
    f.write_text(yaml.safe_dump(spec))
    try:
        up = meshctl("lab", "up", "-f", str(f), "--prefix", prefix, "--wait", "60", timeout=100)
        left = netns.list_prefixed(prefix)
    finally:
        meshctl("lab", "down", "--lab", prefix.rstrip("-"))
    assert up.returncode != 0 and "Traceback" not in up.stderr, up.stderr[-2000:]
    last = up.stderr.strip().splitlines()[-1]
    assert re.search(r"the agent of default/a[12] exited: .*--no-such-flag: no such option of meshctl agent",
                     last), last
    assert not left, left


def test_bad_lab_file_is_one_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("nodes:\n  - {name: a1, pod_cidr: 10.42.1.0/33}\n")
    r = meshctl("lab", "up", "-f", str(p), "--prefix", "zz-")
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
    assert "bad.yaml: nodes[0].pod_cidr: '10.42.1.0/33' is not a CIDR" in r.stderr
    with pytest.raises(InputError, match="lab.pods_per_node"):
        parse_lab({**BASE, "lab": {"pods_per_node": 0}})


def test_two_cluster_lab_has_an_etcd_each_and_clustermesh_files():
    doc = {
        "clusters": [
            {"cluster": {"name": "one", "id": 1}, "mesh": {"granularity": "location"},
             "nodes": [{"name": "x1", "location": "l1", "internal_ip": "10.10.1.11/24", "pod_cidr": "10.42.1.0/24"}]},
            {"cluster": {"name": "two", "id": 2}, "mesh": {"granularity": "location", "subnet": "10.5.0.0/16"},
             "nodes": [{"name": "x1", "location": "l2", "internal_ip": "10.10.2.11/24", "pod_cidr": "10.43.1.0/24"}]},
        ],
        "lab": {"lease_ttl": 3},
    }
    prefix = unique("mtm") + "-"
    try:
        st = build.up(parse_lab(doc), prefix=prefix)
        assert [c.name for c in st.clusters] == ["one", "two"]
        assert st.clusters[0].etcd.endpoints != st.clusters[1].etcd.endpoints
        for c, other in (("one", "two"), ("two", "one")):
            cm = Path(st.dir) / "clustermesh" / c
            assert sorted(p.name for p in cm.iterdir()) == [other]
            conf = yaml.safe_load((cm / other).read_text())
            assert conf["endpoints"] == st.cluster(other).etcd.endpoints
            assert all(Path(conf[k]).exists() for k in ("ca-file", "cert-file", "key-file"))
        assert netns.exists(f"{prefix}one-x1") and netns.exists(f"{prefix}two-x1")
        s = status(st, "x1")
        assert s["ready"] and s["cluster"] == "one"
    finally:
        build.down(prefix.rstrip("-"))
