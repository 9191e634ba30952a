# SPDX-License-Identifier: Apache-2.0
"""BPF_PROG_TEST_RUN of the encapsulated direct paths over an IPv6 underlay (the entries' outer
addresses are IPv6): what from_pod puts on the wire for IPv4 and IPv6 pods (VXLAN over IPv6 with a
zero UDP checksum; IPv4-in-IPv6, next header 4; IPv6-in-IPv6, next header 41), byte by byte; what
from_private accepts and unwraps (only for this node's private IPv6 address, MC_CFG_PRIVATE6),
also as a kernel without the 6.3 decapsulation flags does it; and the path MTU with the 40-byte
outer header."""

from __future__ import annotations

import ipaddress
import struct

import pytest

from meshctl.datapath import Datapath, features, layout
from meshctl.lab.rigs.testrun import PROTO_ICMP, PROTO_UDP, frame, ip_checksum, run
from meshctl.mesh.plan import Encap, FastPathEntry
from meshctl.setns import in_netns
from tests.datapath.conftest import SMALL_MTU

net = ipaddress.ip_network
ip = ipaddress.ip_address

ME, PEER = ip("fd30::1:a1e:301"), ip("fd30::2:a1e:302")
POD4, POD6 = "10.42.1.5", "fd00:42:1::5"
# rung -> (IPv4 pod destination, IPv6 pod destination)
DST = {"vxlan": ("10.46.0.9", "fd00:46::9"), "ipip": ("10.47.0.9", "fd00:47::9")}
PLAN = [
    FastPathEntry(net("10.42.1.0/24"), "local", None),
    *(FastPathEntry(net(d).supernet(new_prefix=24 if "." in d else 64), "direct", None,
                    Encap(kind, ME, PEER))  # type: ignore[arg-type]
      for kind, pair in DST.items() for d in pair),
]
LO = 1  # the loopback's ifindex in every network namespace: the "private NIC" of these runs
ETH_P_IPV6 = b"\x86\xdd"
CASES = [pytest.param(kind, fam, id=f"{kind}6-v{fam}pod") for kind in ("vxlan", "ipip") for fam in (4, 6)]


def configure(dp: Datapath) -> Datapath:
    dp.sync(PLAN, "lo")
    hi, lo = layout.config_addr6(PEER)  # decapsulate as the peer would
    dp.maps.config_set(layout.CFG_PRIVATE6, hi)
    dp.maps.config_set(layout.CFG_PRIVATE6 + 1, lo)
    dp.maps.config_set(layout.CFG_PRIVATE4, 0)  # an IPv6-only underlay
    dp.maps.config_set(layout.CFG_PRIVATE_MTU, SMALL_MTU)
    dp.maps.pods.sync({layout.pod_key(ip(d)): layout.pod_value(LO) for pair in DST.values() for d in pair})
    return dp


@pytest.fixture(scope="module")
def dp(unit_dp):
    return configure(unit_dp)


def pod_frame(kind: str, fam: int, **kw) -> bytes:
    return frame(POD4 if fam == 4 else POD6, DST[kind][0 if fam == 4 else 1], **kw)


def delta(dp, fn):
    before = dp.counters()
    out = fn()
    after = dp.counters()
    return out, {k: (after[k][0] - before[k][0], after[k][1] - before[k][1]) for k in after if after[k] != before[k]}


def outer6(out: bytes) -> dict:
    """The outer IPv6 header of a frame from_pod encapsulated."""
    assert out[12:14] == ETH_P_IPV6, "the outer Ethernet type is IPv6"
    word, plen, nh, hops, src, dst = struct.unpack("!IHBB16s16s", out[14:54])
    return {"version": word >> 28, "tclass": (word >> 20) & 0xFF, "label": word & 0xFFFFF, "plen": plen,
            "nh": nh, "hops": hops, "src": ip(src), "dst": ip(dst)}


def check_inner(inner: bytes, pkt: bytes, fam: int, ttl: int = 63) -> None:
    """The pod packet after the outer headers: unchanged but for its TTL (and IPv4 checksum)."""
    ttl_at = 8 if fam == 4 else 7
    assert inner[:ttl_at] == pkt[14:14 + ttl_at]
    assert inner[ttl_at] == ttl, "the pod packet's TTL is decremented (the node forwards it)"
    skip = 12 if fam == 4 else ttl_at + 1  # IPv4: the header checksum changes with the TTL
    assert inner[skip:] == pkt[14 + skip:]
    if fam == 4:
        assert ip_checksum(inner[:20]) == 0


@pytest.mark.parametrize("fam", [4, 6])
def test_vxlan_over_ipv6_wraps_either_pod_family(dp, fam):
    pkt = pod_frame("vxlan", fam, ttl=64)
    res, moved = delta(dp, lambda: run(dp.programs["from_pod"], pkt))
    assert res.verdict == "redirect" and moved == {"encap": (1, len(pkt))}
    o = outer6(res.out)
    assert (o["version"], o["nh"], o["hops"], o["src"], o["dst"]) == (6, PROTO_UDP, 64, ME, PEER)
    assert o["plen"] == len(pkt) - 14 + layout.VXLAN6_OVERHEAD - 40 == len(res.out) - 54
    assert len(res.out) == len(pkt) + layout.VXLAN6_OVERHEAD
    sport, dport, ulen, csum, flags, vni = struct.unpack("!HHHHII", res.out[54:70])
    assert dport == layout.VXLAN_PORT and 32768 <= sport <= 60999 and ulen == o["plen"]
    assert csum == 0, "zero UDP checksum (RFC 6935): receivers allow it (udp6zerocsumrx)"
    assert (flags, vni >> 8) == (0x08000000, layout.VXLAN_VNI)
    inner_eth = res.out[70:84]
    assert inner_eth[:6].hex(":") == layout.vtep_mac(PEER) == "02:6d:f7:2e:03:00"  # fd300000^0^2^0a1e0302
    assert inner_eth[6:12].hex(":") == layout.vtep_mac(ME)
    assert inner_eth[12:14] == pkt[12:14]
    check_inner(res.out[84:], pkt, fam)


@pytest.mark.parametrize("fam,nh", [(4, 4), (6, 41)])
def test_ipip_over_ipv6_is_4in6_for_ipv4_pods_and_6in6_for_ipv6_pods(dp, fam, nh):
    pkt = pod_frame("ipip", fam, ttl=64)
    res, moved = delta(dp, lambda: run(dp.programs["from_pod"], pkt))
    assert res.verdict == "redirect" and moved == {"encap": (1, len(pkt))}
    o = outer6(res.out)
    assert (o["version"], o["nh"], o["hops"], o["src"], o["dst"]) == (6, nh, 64, ME, PEER)
    assert o["plen"] == len(pkt) - 14 and len(res.out) == len(pkt) + layout.IPIP6_OVERHEAD
    check_inner(res.out[54:], pkt, fam)


def test_the_outer_header_copies_the_traffic_class_and_labels_the_flow(dp):
    tos = 0xB8  # EF
    pkt = bytearray(pod_frame("ipip", 4, ttl=64))
    pkt[15] = tos
    pkt[24:26] = b"\0\0"
    pkt[24:26] = struct.pack("!H", ip_checksum(bytes(pkt[14:34])))
    o = outer6(run(dp.programs["from_pod"], bytes(pkt)).out)
    assert o["tclass"] == tos
    other = frame(POD4, DST["ipip"][0], sport=40001)
    labels = {o["label"], outer6(run(dp.programs["from_pod"], other).out)["label"]}
    assert len(labels) == 2, "a flow label from the flow hash: two flows, two labels"


def wire(dp: Datapath, kind: str, fam: int) -> tuple[bytes, bytes]:
    pkt = pod_frame(kind, fam, ttl=64)
    return pkt, run(dp.programs["from_pod"], pkt).out


def check_unwrapped(dp: Datapath, kind: str, fam: int) -> None:
    pkt, w = wire(dp, kind, fam)
    res, moved = delta(dp, lambda: run(dp.programs["from_private"], w))
    assert res.verdict == "redirect"
    assert moved == {"decap": (1, len(w)), "peer": (1, len(w))}
    assert res.out[12:14] == pkt[12:14], "the Ethernet type is the pod packet's again"
    assert len(res.out) == len(pkt)
    check_inner(res.out[14:], pkt, fam, ttl=62)


@pytest.mark.parametrize("kind,fam", CASES)
def test_the_receiver_unwraps_every_rung_and_pod_family_into_the_pod(dp, kind, fam):
    """What from_pod built is what from_private accepts: IPv6 outer, either pod family."""
    check_unwrapped(dp, kind, fam)


def test_the_receiver_leaves_what_is_not_for_it_to_the_kernel(dp):
    _, w = wire(dp, "vxlan", 4)
    other = ip("fd30::9").packed
    cases = {
        "another node's outer address": w[:38] + other + w[54:],
        "another VNI": w[:66] + struct.pack("!I", 7 << 8) + w[70:],
        "another UDP port": w[:56] + struct.pack("!H", 4790) + w[58:],
    }
    _, w4 = wire(dp, "ipip", 4)
    cases["IPv4-in-IPv6 to another node"] = w4[:38] + other + w4[54:]
    for what, pkt in cases.items():
        res, moved = delta(dp, lambda pkt=pkt: run(dp.programs["from_private"], pkt))
        assert res.verdict == "ok" and res.out == pkt, what
        assert moved == {"pass": (1, len(pkt))}, what


def test_a_node_without_a_private_ipv6_address_unwraps_nothing_over_ipv6(dp):
    _, w = wire(dp, "ipip", 6)
    dp.maps.config_set(layout.CFG_PRIVATE6, 0)
    dp.maps.config_set(layout.CFG_PRIVATE6 + 1, 0)
    try:
        res, moved = delta(dp, lambda: run(dp.programs["from_private"], w))
        assert res.verdict == "ok" and moved == {"pass": (1, len(w))}
    finally:
        configure(dp)


@pytest.mark.parametrize("kind", ["vxlan", "ipip"])
def test_the_path_mtu_counts_the_40_byte_ipv6_header(dp, small_mtu_ns, kind):
    """IPv4 DF: "fragmentation needed" with 1500 - 70 (VXLAN) / 1500 - 40 (IP-in-IPv6); from the
    packet's destination, since this node has no private IPv4 address. IPv6: "packet too big"."""
    overhead = layout.overhead(kind, 6)
    dst4, dst6 = DST[kind]
    fits = frame(POD4, dst4, proto=PROTO_ICMP, payload=bytes(1500 - 28 - overhead), df=True)
    res = in_netns(small_mtu_ns, lambda: run(dp.programs["from_pod"], fits))
    assert res.verdict == "redirect" and len(res.out) == 14 + 1500
    big = frame(POD4, dst4, proto=PROTO_ICMP, payload=bytes(1500 - 28 - overhead + 1), df=True)
    res, moved = delta(dp, lambda: in_netns(small_mtu_ns, lambda: run(dp.programs["from_pod"], big)))
    assert res.verdict == "redirect" and moved == {"too_big": (1, len(big))}
    h = res.out[14:34]
    assert ip_checksum(h) == 0 and h[9] == PROTO_ICMP and (ip(h[12:16]), ip(h[16:20])) == (ip(dst4), ip(POD4))
    typ, code, _, _, mtu = struct.unpack("!BBHHH", res.out[34:42])
    assert (typ, code, mtu) == (3, 4, 1500 - overhead)
    big6 = frame(POD6, dst6, proto=PROTO_UDP, payload=bytes(1500 - 48 - overhead + 1))
    res, moved = delta(dp, lambda: in_netns(small_mtu_ns, lambda: run(dp.programs["from_pod"], big6)))
    assert res.verdict == "redirect" and moved == {"too_big": (1, len(big6))}
    typ, code, _, mtu = struct.unpack("!BBHI", res.out[14 + 40:14 + 48])
    assert (typ, code, mtu) == (2, 0, 1500 - overhead)


def test_maps_dump_shows_ipv6_outer_addresses(dp):
    rows = {e["prefix"]: e for e in dp.entries()}
    assert rows["10.47.0.0/24"] == {"prefix": "10.47.0.0/24", "action": "direct", "nexthop": None, "ifname": "lo",
                                    "encap": "ipip", "outer_src": str(ME), "outer_dst": str(PEER)}
    assert rows["fd00:46::/64"]["outer_dst"] == str(PEER)


@pytest.fixture
def old_dp(pin_root, monkeypatch):
    """A node compiled as for a kernel before 6.3: no decapsulation flags, so the pop cannot change
    the IP version (bpf_skb_change_proto first)."""
    monkeypatch.setenv(features.WITHOUT_ENV, "adjust_room_decap_l3")
    features.probe.cache_clear()
    try:
        assert "-DMC_HAVE_ADJ_ROOM_DECAP_L3=0" in features.probe().cflags()
        d = Datapath.open("unit-pre63", pin_root=pin_root)
        assert d.mode == "ebpf", d.reason
        yield configure(d)
        d.close()
        Datapath.unload("unit-pre63", pin_root=pin_root)
    finally:
        monkeypatch.undo()
        features.probe.cache_clear()


def test_before_6_3_the_version_changes_before_the_pop(old_dp):
    """IPv4 inside IPv6 (change_proto pops 20 bytes, the pop 20 fewer) and IPv6 inside IPv6 (no
    version change): byte for byte what the 6.3 flags give."""
    for kind in ("ipip", "vxlan"):
        for fam in (4, 6):
            check_unwrapped(old_dp, kind, fam)
    v4 = FastPathEntry(net("fd00:48::/64"), "direct", None, Encap("ipip", ip("10.30.0.1"), ip("10.30.0.2")))
    old_dp.maps.sync_routes({**old_dp.maps.routes.items(), **layout.route_table([v4], LO)})
    old_dp.maps.config_set(layout.CFG_PRIVATE4, layout.config_addr(ip("10.30.0.2")))
    old_dp.maps.pods.sync({**old_dp.maps.pods.items(), layout.pod_key(ip("fd00:48::9")): layout.pod_value(LO)})
    pkt = frame(POD6, "fd00:48::9", ttl=64)
    w = run(old_dp.programs["from_pod"], pkt).out
    assert w[12:14] == b"\x08\x00" and w[23] == 41, "IPv6 inside IPv4 (6in4)"
    res = run(old_dp.programs["from_private"], w)
    assert res.verdict == "redirect" and res.out[12:14] == ETH_P_IPV6 and len(res.out) == len(pkt)
    check_inner(res.out[14:], pkt, 6, ttl=62)


def test_raw_direct_an_ipv4_pod_may_take_an_ipv6_next_hop_not_the_other_way(dp):
    """RFC 5549: bpf_redirect_neigh resolves an IPv6 next hop for an IPv4 packet. An IPv6 packet
    whose entry names an IPv4 next hop would be sent to a garbage neighbour: the kernel decides."""
    entries = [FastPathEntry(net("10.49.0.0/24"), "direct", PEER),
               FastPathEntry(net("fd00:49::/64"), "direct", ip("10.30.0.2"))]
    before = dp.maps.routes.items()
    dp.maps.sync_routes({**before, **layout.route_table(entries, LO)})
    try:
        pkt = frame(POD4, "10.49.0.9", ttl=64)
        res, moved = delta(dp, lambda: run(dp.programs["from_pod"], pkt))
        assert res.verdict == "redirect" and moved == {"direct": (1, len(pkt))}
        assert res.out[14 + 8] == 63
        pkt6 = frame(POD6, "fd00:49::9", ttl=64)
        res, moved = delta(dp, lambda: run(dp.programs["from_pod"], pkt6))
        assert res.verdict == "ok" and res.out == pkt6 and moved == {"pass": (1, len(pkt6))}
    finally:
        dp.maps.sync_routes(before)


def test_monitor_events_name_the_ipv6_outer_addresses(dp):
    """`meshctl monitor` of an IPv6-underlay pair: the encap event (from_pod) and the decap event
    (from_private) carry the pod addresses and the IPv6 outer ones."""
    from meshctl.datapath import monitor as mon

    pkt, w = wire(dp, "ipip", 4)
    session = mon.Session(dp.pin_dir, mon.parse_filter(None, DST["ipip"][0], "all", "0"))
    try:
        assert run(dp.programs["from_pod"], pkt).verdict == "redirect"
        assert run(dp.programs["from_private"], w).verdict == "redirect"
        events = [mon.decode_event(raw) for raw in session.poll(100)]
    finally:
        session.close()
    by_hook = {e["hook"]: e for e in events}
    sent, got = by_hook["from_pod"], by_hook["from_private"]
    assert (sent["rung"], sent["src"], sent["dst"]) == ("direct+ipip", POD4, DST["ipip"][0])
    assert (sent["outer_src"], sent["outer_dst"]) == (str(ME), str(PEER))
    assert (got["decapsulated"], got["encap"], got["dst"]) == (True, "ipip", DST["ipip"][0])
    assert (got["outer_src"], got["outer_dst"]) == (str(ME), str(PEER))
