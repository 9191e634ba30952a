# SPDX-License-Identifier: Apache-2.0
"""The default lab with its agents from the agent image (`lab.agent: image`): every node's agent and
wireguard-go run with podman in the node's network namespace as manifests/04-daemonset.yaml runs
them (read from the manifest itself); every pair answers on its planned path; `maps dump` inside the
agent's container reads the node's maps; and the agent's container killed under ping loses no
packet on a direct or a tunnelled pair: the programs and the WireGuard device outlive it."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from importlib.resources import files
from pathlib import Path

import pytest
import yaml

from meshctl.lab.namespaces import build, daemonset, image_agents, podman
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.namespaces.state import LabState
from meshctl.lab.rigs import netns
from tests.names import unique
from tests.pinging import PodPing

from .conftest import node_of, status, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]

DEFAULT_LAB = Path(str(files("meshctl.lab") / "labs" / "default.yaml"))


@pytest.fixture(scope="module")
def lab(agent_image: str) -> Iterator[LabState]:
    doc = yaml.safe_load(DEFAULT_LAB.read_text())
    doc["lab"]["agent"] = "image"
    prefix = unique("im") + "-"
    try:
        yield build.up(parse_lab(doc), prefix=prefix)
    finally:
        build.down(labstate.lab_name(prefix))
        assert not image_agents.leftovers(prefix), "lab down left containers"


def _inspect(name: str) -> dict:
    return json.loads(podman.podman("inspect", name).stdout)[0]


def test_each_container_runs_as_the_daemonset_says(lab: LabState, agent_image: str) -> None:
    pod = daemonset.load()
    a1 = node_of(lab, "a1")
    assert a1.containers == [f"meshctl-{a1.netns}-{c.name}" for c in pod.containers]
    for c in pod.containers:
        got = _inspect(f"meshctl-{a1.netns}-{c.name}")
        host = got["HostConfig"]
        assert got["ImageName"].endswith(agent_image) and got["State"]["Running"]
        assert host["NetworkMode"] == f"ns:{netns.NETNS_DIR}/{a1.netns}"  # hostNetwork: the node's namespace
        assert host["Privileged"] == bool(c.security.get("privileged"))
        if not c.security.get("privileged"):  # the runtime's default set, plus what the manifest adds
            want = {f"CAP_{x}" for x in (*daemonset.DEFAULT_CAPS, *c.security["capabilities"]["add"])}
            assert set(host["CapAdd"]) | set(got.get("EffectiveCaps") or []) >= want
        binds = {b.split(":")[1]: b.split(":")[0] for b in host["Binds"]}
        assert {m.path for m in c.mounts} <= set(binds)
        if c.memory_limit:
            assert host["Memory"] == c.memory_limit
    agent = pod.container(image_agents.AGENT)
    got = _inspect(f"meshctl-{a1.netns}-agent")
    argv = got["Config"]["Cmd"]
    # the manifest's arguments, $(NODE_NAME) expanded, in order; its backend replaced by the lab's
    manifest = [daemonset.expand(a, {"NODE_NAME": "a1"}) for a in agent.args if not a.startswith("--backend=")]
    assert argv[:len(manifest)] == manifest and "--node=a1" in manifest
    assert argv[argv.index("--backend") + 1] == "etcd" and "--bpf-pin-root" not in argv
    assert "NODE_NAME=a1" in got["Config"]["Env"] and "MESHCTL_FASTPATH=true" in got["Config"]["Env"]
    # the lab's etcd identity is bound into the agent's container only, read-only
    wg_binds = _inspect(f"meshctl-{a1.netns}-wireguard-go")["HostConfig"]["Binds"]
    assert not [b for b in wg_binds if "/pki/" in b]
    assert [b for b in got["HostConfig"]["Binds"] if "/pki/" in b and ":ro" in b]


def test_every_pair_answers_on_its_path(lab: LabState) -> None:
    results = labcheck.check(lab, count=3)
    assert len(results) == 20
    for r in results:
        assert r.ok and r.path == r.expected, r
    assert {r.path for r in results} == {"direct", "tunnel", "via-leader"}
    s = status(lab, "a1")
    assert s["datapath"]["mode"] == "ebpf" and "shipped" in str(s["datapath"]), s["datapath"]


def test_maps_dump_inside_the_agents_container(lab: LabState) -> None:
    a1 = node_of(lab, "a1")
    p = podman.podman("exec", f"meshctl-{a1.netns}-agent", "meshctl", "maps", "dump", "-o", "json")
    (dump,) = json.loads(p.stdout)
    assert dump["node"] == "a1"
    entries = {e["prefix"]: e["action"] for e in dump["entries"]}
    assert entries["10.42.2.0/24"] == "direct" and entries["10.42.3.0/24"] == "tunnel", entries
    # the same maps the host reads through the lab: the container pinned them in the node's own bpffs
    assert Path(f"{lab.pin_root_of(lab.clusters[0], a1)}/a1").is_dir()
    host = subprocess.run([sys.executable, "-m", "meshctl.cli", "maps", "dump", "--lab", lab.name, "--node", "a1",
                           "-o", "json"], capture_output=True, text=True, check=True)
    seen = json.loads(host.stdout)  # one node named: its dump alone
    assert seen["node"] == "a1" and {e["prefix"]: e["action"] for e in seen["entries"]} == entries


def test_agent_container_killed_under_ping_loses_nothing(lab: LabState) -> None:
    """SIGKILL to a1's and b1's agent containers (a1 leads loc-a: both ends of a1->b1's tunnel and
    one end of a2->a1's direct path), then new containers: every ping answered."""
    direct = PodPing(lab, "a2", "a1", 8)
    tunnel = PodPing(lab, "a1", "b1", 8)
    direct.answered(1), tunnel.answered(1)
    kilo0 = {n: netns.run(node_of(lab, n).netns, ["ip", "-o", "link", "show", "kilo0"]).stdout for n in ("a1", "b1")}
    for n in ("a1", "b1"):
        build.stop_agent(lab, n, kill=True)
    for n in ("a1", "b1"):
        node = node_of(lab, n)
        assert podman.container_pid(f"meshctl-{node.netns}-agent") is None
        assert podman.container_pid(f"meshctl-{node.netns}-wireguard-go"), "the sidecar outlives the agent"
        # the WireGuard device (its ifindex too) is the same one
        assert netns.run(node.netns, ["ip", "-o", "link", "show", "kilo0"]).stdout.split(":")[0] == \
            kilo0[n].split(":")[0]
    for n in ("a1", "b1"):
        build.start_agent(lab, n)
    assert wait_for(lambda: all(((labcheck.agent_status(node_of(lab, n)) or {}).get("last_reconcile") or {})
                                .get("applied") for n in ("a1", "b1")), timeout=30)
    for p in (direct, tunnel):
        got = p.result()
        assert not got.lost and got.covered, got
    assert all(status(lab, n)["nodes"] == 5 for n in ("a1", "b1"))


def test_a_changed_manifest_changes_the_lab(lab: LabState, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The manifest is read when a container starts: an argument added there reaches the agent."""
    doc = list(yaml.safe_load_all(daemonset.MANIFEST.read_text()))
    ds = copy.deepcopy(next(d for d in doc if d.get("kind") == "DaemonSet"))
    agent = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent")
    agent["args"].append("--resync-seconds=7")
    changed = tmp_path / "04-daemonset.yaml"
    changed.write_text(yaml.safe_dump(ds))
    monkeypatch.setattr(daemonset, "MANIFEST", changed)
    build.stop_agent(lab, "c1")
    build.start_agent(lab, "c1")
    c1 = node_of(lab, "c1")
    assert "--resync-seconds=7" in _inspect(f"meshctl-{c1.netns}-agent")["Config"]["Cmd"]
    assert wait_for(lambda: ((labcheck.agent_status(c1) or {}).get("last_reconcile") or {}).get("applied"),
                    timeout=30)
    r = subprocess.run([*netns.exec_prefix(c1.pods[0].netns), "ping", "-c", "2", "-W", "2",
                        node_of(lab, "a1").pods[0].ip], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout
