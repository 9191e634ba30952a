# SPDX-License-Identifier: Apache-2.0
"""The route cache (meshctl_maps.h, route_cache): a destination's packets after its first take the
CPU's slot instead of the LPM trie's walk, and every write to the routes map retires every slot, so
no packet follows an entry the plan has changed or removed. BPF_PROG_TEST_RUN, pinned to one CPU
(the cache is per CPU)."""

from __future__ import annotations

import ipaddress
import os

import pytest
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.datapath import layout, libbpf
from meshctl.datapath.maps import FlowFilter
from meshctl.lab.rigs.testrun import PROTO_TCP, PROTO_UDP, frame, run
from meshctl.mesh.plan import FastPathEntry

net = ipaddress.ip_network
ip = ipaddress.ip_address

DIRECT4 = FastPathEntry(net("10.42.2.0/24"), "direct", ip("192.168.0.2"))
TUNNEL4 = FastPathEntry(net("10.42.9.0/24"), "tunnel", None)
DIRECT6 = FastPathEntry(net("fd00:42:2::/64"), "direct", ip("fd00:1::2"))
PLAN = [DIRECT4, TUNNEL4, DIRECT6]
POD = "10.42.1.5"


@pytest.fixture(scope="module")
def dp(unit_dp):
    unit_dp.sync(PLAN, "lo")
    return unit_dp


@pytest.fixture(autouse=True)
def one_cpu(dp):
    """Every test run on one CPU (its slots are that CPU's), and the plan as PLAN afterwards."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(before)})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
        dp.sync(PLAN, "lo")


def send(dp, dst: str) -> str:
    """from_pod's verdict for a packet from a local pod to `dst`."""
    src, proto = ("fd00:42:1::5", PROTO_UDP) if ":" in dst else (POD, PROTO_TCP)
    return run(dp.programs["from_pod"], frame(src, dst, ttl=64, proto=proto)).verdict


def slot_of(dp, dst: str) -> tuple[int, ...]:
    """This CPU's route cache slot for `dst`, decoded (gen, family, addr, then the routes value)."""
    cpu = min(os.sched_getaffinity(0))
    raw = dp.maps._per_cpu(dp.maps.route_cache, layout.route_cache_slot(ip(dst)))[cpu]
    return layout.ROUTE_CACHE_SLOT.unpack(raw)


def forge(dp, dst: str, gen: int, action: str) -> None:
    """Write `dst`'s slot on every CPU: generation `gen`, an entry of `action` (what no trie holds)."""
    d = ip(dst)
    value = layout.route_value(action, 1, None)
    slot = layout.ROUTE_CACHE_SLOT.pack(gen, 4 if d.version == 4 else 6, d.packed.ljust(16, b"\0"),
                                        *layout.ROUTE_VALUE.unpack(value), 0)
    stride = (len(slot) + 7) // 8 * 8
    libbpf.update(dp.maps.route_cache.fd, layout.U32.pack(layout.route_cache_slot(d)),
                  slot.ljust(stride, b"\0") * libbpf.possible_cpus())


def test_the_first_packet_fills_the_slot_and_the_next_ones_find_it(dp):
    gen = dp.maps.flowfilter.routes_gen
    assert gen != 0, "the agent turned the cache on when it opened the datapath"
    before = dp.maps.route_cache_stats()
    assert send(dp, "10.42.2.7") == "redirect"
    assert slot_of(dp, "10.42.2.7")[:3] == (gen, 4, ip("10.42.2.7").packed.ljust(16, b"\0"))
    after = dp.maps.route_cache_stats()
    assert (after.held, after.fills) == (before.held + 1, before.fills + 1)
    assert send(dp, "10.42.2.7") == "redirect"
    assert dp.maps.route_cache_stats() == after, "the second packet took the slot: nothing filled"


def test_a_slot_of_the_current_generation_answers_without_the_trie(dp):
    """A slot forged to say `tunnel` for a direct destination is obeyed: hits skip the trie. The next
    write to the routes map retires it, and the trie's answer comes back."""
    gen = dp.maps.flowfilter.routes_gen
    forge(dp, "10.42.2.8", gen, "tunnel")
    assert send(dp, "10.42.2.8") == "ok"
    dp.maps.route_changed()
    assert send(dp, "10.42.2.8") == "redirect"
    assert slot_of(dp, "10.42.2.8")[0] == gen + 1


def test_a_slot_filled_under_an_older_generation_is_never_taken(dp):
    """A program that read the generation before the agent's write and filled its slot after it
    tagged the slot with the older generation: the slot is passed over."""
    gen = dp.maps.flowfilter.routes_gen
    forge(dp, "10.42.2.9", gen - 1 or 0xFFFFFFFF, "tunnel")
    assert send(dp, "10.42.2.9") == "redirect"


CHANGES = [
    # (case, destination, plan before, plan after, verdict after)
    ("direct becomes tunnel", "10.42.2.20", PLAN,
     [FastPathEntry(DIRECT4.prefix, "tunnel", None), TUNNEL4, DIRECT6], "ok"),
    ("tunnel becomes direct", "10.42.9.20", PLAN,
     [DIRECT4, FastPathEntry(TUNNEL4.prefix, "direct", ip("192.168.0.9")), DIRECT6], "redirect"),
    ("the entry is removed", "10.42.2.21", PLAN, [TUNNEL4, DIRECT6], "ok"),
    ("a longer prefix covers it", "10.42.2.200", PLAN,
     [*PLAN, FastPathEntry(net("10.42.2.128/25"), "tunnel", None)], "ok"),
    ("a new entry where none was", "10.42.77.1", PLAN,
     [*PLAN, FastPathEntry(net("10.42.77.0/24"), "direct", ip("192.168.0.7"))], "redirect"),
    ("IPv6: direct becomes tunnel", "fd00:42:2::20", PLAN,
     [DIRECT4, TUNNEL4, FastPathEntry(DIRECT6.prefix, "tunnel", None)], "ok"),
]


@pytest.mark.parametrize(("case", "dst", "before", "after", "verdict"), CHANGES, ids=[c[0] for c in CHANGES])
def test_every_change_to_the_routes_map_reaches_the_next_packet(dp, case, dst, before, after, verdict):
    dp.sync(before, "lo")
    first = send(dp, dst)
    send(dp, dst)  # now from the slot, where the destination has an entry
    dp.sync(after, "lo")
    assert send(dp, dst) == verdict, case
    assert first != verdict, f"{case}: the case must change the verdict"


def test_a_write_beside_the_plan_through_sync_routes_reaches_the_next_packet(dp):
    """NodeMaps.sync_routes (the tests' and benches' way to write routes beside Datapath.stage)
    retires the cache as the agent's writes do. A bare Map.sync does not: the slot filled before it
    keeps answering on that CPU, which is how a test that wrote a temporary /32 left another
    test's packets on the wrong encapsulation, on whichever CPU the temporary entry's packet ran."""
    dst = "10.42.2.40"
    before = dp.maps.routes.items()
    host = layout.route_table([FastPathEntry(net(f"{dst}/32"), "tunnel", None)], 1)
    assert send(dp, dst) == "redirect"
    dp.maps.routes.sync({**before, **host})
    assert send(dp, dst) == "redirect", "the bare write: the slot still answers"
    dp.maps.sync_routes({**before, **host})
    assert send(dp, dst) == "ok", "sync_routes retired the slot: the /32's tunnel"
    dp.maps.sync_routes(before)
    assert send(dp, dst) == "redirect"


def test_two_destinations_of_one_slot_each_get_their_own_entry(dp):
    a = "10.42.2.30"
    slot = layout.route_cache_slot(ip(a))
    b = next(str(d) for d in net("10.42.9.0/24").hosts() if layout.route_cache_slot(d) == slot)
    for _ in range(3):
        assert (send(dp, a), send(dp, b)) == ("redirect", "ok")


def test_on_a_weakly_ordered_machine_the_cache_stays_off(dp):
    """Off (generation 0, where the agent's stores may be seen out of order): no slot is filled and
    every packet walks the trie."""
    arm = FlowFilter(dp.maps.flowfilter.map, machine="aarch64")
    try:
        arm.retire_route_cache()
        assert dp.maps.flowfilter.routes_gen == 0
        assert dp.maps.route_cache_stats().held == 0
        for _ in range(2):
            assert (send(dp, "10.42.2.40"), send(dp, "fd00:42:2::40")) == ("redirect", "redirect")
        assert slot_of(dp, "10.42.2.40")[0] != 0 or slot_of(dp, "10.42.2.40")[1] == 0
        assert dp.maps.route_cache_stats().held == 0
    finally:
        arm.close()
        dp.maps.route_changed()
    assert dp.maps.flowfilter.routes_gen != 0


def test_datapath_status_shows_the_cache(dp, pin_root):
    send(dp, "10.42.2.50")
    st = dp.status()["route_cache"]
    assert st["generation"] == dp.maps.flowfilter.routes_gen != 0
    assert 1 <= st["held"] <= st["slots"] == layout.ROUTE_CACHE_SLOTS * libbpf.possible_cpus()
    assert st["fills"] >= st["held"]
    r = CliRunner().invoke(main, ["datapath", "status", "--node", dp.node, "--bpf-pin-root", pin_root])
    assert r.exit_code == 0, r.output
    want = (f"  route cache on (generation {st['generation']}), {st['held']} of {st['slots']} slots held; "
            f"{st['fills']} fills")
    assert want in r.stdout.splitlines(), r.stdout
