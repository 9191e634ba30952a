# SPDX-License-Identifier: Apache-2.0
"""Two nodes in namespaces (pods, private bridge, a stand-in kilo0): same-subnet pod traffic takes
the fast path, cross-location traffic goes to kilo0, a DNAT service keeps working next to
`ct state invalid drop`, and unloading the programs leaves every path working through the kernel.
Tests run in file order: the last one unloads."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import textwrap

import pytest
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.datapath import Datapath, features, layout, links
from meshctl.lab.rigs import netns
from meshctl.lab.rigs.testbed import FAR_POD, PODS, SERVICE_IP, Testbed
from meshctl.node import discovery
from meshctl.setns import in_netns

pytestmark = [pytest.mark.root, pytest.mark.slow]

SERVER = textwrap.dedent("""
    import socket, sys
    s = socket.socket(socket.AF_INET6 if ':' in sys.argv[1] else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(64)
    while True:
        c, peer = s.accept()
        data = c.recv(100)
        c.sendall(b'pong from ' + peer[0].encode() + b' ' + data); c.close()
""")
CLIENT = ("import socket,sys; c=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=3); "
          "c.sendall(b'ping'); print(c.recv(200).decode()); c.close()")


@pytest.fixture(scope="module")
def bed(pin_root, tmp_path_factory):
    tb = Testbed(f"mdp{os.getpid() % 10000}-")
    try:
        tb.up()
        tb.pin_root = pin_root
        script = tmp_path_factory.mktemp("srv") / "server.py"
        script.write_text(SERVER)
        tb.spawn("b-p1", ["python3", str(script), "0.0.0.0", "8080"])
        tb.spawn("b-p1", ["python3", str(script), "::", "8081"])
        tb.spawn("b-p1", ["iperf3", "-s", "-p", "5201"])
        for node in ("a", "b"):
            dp = in_netns(tb.ns(node), lambda node=node: _load(tb, node))
            assert dp.mode == "ebpf", dp.reason
            dp.close()
        tb.wait_port("a-p1", PODS["b"][0], 8080)
        yield tb
    finally:
        for node in ("a", "b"):
            with contextlib.suppress(Exception):  # the namespace may not exist if up() failed early
                in_netns(tb.ns(node), lambda node=node: Datapath.unload(node, pin_root=pin_root))
        tb.down()


def _load(tb: Testbed, node: str) -> Datapath:
    """What the agent does in its node's netns."""
    dp = Datapath.open(node, pin_root=tb.pin_root)
    if dp.mode == "ebpf":
        dp.attach("eth1", "kilo0" if node == "a" else None, ["vp1"], pods=discovery.pod_routes(["vp1"]),
                  private4=discovery.private_ipv4("eth1"))
        dp.sync(tb.fastpath(node), "eth1")
    return dp


def counters(tb: Testbed, node: str) -> dict[str, tuple[int, int]]:
    def read():
        dp = Datapath.pinned(node, pin_root=tb.pin_root)
        try:
            return dp.counters()
        finally:
            dp.close()

    return in_netns(tb.ns(node), read)


def snapshot(tb: Testbed) -> dict:
    return {"a": counters(tb, "a"), "b": counters(tb, "b"), "fwd_a": tb.fwd_packets("a"),
            "fwd_b": tb.fwd_packets("b"), "kilo0": tb.tx_packets("a", "kilo0")}


def moved(before: dict, after: dict, node: str, action: str) -> int:
    return after[node][action][0] - before[node][action][0]


def test_pods_maps_hold_the_local_pods(bed):
    def read():
        dp = Datapath.pinned("a", pin_root=bed.pin_root)
        try:
            return dp.pods(), dp.entries(), dp.status()
        finally:
            dp.close()

    pods, entries, status = in_netns(bed.ns("a"), read)
    assert {p["ip"] for p in pods} == set(PODS["a"])
    assert all(p["ifname"] == "vp1" for p in pods)
    assert {"prefix": "10.42.2.0/24", "action": "direct", "nexthop": "192.168.77.2", "ifname": "eth1",
            "encap": None, "outer_src": None, "outer_dst": None} in entries
    assert {"prefix": "10.42.9.0/24", "action": "tunnel", "nexthop": None, "ifname": None, "encap": None,
            "outer_src": None, "outer_dst": None} in entries
    hooks = {(lk["hook"], lk["ifname"]) for lk in status["links"]}
    assert hooks == {("private-in", "eth1"), ("private-out", "eth1"), ("tunnel-in", "kilo0"), ("tunnel-out", "kilo0"),
                     ("pod-in", "vp1"), ("pod-out", "vp1")}
    # tcx links where the kernel has them (>= 6.6), clsact filters elsewhere: reported alike
    assert all(lk["kind"] == ("tcx" if features.probe().tcx else "clsact") for lk in status["links"])
    assert status["attach"] == ("tcx" if features.probe().tcx else "clsact")


def test_same_subnet_ping_and_tcp_take_the_fast_path(bed):
    v6_before = counters(bed, "a")
    assert bed.ping("a-p1", PODS["b"][1], count=3), "IPv6"
    assert counters(bed, "a")["direct"][0] - v6_before["direct"][0] >= 3, "IPv6 takes the fast path too"
    before = snapshot(bed)
    assert bed.ping("a-p1", PODS["b"][0], count=5)
    out = bed.sh("a-p1", ["iperf3", "-c", PODS["b"][0], "-p", "5201", "-t", "1", "-J"], timeout=30)
    received = json.loads(out.stdout)["end"]["sum_received"]["bytes"]
    r = bed.sh("a-p1", ["python3", "-c", CLIENT, PODS["b"][0], "8080"])
    assert r.stdout.strip() == f"pong from {PODS['a'][0]} ping"
    after = snapshot(bed)
    assert moved(before, after, "a", "direct") >= 5 + 100
    assert after["a"]["direct"][1] - before["a"]["direct"][1] >= received
    assert moved(before, after, "b", "peer") >= 5 + 100
    assert moved(before, after, "b", "direct") >= 5  # the replies, b -> a
    assert moved(before, after, "a", "peer") >= 5
    # Nothing crossed either node's FORWARD netfilter hook, and nothing went to kilo0.
    assert after["fwd_a"] == before["fwd_a"]
    assert after["fwd_b"] == before["fwd_b"]
    assert after["kilo0"] == before["kilo0"]
    assert after["a"]["error"] == before["a"]["error"] and after["b"]["error"] == before["b"]["error"]


def test_cross_location_goes_to_kilo0(bed):
    before = snapshot(bed)
    assert bed.ping("a-p1", FAR_POD, count=3)
    assert bed.ping("b-p1", FAR_POD, count=3), "from b: direct to the leader a, then kilo0"
    after = snapshot(bed)
    assert moved(before, after, "a", "tunnel") >= 3
    assert after["kilo0"] - before["kilo0"] >= 6
    assert moved(before, after, "b", "direct") >= 3
    assert after["fwd_a"][0] - before["fwd_a"][0] >= 6  # a forwards into kilo0 through its kernel


def test_dnat_service_works_with_the_fast_path_and_ct_invalid_drop(bed):
    bed.add_service("a", 80, PODS["b"][0], 8080)
    before = snapshot(bed)
    for _ in range(3):
        r = bed.sh("a-p1", ["python3", "-c", CLIENT, SERVICE_IP, "80"])
        assert r.stdout.strip() == f"pong from {PODS['a'][0]} ping"
    after = snapshot(bed)
    # The replies came back through a's kernel (reverse DNAT), flagged by the flow tracker.
    assert moved(before, after, "a", "flow") >= 3 * 2
    assert after["fwd_a"][1] == before["fwd_a"][1], "no packet was dropped as ct state invalid"


def test_without_flow_tracking_the_service_breaks(bed):
    """The negative control of the test above: with a's egress tracker detached (and its flows
    forgotten), the service's replies bypass a's reverse DNAT and the connection fails.
    Premise per kernel: the tracker is a tcx link where the kernel has tcx (>= 6.6) and a clsact
    filter before; detached as what it is, the premise holds on 6.1 (clsact) as on 6.18 (tcx).
    Detaching a tcx link on a clsact kernel removed nothing, which is why the service once
    "worked" on 6.1."""
    pin_dir = f"{bed.pin_root}/a"

    def untrack():
        with contextlib.closing(Datapath.pinned("a", pin_root=bed.pin_root)) as dp:
            tracker = [a for a in dp.attachments() if a.hook == "private-out"]
        assert len(tracker) == 1, "the egress tracker is attached (tcx link or clsact filter)"
        if tracker[0].kind == "tcx":
            links.detach_tcx(pin_dir, "private-out", tracker[0].ifindex)
        else:
            links.detach_clsact("private-out", tracker[0].ifname)
        with contextlib.closing(Datapath.pinned("a", pin_root=bed.pin_root)) as dp:
            dp.maps.flows4.sync({})

    in_netns(bed.ns("a"), untrack)
    try:
        r = bed.sh("a-p1", ["python3", "-c", CLIENT, SERVICE_IP, "80"], check=False)
        assert r.returncode != 0, r.stdout
    finally:
        in_netns(bed.ns("a"), lambda: _load(bed, "a").close())
    r = bed.sh("a-p1", ["python3", "-c", CLIENT, SERVICE_IP, "80"])
    assert r.stdout.strip() == f"pong from {PODS['a'][0]} ping"


def test_agent_restarts_and_a_program_upgrade_drop_no_packet(bed):
    before = counters(bed, "a")["direct"][0]
    ping = subprocess.Popen([*netns.exec_prefix(bed.ns("a-p1")), "ping", "-c", "400", "-i", "0.01", "-W", "1",
                             PODS["b"][0]], stdout=subprocess.PIPE, text=True)
    bed.pids.append(ping.pid)
    try:
        for node, upgrade in (("a", False), ("b", False), ("a", True), ("b", True)):
            if upgrade:  # a new agent version: another program source, links switched in place
                with contextlib.closing(Datapath.pinned(node, pin_root=bed.pin_root)) as dp:
                    dp.maps.config_set(layout.CFG_SOURCE_HASH, 1)
            dp = in_netns(bed.ns(node), lambda node=node: _load(bed, node))
            assert dp.mode == "ebpf" and dp.status()["compiled"] is upgrade
            dp.close()
        out, _ = ping.communicate(timeout=60)
    finally:
        ping.kill()
    assert " 0% packet loss" in out, out.splitlines()[-2:]
    assert counters(bed, "a")["direct"][0] - before >= 400


def test_cli_dump_and_status(bed):
    runner = CliRunner()
    where = ["--node", "a", "--bpf-pin-root", bed.pin_root, "--netns", bed.ns("a")]
    r = runner.invoke(main, ["maps", "dump", *where, "-o", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert {"prefix": "10.42.2.0/24", "action": "direct", "nexthop": "192.168.77.2", "ifname": "eth1",
            "encap": None, "outer_src": None, "outer_dst": None} in d["entries"]
    assert d["counters"]["direct"]["packets"] > 0
    r = runner.invoke(main, ["maps", "dump", *where])
    assert r.exit_code == 0
    assert any(line.split()[:4] == ["10.42.2.0/24", "direct", "192.168.77.2", "eth1"] for line in r.stdout.splitlines())
    r = runner.invoke(main, ["maps", "dump", *where, "--counters"])
    assert r.exit_code == 0 and "10.42.2.0/24" not in r.stdout and "direct" in r.stdout
    r = runner.invoke(main, ["datapath", "status", *where])
    assert r.exit_code == 0 and "datapath ebpf" in r.stdout and "pod-in" in r.stdout and "vp1" in r.stdout
    r = runner.invoke(main, ["maps", "dump", "--node", "a", "--bpf-pin-root", bed.pin_root, "--netns", "mdp-none"])
    assert r.exit_code == 2 and r.stderr.strip() == "error: --netns: 'mdp-none' is not a network namespace"
    r = runner.invoke(main, ["maps", "dump", "--node", "zz", "--bpf-pin-root", bed.pin_root])
    assert r.exit_code == 1 and r.stderr.startswith("error: nothing is pinned")


def test_unloading_keeps_traffic_flowing_through_kernel_routes(bed):
    r = CliRunner().invoke(main, ["datapath", "unload", "--node", "a", "--bpf-pin-root", bed.pin_root,
                                  "--netns", bed.ns("a")])
    assert r.exit_code == 0, r.output
    in_netns(bed.ns("b"), lambda: Datapath.unload("b", pin_root=bed.pin_root))
    for node in ("a", "b"):
        assert not os.path.exists(f"{bed.pin_root}/{node}")
    fwd_a, fwd_b = bed.fwd_packets("a"), bed.fwd_packets("b")
    assert bed.ping("a-p1", PODS["b"][0], count=3)
    assert bed.ping("a-p1", PODS["b"][1], count=3)
    r = bed.sh("a-p1", ["python3", "-c", CLIENT, PODS["b"][0], "8080"])
    assert r.stdout.strip() == f"pong from {PODS['a'][0]} ping"
    r = bed.sh("a-p1", ["python3", "-c", CLIENT, SERVICE_IP, "80"])
    assert r.stdout.strip().startswith("pong")
    assert bed.ping("a-p1", FAR_POD, count=2)
    # Now the kernel forwards: both FORWARD hooks count.
    assert bed.fwd_packets("a")[0] - fwd_a[0] >= 6
    assert bed.fwd_packets("b")[0] - fwd_b[0] >= 6
