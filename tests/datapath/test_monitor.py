# SPDX-License-Identifier: Apache-2.0
"""`meshctl monitor` on the two-node namespace testbed: its events for a pod pair against tcpdump
on the same interface (an independent observer), the rate limit's counted loss, two monitors at
once (one killed), and bad input. The monitors run as processes, as a person runs them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.datapath import Datapath, layout, libbpf
from meshctl.datapath import monitor as mon
from meshctl.lab.rigs import netns
from meshctl.lab.rigs.testbed import PODS, Testbed
from meshctl.lab.rigs.testrun import PROTO_TCP, frame, run
from meshctl.node import discovery
from meshctl.setns import in_netns
from tests.waiting import wait_until

from .conftest import unload_testbed

pytestmark = [pytest.mark.root, pytest.mark.slow]
needs_tcpdump = pytest.mark.skipif(shutil.which("tcpdump") is None, reason="tcpdump is not installed")

A4, B4 = PODS["a"][0], PODS["b"][0]
BPF_MAP_TYPE_RINGBUF = 27
RING_BYTES = layout.header_defines("MC_MON_")["RING_BYTES"][0]
# A monitor's start (Python importing the CLI) takes ~1 s here and tens of seconds in a TCG guest.
MONITOR_START_S = 120


@pytest.fixture(scope="module")
def bed(pin_root):
    tb = Testbed(f"mmo{os.getpid() % 10000}-")
    try:
        tb.up(ipv6=False)
        tb.pin_root = pin_root
        tb.spawn("b-p1", ["iperf3", "-s", "-p", "5201"])
        for node in ("a", "b"):
            in_netns(tb.ns(node), lambda node=node: _load(tb, node))
        tb.wait_port("a-p1", B4, 5201)
        yield tb
    finally:
        unload_testbed(tb, pin_root)


def _load(tb: Testbed, node: str) -> None:
    dp = Datapath.open(node, pin_root=tb.pin_root)
    try:
        assert dp.mode == "ebpf", dp.reason
        dp.attach("eth1", "kilo0" if node == "a" else None, ["vp1"], pods=discovery.pod_routes(["vp1"]),
                  private4=discovery.private_ipv4("eth1"))
        dp.sync(tb.fastpath(node), "eth1")
    finally:
        dp.close()


def gate(tb: Testbed) -> int:
    def read() -> int:
        with contextlib.closing(Datapath.pinned("a", pin_root=tb.pin_root)) as dp:
            assert dp.maps is not None
            return dp.maps.config_get(layout.CFG_MONITOR)

    return in_netns(tb.ns("a"), read)


def start_monitor(tb: Testbed, *args: str, slots: int = 1, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A `meshctl monitor -o json` of node a (`env` added to ours); returns once `slots` monitors
    hold the gate."""
    argv = [sys.executable, "-m", "meshctl.cli", "monitor", "--node", "a", "--bpf-pin-root", tb.pin_root,
            "--netns", tb.ns("a"), "-o", "json", *args]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})

    def claimed() -> bool:
        assert proc.poll() is None, proc.communicate()
        return bin(gate(tb)).count("1") >= slots

    try:
        wait_until(claimed, MONITOR_START_S, "the monitor claiming its slot")
    except BaseException:  # a monitor left running would hold its slot into the next test
        proc.kill()
        proc.communicate()
        raise
    return proc


def stop_monitor(proc: subprocess.Popen, timeout: float = 10) -> tuple[list[dict], dict]:
    """Ctrl-C, then (events, summary). Nothing to wait for before: the programs put an event in the
    ring as the packet passes, and the monitor drains its ring when it stops (Session.stop)."""
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    docs = [json.loads(line) for line in out.splitlines()]
    assert docs and docs[-1].get("summary"), out
    return docs[:-1], docs[-1]


def start_capture(tb: Testbed, path: str, expr: str) -> subprocess.Popen:
    """tcpdump of what node a's pod veth receives from the pod."""
    argv = ["tcpdump", "-i", "vp1", "-Q", "in", "-n", "-s", "96", "-U", "--immediate-mode", "-w", path, expr]
    proc = subprocess.Popen([*netns.exec_prefix(tb.ns("a")), *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert "listening" in line, line
    return proc


def pcap_lengths(path: str) -> list[int]:
    """The length on the wire of each packet tcpdump has written to the pcap so far."""
    data = Path(path).read_bytes()
    off, lengths = 24, []
    while off + 16 <= len(data):
        _, _, incl, orig = struct.unpack_from("<IIII", data, off)
        if off + 16 + incl > len(data):
            break  # a record tcpdump is still writing
        lengths.append(orig)
        off += 16 + incl
    return lengths


MARK_BYTES = 1111  # the ICMP payload of the last ping of a test: no other packet of the tests has this length
MARK_LEN = 14 + 20 + 8 + MARK_BYTES


def mark(tb: Testbed) -> None:
    """One ping that ends a test's traffic: once tcpdump has written it (-U: packet by packet, in
    order), it has written everything before it."""
    tb.sh("a-p1", ["ping", "-c", "1", "-s", str(MARK_BYTES), B4])


def through_mark(lengths: list[int]) -> list[int]:
    """The packets up to the marker (mark()), itself included."""
    assert MARK_LEN in lengths, lengths[-20:]
    return lengths[: lengths.index(MARK_LEN) + 1]


def stop_capture(proc: subprocess.Popen, path: str, until: Callable[[list[int]], bool]) -> list[int]:
    """The lengths of the packets captured, once `until(lengths)` holds (what the test sent is in)."""
    try:
        wait_until(lambda: until(pcap_lengths(path)), 30, "tcpdump writing the test's packets")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=10)
    return pcap_lengths(path)


@needs_tcpdump
def test_events_for_a_pair_equal_what_tcpdump_captures(bed, tmp_path):
    pcap = str(tmp_path / "a.pcap")
    cap = start_capture(bed, pcap, f"src {A4} and dst {B4}")
    mon = start_monitor(bed, "--from", A4, "--to", f"{B4}/32", "--rate", "0")
    try:
        bed.sh("a-p1", ["ping", "-c", "20", "-i", "0.01", B4])
        bed.sh("a-p1", ["iperf3", "-c", B4, "-p", "5201", "-t", "1", "-b", "200M"])
        mark(bed)
    finally:
        events, summary = stop_monitor(mon)
        captured = stop_capture(cap, pcap, lambda lengths: MARK_LEN in lengths)
    assert {(e["hook"], e["interface"], e["src"], e["dst"]) for e in events} == {("from_pod", "vp1", A4, B4)}
    assert {e["type"] for e in events} == {"direct"}
    assert all(e["nexthop"] == "192.168.77.2" and e["out_interface"] == "eth1" for e in events)
    assert {"icmp", "tcp"} <= {e["proto"] for e in events}
    assert summary["lost"] == 0, summary
    # Both up to the marker: the last ACK of iperf3's connection may leave after it (late on a loaded
    # machine), when the monitor has stopped and tcpdump has not.
    seen, captured = through_mark([e["len"] for e in events]), through_mark(captured)
    assert (len(seen), sum(seen)) == (len(captured), sum(captured)), sorted(set(seen) ^ set(captured))
    assert len(captured) > 20


@needs_tcpdump
def test_a_low_rate_counts_every_event_it_does_not_show(bed, tmp_path):
    pcap = str(tmp_path / "r.pcap")
    cap = start_capture(bed, pcap, f"icmp and src {A4} and dst {B4}")
    mon = start_monitor(bed, "--to", B4, "--type", "direct", "--rate", "50")
    try:
        bed.sh("a-p1", ["ping", "-q", "-c", "300", "-i", "0.005", B4])
    finally:
        events, summary = stop_monitor(mon)
        packets = len(stop_capture(cap, pcap, lambda lengths: len(lengths) >= 300))
    icmp = [e for e in events if e["proto"] == "icmp"]
    assert len(icmp) == len(events)
    assert summary["lost_rate"] > 0 and summary["lost_buffer"] == 0
    assert len(events) + summary["lost"] == packets == 300


def test_two_monitors_at_once_and_killing_one_leaves_the_other(bed):
    first = start_monitor(bed, "--to", B4, "--rate", "0")
    second = start_monitor(bed, "--to", B4, "--type", "direct", "--rate", "0", slots=2)
    bed.sh("a-p1", ["ping", "-c", "5", "-i", "0.01", B4])
    first.kill()  # a crash: no cleanup of its own
    first.communicate(timeout=10)
    bed.sh("a-p1", ["ping", "-c", "5", "-i", "0.01", B4])
    events, summary = stop_monitor(second)
    assert [e["proto"] for e in events].count("icmp") == 10
    assert summary["lost"] == 0
    assert gate(bed) == 0  # the last monitor out turns the event path off, the crashed one's bit too


def test_ctrl_c_while_the_agent_is_asked_for_owners_still_ends_with_the_summary(bed):
    """An agent that accepts and never answers holds the monitor in its owners' lookup for
    OWNERS_TIMEOUT, after it claimed its slot: a Ctrl-C then ends it as a later one would, with the
    events it caught meanwhile and the summary, exit 0 (not click's "Aborted!")."""
    import socket

    from meshctl import defaults
    from meshctl.cli.monitor import OWNERS_TIMEOUT

    host, port = defaults.METRICS_ADDR.rsplit(":", 1)

    def silent_agent() -> socket.socket:
        s = socket.socket()
        s.bind((host, int(port)))
        s.listen(4)
        return s

    agent = in_netns(bed.ns("a"), silent_agent)
    try:
        proc = start_monitor(bed, "--to", B4, "--rate", "0")
        bed.sh("a-p1", ["ping", "-c", "3", "-i", "0.01", B4])
        events, summary = stop_monitor(proc, timeout=OWNERS_TIMEOUT + 10)
    finally:
        agent.close()
    assert [e["proto"] for e in events].count("icmp") == 3
    assert summary["lost"] == 0
    assert gate(bed) == 0


def test_an_agent_slower_than_the_owners_wait_still_names_owners_where_agents_are_known_slow(bed):
    """Where $MESHCTL_AGENT_WAIT says agents answer slowly (the labs set it for commands run in an
    emulated guest), the owners' lookup waits that long: a stand-in agent that answers its node
    list a second after OWNERS_TIMEOUT still names the pods' nodes (CI: a 5.10 TCG guest's agent
    took more than 5 s, and `monitor --node a2` showed bare addresses)."""
    import http.server
    import threading

    from meshctl import defaults
    from meshctl.cli.monitor import OWNERS_TIMEOUT

    host, port = defaults.METRICS_ADDR.rsplit(":", 1)
    doc = json.dumps({"node": "a", "node_list": [{"name": "b", "pod_cidrs": [f"{B4}/32"], "path": "direct"}]})

    class Late(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            threading.Event().wait(OWNERS_TIMEOUT + 1)
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(doc.encode())

        def log_message(self, *_a: object) -> None:
            pass

    agent = in_netns(bed.ns("a"), lambda: http.server.ThreadingHTTPServer((host, int(port)), Late))
    threading.Thread(target=agent.serve_forever, daemon=True).start()
    try:
        proc = start_monitor(bed, "--to", B4, "--rate", "0", "--count", "3",
                             env={defaults.ANSWER_WAIT_ENV: str(OWNERS_TIMEOUT + 10)})
        bed.sh("a-p1", ["ping", "-c", "3", "-i", "0.01", B4])
        out, err = proc.communicate(timeout=OWNERS_TIMEOUT + 30)
    finally:
        agent.shutdown()
        agent.server_close()
    events = [e for e in map(json.loads, out.splitlines()) if not e.get("summary")]
    assert proc.returncode == 0 and "without owners" not in err, err
    assert [(e["dst"], e["dst_owner"]) for e in events] == [(B4, "default/b")] * 3, events


@pytest.mark.parametrize("args, named", [
    (["--from", "10.42.1.0/33"], "--from: '10.42.1.0/33'"),
    (["--to", "pod-b"], "--to: 'pod-b'"),
    (["--rate", "-1"], "--rate: '-1'"),
    (["--type", "bogus"], "--type: 'bogus'"),
    (["--count", "0"], "--count: '0'"),
    (["--lab", "mmo-nosuchlab", "--node", "zz"], "--node: 'zz'"),
])
def test_bad_input_is_one_line_and_exit_2(args, named):
    r = CliRunner().invoke(main, ["monitor", *args])
    assert r.exit_code == 2, r.output
    assert r.output.count("\n") == 1 and named in r.output and "Traceback" not in r.output


def test_a_node_without_the_fast_path_says_so(pin_root):
    r = CliRunner().invoke(main, ["monitor", "--node", "nofastpath", "--bpf-pin-root", pin_root])
    assert r.exit_code == 1
    assert r.output.count("\n") == 1 and "fast path is off" in r.output


def test_the_monitor_maps_are_the_layouts_and_a_miss_says_why(unit_dp):
    """Without traffic: the compiled maps have the layout's sizes, and a test-run packet nobody
    routes comes out of the ring as a `pass` event with reason `no_entry`, while a filter that
    does not match it keeps it in the kernel."""
    pin_dir = unit_dp.pin_dir
    for name in layout.MONITOR_MAPS:
        info = libbpf.map_info(fd := libbpf.obj_get(f"{pin_dir}/{name}"))
        os.close(fd)
        if name.startswith("mon_ring"):
            assert (info.type, info.max_entries) == (BPF_MAP_TYPE_RINGBUF, RING_BYTES), name
        else:
            assert (info.key_size, info.value_size) == layout.MAP_SIZES[name], name
    prog = unit_dp.programs["from_pod"]
    miss = frame("10.42.1.5", "8.8.8.8", ttl=64, sport=1234, dport=80, proto=PROTO_TCP)
    wide = mon.Session(pin_dir, mon.parse_filter(None, "8.8.0.0/16", "pass", "0"))
    narrow = mon.Session(pin_dir, mon.parse_filter(None, "9.9.9.9", "all", "0"))
    try:
        assert run(prog, miss).verdict == "ok"
        [raw] = wide.poll(100)
        assert narrow.poll(100) == []
    finally:
        wide.close()
        narrow.close()
    ev = mon.decode_event(raw)
    assert (ev["hook"], ev["type"], ev["decision"], ev["reason"]) == ("from_pod", "pass", "pass", "no_entry")
    assert (ev["src"], ev["dst"], ev["proto"], ev["sport"], ev["dport"], ev["len"]) == (
        "10.42.1.5", "8.8.8.8", "tcp", 1234, 80, len(miss))


def test_owners_name_pod_and_node_addresses_and_relay_narrows_tunnel_events():
    rows = [{"name": "c", "cluster": "far", "pod_cidrs": ["10.42.9.0/24"], "internal_ip": "172.20.0.9/24",
             "path": "relay"},
            {"name": "b", "cluster": "default", "pod_cidrs": ["10.42.2.0/24"], "internal_ip": "192.168.77.2",
             "path": "direct"}]
    owners = mon.owners_from_node_list(rows)
    base = {"ts_ns": 0, "ifindex": 1, "out_ifindex": None, "src": A4}
    relayed = mon.describe({**base, "dst": "10.42.9.5", "type": "tunnel"}, "a", {1: "vp1"}, owners, 0)
    direct = mon.describe({**base, "dst": "192.168.77.2", "type": "tunnel"}, "a", {1: "vp1"}, owners, 0)
    assert (relayed["dst_owner"], relayed["type"], relayed["src_owner"]) == ("far/c", "relay", None)
    assert (direct["dst_owner"], direct["type"]) == ("default/b", "tunnel")
    assert mon.wanted(relayed, "relay") and not mon.wanted(direct, "relay") and mon.wanted(direct, "all")
    assert mon.type_mask("relay") == mon.type_mask("tunnel")
