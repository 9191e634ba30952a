# SPDX-License-Identifier: Apache-2.0
"""Map sync and the pinned lifecycle: 100,000 entries, one plan change touching one entry, a
second loader process seeing the same maps, restarts that reopen instead of recompiling, layout
migration, the off switch, and the kernel-routes fallback."""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import time

import pytest

from meshctl.datapath import Datapath, layout, links
from meshctl.lab.rigs import netns
from meshctl.lab.rigs.testrun import frame, run
from meshctl.mesh.plan import FastPathEntry
from meshctl.node import discovery
from meshctl.setns import in_netns
from tests.names import unique

NH = ipaddress.ip_address("192.168.0.2")


def big_plan(n: int = 100_000, base: str = "10.0.0.0") -> list[FastPathEntry]:
    start = int(ipaddress.IPv4Address(base))
    return [FastPathEntry(ipaddress.IPv4Network((start + i * 32, 27)), "direct" if i % 2 else "tunnel",
                          NH if i % 2 else None) for i in range(n)]


def _attach(dp: Datapath, private_if: str, pod_ifs: list[str]) -> int:
    """Attach as the agent does: with the pod routes and private address read in this namespace."""
    return dp.attach(private_if, None, pod_ifs, pods=discovery.pod_routes(pod_ifs),
              private4=discovery.private_ipv4(private_if))


@pytest.fixture
def node(pin_root, request):
    name = request.node.name.replace("_", "-")[:40].strip("-")
    yield name
    Datapath.unload(name, pin_root=pin_root)


@pytest.fixture
def ns_with_veth():
    """A namespace with a veth pair p0/p1 to attach programs to."""
    ns = unique("mds")
    netns.add(ns)
    try:
        netns.run(ns, ["ip", "link", "add", "p0", "type", "veth", "peer", "name", "p1"])
        for d in ("p0", "p1"):
            netns.run(ns, ["ip", "link", "set", d, "up"])
        yield ns
    finally:
        netns.delete(ns)


def test_100k_entries_load_and_route(pin_root, node):
    dp = Datapath.open(node, pin_root=pin_root)
    assert dp.mode == "ebpf", dp.reason
    plan = big_plan()
    t = time.perf_counter()
    stats = dp.sync(plan, "lo")
    took = time.perf_counter() - t
    assert (stats.added, stats.changed, stats.deleted) == (100_000, 0, 0)
    print(f"\n100k-entry sync into an empty map: {took:.2f} s (bench/datapath.py measures it)")
    # Byte for byte what the plan encodes (the batch into the empty map wrote the plan's own rows).
    assert dp.maps.routes.items() == layout.route_table(plan, links.ifindex("lo"))
    # The last entry (odd: direct) routes; the one before it (tunnel) passes.
    last = plan[-1].prefix
    assert run(dp.programs["from_pod"], frame("10.42.1.5", str(last.network_address + 3))).verdict == "redirect"
    assert run(dp.programs["from_pod"], frame("10.42.1.5", str(plan[-2].prefix.network_address + 3))).verdict == "ok"
    # Syncing the same plan again changes nothing.
    assert dp.sync(plan, "lo").total == 0
    dp.close()


def test_one_plan_change_touches_one_entry(pin_root, node):
    dp = Datapath.open(node, pin_root=pin_root)
    plan = big_plan(2000)
    dp.sync(plan, "lo")
    changed = list(plan)
    changed[7] = FastPathEntry(plan[7].prefix, "direct", ipaddress.ip_address("192.168.0.9"))
    s = dp.sync(changed, "lo")
    assert (s.added, s.changed, s.deleted) == (0, 1, 0)
    assert dp.sync(changed, "lo").total == 0
    # Another next hop, then one added and one removed: each is one map operation.
    changed[8] = FastPathEntry(plan[8].prefix, "direct", ipaddress.ip_address("192.168.0.10"))
    s = dp.sync(changed, "lo")
    assert (s.added, s.changed, s.deleted) == (0, 1, 0)
    st = dp.sync(changed[:-1] + [FastPathEntry(ipaddress.ip_network("10.99.0.0/16"), "tunnel", None)], "lo")
    assert (st.added, st.changed, st.deleted) == (1, 0, 1)
    rows = {e["prefix"]: e for e in dp.entries()}
    assert rows[str(plan[7].prefix)]["nexthop"] == "192.168.0.9"
    assert rows[str(plan[8].prefix)]["nexthop"] == "192.168.0.10"
    assert str(plan[-1].prefix) not in rows and "10.99.0.0/16" in rows
    dp.close()
    # A new agent (nothing remembered) diffs against the pinned map itself.
    dp2 = Datapath.open(node, pin_root=pin_root)
    plan2 = changed[:-1] + [FastPathEntry(ipaddress.ip_network("10.99.0.0/16"), "tunnel", None)]
    plan2[0] = FastPathEntry(plan2[0].prefix, "local", None)
    st = dp2.sync(plan2, "lo")
    assert (st.added, st.changed, st.deleted) == (0, 1, 0)
    dp2.close()


def test_a_prefix_listed_twice_keeps_its_last_entry(pin_root, node):
    dp = Datapath.open(node, pin_root=pin_root)
    plan = big_plan(100)
    twice = [*plan, FastPathEntry(plan[3].prefix, "local", None)]
    st = dp.sync(twice, "lo")
    assert (st.added, st.changed, st.deleted) == (100, 0, 0)
    assert layout.decode_route(*_route_of(dp, plan[3].prefix)).entry.action == "local"
    assert dp.sync(twice, "lo").total == 0
    st = dp.sync(plan, "lo")  # the same keys, one value back to the plan's
    assert (st.added, st.changed, st.deleted) == (0, 1, 0)
    assert dp.maps.routes.items() == layout.route_table(plan, links.ifindex("lo"))
    dp.close()


def _route_of(dp: Datapath, prefix: ipaddress.IPv4Network) -> tuple[bytes, bytes]:
    key = layout.route_key(prefix)
    return key, dp.maps.routes.items()[key]


def test_a_second_loader_process_sees_the_same_pinned_maps(pin_root, node):
    dp = Datapath.open(node, pin_root=pin_root)
    dp.sync(big_plan(50), "lo")
    mine = dp.entries()
    code = ("import json,sys; from meshctl.datapath import Datapath; "
            "dp=Datapath.open(sys.argv[1], pin_root=sys.argv[2]); "
            "print(json.dumps({'mode': dp.mode, 'entries': dp.entries(), 'status': dp.status()}))")
    out = subprocess.run([sys.executable, "-c", code, node, pin_root], capture_output=True, text=True, check=True)
    other = json.loads(out.stdout)
    assert other["mode"] == "ebpf"
    assert other["entries"] == mine
    assert other["status"]["compiled"] is False, "a second loader reopens the pinned programs"
    assert other["status"]["programs"] == dp.status()["programs"]
    # What the other process writes, this one reads.
    subprocess.run([sys.executable, "-c", "import sys,ipaddress; from meshctl.datapath import Datapath; "
                    "from meshctl.mesh.plan import FastPathEntry as F; "
                    "dp=Datapath.open(sys.argv[1], pin_root=sys.argv[2]); "
                    "dp.sync([F(ipaddress.ip_network('10.77.0.0/16'),'tunnel',None)], 'lo')", node, pin_root],
                   check=True, capture_output=True)
    assert [e["prefix"] for e in dp.entries()] == ["10.77.0.0/16"]
    dp.close()


def test_restart_reopens_links_and_a_new_source_switches_them(pin_root, node, ns_with_veth):
    def agent():
        dp = Datapath.open(node, pin_root=pin_root)
        _attach(dp, "p0", ["p1"])
        st = dp.status()
        dp.close()
        return st

    first = in_netns(ns_with_veth, agent)
    hooks = {(lk["hook"], lk["ifname"]): lk["prog_id"] for lk in first["links"]}
    assert set(hooks) == {("private-in", "p0"), ("private-out", "p0"), ("pod-in", "p1"), ("pod-out", "p1")}
    again = in_netns(ns_with_veth, agent)
    assert again["compiled"] is False and again["programs"] == first["programs"]
    assert {(lk["hook"], lk["ifname"]): lk["prog_id"] for lk in again["links"]} == hooks
    # A different program source (a new agent version): recompiled, links switched in place.
    dp = Datapath.open(node, pin_root=pin_root)
    dp.maps.config_set(layout.CFG_SOURCE_HASH, 12345)
    dp.close()
    third = in_netns(ns_with_veth, agent)
    assert third["compiled"] is True and third["programs"] != first["programs"]
    for lk in third["links"]:
        assert lk["prog_id"] == third["programs"][links.HOOKS[lk["hook"]][0]]
    # p1 no longer a pod veth: its links go, the private NIC's stay.
    def shrink():
        dp = Datapath.open(node, pin_root=pin_root)
        _attach(dp, "p0", [])
        st = dp.status()
        dp.close()
        return st

    st = in_netns(ns_with_veth, shrink)
    assert {(lk["hook"], lk["ifname"]) for lk in st["links"]} == {("private-in", "p0"), ("private-out", "p0")}


def test_an_old_layout_is_migrated_not_misread(pin_root, node, ns_with_veth):
    def agent():
        dp = Datapath.open(node, pin_root=pin_root)
        _attach(dp, "p0", ["p1"])
        dp.sync(big_plan(10), "p0")
        st = dp.status()
        dp.close()
        return st

    first = in_netns(ns_with_veth, agent)
    dp = Datapath.open(node, pin_root=pin_root)
    dp.maps.config_set(layout.CFG_LAYOUT, 999)  # as if an agent of another layout pinned them
    dp.close()
    dp = Datapath.open(node, pin_root=pin_root)
    st = dp.status()
    assert st["layout"] == layout.LAYOUT_VERSION and st["compiled"] is True
    assert dp.entries() == [], "the old map is not reused"
    assert st["programs"] != first["programs"]
    dp.close()
    # The surviving links were switched to the new programs (none detached).
    after = in_netns(ns_with_veth, lambda: Datapath.open(node, pin_root=pin_root).status())
    assert len(after["links"]) == 4
    for lk in after["links"]:
        assert lk["prog_id"] == after["programs"][links.HOOKS[lk["hook"]][0]]


def test_disabled_removes_the_fast_path(pin_root, node, ns_with_veth):
    def agent(enabled):
        dp = Datapath.open(node, pin_root=pin_root, enabled=enabled)
        if enabled:
            _attach(dp, "p0", ["p1"])
        return dp.mode, dp.reason

    assert in_netns(ns_with_veth, lambda: agent(True)) == ("ebpf", "")
    assert in_netns(ns_with_veth, lambda: agent(False)) == ("kernel-routes", "disabled")
    assert not os.path.exists(f"{pin_root}/{node}")
    out = netns.run(ns_with_veth, ["bpftool", "link", "show"], check=False).stdout
    assert "tcx" not in out or "ifindex" not in out


def test_clsact_fallback_attaches_and_unloads(pin_root, node, ns_with_veth):
    def agent():
        dp = Datapath.open(node, pin_root=pin_root)
        dp._tc_fallback = True  # as on a kernel without tcx
        _attach(dp, "p0", ["p1"])
        dp.close()
        return links.clsact_attached("p0"), links.clsact_attached("p1")

    on_p0, on_p1 = in_netns(ns_with_veth, agent)
    assert set(on_p0) == {"private-in", "private-out"} and set(on_p1) == {"pod-in", "pod-out"}
    in_netns(ns_with_veth, lambda: Datapath.unload(node, pin_root=pin_root))
    assert in_netns(ns_with_veth, lambda: links.clsact_attached("p0") + links.clsact_attached("p1")) == []


def test_clsact_links_are_reported_switched_and_detached_like_tcx(pin_root, node, ns_with_veth):
    def agent():
        dp = Datapath.open(node, pin_root=pin_root)
        dp._tc_fallback = True  # as on a kernel without tcx (5.10, 6.1)
        _attach(dp, "p0", ["p1"])
        first = dp.status()
        reopened = Datapath.pinned(node, pin_root=pin_root).status()  # what `datapath status` shows
        _attach(dp, "p0", [])  # the pod on p1 went away
        after = dp.status()
        dp.close()
        return first, reopened, after

    first, reopened, after = in_netns(ns_with_veth, agent)
    assert first["attach"] == reopened["attach"] == "clsact"
    seen = {(lk["kind"], lk["hook"], lk["ifname"], lk["prog_id"]) for lk in first["links"]}
    progs = first["programs"]
    assert seen == {("clsact", "private-in", "p0", progs["from_private"]), ("clsact", "private-out", "p0",
                    progs["flow_egress"]), ("clsact", "pod-in", "p1", progs["from_pod"]),
                    ("clsact", "pod-out", "p1", progs["flow_egress"])}
    assert reopened["links"] == first["links"]
    assert {lk["hook"] for lk in after["links"]} == {"private-in", "private-out"}
    assert in_netns(ns_with_veth, lambda: links.clsact_attached("p1")) == []
    in_netns(ns_with_veth, lambda: Datapath.unload(node, pin_root=pin_root))
    assert in_netns(ns_with_veth, links.clsact_links) == []


def test_a_resync_on_clsact_changes_only_the_filters_that_differ(pin_root, node, ns_with_veth):
    """A kernel without tcx (5.10, 6.1): the agent attaches again on every resync; it replaces no
    filter that runs its program already, and puts back one that was removed behind its back."""
    def agent():
        dp = Datapath.open(node, pin_root=pin_root)
        dp._tc_fallback = True
        first, again = _attach(dp, "p0", ["p1"]), _attach(dp, "p0", ["p1"])
        links.detach_clsact("pod-in", "p1")  # somebody's `tc filter del`
        repaired = _attach(dp, "p0", ["p1"])
        gone = _attach(dp, "p0", [])
        dp.close()
        return first, again, repaired, gone, links.clsact_attached("p1")

    first, again, repaired, gone, on_p1 = in_netns(ns_with_veth, agent)
    assert (first, again, repaired, gone, on_p1) == (4, 0, 1, 2, [])
    in_netns(ns_with_veth, lambda: Datapath.unload(node, pin_root=pin_root))


def test_without_bcc_the_node_falls_back_to_kernel_routes(pin_root, node, tmp_path):
    fake = tmp_path / "bcc"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('No module named bcc (test)')\n")
    code = ("import json,logging,sys; logging.basicConfig(level=logging.WARNING); "
            "from meshctl.datapath import Datapath; from meshctl.mesh.plan import FastPathEntry; "
            "dp=Datapath.open(sys.argv[1], pin_root=sys.argv[2]); dp2=Datapath.open(sys.argv[1], pin_root=sys.argv[2]);"
            "print(json.dumps([dp.mode, dp.reason, dp.sync([], 'lo').total, dp.counters(), dp.entries()]))")
    # no bcc and no compiled object in the cache (a cached one loads without bcc: test_objcache)
    env = dict(os.environ, PYTHONPATH=str(tmp_path), MESHCTL_BPF_CACHE=str(tmp_path / "empty-cache"))
    p = subprocess.run([sys.executable, "-c", code, node, pin_root], capture_output=True, text=True, env=env,
                       check=True)
    mode, reason, total, counters, entries = json.loads(p.stdout)
    assert mode == "kernel-routes" and "bcc" in reason
    assert (total, counters, entries) == (0, {}, [])
    assert p.stderr.count("WARNING") == 1, "said once, loudly"


def test_compiling_happens_in_a_child_so_the_agent_never_loads_bcc(pin_root, node):
    # VmHWM: this process's peak resident memory (ru_maxrss would include the forking parent's).
    code = ("import json,re,sys; from meshctl.datapath import Datapath; "
            "dp=Datapath.open(sys.argv[1], pin_root=sys.argv[2]); "
            "hwm=int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)); "
            "print(json.dumps([dp.mode, dp.status()['compiled'], 'bcc' in sys.modules, hwm // 1024]))")
    p = subprocess.run([sys.executable, "-c", code, node, pin_root], capture_output=True, text=True, check=True)
    mode, compiled, bcc_loaded, rss_mb = json.loads(p.stdout)
    assert (mode, compiled, bcc_loaded) == ("ebpf", True, False)
    assert rss_mb < 100, f"the agent process peaked at {rss_mb} MB"
