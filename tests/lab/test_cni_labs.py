# SPDX-License-Identifier: Apache-2.0
"""The CNI labs (`lab.cni: calico|cilium`, labs/calico.yaml and cilium.yaml): every pod pair
reachable, each node pair on its path, the CNI's own node state untouched by the agents, and (Calico)
a block moved between nodes while a pod in it is pinged: the routes follow within 1 s."""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from meshctl.agent.status import AgentStatus
from meshctl.datapath import libbpf, links
from meshctl.lab.namespaces import build, cni_calico
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.cni_labs import CNI_LABS
from meshctl.lab.namespaces.spec import load_lab
from meshctl.lab.namespaces.state import LabState
from meshctl.lab.namespaces.wiring import quiet
from meshctl.lab.rigs import netns
from meshctl.setns import in_netns
from tests.names import unique
from tests.pinging import PodPing
from tests.waiting import wait_until

pytestmark = [pytest.mark.root, pytest.mark.slow]

LABS = Path(__file__).resolve().parents[2] / "ctl" / "meshctl" / "lab" / "labs"
# Each node pair's path in both labs (location granularity, two locations of two nodes, a1 and b1
# leading): the fast path (Calico) or the private NIC's kernel route (Cilium: the fast path stays
# off) inside a location, kilo0 across, through the leader from a follower.
PATHS = {
    ("a1", "a2"): "direct", ("a2", "a1"): "direct", ("b1", "b2"): "direct", ("b2", "b1"): "direct",
    ("a1", "b1"): "tunnel", ("a1", "b2"): "tunnel", ("b1", "a1"): "tunnel", ("b1", "a2"): "tunnel",
    ("a2", "b1"): "via-leader", ("a2", "b2"): "via-leader", ("b2", "a1"): "via-leader", ("b2", "a2"): "via-leader",
}
MOVE_PING_S = 10  # b1 pings the moving pod this long: the move, and time after it on a loaded machine


@pytest.fixture
def cni_lab() -> Iterator[Callable[[str], tuple[LabState, dict[str, Any]]]]:
    """Build a CNI lab (agents not started), record the CNI's node state, then start the agents."""
    if os.geteuid() != 0:
        pytest.fail("needs root for network namespaces")
    names: list[str] = []

    def make(cni: str) -> tuple[LabState, dict[str, Any]]:
        prefix = unique("cc") + "-"
        names.append(labstate.lab_name(prefix))
        st = build.up(load_lab(LABS / f"{cni}.yaml"), prefix=prefix, start_agents=False)
        before = {n.name: CNI_LABS[cni].cni_state(n) for _, n in st.nodes()}
        build.start_all_agents(st, quiet)
        build.wait_converged(st, quiet, 120)
        return st, before

    try:
        yield make
    finally:
        for n in names:
            assert not build.down(n)


def unreachable_pod_pairs(st: LabState) -> list[str]:
    """Every pod to every pod of the other nodes (all pods: a Calico node's pods sit in two blocks)."""
    out = []
    for _, a in st.nodes():
        for pa in a.pods:
            for _, b in st.nodes():
                for pb in b.pods if b is not a else ():
                    if labcheck.ping(pa.netns, pb.ip, count=2, wait=1)[1] == 0 and \
                            labcheck.ping(pa.netns, pb.ip, count=3, wait=3)[1] == 0:  # a handshake's wait
                        out.append(f"{a.name}/{pa.ip} -> {b.name}/{pb.ip}")
    return out


def assert_cni_state_kept(st: LabState, cni: str, before: dict[str, Any]) -> None:
    for name in [n.name for _, n in st.nodes()]:
        build.stop_agent(st, name)
    after = {n.name: CNI_LABS[cni].cni_state(n) for _, n in st.nodes()}
    assert after == before


@pytest.mark.parametrize("cni", ["calico", "cilium"])
def test_cni_lab_reaches_every_pod_on_its_path_and_keeps_the_cnis_state(cni_lab, cni: str) -> None:
    st, before = cni_lab(cni)
    unreachable = unreachable_pod_pairs(st)
    assert unreachable == []  # every pod: a Calico node's in both its blocks
    got = {(r.src, r.dst): r.path for r in labcheck.check(st)}
    assert got == PATHS
    if cni == "cilium":
        view = labcheck.agent_view(next(n for _, n in st.nodes()))
        assert view is not None and view.live.datapath.mode == "kernel-routes"
        assert (view.live.datapath.reason or "").startswith("--cni cilium: Cilium's tc programs")
    assert_cni_state_kept(st, cni, before)


def test_calico_lab_reaches_pods_in_every_block(cni_lab) -> None:
    """Every block of a Calico node is its record's pod CIDR: each is routed (kilo0 across
    locations, the private NIC inside one) and has its own fast-path entry on the other nodes."""
    st, _ = cni_lab("calico")
    by = {n.name: n for _, n in st.nodes()}
    blocks = {name: cni_calico.node_blocks(ipaddress.ip_network(n.pods_cidr)) for name, n in by.items()}
    assert all(len(b) == cni_calico.BLOCKS_PER_NODE for b in blocks.values())
    assert unreachable_pod_pairs(st) == []
    a1 = labcheck.agent_view(by["a1"])
    assert a1 is not None
    rows = {r.name: r for r in a1.live.node_list or ()}
    for name, bs in blocks.items():
        assert rows[name].pod_cidrs == tuple(str(b) for b in bs), name
        if name != "a1":
            assert [e.prefix for e in rows[name].fastpath] == [str(b) for b in bs], name
            for b in bs:  # a1's kernel route to each block: the private NIC in loc-a, kilo0 across
                dev = "priv" if by[name].location == by["a1"].location else "kilo0"
                assert f"dev {dev}" in _route_to(by["a1"].netns or "", str(b.network_address + 2)), (name, b)


def _route_to(ns: str, ip: str) -> str:
    """`ip route get` (empty while no route covers `ip`: between the blackhole going and meshctl's route)."""
    return netns.run(ns, ["ip", "-o", "route", "get", ip], check=False).stdout


class RouteMonitor:
    """`ip -ts -o monitor route` in a namespace, started before a change: each route the kernel
    added or deleted there with the time it happened (wall clock). A process blocked on the netlink
    socket stamps an event when it comes, where polling with a command per look (`ip netns exec`
    remounts /sys each time: a few hundred ms on a loaded machine) would measure its own start."""

    SENTINEL = "10.254.254.254/32"

    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.out = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen([*netns.exec_prefix(ns), "ip", "-ts", "-o", "monitor", "route"],
                                     stdout=self.out, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 30
        while not any(self.SENTINEL.split("/")[0] in line for _, line in self._lines()):  # listening
            assert time.monotonic() < deadline, "ip monitor printed nothing"
            netns.run(ns, ["ip", "route", "replace", self.SENTINEL, "dev", "lo"], check=False)
            netns.run(ns, ["ip", "route", "del", self.SENTINEL, "dev", "lo"], check=False)

    def _lines(self) -> list[tuple[float, str]]:
        self.out.seek(0)
        out = []
        for line in self.out.read().splitlines():
            m = re.match(r"\[([0-9T:.-]+)\] (.*)", line)
            if m:
                out.append((datetime.datetime.fromisoformat(m.group(1)).timestamp(), m.group(2).strip()))
        return out

    def stop(self) -> list[tuple[float, str]]:
        self.proc.kill()
        self.proc.wait(5)
        try:
            return self._lines()
        finally:
            self.out.close()


def test_calico_block_moves_and_routes_follow(cni_lab) -> None:
    """a1's route follows the moved block and b1's pod reaches the pod on its new node. The times
    printed are the product's own reaction, stamped where it happens (a1's kernel route by a netlink
    monitor in a1, b1's pod's echoes by one `ping -D` running through the move); bench/cni_move.py
    measures them against their goal (< 1 s), the test only that they happen."""
    st, _ = cni_lab("calico")
    by = {n.name: n for _, n in st.nodes()}
    block = ipaddress.ip_network("10.42.1.0/26")  # a1's first block, with its pod 0
    pod_ip = by["a1"].pods[0].ip
    assert ipaddress.ip_address(pod_ip) in block
    a2_priv = str(ipaddress.ip_interface(by["a2"].internal_ip or "").ip)
    routes = RouteMonitor(by["a1"].netns or "")
    # b1's pod pings the pod through the move (-c: it keeps sending through the "Net Unreachable"
    # of the moment between the blackhole going and meshctl's route coming).
    ping = PodPing(st, "b1", "a1", seconds=MOVE_PING_S, interval=0.05, through_errors=True).answered()
    t0 = time.time()
    cni_calico.move_block(st, block, "a1", "a2")
    t_api = time.time()
    wait_until(lambda: re.search(rf"via {re.escape(a2_priv)} dev priv", _route_to(by["a1"].netns or "", pod_ip)),
               MOVE_PING_S, "a1's route to the moved pod")
    res = ping.result()
    changed = routes.stop()
    t_route = next((t for t, line in changed if t >= t0 and line.startswith(f"{block} via {a2_priv} dev priv")),
                   None)
    assert t_route is not None, changed
    follow = max(0.0, t_route - t_api)  # the agent may act on the watch event before the test's PATCH returns
    failed = [t for t in res.lost_at if t >= t0]
    back = next((t for t in res.replied_at if t > max(failed, default=t0)), None)
    outage = (back - t0) if failed and back else 0.0
    print(f"block {block} a1 -> a2: kernel move {t_api - t0:.3f} s; a1's route followed {follow:.3f} s after the "
          f"objects; b1's pod: {len(failed)} of {res.sent} echoes lost, reached again {outage:.3f} s after "
          f"the move began (load {os.getloadavg()[0]:.1f})")
    assert back is not None, "the pod was never reached again on its new node"
    assert res.replied_at[-1] > t_route, "echoes stopped coming back after the route followed"
    assert labcheck.ping(by["b2"].pods[0].netns, pod_ip, count=3, wait=3)[1] > 0  # the rest of the mesh reaches it


REPRO = Path(__file__).resolve().parents[2] / "bench" / "repro_cilium_lxc.c"


def _fastpath_packets(node: Any) -> dict[str, int]:
    st = labcheck.agent_status(node, fresh=True)
    return {a: p for a, (p, _) in (AgentStatus.from_json(st).live.datapath.counters.items() if st else ())}


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {a: n - before.get(a, 0) for a, n in after.items() if n != before.get(a, 0)}


def _pings(src_ns: str, dst: str, count: int = 20) -> int:
    return labcheck.ping(src_ns, dst, count=count, wait=2)[1]


def test_tcx_chain_next_to_a_cilium_like_program(cni_lab) -> None:
    """meshctl's from_pod and a reproduction of Cilium's from-container verdicts on one pod device,
    in both orders: whichever runs first decides alone (neither returns TCX_NEXT), so meshctl first
    bypasses Cilium's program and Cilium first leaves meshctl's idle: why `--cni cilium` keeps the
    fast path off. The pod's traffic flows in both orders."""
    from bcc import BPF

    st, _ = cni_lab("calico")  # the fast path on routed pod veths, as it would be on lxc*
    by = {n.name: n for _, n in st.nodes()}
    a1 = by["a1"]
    assert a1.netns is not None
    pod = a1.pods[0]
    dst = by["a2"].pods[0].ip  # same subnet: the fast path redirects it
    ifindex = netns.ifindex(a1.netns, pod.host_if)
    pin_dir = f"{st.pin_root}/default/a1"
    assert os.path.exists(links.link_path(pin_dir, "pod-in", ifindex))
    b = BPF(src_file=str(REPRO).encode())
    fd = b.load_func(b"repro_from_container", BPF.SCHED_CLS).fd
    seen = b.get_table(b"repro_seen")

    def repro_count() -> int:
        return int(seen[0].value)  # type: ignore[index]

    link = in_netns(a1.netns, lambda: libbpf.link_create(fd, ifindex, libbpf.BPF_TCX_INGRESS))  # appended: 2nd
    try:
        fp0, r0 = _fastpath_packets(a1), repro_count()
        assert _pings(pod.netns, dst) >= 18
        meshctl_first = (_delta(_fastpath_packets(a1), fp0), repro_count() - r0)
        # Cilium's first: meshctl's link goes while its agent is away and comes back after the
        # reproduction when the agent starts again (tcx appends).
        build.stop_agent(st, "a1")
        libbpf.unpin(links.link_path(pin_dir, "pod-in", ifindex))
        build.start_agent(st, "a1")
        wait_until(lambda: os.path.exists(links.link_path(pin_dir, "pod-in", ifindex)), 60, "the pod-in link back")
        build.wait_converged(st, quiet, 60)
        fp1, r1 = _fastpath_packets(a1), repro_count()
        assert _pings(pod.netns, dst) >= 18
        cilium_first = (_delta(_fastpath_packets(a1), fp1), repro_count() - r1)
    finally:
        os.close(link)
    print(f"meshctl first: meshctl's counters +{meshctl_first[0]}, the reproduction saw {meshctl_first[1]}; "
          f"reproduction first: meshctl's +{cilium_first[0]}, the reproduction saw {cilium_first[1]}")
    assert meshctl_first[0].get("direct", 0) >= 18 and meshctl_first[1] == 0  # Cilium's program bypassed
    assert "direct" not in cilium_first[0] and cilium_first[1] >= 18  # meshctl's from_pod never ran
