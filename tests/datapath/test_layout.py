# SPDX-License-Identifier: Apache-2.0
"""The Python mirror (datapath/layout.py) agrees with bpf/meshctl_maps.h: constants by reading the
header, struct sizes by what the kernel says of the maps bcc created from it."""

from __future__ import annotations

import ipaddress
import re

import pytest

from meshctl.datapath import layout, libbpf
from meshctl.datapath.loader import bpf_dir
from meshctl.errors import MeshError
from meshctl.mesh.plan import Encap, FastPathEntry

ip = ipaddress.ip_address

DEFINES = {m.group(1): int(m.group(2), 0) for m in re.finditer(
    r"^#define (MC_\w+) (0x[0-9a-fA-F]+|\d+)\b", (bpf_dir() / "meshctl_maps.h").read_text(), re.M)}


def test_constants_match_the_header():
    assert DEFINES["MC_LAYOUT_VERSION"] == layout.LAYOUT_VERSION
    assert (DEFINES["MC_ROUTES_MAX"], DEFINES["MC_PODS_MAX"], DEFINES["MC_FLOWS_MAX"]) == (
        layout.ROUTES_MAX, layout.PODS_MAX, layout.FLOWS_MAX)
    assert {a: DEFINES[f"MC_ACT_{a.upper()}"] for a in layout.ACTIONS} == layout.ACTIONS
    assert {e: DEFINES[f"MC_ENCAP_{e.upper()}"] for e in layout.ENCAPS} == layout.ENCAPS
    slots = {k[len("MC_C_"):].lower(): v for k, v in DEFINES.items() if k.startswith("MC_C_")}
    assert [n for n, _ in sorted(slots.items(), key=lambda kv: kv[1])] == list(layout.COUNTERS)
    assert DEFINES["MC_COUNTERS"] == len(layout.COUNTERS)
    assert (DEFINES["MC_CFG_LAYOUT"], DEFINES["MC_CFG_SOURCE_HASH"], DEFINES["MC_CFG_MARK"],
            DEFINES["MC_CFG_CLSACT"], DEFINES["MC_CFG_PRIVATE4"], DEFINES["MC_CFG_PRIVATE6"],
            DEFINES["MC_CONFIG_SLOTS"]) == (
        layout.CFG_LAYOUT, layout.CFG_SOURCE_HASH, layout.CFG_MARK, layout.CFG_CLSACT, layout.CFG_PRIVATE4,
        layout.CFG_PRIVATE6, layout.CONFIG_SLOTS)
    assert layout.CFG_PRIVATE6 + 2 <= layout.CONFIG_SLOTS, "the private IPv6 address takes two slots"


def test_load_time_settings_reach_the_c_as_cflags_only():
    """The loader never edits the source: every setting the header needs is a -D flag, and the
    header refuses to compile without them (or with another layout version)."""
    flags = {f.split("=", 1)[0][2:]: f.split("=", 1)[1] for f in layout.cflags("/sys/fs/bpf/x/n1")}
    assert flags == {"MC_PIN_DIR": '"/sys/fs/bpf/x/n1"', "MC_LOADER_LAYOUT": str(layout.LAYOUT_VERSION),
                     "MC_MARK": hex(layout.MARK), "MC_VXLAN_PORT": str(layout.VXLAN_PORT),
                     "MC_VXLAN_VNI": hex(layout.VXLAN_VNI), "MC_VTEP_OUI": hex(layout.VTEP_OUI),
                     "MC_PROBE_PORT": str(layout.PROBE_PORT)}
    text = (bpf_dir() / "meshctl_maps.h").read_text()
    for name in flags:
        assert f"!defined({name})" in text, name
        assert not re.search(rf"^#define {name}\b", text, re.M), f"{name} is defined in the header too"
    assert "#if MC_LOADER_LAYOUT != MC_LAYOUT_VERSION" in text


def test_struct_sizes_match_the_compiled_maps(unit_dp):
    m = unit_dp.maps
    for name, mp in (("routes", m.routes), ("pods", m.pods), ("flows4", m.flows4), ("flows6", m.flows6),
                     ("flowfilter", m.flowfilter.map), ("route_cache", m.route_cache), ("counters", m.counters_map),
                     ("config", m.config)):
        info = libbpf.map_info(mp.fd)
        assert (info.key_size, info.value_size) == layout.MAP_SIZES[name], name
    assert libbpf.map_info(m.routes.fd).max_entries == layout.ROUTES_MAX
    assert libbpf.map_info(m.route_cache.fd).max_entries == layout.ROUTE_CACHE_SLOTS


def test_encapsulated_route_codec_round_trips():
    enc = Encap("vxlan", ip("10.30.2.1"), ip("10.30.3.1"))
    e = FastPathEntry(ipaddress.ip_network("10.42.3.0/24"), "direct", None, enc)
    [(k, v)] = layout.route_table([e], 4).items()
    r = layout.decode_route(k, v)
    assert (r.entry, r.ifindex, r.entry.rung) == (e, 4, "direct+vxlan")
    ipip = FastPathEntry(e.prefix, "direct", ip("10.30.2.254"), Encap("ipip", ip("10.30.2.1"), ip("10.30.3.1")))
    r = layout.decode_route(*next(iter(layout.route_table([ipip], 4).items())))
    assert (r.entry, r.entry.rung) == (ipip, "direct+ipip")
    # An IPv6 underlay: the outer family is the outer addresses', whatever the pod prefix's.
    for prefix in ("10.42.3.0/24", "fd00:42:3::/64"):
        v6 = FastPathEntry(ipaddress.ip_network(prefix), "direct", None, Encap("ipip", ip("fd10::1"), ip("fd10::2")))
        [(k, v)] = layout.route_table([v6], 4).items()
        assert layout.ROUTE_VALUE.unpack(v)[4] == layout.FAMILY_V6
        assert layout.decode_route(k, v).entry == v6
    with pytest.raises(MeshError, match="outer addresses must be of one family"):
        layout.route_table([FastPathEntry(e.prefix, "direct", None, Encap("ipip", ip("10.0.0.1"), ip("fd00::2")))], 4)
    assert layout.vtep_mac(ip("10.30.3.1")) == "02:6d:0a:1e:03:01"
    assert layout.vtep_mac(ip("fd10::a1e:301")) == "02:6d:f7:0e:03:01", "IPv6: its four words XORed"
    assert layout.vtep_mac(ip("fd10:1::4")) != layout.vtep_mac(ip("fd10:2::4"))


def test_private6_config_round_trips():
    a = ip("fd10:1:2:3::a1e:301")
    hi, lo = layout.config_addr6(a)
    assert layout.CONFIG_VALUE.pack(hi) + layout.CONFIG_VALUE.pack(lo) == a.packed, "packet order in memory"
    assert layout.addr6_from_config(hi, lo) == a
    assert layout.config_addr6(None) == (0, 0) == layout.config_addr6(ip("10.0.0.1"))
    assert layout.addr6_from_config(0, 0) is None


@pytest.mark.parametrize("kind,underlay,bytes_", [("vxlan", 4, 50), ("ipip", 4, 20), ("vxlan", 6, 70),
                                                  ("ipip", 6, 40)])
def test_overhead_per_underlay_family(kind, underlay, bytes_):
    assert layout.overhead(kind, underlay) == bytes_


def test_route_codec_round_trips():
    for prefix, action, nh in (("10.42.2.0/24", "direct", "192.168.0.2"), ("fd42::/48", "tunnel", None),
                               ("10.43.0.0/16", "direct", "fd77::3"), ("0.0.0.0/0", "local", None)):
        net = ipaddress.ip_network(prefix)
        nexthop = ipaddress.ip_address(nh) if nh else None
        table = layout.route_table([FastPathEntry(net, action, nexthop)], 7)
        [(k, v)] = table.items()
        assert k == layout.route_key(net)
        r = layout.decode_route(k, v)
        assert (r.entry, r.ifindex) == (FastPathEntry(net, action, nexthop), 7 if action == "direct" else 0)
    # Next hops of both families with the same integer value stay apart.
    a, b = ipaddress.ip_address("0.0.0.7"), ipaddress.ip_address("::7")
    table = layout.route_table([FastPathEntry(ipaddress.ip_network("10.1.0.0/16"), "direct", a),
                                FastPathEntry(ipaddress.ip_network("10.2.0.0/16"), "direct", b)], 3)
    assert sorted(str(layout.decode_route(k, v).entry.nexthop) for k, v in table.items()) == ["0.0.0.7", "::7"]
