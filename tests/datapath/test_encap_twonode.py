# SPDX-License-Identifier: Apache-2.0
"""direct+vxlan and direct+ipip through the fast path, between two namespace nodes joined by a
routed private fabric that behaves like a VPC: it forwards only packets whose source and
destination are node addresses, so raw pod-to-pod packets die there and encapsulated ones pass.
The router's counters prove what was on the wire (outer headers between the two private
addresses); the nodes' counters prove the programs built and unwrapped it. Tests run in file
order: the last ones unload the programs and use the kernel fallback (a VXLAN device)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re

import pytest
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.datapath import Datapath, features
from meshctl.lab.rigs import netns
from meshctl.lab.rigs.testbed import PODS, FabricTestbed
from meshctl.mesh.plan import Encap, FastPathEntry
from meshctl.node import discovery
from meshctl.node.encap import IPIP_DEV, EncapApplier, kernel_has
from meshctl.setns import in_netns
from tests.datapath.conftest import raw_pods_bed
from tests.waiting import wait_until

from .conftest import unload_testbed

pytestmark = [pytest.mark.root, pytest.mark.slow]

A4, B4 = PODS["a"][0], PODS["b"][0]
B6 = PODS["b"][1]
ip = ipaddress.ip_address


@pytest.fixture(scope="module")
def bed(pin_root):
    tb = FabricTestbed(f"ea{os.getpid() % 10000}-", fabric="vpc")
    try:
        raw_pods_bed(tb, pin_root)
        for node in ("a", "b"):
            dp = in_netns(tb.ns(node), lambda node=node: _load(tb, node, None))
            assert dp.mode == "ebpf", dp.reason
            dp.close()
        yield tb
    finally:
        unload_testbed(tb, pin_root)


def _load(tb: FabricTestbed, node: str, kind: str | None) -> Datapath:
    dp = Datapath.open(node, pin_root=tb.pin_root)
    if dp.mode == "ebpf":
        dp.attach("eth1", None, ["vp1"], pods=discovery.pod_routes(["vp1"]), private4=discovery.private_ipv4("eth1"))
        dp.sync(tb.fastpath(node, kind), "eth1")
    return dp


def use(tb: FabricTestbed, a: str | None, b: str | None) -> None:
    """Entries of a (towards b) on rung `a`, of b (towards a) on rung `b` (None: raw direct)."""
    for node, kind in (("a", a), ("b", b)):
        in_netns(tb.ns(node), lambda node=node, kind=kind: _load(tb, node, kind).close())


def counters(tb: FabricTestbed, node: str) -> dict[str, int]:
    def read():
        with contextlib.closing(Datapath.pinned(node, pin_root=tb.pin_root)) as dp:
            return {k: v[0] for k, v in dp.counters().items()}

    return in_netns(tb.ns(node), read)


def snapshot(tb: FabricTestbed) -> dict:
    return {"a": counters(tb, "a"), "b": counters(tb, "b"), "vpc": tb.vpc_counters(),
            "fwd_a": tb.fwd_packets("a")[0], "fwd_b": tb.fwd_packets("b")[0]}


def moved(before: dict, after: dict, where: str, what: str) -> int:
    return after[where][what] - before[where][what]


def iperf(tb: FabricTestbed, seconds: int = 1, dst: str = B4, port: int = 5201, server: str = "b-p1") -> int:
    """Bytes received in one iperf3 run from a's pod, once the server (in namespace `server`) listens."""
    wait_until(lambda: f":{port} " in tb.sh(server, ["ss", "-Htln"]).stdout, 30, f"iperf3 listening on {port}")
    out = json.loads(tb.sh("a-p1", ["iperf3", "-c", dst, "-p", str(port), "-t", str(seconds), "-J"],
                           check=False, timeout=30 + seconds).stdout or "{}")
    assert "end" in out and "error" not in out, f"iperf3 to {dst}:{port}: {out.get('error')}"
    return out["end"]["sum_received"]["bytes"]


def test_the_vpc_drops_raw_pod_packets(bed):
    before = snapshot(bed)
    assert not bed.ping("a-p1", B4, count=2), "raw pod-addressed packets must not cross a VPC"
    after = snapshot(bed)
    assert moved(before, after, "a", "direct") >= 2, "the fast path sent them raw"
    assert moved(before, after, "vpc", "dropped") >= 2
    assert moved(before, after, "vpc", "node_to_node") == 0


@pytest.mark.parametrize("kind", ["vxlan", "ipip"])
def test_encapsulated_ping_and_tcp_take_the_fast_path_across_the_vpc(bed, kind):
    use(bed, kind, kind)
    before = snapshot(bed)
    assert bed.ping("a-p1", B4, count=5), f"{kind}: IPv4 pods"
    assert bed.ping("a-p1", B6, count=3), f"{kind}: IPv6 pods inside IPv4 outer headers"
    received = iperf(bed)
    assert received > 10_000_000
    after = snapshot(bed)
    # a built the outer headers, b unwrapped them into its pod, and the replies went the other way.
    assert moved(before, after, "a", "encap") >= 8 + 100
    assert moved(before, after, "b", "decap") >= 8 + 100
    assert moved(before, after, "b", "peer") >= 8 + 100
    assert moved(before, after, "b", "encap") >= 8 and moved(before, after, "a", "decap") >= 8
    assert moved(before, after, "a", "direct") == 0 and moved(before, after, "b", "direct") == 0
    # On the wire: only node-addressed packets of this kind crossed the VPC, none was dropped.
    assert moved(before, after, "vpc", kind) >= 2 * 8 + 100
    assert moved(before, after, "vpc", "vxlan" if kind == "ipip" else "ipip") == 0
    assert moved(before, after, "vpc", "dropped") == 0
    # Neither node's kernel forwarded anything: the programs did.
    assert after["fwd_a"] == before["fwd_a"] and after["fwd_b"] == before["fwd_b"]
    assert after["a"]["error"] == before["a"]["error"] and after["b"]["error"] == before["b"]["error"]


def test_maps_dump_shows_each_entrys_encapsulation_and_outer_addresses(bed):
    use(bed, "vxlan", "ipip")
    where = ["--bpf-pin-root", bed.pin_root]
    r = CliRunner().invoke(main, ["maps", "dump", "--node", "a", *where, "--netns", bed.ns("a"), "-o", "json"])
    assert r.exit_code == 0, r.output
    rows = {e["prefix"]: e for e in json.loads(r.stdout)["entries"]}
    assert rows["10.42.2.0/24"] == {"prefix": "10.42.2.0/24", "action": "direct", "nexthop": None, "ifname": "eth1",
                                    "encap": "vxlan", "outer_src": "10.30.2.1", "outer_dst": "10.30.3.1"}
    assert rows["fd42:2::/64"]["encap"] == "vxlan" and rows["10.42.1.0/24"]["encap"] is None
    r = CliRunner().invoke(main, ["maps", "dump", "--node", "b", *where, "--netns", bed.ns("b")])
    assert r.exit_code == 0, r.output
    line = next(ln for ln in r.stdout.splitlines() if ln.split()[:1] == ["10.42.1.0/24"])
    assert line.split()[1:] == ["direct", "-", "eth1", "ipip", "10.30.3.1", "->", "10.30.2.1"]
    r = CliRunner().invoke(main, ["datapath", "status", "--node", "b", *where, "--netns", bed.ns("b"), "-o", "json"])
    assert r.exit_code == 0, r.output
    assert "10.30.3.1" in r.stdout, "status names the address encapsulated packets must be sent to"


@pytest.mark.parametrize("kind,mtu", [("vxlan", 1450), ("ipip", 1480)])
def test_path_mtu_discovery_works_through_the_encapsulation(bed, kind, mtu):
    use(bed, kind, kind)
    pmtu_and_throughput(bed, mtu)


@pytest.mark.parametrize("kind,mtu", [("vxlan", 1450), ("ipip", 1480)])
def test_as_on_5_10_without_check_mtu_and_the_adjust_room_flags(bed, kind, mtu, monkeypatch):
    """Debian 11's 5.10 has no bpf_check_mtu (5.12), refuses BPF_F_ADJ_ROOM_ENCAP_L2_ETH (5.18) and
    the decapsulation flags (6.3): the programs are compiled without them, compare with the private
    NIC's MTU the datapath wrote in config, leave the VXLAN inner protocol as IP, and turn an IPv6
    packet inside IPv4 into IPv6 before the pop. Built here as the feature probe does on such a
    kernel: the same path MTU discovery (IPv4 and IPv6 pods), and TCP runs."""
    monkeypatch.setenv(features.WITHOUT_ENV, "check_mtu,adjust_room_encap_l2_eth,adjust_room_decap_l3")
    features.probe.cache_clear()
    try:
        assert features.probe().cflags() == ["-DMC_HAVE_ADJ_ROOM_DECAP_L3=0", "-DMC_HAVE_ADJ_ROOM_L2_ETH=0",
                                             "-DMC_HAVE_CHECK_MTU=0"]
        use(bed, kind, kind)
        pmtu_and_throughput(bed, mtu)
    finally:
        monkeypatch.undo()
        features.probe.cache_clear()
        use(bed, None, None)


def pmtu_and_throughput(bed: FabricTestbed, mtu: int) -> None:
    """A DF ping that fits passes; one that does not gets "fragmentation needed" from the fast path
    (counted as too_big) with the encapsulated path's MTU, as does IPv6; then TCP runs."""
    bed.sh("a-p1", ["ip", "route", "flush", "cache"])
    p = bed.sh("a-p1", ["ping", "-c", "2", "-i", "0.2", "-W", "2", "-M", "do", "-s", "1400", B4], check=False)
    assert p.returncode == 0, "a 1,400-byte ping with DF passes"
    before = counters(bed, "a")
    p = bed.sh("a-p1", ["ping", "-c", "2", "-i", "0.2", "-W", "1", "-M", "do", "-s", "1472", B4], check=False)
    assert counters(bed, "a")["too_big"] - before["too_big"] >= 1
    assert re.search(rf"mtu\s*=\s*{mtu}", p.stdout + p.stderr), p.stdout + p.stderr
    route = bed.sh("a-p1", ["ip", "route", "get", B4]).stdout
    assert f"mtu {mtu}" in route, route
    # The largest packet that fits now passes.
    p = bed.sh("a-p1", ["ping", "-c", "2", "-i", "0.2", "-W", "2", "-M", "do", "-s", str(mtu - 28), B4], check=False)
    assert p.returncode == 0
    assert iperf(bed) > 10_000_000
    # IPv6 pods: ICMPv6 "packet too big" from the fast path, the same lowered path MTU.
    bed.sh("a-p1", ["ip", "-6", "route", "flush", "cache"])
    p = bed.sh("a-p1", ["ping", "-6", "-c", "2", "-i", "0.2", "-W", "1", "-M", "do", "-s", "1452", B6], check=False)
    assert re.search(rf"mtu\s*=\s*{mtu}", p.stdout + p.stderr), p.stdout + p.stderr
    p = bed.sh("a-p1", ["ping", "-6", "-c", "2", "-i", "0.2", "-W", "2", "-M", "do", "-s", str(mtu - 48), B6],
               check=False)
    assert p.returncode == 0


def test_the_receiver_accepts_every_rung_at_once(bed):
    """a sends VXLAN while b answers with IPIP (a rung change under way on one side)."""
    use(bed, "vxlan", "ipip")
    before = snapshot(bed)
    assert bed.ping("a-p1", B4, count=4)
    assert iperf(bed) > 10_000_000
    after = snapshot(bed)
    assert moved(before, after, "vpc", "vxlan") >= 4 + 100 and moved(before, after, "vpc", "ipip") >= 4
    assert moved(before, after, "b", "decap") >= 4 + 100 and moved(before, after, "a", "decap") >= 4


@pytest.mark.parametrize("kind", ["vxlan", "ipip"])
def test_unwrapped_packets_for_elsewhere_go_on_through_the_receivers_kernel(bed, kind):
    """A pair whose receiver forwards (a location leader's via-leader traffic): b unwraps what a
    sent for a network behind b (here a veth, standing in for kilo0) and b's kernel routes it on;
    TCP (GSO packets) included."""
    far = bed.ns("far")
    if not netns.exists(far):
        netns.add(far)
        bed.namespaces.append(far)
        netns.veth(bed.ns("b"), "far0", far, "eth0")
        netns.addr(bed.ns("b"), "far0", "10.42.9.1/24")
        netns.addr(far, "eth0", "10.42.9.5/24")
        netns.run(far, ["ip", "route", "add", "default", "via", "10.42.9.1"])
        bed.spawn("far", ["iperf3", "-s", "-p", "5202"])
    me, peer = ip(bed.private("a")), ip(bed.private("b"))
    extra = FastPathEntry(ipaddress.ip_network("10.42.9.0/24"), "direct", None, Encap(kind, me, peer))
    use(bed, kind, kind)
    in_netns(bed.ns("a"), lambda: _load_entries(bed, "a", (*bed.fastpath("a", kind), extra)))
    bed.route_pods("b", "vxlan")  # far's replies to a's pod leave through b's kernel
    before = counters(bed, "b")
    assert bed.ping("a-p1", "10.42.9.5", count=3)
    assert iperf(bed, dst="10.42.9.5", port=5202, server="far") > 10_000_000
    after = counters(bed, "b")
    assert after["decap"] - before["decap"] >= 3 + 100
    assert after["pass"] - before["pass"] >= 3 + 100, "not a local pod: handed to b's kernel"
    bed.route_pods("b", "raw")


def _load_entries(tb: FabricTestbed, node: str, entries) -> None:
    with Datapath.open(node, pin_root=tb.pin_root) as dp:
        dp.attach("eth1", None, ["vp1"], pods=discovery.pod_routes(["vp1"]), private4=discovery.private_ipv4("eth1"))
        dp.sync(entries, "eth1")


def has_ipip(bed: FabricTestbed) -> bool:
    """Whether this kernel makes ipip devices (this host's 6.18 has no module for it; Debian's have)."""
    return bool(in_netns(bed.ns("a"), lambda: kernel_has("ipip")))


def test_the_ipip_fallback_takes_what_the_kernel_has(bed):
    v4 = [e for e in bed.fastpath("a", "ipip") if e.prefix.version == 4]  # the kernel's ipip carries IPv4
    diff = in_netns(bed.ns("a"), lambda: EncapApplier("eth1").sync(v4))
    try:
        if has_ipip(bed):
            assert f"ipip device {IPIP_DEV}" in diff.added and not diff.unavailable, diff
        else:
            assert any(u.startswith("ipip 10.42.2.0/24: this kernel has no ipip device") for u in diff.unavailable)
            assert not diff.added
        # a restarted agent's applier finds the same (its probe must not take our device for absence)
        again = in_netns(bed.ns("a"), lambda: EncapApplier("eth1").sync(v4))
        assert not again.added and not again.removed and again.unavailable == diff.unavailable, again
    finally:
        in_netns(bed.ns("a"), lambda: EncapApplier("eth1").sync([]))


def test_what_the_programs_leave_to_the_kernel_still_reaches_the_peer_on_an_ipip_pair(bed):
    """On an ipip pair the kernel carries, over its ipip device (or its VXLAN device where it has no
    ipip), what the programs hand it: here
    oversize packets without DF, which a's kernel fragments (a service reply would take the same
    way), and b's programs unwrap into the pod."""
    use(bed, "ipip", "ipip")
    ipip = has_ipip(bed)  # else the kernel carries the pair over its VXLAN device
    try:
        for node in ("a", "b"):
            diff = in_netns(bed.ns(node), lambda node=node: EncapApplier("eth1").sync(
                [e for e in bed.fastpath(node, "ipip") if e.prefix.version == 4], fastpath=True))
            assert diff.substituted == ([] if ipip else [f"ipip 10.42.{2 if node == 'a' else 1}.0/24: over vxlan "
                                                         "(this kernel has no ipip device)"]) and not diff.unavailable
        bed.sh("a-p1", ["ip", "route", "flush", "cache"])  # no path MTU learnt by earlier tests
        before, vpc, before_b = counters(bed, "a"), bed.vpc_counters(), counters(bed, "b")
        # One way: the echo replies would meet b's `ct state invalid drop` (b's conntrack never saw the
        # requests, which its programs delivered), as any reply of a flow the programs started would.
        bed.sh("a-p1", ["ping", "-c", "3", "-i", "0.2", "-W", "1", "-M", "dont", "-s", "1472", B4], check=False)
        after, after_b = counters(bed, "a"), counters(bed, "b")
        assert after["pass"] - before["pass"] >= 3 and after["encap"] == before["encap"], "left to a's kernel"
        wire = "ipip" if ipip else "vxlan"
        assert bed.vpc_counters()[wire] - vpc[wire] >= 2 * 3, f"each fragment crossed the VPC in {wire}"
        assert bed.vpc_counters()["dropped"] == vpc["dropped"]
        assert after_b["decap"] - before_b["decap"] >= 6 and after_b["peer"] - before_b["peer"] >= 6, "into b's pod"
    finally:
        for node in ("a", "b"):
            in_netns(bed.ns(node), lambda: EncapApplier("eth1").sync([]))


def test_a_vxlan_port_held_by_another_device_is_reported_not_raised(bed):
    bed.sh("a", ["ip", "link", "add", "eaother", "type", "vxlan", "external", "dstport", "4789"])
    bed.sh("a", ["ip", "link", "set", "eaother", "up"])
    try:
        diff = in_netns(bed.ns("a"), lambda: EncapApplier("eth1").sync(
            [e for e in bed.fastpath("a", "vxlan") if e.prefix.version == 4]))
        [u] = diff.unavailable
        assert u.startswith("vxlan 10.42.2.0/24: device meshvx0: ") and "in use" in u, u
        assert bed.sh("a", ["ip", "link", "show", "meshvx0"], check=False).returncode != 0, "no half-made device"
    finally:
        bed.sh("a", ["ip", "link", "del", "eaother"], check=False)


def test_a_kernel_vxlan_sender_reaches_a_fast_path_receiver(bed):
    """a in kernel-routes mode (programs unloaded, the fallback's VXLAN device), b still on the
    fast path: b unwraps what a's kernel built."""
    use(bed, "vxlan", "vxlan")
    in_netns(bed.ns("a"), lambda: Datapath.unload("a", pin_root=bed.pin_root))
    bed.route_pods("a", "vxlan")
    before_b, vpc = counters(bed, "b"), bed.vpc_counters()
    assert bed.ping("a-p1", B4, count=4)
    assert iperf(bed) > 10_000_000
    after_b = counters(bed, "b")
    assert after_b["decap"] - before_b["decap"] >= 4 + 100
    assert after_b["peer"] - before_b["peer"] >= 4 + 100
    assert bed.vpc_counters()["vxlan"] - vpc["vxlan"] >= 2 * 4 + 100


def test_the_kernel_fallback_alone_carries_vxlan_with_pmtu(bed):
    in_netns(bed.ns("b"), lambda: Datapath.unload("b", pin_root=bed.pin_root))
    bed.route_pods("b", "vxlan")
    before = bed.vpc_counters()
    assert bed.ping("a-p1", B4, count=3)
    p = bed.sh("a-p1", ["ping", "-c", "2", "-i", "0.2", "-W", "2", "-M", "do", "-s", "1400", B4], check=False)
    assert p.returncode == 0
    assert iperf(bed) > 10_000_000
    after = bed.vpc_counters()
    assert after["vxlan"] - before["vxlan"] >= 100 and after["dropped"] == before["dropped"]
    # Idempotent: a second pass changes nothing; an empty plan removes the device.
    diff = in_netns(bed.ns("a"), lambda: EncapApplier("eth1").sync(
        [e for e in bed.fastpath("a", "vxlan") if e.prefix.version == 4]))
    assert not diff and not diff.unavailable
    diff = in_netns(bed.ns("a"), lambda: EncapApplier("eth1").sync([]))
    assert "vxlan device meshvx0" in diff.removed
    assert not bed.ping("a-p1", B4, count=1)
