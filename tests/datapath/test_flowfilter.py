# SPDX-License-Identifier: Apache-2.0
"""The flow filter in front of the flow LRUs (meshctl_maps.h, flowfilter): a tracked flow's reply
still goes to the kernel, an untracked one takes the fast path without the LRU lookup, the
agent's rebuild clears the slots of flows the LRU no longer holds and keeps those recorded while
it runs, and programs just replaced look every tuple up until the rebuild after their links."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

import pytest
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.datapath import Datapath, layout, libbpf
from meshctl.lab.rigs.testrun import PROTO_TCP, PROTO_UDP, frame, run
from meshctl.mesh.plan import FastPathEntry

net = ipaddress.ip_network
ip = ipaddress.ip_address

PLAN = [
    FastPathEntry(net("10.42.1.0/24"), "local", None),
    FastPathEntry(net("10.42.2.0/24"), "direct", ip("192.168.0.2")),
    FastPathEntry(net("fd00:42:2::/64"), "direct", ip("fd00:1::2")),
]
POD4, PEER4 = "10.42.1.5", "10.42.2.7"        # a local pod, a pod of a direct peer
POD6, PEER6 = "fd00:42:1::5", "fd00:42:2::9"


@pytest.fixture(scope="module")
def node(unit_dp):
    unit_dp.sync(PLAN, "lo")
    unit_dp.maps.pods.sync({layout.pod_key(ip(a)): layout.pod_value(1) for a in (POD4, POD6)})
    return unit_dp


@pytest.fixture
def dp(node):
    """The node with empty flow LRUs and the filter rebuilt from them (on, no slot set)."""
    node.maps.flows4.sync({})
    node.maps.flows6.sync({})
    stats = node.rebuild_flow_filter()
    assert (stats.flows, node.maps.flowfilter.filled()) == (0, 0)
    assert node.maps.flowfilter.active in (1, 2)
    return node


def key(src: str, dst: str, sport: int, dport: int, proto: int = PROTO_TCP) -> bytes:
    return layout.flow_key(ip(src), ip(dst), sport, dport, proto)


def outcome(dp, prog: str, pkt: bytes) -> tuple[str, set[str]]:
    """The verdict and the counters the packet moved."""
    before = dp.counters()
    verdict = run(dp.programs[prog], pkt).verdict
    after = dp.counters()
    return verdict, {k for k in after if after[k] != before[k]}


@pytest.mark.parametrize("src,dst,proto", [
    (PEER4, POD4, PROTO_TCP), (PEER4, POD4, PROTO_UDP), (PEER6, POD6, PROTO_TCP),
], ids=["IPv4 TCP", "IPv4 UDP", "IPv6 TCP"])
def test_the_programs_and_the_agent_put_a_flow_in_the_same_slot(dp, src, dst, proto):
    # A flow into the pod through the kernel: the egress tracker records its reply's tuple.
    run(dp.programs["flow_egress"], frame(src, dst, sport=50000, dport=80, proto=proto))
    reply = key(dst, src, 80, 50000, proto)
    assert reply in dp.maps.flows4.items() or reply in dp.maps.flows6.items()
    ff = dp.maps.flowfilter
    assert ff.filled() == 1, "one flow, one slot"
    assert ff.may_hold(reply), "the slot the programs set is the one the agent computes"
    other = key(dst, src, 80, 50001, proto)
    assert layout.flow_slot(other) != layout.flow_slot(reply)
    assert not ff.may_hold(other)


@pytest.mark.parametrize("prog,inbound,reply,untracked,fast", [
    ("from_pod", (PEER4, POD4, 50000, 80), (POD4, PEER4, 80, 50000), (POD4, PEER4, 80, 50001), "direct"),
    ("from_pod", (PEER6, POD6, 50000, 80), (POD6, PEER6, 80, 50000), (POD6, PEER6, 80, 50001), "direct"),
    ("from_private", (POD4, PEER4, 40001, 8080), (PEER4, POD4, 8080, 40001), (PEER4, POD4, 8080, 40002), "peer"),
], ids=["NodePort reply from the pod, IPv4", "NodePort reply from the pod, IPv6", "NATed client's reply into the pod"])
def test_a_tracked_flows_reply_goes_to_the_kernel_and_an_untracked_one_takes_the_fast_path(
        dp, prog, inbound, reply, untracked, fast):
    s, d, sp, dpt = inbound
    run(dp.programs["flow_egress"], frame(s, d, sport=sp, dport=dpt))
    s, d, sp, dpt = reply
    assert outcome(dp, prog, frame(s, d, sport=sp, dport=dpt)) == ("ok", {"flow"})
    s, d, sp, dpt = untracked
    assert not dp.maps.flowfilter.may_hold(key(s, d, sp, dpt)), "the filter proves it untracked: no LRU lookup"
    assert outcome(dp, prog, frame(s, d, sport=sp, dport=dpt)) == ("redirect", {fast})


def test_a_clear_slot_skips_the_lookup_and_a_filter_that_is_off_looks_every_tuple_up(dp):
    """A tuple in the LRU without its slot (what programs before the filter recorded) shows what
    the programs trust: with the filter on they skip the lookup and miss it; off, they find it; the
    rebuild gives it its slot."""
    k = key(POD4, PEER4, 80, 50000)
    libbpf.update(dp.maps.flows4.fd, k, layout.FLOW_VALUE.pack(1))
    reply = frame(POD4, PEER4, sport=80, dport=50000)
    assert outcome(dp, "from_pod", reply) == ("redirect", {"direct"})
    dp.maps.flowfilter.turn_off()
    assert dp.maps.flowfilter.may_hold(key(POD4, PEER4, 80, 50001)), "off: every tuple may be tracked"
    assert outcome(dp, "from_pod", reply) == ("ok", {"flow"})
    assert dp.rebuild_flow_filter().flows == 1
    assert dp.maps.flowfilter.active in (1, 2)
    assert outcome(dp, "from_pod", reply) == ("ok", {"flow"})


def test_on_a_weakly_ordered_machine_the_filter_stays_off_and_every_tuple_is_looked_up(dp):
    """Python issues no store fence, so on arm64 the switch of `active` could be seen before the
    slots it publishes: there the rebuild leaves the filter off and a tracked reply still finds
    its flow through the lookup."""
    from meshctl.datapath.maps import FlowFilter

    k = key(POD4, PEER4, 80, 50000)
    libbpf.update(dp.maps.flows4.fd, k, layout.FLOW_VALUE.pack(1))
    arm = FlowFilter(dp.maps.flowfilter.map, machine="aarch64")
    try:
        assert not arm.enabled and dp.maps.flowfilter.enabled  # this machine (x86_64) orders stores
        assert arm.rebuild(dp.maps.flows4, dp.maps.flows6).slots == 0
        assert arm.active == 0 and arm.may_hold(key(POD4, PEER4, 80, 50001))
        assert outcome(dp, "from_pod", frame(POD4, PEER4, sport=80, dport=50000)) == ("ok", {"flow"})
    finally:
        arm.close()


def test_after_a_rebuild_the_slot_of_a_flow_the_lru_no_longer_holds_is_clear(dp):
    gone, kept = (PEER4, POD4, 50000, 80), (PEER4, POD4, 50001, 80)
    for s, d, sp, dpt in (gone, kept):
        run(dp.programs["flow_egress"], frame(s, d, sport=sp, dport=dpt))
    gone_key, kept_key = key(POD4, PEER4, 80, 50000), key(POD4, PEER4, 80, 50001)
    libbpf.delete(dp.maps.flows4.fd, gone_key)  # as the LRU evicts it
    ff = dp.maps.flowfilter
    assert ff.may_hold(gone_key), "until the rebuild its slot stays set ..."
    gone_reply = frame(POD4, PEER4, sport=80, dport=50000)
    assert outcome(dp, "from_pod", gone_reply) == ("redirect", {"direct"}), "... which only costs the LRU lookup"
    active = ff.active
    stats = dp.rebuild_flow_filter()
    assert (stats.flows, stats.slots, ff.filled()) == (1, 1, 1)
    assert ff.active == 3 - active, "the other half"
    assert not ff.may_hold(gone_key)
    assert ff.may_hold(kept_key)
    assert outcome(dp, "from_pod", frame(POD4, PEER4, sport=80, dport=50001)) == ("ok", {"flow"})
    assert outcome(dp, "from_pod", gone_reply) == ("redirect", {"direct"})


class RecordsWhileRead:
    """A flow LRU whose keys are read while the programs record a new flow, which the keys read
    miss (its insert lands after the read passed its bucket)."""

    def __init__(self, dp, lru, pkt: bytes) -> None:
        self.dp, self.lru, self.pkt = dp, lru, pkt

    def items(self) -> Mapping[bytes, bytes]:
        before = self.lru.items()
        run(self.dp.programs["flow_egress"], self.pkt)
        return before


def test_a_flow_recorded_while_the_agent_rebuilds_keeps_its_slot(dp):
    run(dp.programs["flow_egress"], frame(PEER4, POD4, sport=50000, dport=80))
    racing = RecordsWhileRead(dp, dp.maps.flows4, frame(PEER4, POD4, sport=50002, dport=80))
    stats = dp.maps.flowfilter.rebuild(racing, dp.maps.flows6)
    assert stats.flows == 1, "the keys read lack the flow recorded meanwhile"
    assert dp.maps.flowfilter.may_hold(key(POD4, PEER4, 80, 50002)), "the programs set its slot after the zeroing"
    assert outcome(dp, "from_pod", frame(POD4, PEER4, sport=80, dport=50002)) == ("ok", {"flow"})


def test_datapath_status_shows_the_tracked_flows_and_the_filter(dp, pin_root):
    run(dp.programs["flow_egress"], frame(PEER4, POD4, sport=50000, dport=80))
    run(dp.programs["flow_egress"], frame(PEER6, POD6, sport=50000, dport=80))
    st = dp.status()
    assert (st["flows"], st["flow_filter"]) == (2, {"on": True, "slots_set": 2, "slots": layout.FLOWFILTER_SLOTS})
    r = CliRunner().invoke(main, ["datapath", "status", "--node", dp.node, "--bpf-pin-root", pin_root])
    assert r.exit_code == 0, r.output
    assert f"  2 tracked flows; flow filter on, 2 of {layout.FLOWFILTER_SLOTS} slots set" in r.stdout.splitlines()
    dp.maps.flowfilter.turn_off()
    r = CliRunner().invoke(main, ["datapath", "status", "--node", dp.node, "--bpf-pin-root", pin_root])
    assert "  2 tracked flows; flow filter off (every tuple looked up)" in r.stdout.splitlines(), r.stdout


def test_new_programs_cover_the_flows_the_programs_before_them_recorded(pin_root):
    """Programs replaced (another source): the flows the programs before recorded have no slot
    (here: written into the LRU directly) until the rebuild that opening makes once the links run
    the new programs; until then the filter is off."""
    dp = Datapath.open("ffup", pin_root=pin_root)
    try:
        assert dp.mode == "ebpf", dp.reason
        dp.sync(PLAN, "lo")
        k = key(POD4, PEER4, 80, 50000)
        libbpf.update(dp.maps.flows4.fd, k, layout.FLOW_VALUE.pack(1))
        assert not dp.maps.flowfilter.may_hold(k), "on, and the slot missing: the hazard"
        dp.maps.config_set(layout.CFG_SOURCE_HASH, 1)
        dp.close()
        dp = Datapath.open("ffup", pin_root=pin_root)
        assert dp.status()["compiled"] is True
        assert dp.maps.flowfilter.active in (1, 2)
        assert dp.maps.flowfilter.may_hold(k)
        assert run(dp.programs["from_pod"], frame(POD4, PEER4, sport=80, dport=50000)).verdict == "ok"
    finally:
        dp.close()
        Datapath.unload("ffup", pin_root=pin_root)
