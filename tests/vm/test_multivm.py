# SPDX-License-Identifier: Apache-2.0
"""The mixed-kernel multi-VM lab (`lab.vms`, the shipped labs/vms.yaml): a1 on Debian 12's 6.1,
a2 on Debian 11's 5.10 (no tcx, no bpf_check_mtu), b1 on Debian 13's 6.12, each its own VM on taps
of the lab's bridges, etcd on the host side. Every pod pair answers on the path its source agent
planned; every node runs its own kernel with kernel WireGuard and the fast path (clsact where tcx
is missing, the MTU fallback on 5.10); `lab down` leaves no VM process, tap, bridge, namespace or
directory behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from importlib.resources import files
from pathlib import Path

import pytest

from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.state import LabState, NodeState
from meshctl.lab.rigs.netns import list_prefixed
from meshctl.lab.vms import vm, vmnodes
from meshctl.node.shell import pid_alive
from tests.vm.conftest import LAB_UP_TIMEOUT_S, LOADED_CONVERGE_WAIT_S
from tests.waiting import wait_for

PREFIX = f"mv{os.getpid() % 1000}t-"
NAME = labstate.lab_name(PREFIX)
LAB_FILE = str(files("meshctl.lab") / "labs" / "vms.yaml")
KERNELS = {"a1": "6.1", "a2": "5.10", "b1": "6.12"}
# what each kernel lacks of what the programs use, each with a fallback (docs/datapath.md)
DECAP = "flag BPF_F_ADJ_ROOM_DECAP_L3_IPV4"
CHECK_WAIT_S = 300  # as test_vmlab's: a lab check of TCG guests on a loaded host takes minutes
FALLBACKS = {"5.10": ["helper bpf_check_mtu", "flag BPF_F_ADJ_ROOM_ENCAP_L2_ETH", DECAP], "6.1": [DECAP], "6.12": []}

pytestmark = [pytest.mark.root, pytest.mark.slow]


def meshctl(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshctl.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def nodes(st: LabState) -> dict[str, NodeState]:
    return {n.name: n for _, n in st.nodes()}


@pytest.fixture(scope="module")
def lab():
    try:
        for series in set(KERNELS.values()):
            vm.kernel(series)
    except vm.MeshError as e:  # `make test` fetches them first (scripts/kernels.sh)
        pytest.skip(str(e))
    try:
        up = meshctl("lab", "up", "-f", LAB_FILE, "--prefix", PREFIX, "--wait", str(LOADED_CONVERGE_WAIT_S),
                     timeout=LAB_UP_TIMEOUT_S)
        assert up.returncode == 0, up.stderr[-3000:]
        st = labstate.load(NAME)
        assert st is not None
        print(f"\nmulti-VM lab up: {up.stderr.strip().splitlines()[-1]}")
        yield st
    finally:
        meshctl("lab", "down", "--lab", NAME, timeout=180)


def test_every_pod_pair_answers_on_the_path_its_agent_planned(lab):
    """Every pair answers on its plan's path. A loaded machine's TCG guests may still be settling
    when `lab up --wait` returns (an agent whose private-path probes were answered late has its
    pair on a fallback rung for a while): pairs that do not yet are measured again, until
    CHECK_WAIT_S."""
    off: list[str] = []

    def as_planned() -> list[labcheck.PairResult] | None:
        results = labcheck.check(lab, count=3, run=vmnodes.on_node)
        assert len(results) == 6
        off[:] = [f"{r.src} -> {r.dst}: {r.received}/{r.sent} took {r.path}, its agent planned {r.expected}"
                  for r in results if not r.ok or r.path != r.expected]
        return None if off else results

    results = wait_for(as_planned, CHECK_WAIT_S, 0.05)
    assert results, off
    paths = {(r.src, r.dst): r.path for r in results}
    assert paths["a1", "a2"] == paths["a2", "a1"] == "direct", "a 6.1 and a 5.10 node share loc-a's private /24"
    assert paths["a1", "b1"] == paths["b1", "a1"] == "tunnel"
    assert paths["a2", "b1"] == "via-leader"


def test_each_node_runs_its_kernel_with_kernel_wireguard_and_the_fast_path(lab):
    for name, n in nodes(lab).items():
        release = vmnodes.guest_run(n, None, ["uname", "-r"]).stdout.strip()
        assert release.startswith(f"{KERNELS[name]}."), f"{name} runs {release}"
        s = labcheck.agent_status(n, timeout=60)  # a TCG guest on a loaded host answers late
        assert s is not None, f"{name}'s agent answers on its public address"
        assert s["wireguard_mode"] == "kernel", f"{name}: {release} has WireGuard's module"
        dp = s["datapath"]
        assert dp["mode"] == "ebpf", f"{name}: {dp.get('reason')}"
        tcx = tuple(int(x) for x in release.split(".")[:2]) >= (6, 6)
        assert dp["attach"] == ("tcx" if tcx else "clsact"), f"{name} ({release})"
        assert dp["fallbacks"] == FALLBACKS[KERNELS[name]], (name, dp["fallbacks"])
    out = meshctl("lab", "status", "--lab", NAME)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("wireguard kernel") == 3 and "VM 5.10.0" in out.stdout


def test_node_commands_typed_on_the_host_answer_for_that_vm(lab):
    st = meshctl("status", "--lab-node", "a2", "--lab", NAME)
    assert st.returncode == 0, st.stderr
    assert "(kernel)" in st.stdout, st.stdout
    assert ("[clsact, without bpf_check_mtu, without BPF_F_ADJ_ROOM_ENCAP_L2_ETH, without "
            "BPF_F_ADJ_ROOM_DECAP_L3_IPV4]") in st.stdout, st.stdout
    dump = meshctl("maps", "dump", "--node", "a2", "--lab", NAME, "-o", "json", timeout=300)
    assert dump.returncode == 0, dump.stderr
    entries = {e["prefix"]: e for e in json.loads(dump.stdout)["entries"]}
    # b1 is via-leader from a2: straight to a1 (the leader) over the private NIC, a1 tunnels on
    assert [entries[p]["action"] for p in ("10.42.1.0/24", "10.42.2.0/24", "10.42.3.0/24")] == [
        "direct", "local", "direct"], entries
    assert entries["10.42.3.0/24"]["nexthop"] == entries["10.42.1.0/24"]["nexthop"] == "10.10.1.11", entries


def test_monitor_typed_on_the_host_streams_the_events_of_a_vm_nodes_fast_path(lab):
    """`monitor --node a2` runs inside a2's 5.10 guest (ring buffer, clsact): the pings of a lab
    check from a1 arrive as events of a2's fast path, with their owners."""
    a1_pod = nodes(lab)["a1"].pods[0].ip
    mon = subprocess.Popen([sys.executable, "-m", "meshctl.cli", "monitor", "--node", "a2", "--lab", NAME, "--from",
                            a1_pod, "--count", "2", "-o", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        deadline = time.monotonic() + 240
        while mon.poll() is None and time.monotonic() < deadline:
            labcheck.check(lab, count=3, pairs=[("a1", "a2")], run=vmnodes.on_node)
        out, err = mon.communicate(timeout=30)
    finally:
        if mon.poll() is None:
            mon.kill()
    assert mon.returncode == 0, err[-2000:]
    events = [e for e in map(json.loads, out.splitlines()) if not e.get("summary")]
    assert len(events) == 2 and all(e["src"] == a1_pod and e["node"] == "a2" for e in events), events
    assert all(e["src_owner"] == "default/a1" for e in events), (events, err)


def test_lab_down_leaves_nothing_behind(lab):
    pids = [p for n in nodes(lab).values() if n.vm for p in (n.vm.pid, n.vm.qemu_pid) if p]
    assert pids and all(pid_alive(p) for p in pids)
    down = meshctl("lab", "down", "--lab", NAME, timeout=180)
    assert down.returncode == 0, down.stderr
    assert not [p for p in pids if pid_alive(p)], "every VM process ended"
    assert not list_prefixed(PREFIX), "no namespace (the taps and bridges lived in the fabric's)"
    assert not (vm.VM_ROOT / NAME).exists() and not labstate.lab_dir(NAME).exists()
    taps = [x.tap for n in nodes(lab).values() for x in n.nics]
    assert taps and not [t for t in taps if Path(f"/sys/class/net/{t}").exists()], "no lab tap in the host's namespace"
