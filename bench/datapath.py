# SPDX-License-Identifier: Apache-2.0
"""Datapath benchmark: the eBPF fast path against plain kernel routing and wireguard-go.

    .venv/bin/python bench/datapath.py [--rounds 9] [--seconds 3] [--rr-rounds 30] [--json out.json]
    .venv/bin/python bench/datapath.py --against REV [--rounds 9]   # 2. and 3. only, side by side
    .venv/bin/python bench/datapath.py --parts [--rounds 7]         # from_pod with each part taken out

1. Pod-to-pod TCP throughput (iperf3, one stream) and request/response latency (1-byte TCP
   ping-pong over one connection) between two namespace nodes on one private bridge, in three
   modes measured side by side and alternating round by round: `fastpath` (programs loaded),
   `kernel` (programs unloaded: the same kernel routes), `wireguard-go` (pod routes through a
   wireguard-go tunnel between the nodes). Medians and min..max over the rounds. The ping-pong
   client and server are pinned to CPU 0 (see traffic()); iperf3 is not.
2. BPF_PROG_TEST_RUN ns/packet of each program outcome with 3 and with 100,000 routes.
3. Map sync time: 100,000 entries into an empty map, a no-op resync, a one-entry change; and the
   kernel's batch update of the same 100,000 entries alone (the floor of the first).

With --against REV, 2. and 3. are measured for this tree and for revision REV (`git archive` into
a temporary directory) in two long-lived worker processes, one round each in turn (the order
alternating), next to the calibration lines; the report gives each figure side by side, the
direct decision at 100,000 entries over the bare LPM lookup, and sync over batch update alone.

With --parts, from_pod at 100,000 entries as shipped and in copies of this tree with one part of
the direct decision taken out (VARIANTS), next to the calibration, which builds the same decision
up from its parts.

Runs as root; everything it makes is prefixed mdpb<pid>- and removed at the end, pass or fail.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# A worker of --against imports the package of the tree it measures (TREE_ENV), not this one's.
sys.path.insert(0, str(Path(os.environ.get("MDPB_TREE") or Path(__file__).resolve().parents[1]) / "ctl"))

from meshctl.datapath import Datapath, layout, links, loader
from meshctl.lab.rigs import netns
from meshctl.lab.rigs.testbed import PODS, PRIVATE, Testbed
from meshctl.lab.rigs.testrun import PROTO_TCP, frame, ns_per_packet, run
from meshctl.mesh.plan import FastPathEntry
from meshctl.node import discovery
from meshctl.setns import in_netns

TREE_ENV = "MDPB_TREE"  # the tree a worker of --against measures (read at the sys.path line above)
RUN_ENV = "MDPB_RUN"  # a worker of --against takes its parent's run name (and so its pin root)


def run_names(tag: str) -> tuple[str, str, dict[str, str]]:
    """A benchmark run's names: `tag` and this PID, its BPF pin root, its two nodes' WireGuard devices."""
    run = os.environ.get(RUN_ENV) or f"{tag}{os.getpid() % 10000}"
    return run, f"/sys/fs/bpf/{run}", {n: f"wg{run}{n}"[:15] for n in ("a", "b")}


RUN, PIN_ROOT, WG = run_names("mdpb")
WG_IP = {"a": "10.5.0.1", "b": "10.5.0.2"}
WG_PORT = 51900

PINGPONG_SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(8)
while True:
    c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while True:
        b = c.recv(1)
        if not b:
            break
        c.sendall(b)
    c.close()
"""
PINGPONG_CLIENT = """
import socket, sys, time, json
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
n = int(sys.argv[3]); out = []
for i in range(n + 200):
    t = time.perf_counter_ns(); c.sendall(b"x"); c.recv(1); d = time.perf_counter_ns() - t
    if i >= 200:
        out.append(d)
out.sort(); print(json.dumps({"p50_us": out[len(out) // 2] / 1000, "p99_us": out[len(out) * 99 // 100] / 1000}))
"""


def big_plan(n: int, base: str = "100.64.0.0") -> list[FastPathEntry]:
    start = int(ipaddress.IPv4Address(base))
    nh = ipaddress.ip_address("192.168.0.2")
    return [FastPathEntry(ipaddress.IPv4Network((start + i * 32, 27)), "direct" if i % 2 else "tunnel",
                          nh if i % 2 else None) for i in range(n)]


def spread(xs: list[float]) -> dict[str, float]:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


# --- modes ----------------------------------------------------------------------------------


class Modes:
    def __init__(self, tb: Testbed, tmp: Path) -> None:
        self.tb = tb
        self.tmp = tmp
        self.wg_up = False

    def _agent(self, node: str) -> None:
        dp = Datapath.open(node, pin_root=PIN_ROOT)
        if dp.mode != "ebpf":
            raise SystemExit(f"datapath of {node}: {dp.reason}")
        dp.attach("eth1", "kilo0" if node == "a" else None, ["vp1"], pods=discovery.pod_routes(["vp1"]),
                  private4=discovery.private_ipv4("eth1"))
        dp.sync(self.tb.fastpath(node), "eth1")
        dp.close()

    def _routes(self, via_wg: bool) -> None:
        for node, other, net in (("a", "b", "10.42.2.0/24"), ("b", "a", "10.42.1.0/24")):
            if via_wg:
                self.tb.sh(node, ["ip", "route", "replace", net, "dev", WG[node]])
            else:
                self.tb.sh(node, ["ip", "route", "replace", net, "via", PRIVATE[other][0], "dev", "eth1", "onlink"])
        for pod in ("a-p1", "b-p1"):  # forget path MTUs learnt through the tunnel
            self.tb.sh(pod, ["ip", "route", "flush", "cache"])

    def set(self, mode: str) -> None:
        for node in ("a", "b"):
            # Programs off the wire (kernel routing), kept pinned so switching back needs no compile.
            in_netns(self.tb.ns(node), lambda node=node: links.detach_all(f"{PIN_ROOT}/{node}"))
        if mode == "wireguard-go":
            self._wireguard()
            self._routes(True)
            return
        self._routes(False)
        if mode == "fastpath":
            for node in ("a", "b"):
                in_netns(self.tb.ns(node), lambda node=node: self._agent(node))

    def _wireguard(self) -> None:
        if self.wg_up:
            return
        self.tb.wireguard_go(WG, WG_IP, {"a": "10.42.1.0/24", "b": "10.42.2.0/24"},
                             {n: PRIVATE[n][0] for n in WG}, WG_PORT, self.tmp)
        self.wg_up = True

    def down(self) -> None:
        self.tb.wireguard_down(WG)


def iperf(tb: Testbed, seconds: int, dst: str = PODS["b"][0]) -> float:
    """One stream's received Gbit/s from a's pod to `dst` (b's IPv4 pod). A control connection the
    server drops (it happens right after a path change, or after wait_port's probe) is retried
    twice before giving up."""
    for attempt in range(3):
        out = json.loads(tb.sh("a-p1", ["iperf3", "-c", dst, "-p", "5201", "-t", str(seconds), "-J"],
                               check=False, timeout=seconds + 30).stdout or "{}")
        if "end" in out and "error" not in out:
            return out["end"]["sum_received"]["bits_per_second"] / 1e9
        print(f"  iperf3: {out.get('error', 'no result')} (attempt {attempt + 1})", file=sys.stderr)
        time.sleep(1)
    raise SystemExit("iperf3 failed three times")


def latency(tb: Testbed, n: int = 1500, probes: int = 3) -> dict[str, float]:
    """Median over `probes` connections of each one's p50/p99 round trip (a burst of the other
    work sharing the machine spoils one probe, not the round)."""
    runs = [json.loads(tb.sh("a-p1", ["taskset", "-c", "0", "python3", "-c", PINGPONG_CLIENT, PODS["b"][0], "9000",
                                      str(n)], timeout=60).stdout) for _ in range(probes)]
    return {k: statistics.median(r[k] for r in runs) for k in ("p50_us", "p99_us")}


def traffic(tb: Testbed, rounds: int, seconds: int, tmp: Path, rr_rounds: int) -> dict:
    srv = tmp / "pingpong.py"
    srv.write_text(PINGPONG_SERVER)
    tb.spawn("b-p1", ["iperf3", "-s", "-p", "5201"])
    # Client and server of the ping-pong share CPU 0: unpinned, each round trip's latency flips
    # between ~30 and ~150 us with where the scheduler put them (cross-CPU wakeups of idle vCPUs),
    # in every mode alike, which drowns the datapath's own difference.
    tb.spawn("b-p1", ["taskset", "-c", "0", "python3", str(srv), "9000"])
    tb.wait_port("a-p1", PODS["b"][0], 5201)
    modes = Modes(tb, tmp)
    order = ["fastpath", "kernel", "wireguard-go"]
    res: dict[str, dict[str, list[float]]] = {m: {"gbps": [], "p50_us": [], "p99_us": []} for m in order}
    try:
        for r in range(rounds):
            for m in order if r % 2 == 0 else order[::-1]:
                modes.set(m)
                tb.wait_port("a-p1", PODS["b"][0], 5201)
                res[m]["gbps"].append(iperf(tb, seconds))
                print(f"  round {r + 1} {m:<13} {res[m]['gbps'][-1]:7.2f} Gbit/s", file=sys.stderr)
        # Request/response in many short alternating rounds (switching is cheap: links only), so a
        # burst of the machine's other work lands on every mode alike.
        for r in range(rr_rounds):
            for m in order if r % 2 == 0 else order[::-1]:
                modes.set(m)
                tb.wait_port("a-p1", PODS["b"][0], 9000)
                lat = latency(tb, n=1000, probes=1)
                res[m]["p50_us"].append(lat["p50_us"])
                res[m]["p99_us"].append(lat["p99_us"])
            print(f"  rr round {r + 1}: " + ", ".join(f"{m} {res[m]['p50_us'][-1]:.1f}" for m in order) + " us",
                  file=sys.stderr)
    finally:
        modes.set("kernel")
        modes.down()
    return {m: {k: spread(v) for k, v in d.items()} for m, d in res.items()}


# --- BPF_PROG_TEST_RUN and sync -------------------------------------------------------------


BASE_PLAN = (("10.42.1.0/24", "local", None), ("10.42.2.0/24", "direct", "192.168.0.2"),
             ("10.42.9.0/24", "tunnel", None))
DIRECT_100K = "direct (from_pod)"
# The direct decision with every packet walking the trie: the route cache off (a tree without one:
# its direct decision again). What a destination's first packet costs, less the slot's fill.
DIRECT_WALK = "direct, trie walk (route cache off)"


class ProgRig:
    """One tree's programs, loaded under `node`, and the frames of every outcome: measure(label)
    syncs the plan of that label ("3 entries", "100,000 entries") and times each outcome."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.base = [FastPathEntry(ipaddress.ip_network(n), a, ipaddress.ip_address(h) if h else None)
                     for n, a, h in BASE_PLAN]
        self.big = big_plan(100_000 - len(self.base))
        self.dp = Datapath.open(node, pin_root=PIN_ROOT)
        if self.dp.maps is None:
            raise SystemExit(f"datapath of {node}: {self.dp.reason}")
        self.dp.maps.pods.sync({layout.pod_key(ipaddress.ip_address("10.42.1.5")): layout.pod_value(1)})
        self.progs = self.dp.programs
        self.flow_pkt = frame("10.42.1.5", "10.42.2.7", ttl=255, sport=1234, dport=80, proto=PROTO_TCP)
        run(self.progs["flow_egress"], self.flow_pkt)  # the flow exists: the steady-state egress cost
        self.synced = ""

    def cases(self, label: str) -> dict[str, tuple[int, bytes]]:
        big = label != "3 entries"
        direct_dst = str(next(e for e in reversed(self.big) if e.action == "direct").prefix.network_address + 5) \
            if big else "10.42.2.7"
        tunnel_dst = str(next(e for e in reversed(self.big) if e.action == "tunnel").prefix.network_address + 5) \
            if big else "10.42.9.7"
        pod, priv, egress = self.progs["from_pod"], self.progs["from_private"], self.progs["flow_egress"]
        return {
            DIRECT_100K: (pod, frame("10.42.1.5", direct_dst, ttl=255)),
            "tunnel pass (from_pod)": (pod, frame("10.42.1.5", tunnel_dst, ttl=255)),
            "local pass (from_pod)": (pod, frame("10.42.1.6", "10.42.1.9", ttl=255)),
            "miss pass (from_pod)": (pod, frame("10.42.1.5", "8.8.8.8", ttl=255)),
            "peer (from_private)": (priv, frame("10.42.2.7", "10.42.1.5", ttl=255)),
            "tracked flow (flow_egress)": (egress, self.flow_pkt),
        }

    def measure(self, label: str, rounds: int = 15) -> dict[str, float]:
        if self.synced != label:
            self.dp.sync(self.base + self.big if label != "3 entries" else self.base, "lo")
            self.synced = label
        expect = {DIRECT_100K: "redirect", "peer (from_private)": "redirect"}
        row = {}
        for name, (fd, pkt) in self.cases(label).items():
            v = run(fd, pkt).verdict
            if v != expect.get(name, "ok"):
                raise SystemExit(f"{label} {name}: verdict {v}")
            row[name] = ns_per_packet(fd, pkt, rounds=rounds)
        fd, pkt = self.cases(label)[DIRECT_100K]
        row[DIRECT_WALK] = self._without_route_cache(lambda: ns_per_packet(fd, pkt, rounds=rounds))
        return row

    def _without_route_cache(self, measure: Callable[[], float]) -> float:
        """`measure` run with the route cache off, as the agent leaves it on a weakly ordered machine
        (generation 0); the cache on again after. A tree without one just measures."""
        maps = self.dp.maps
        if "route_cache" not in loader.NodeMaps.NAMES or maps is None:
            return measure()
        from meshctl.datapath.maps import FlowFilter

        off = FlowFilter(maps.flowfilter.map, machine="weakly-ordered")
        try:
            off.retire_route_cache()
            return measure()
        finally:
            off.close()
            maps.route_changed()

    def close(self) -> None:
        self.dp.close()
        Datapath.unload(self.node, pin_root=PIN_ROOT)


def prog_timings() -> dict:
    rig = ProgRig(f"{RUN}-progs")
    try:
        return {label: rig.measure(label) for label in ("3 entries", "100,000 entries")}
    finally:
        rig.close()


BARE_LPM = "bare LPM hit, 8-byte key, 100k"
# The direct decision's irreducible parts, built up on the routes map's own key (see calibration()).
LPM24 = "LPM hit, the routes map's 24-byte key, 100k"
LPM24_FLOW = "  + flow LRU lookup (miss)"
LPM24_FLOW_NEIGH = "  + bpf_redirect_neigh"
LPM24_FILTER = "  + flow filter test (slot clear) instead"
LPM24_FILTER_NEIGH = "    + bpf_redirect_neigh"
# The rest of the decision, part by part on top of that floor, with the fast path's own code where
# it is a function of bpf/lib (mc_parse, mc_dec_ttl): cumulative, then alternatives of one part.
PARTS_PARSE = "      same, parsed by mc_parse (lib/pkt.h)"
PARTS_GATE = "        + monitor gate (config lookup)"
PARTS_TTL = "          + TTL decrement and checksum"
PARTS_COUNT = "            + per-CPU counter"
PARTS_MARK = "              + skb->mark: all parts"
PARTS_TTL_HELPER = "          TTL with bpf_l3_csum_replace instead"
PARTS_COUNT_ATOMIC = "            counter: atomic add, array, instead"
PARTS_COUNT_VALUE = "            counter: atomic add in the LPM value"
PARTS = {PARTS_PARSE: b"parts_parse", PARTS_GATE: b"parts_gate", PARTS_TTL: b"parts_ttl", PARTS_COUNT: b"parts_count",
         PARTS_MARK: b"parts_mark", PARTS_TTL_HELPER: b"parts_ttl_helper", PARTS_COUNT_ATOMIC: b"parts_count_atomic",
         PARTS_COUNT_VALUE: b"parts_count_value"}
CALIBRATION = b"""
#include <uapi/linux/if_ether.h>
#include <uapi/linux/in.h>
#include <uapi/linux/ip.h>
#include <uapi/linux/ipv6.h>
#include "meshctl_maps.h"
#include "lib/common.h"
#include "lib/pkt.h"
struct k8 { u32 prefixlen; u32 addr; };
struct k24 { u32 prefixlen; u32 family; u32 addr[4]; };
struct f4 { u32 saddr; u32 daddr; u32 ports; u8 proto; u8 pad[3]; };
BPF_F_TABLE("lpm_trie", struct k8, u64, lpm8, 131072, BPF_F_NO_PREALLOC);
struct v24 { u64 nh; u64 packets; u64 bytes; };
BPF_F_TABLE("lpm_trie", struct k24, struct v24, lpm24, 131072, BPF_F_NO_PREALLOC);
BPF_TABLE("array", u32, u64, config, MC_CONFIG_SLOTS);
BPF_TABLE("percpu_array", u32, struct mc_counter, counters, MC_COUNTERS);
BPF_TABLE("array", u32, struct mc_counter, shared, MC_COUNTERS);
BPF_TABLE("lru_hash", struct f4, u64, flows, 65536);
struct ff { u8 active; u8 pad[7]; u8 slots[2 << 20]; };
BPF_F_TABLE("array", u32, struct ff, filter, 1, BPF_F_MMAPABLE);
static long (*neigh)(u32 ifindex, struct bpf_redir_neigh *params, int plen, u64 flags) =
    (void *)BPF_FUNC_redirect_neigh;
int noop(struct __sk_buff *skb) { return 0; }
int bare_lpm(struct __sk_buff *skb) {
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    if (data + 34 > end) return 0;
    struct k8 k = {32, *(u32 *)(data + 30)};
    return lpm8.lookup(&k) ? 1 : 0;
}
static __always_inline struct v24 *lpm24_hit(struct __sk_buff *skb, struct f4 *f) {
    void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
    if (data + 38 > end) return 0;
    struct k24 k = {64, 4, {*(u32 *)(data + 30)}};
    f->saddr = *(u32 *)(data + 26); f->daddr = k.addr[0]; f->ports = *(u32 *)(data + 34); f->proto = 6;
    return lpm24.lookup(&k);
}
int lpm24_only(struct __sk_buff *skb) { struct f4 f = {}; return lpm24_hit(skb, &f) ? 1 : 0; }
int lpm24_flow(struct __sk_buff *skb) {
    struct f4 f = {};
    if (!lpm24_hit(skb, &f)) return 0;
    return flows.lookup(&f) ? 0 : 1;
}
static __always_inline long redirect(struct v24 *v) {
    struct bpf_redir_neigh nh = {};
    nh.nh_family = 2;
    nh.ipv4_nh = (u32)v->nh;
    return neigh(1, &nh, sizeof(nh), 0);
}
int lpm24_flow_neigh(struct __sk_buff *skb) {
    struct f4 f = {};
    struct v24 *v = lpm24_hit(skb, &f);
    if (!v || flows.lookup(&f)) return 0;
    return redirect(v);
}
/* The fast path's filter test (bpf/lib/flow.h): a multiply-xor hash of the key's two words, one
 * byte of the active half. */
static __always_inline int maybe_tracked(struct f4 *f) {
    u32 zero = 0;
    struct ff *ff = filter.lookup(&zero);
    if (!ff || !ff->active) return 1;
    u64 *w = (u64 *)f, h = (w[0] * 0x9E3779B97F4A7C15ULL ^ w[1]) * 0x9E3779B97F4A7C15ULL;
    u32 half = (u32)(ff->active - 1) & 1;
    return ff->slots[(half << 20) | (u32)(h >> 44)] && flows.lookup(f);
}
int lpm24_filter(struct __sk_buff *skb) {
    struct f4 f __attribute__((aligned(8))) = {};
    if (!lpm24_hit(skb, &f)) return 0;
    return maybe_tracked(&f) ? 0 : 1;
}
int lpm24_filter_neigh(struct __sk_buff *skb) {
    struct f4 f __attribute__((aligned(8))) = {};
    struct v24 *v = lpm24_hit(skb, &f);
    if (!v || maybe_tracked(&f)) return 0;
    return redirect(v);
}
/* The floor after the fast path's parse, then with its other parts (P_*: a constant per program). */
#define P_GATE 1
#define P_TTL 2
#define P_COUNT 4
#define P_MARK 8
#define P_TTL_HELPER 16
#define P_COUNT_ATOMIC 32
#define P_COUNT_VALUE 64
static __always_inline int parts(struct __sk_buff *skb, const int on) {
    if (on & P_GATE) {
        u32 slot = MC_CFG_MONITOR;
        u64 *gate = config.lookup(&slot);
        if (gate && *gate) return 0;
    }
    u32 len = skb->len;
    struct mc_pkt p = {};
    if (mc_parse(skb, &p) < 0 || p.family != MC_FAMILY_V4) return 0;
    struct k24 k = {64, 4, {p.ip4->daddr}};
    struct v24 *v = lpm24.lookup(&k);
    if (!v) return 0;
    struct f4 f __attribute__((aligned(8))) = {p.ip4->saddr, p.ip4->daddr, p.ports.both, p.proto};
    if (maybe_tracked(&f)) return 0;
    if ((on & P_TTL) && mc_dec_ttl(&p) < 0) return 0;
    if (on & P_TTL_HELPER) {
        struct iphdr *ip = p.ip4;
        if (ip->ttl <= 1) return 0;
        u16 *word = (u16 *)&ip->ttl;
        u16 old = *word;
        ip->ttl--;
        if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old, *word, 2) < 0) return 0;
    }
    if (on & P_MARK) skb->mark |= MC_MARK;
    long ret = redirect(v);
    u32 slot = MC_C_DIRECT;
    if (on & P_COUNT) {
        struct mc_counter *c = counters.lookup(&slot);
        if (c) { c->packets += 1; c->bytes += len; }
    }
    if (on & P_COUNT_ATOMIC) {
        struct mc_counter *c = shared.lookup(&slot);
        if (c) { __sync_fetch_and_add(&c->packets, 1); __sync_fetch_and_add(&c->bytes, len); }
    }
    /* An LPM value sits 4 bytes off 8-byte alignment in its trie node (the node header, then the
     * 20-byte key): an 8-byte atomic there that straddles a cache line is a split lock. */
    if (on & P_COUNT_VALUE) { __sync_fetch_and_add(&v->packets, 1); __sync_fetch_and_add(&v->bytes, len); }
    return ret;
}
int parts_parse(struct __sk_buff *skb) { return parts(skb, 0); }
int parts_gate(struct __sk_buff *skb) { return parts(skb, P_GATE); }
int parts_ttl(struct __sk_buff *skb) { return parts(skb, P_GATE | P_TTL); }
int parts_count(struct __sk_buff *skb) { return parts(skb, P_GATE | P_TTL | P_COUNT); }
int parts_mark(struct __sk_buff *skb) { return parts(skb, P_GATE | P_TTL | P_COUNT | P_MARK); }
int parts_ttl_helper(struct __sk_buff *skb) { return parts(skb, P_GATE | P_TTL_HELPER); }
int parts_count_atomic(struct __sk_buff *skb) { return parts(skb, P_GATE | P_TTL | P_COUNT_ATOMIC); }
int parts_count_value(struct __sk_buff *skb) { return parts(skb, P_GATE | P_TTL | P_COUNT_VALUE); }
"""


def calibration() -> dict:
    """The machine's state during this run: the test-run harness alone (a no-op program) and a
    bare LPM lookup (8-byte IPv4 key) at 100,000 entries; under load both rise with ours. Then the
    floor of the direct decision, part by part: the LPM hit on the routes map's 24-byte key, with
    the flow LRU lookup a direct packet needs without the flow filter (a miss, one flow in the
    map), with the neighbour redirect it ends in; and the same with the flow filter's test (its
    slot clear) in place of the LRU lookup. Then the rest of the direct decision on top of the latter,
    part by part (PARTS, cumulative in their order, then one part done another way), parsed with
    this tree's bpf/lib/pkt.h: the parse, the monitor gate, the TTL decrement, the counter, the
    mark. Each frame is run from the same bytes (ns_per_packet), so the TTL never runs out."""
    import socket

    from bcc import BPF

    b = BPF(text=CALIBRATION, cflags=[f"-I{loader.bpf_dir()}", *layout.cflags(f"{PIN_ROOT}/calibration")])
    try:
        plan = big_plan(100_000)
        for name in (b"lpm8", b"lpm24"):
            t = b[name]
            keys = (t.Key * len(plan))()
            for i, e in enumerate(plan):
                addr = socket.htonl(int(e.prefix.network_address))
                if name == b"lpm8":
                    keys[i].prefixlen, keys[i].addr = 27, addr
                else:
                    keys[i].prefixlen, keys[i].family, keys[i].addr[0] = 32 + 27, 4, addr
            t.items_update_batch(keys, (t.Leaf * len(plan))())
        flows = b[b"flows"]
        flows[flows.Key(1, 2, 3, 6)] = flows.Leaf(0)
        ff = b[b"filter"]
        on = ff.Leaf()
        on.active = 1  # half 0, all clear
        ff[ff.Key(0)] = on
        pkt = frame("10.42.1.5", str(plan[-1].prefix.network_address + 5), ttl=255)
        progs = {"no-op program (harness)": (b"noop", "ok"), BARE_LPM: (b"bare_lpm", "1"), LPM24: (b"lpm24_only", "1"),
                 LPM24_FLOW: (b"lpm24_flow", "1"), LPM24_FLOW_NEIGH: (b"lpm24_flow_neigh", "redirect"),
                 LPM24_FILTER: (b"lpm24_filter", "1"), LPM24_FILTER_NEIGH: (b"lpm24_filter_neigh", "redirect"),
                 **{label: (fn, "redirect") for label, fn in PARTS.items()}}
        out = {}
        for label, (fn, want) in progs.items():
            fd = b.load_func(fn, BPF.SCHED_CLS).fd
            if run(fd, pkt).verdict != want:
                raise SystemExit(f"calibration: {fn.decode()} did not take its path")
            out[label] = ns_per_packet(fd, pkt)
        return out
    finally:
        b.cleanup()


def sync_round(node: str, plan: list[FastPathEntry]) -> dict[str, float]:
    """One round of the sync figures, wall seconds (and the process's CPU seconds of the first, all
    of it and without the batch call inside): the plan into an empty map, a no-op resync, one entry
    changed, and the kernel's batch update of the same 100,000 entries (encoded beforehand) into
    the emptied map alone."""
    from meshctl.datapath import libbpf

    dp = Datapath.open(node, pin_root=PIN_ROOT)
    try:
        maps = dp.maps
        assert maps is not None, dp.reason
        out = {}
        in_batch = [0.0]
        batch = libbpf.update_batch

        def timed_batch(*args: Any) -> None:
            c = time.process_time()
            batch(*args)
            in_batch[0] += time.process_time() - c

        libbpf.update_batch = timed_batch  # both trees' maps call it through the module
        try:
            c, t = time.process_time(), time.perf_counter()
            st = dp.sync(plan, "lo")
            out["100k into empty map"] = time.perf_counter() - t
            out["100k into empty map (cpu)"] = time.process_time() - c
        finally:
            libbpf.update_batch = batch
        out["  its own CPU (the batch call left out)"] = out["100k into empty map (cpu)"] - in_batch[0]
        assert st.added == len(plan), st
        t = time.perf_counter()
        assert dp.sync(plan, "lo").total == 0
        out["100k no-op resync"] = time.perf_counter() - t
        changed = list(plan)
        changed[123] = FastPathEntry(plan[123].prefix, "local", None)
        t = time.perf_counter()
        assert dp.sync(changed, "lo").total == 1
        out["one entry changed"] = time.perf_counter() - t
        dp.sync([], "lo")
        table = layout.route_table(plan, links.ifindex("lo"))
        keys, values = b"".join(table), b"".join(table.values())
        c, t = time.process_time(), time.perf_counter()
        libbpf.update_batch(maps.routes.fd, keys, values, len(table))
        out["batch update alone"], out["batch update alone (cpu)"] = time.perf_counter() - t, time.process_time() - c
        libbpf.delete_batch(maps.routes.fd, keys, len(table))
        return out
    finally:
        dp.close()


def sync_timings(reps: int = 5) -> dict:
    plan = big_plan(100_000)
    node = f"{RUN}-sync"
    try:
        rounds = [sync_round(node, plan) for _ in range(reps)]
    finally:
        Datapath.unload(node, pin_root=PIN_ROOT)
    return {k: spread([r[k] for r in rounds]) for k in rounds[0]}


# --- this tree against another revision -----------------------------------------------------


def worker() -> None:
    """--worker: one tree's programs and sync, one round per command read from stdin ("progs",
    "sync", "quit"), each answered with one JSON line on stdout."""
    tag = os.environ.get(TREE_ENV, "this")[-6:].replace("/", "-")
    rig = ProgRig(f"{RUN}-p{tag}")
    node, plan = f"{RUN}-s{tag}", big_plan(100_000)
    try:
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "quit":
                break
            res = rig.measure("100,000 entries", rounds=5) if cmd == "progs" else sync_round(node, plan)
            print(json.dumps(res), flush=True)
    finally:
        rig.close()
        Datapath.unload(node, pin_root=PIN_ROOT)


class Worker:
    """A worker process measuring `tree` (None: this one)."""

    def __init__(self, tree: Path | None) -> None:
        env = dict(os.environ, **{RUN_ENV: RUN}, **({TREE_ENV: str(tree)} if tree else {}))
        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)

    def ask(self, cmd: str) -> dict[str, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the worker of {cmd} ended (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.ask_quit()

    def ask_quit(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def baseline_tree(rev: str, into: Path) -> Path:
    """Revision `rev`'s ctl/ and bpf/ under `into`, its bpf/ reachable as the package meshctl.bpf."""
    archive = subprocess.run(["git", "archive", rev, "ctl", "bpf"], cwd=Path(__file__).resolve().parents[1],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "ctl" / "meshctl" / "bpf").symlink_to(into / "bpf")
    return into


def alternate(workers: dict[str, Worker], rounds: int, whats: tuple[str, ...]) -> dict:
    """`rounds` rounds: the calibration, then each of `whats` ("progs", "sync") asked of every
    worker in turn (the order alternating round by round); medians over the rounds."""
    out: dict[str, dict[str, list[dict[str, float]]]] = {n: {what: [] for what in whats} for n in workers}
    calib: list[dict[str, float]] = []
    try:
        for r in range(rounds):
            order = list(workers) if r % 2 == 0 else list(workers)[::-1]
            calib.append(calibration())
            for what in whats:
                for name in order:
                    out[name][what].append(workers[name].ask(what))
            line = ", ".join(f"{n} {out[n]['progs'][-1][DIRECT_100K]:.0f} ns" for n in workers)
            if "sync" in whats:
                line += "; 100k sync " + ", ".join(f"{n} {out[n]['sync'][-1]['100k into empty map']:.3f} s"
                                                   for n in workers)
            print(f"  round {r + 1}: bare LPM {calib[-1][BARE_LPM]:.0f} ns; direct {line}", file=sys.stderr)
    finally:
        for w in workers.values():
            w.close()
    return {"rounds": rounds, "calibration": {k: statistics.median(c[k] for c in calib) for k in calib[0]},
            "trees": {n: {what: {k: statistics.median(x[k] for x in xs) for k in xs[0]} for what, xs in d.items()}
                      for n, d in out.items()}}


def versus(rev: str, rounds: int) -> dict:
    """Side by side: calibration, the programs at 100,000 entries and the sync, one round of each
    tree in turn (alternating which goes first), medians over `rounds`."""
    with tempfile.TemporaryDirectory(prefix=f"{RUN}-rev-") as tmp:
        workers = {"baseline": Worker(baseline_tree(rev, Path(tmp))), "this tree": Worker(None)}
        return {"rev": rev, **alternate(workers, rounds, ("progs", "sync"))}


# from_pod with one part of the direct decision taken out (--parts; never shipped): each variant is
# a copy of this tree's ctl/ and bpf/ with (file, text, replacement) applied. A text the source no
# longer holds stops the run naming the variant: update the variant with the source.
REDIRECT = "    return mc_redirected(n, mc_redirect_private(r), MC_C_DIRECT);"
MARK = "    skb->mark |= MC_MARK;\n"
TTL_AND_MARK = ("    if (mc_dec_ttl(&p) < 0)\n        return mc_out(n, MC_C_PASS, MC_R_TTL, TC_ACT_OK);\n"
                + MARK + REDIRECT)
NO_GATE = ("bpf/lib/monitor.h", "n->slots = mc_config(MC_CFG_MONITOR);", "n->slots = 0;")
NO_TTL = ("bpf/datapath.c", TTL_AND_MARK, MARK + REDIRECT)
NO_MARK = ("bpf/datapath.c", TTL_AND_MARK, TTL_AND_MARK.replace(MARK, ""))
NO_TTL_MARK = ("bpf/datapath.c", TTL_AND_MARK, REDIRECT)
NO_COUNTER = ("bpf/datapath.c", "struct mc_counter *c = counters.lookup(&slot);", "struct mc_counter *c = 0;")
NO_FLOW = ("bpf/datapath.c", "    if (mc_flow_is_kernel_reply(&p))\n"
           "        return mc_out(n, MC_C_FLOW, MC_R_KERNEL_FLOW, TC_ACT_OK);\n    if (r->encap", "    if (r->encap")
NO_HELPER = ("bpf/datapath.c", "return mc_redirected(n, mc_redirect_private(r), MC_C_DIRECT);",
             "return mc_redirected(n, TC_ACT_REDIRECT, MC_C_DIRECT);")
VARIANTS: dict[str, list[tuple[str, str, str]]] = {
    "as shipped": [],
    "no monitor gate (its notes fold away)": [NO_GATE],
    "no TTL decrement": [NO_TTL],
    "no counter": [NO_COUNTER],
    "no mark": [NO_MARK],
    "no flow filter test": [NO_FLOW],
    "no redirect helper (its verdict kept)": [NO_HELPER],
    "no gate, TTL, counter or mark": [NO_GATE, NO_TTL_MARK, NO_COUNTER],
}


def variant_tree(patches: list[tuple[str, str, str]], name: str, into: Path) -> Path:
    """This tree's ctl/ and bpf/ under `into` with `patches` applied, bpf/ reachable as meshctl.bpf."""
    import shutil

    root = Path(__file__).resolve().parents[1]
    for d in ("ctl", "bpf"):
        shutil.copytree(root / d, into / d, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    link = into / "ctl" / "meshctl" / "bpf"
    if link.is_symlink():
        link.unlink()
    link.symlink_to(into / "bpf")
    for f, text, repl in patches:
        src = (into / f).read_text()
        if text not in src:
            raise SystemExit(f"--parts variant {name!r}: {f} no longer holds {text.splitlines()[0].strip()!r}")
        (into / f).write_text(src.replace(text, repl, 1))
    return into


def parts_in_place(rounds: int) -> dict:
    """VARIANTS side by side, programs only, alternating as versus() does."""
    with tempfile.TemporaryDirectory(prefix=f"{RUN}-var-") as tmp:
        workers = {name: Worker(variant_tree(p, name, Path(tmp) / f"v{i}")) for i, (name, p) in
                   enumerate(VARIANTS.items())}
        return alternate(workers, rounds, ("progs",))


def report_parts(res: dict) -> str:
    cal, t = res["calibration"], res["trees"]
    shipped = t["as shipped"]["progs"][DIRECT_100K]
    lines = [f"from_pod with one part taken out: medians of {res['rounds']} alternating rounds",
             *calibration_lines(cal), "", f"{'direct (from_pod) at 100,000 entries, ns/packet':<50}"
             f"{'ns':>6}{'vs shipped':>12}{'/ bare LPM':>12}"]
    for name, d in t.items():
        ns = d["progs"][DIRECT_100K]
        lines.append(f"  {name:<48}{ns:>6.0f}{ns - shipped:>+12.0f}{ns / cal[BARE_LPM]:>11.2f}x")
    return "\n".join(lines)


def calibration_lines(cal: dict[str, float]) -> list[str]:
    return ["calibration (same run), ns/packet:", *(f"  {k:<48}{v:>6.0f}" for k, v in cal.items())]


def report_versus(res: dict) -> str:
    t, cal = res["trees"], res["calibration"]
    lines = [f"this tree against {res['rev']}: medians of {res['rounds']} alternating rounds",
             *calibration_lines(cal), f"floor of the direct decision / bare LPM hit: "
             f"{cal[LPM24_FLOW_NEIGH] / cal[BARE_LPM]:.2f}x with the LRU lookup, "
             f"{cal[LPM24_FILTER_NEIGH] / cal[BARE_LPM]:.2f}x with the flow filter; "
             f"with every part of from_pod: {cal[PARTS_MARK] / cal[BARE_LPM]:.2f}x", "",
             f"{'BPF_PROG_TEST_RUN at 100,000 entries, ns/packet':<50}{'baseline':>10}{'this tree':>11}"]
    for name in t["baseline"]["progs"]:
        lines.append(f"{name:<50}{t['baseline']['progs'][name]:>10.0f}{t['this tree']['progs'][name]:>11.0f}")
    for name, label in ((DIRECT_100K, "direct / bare LPM hit (goal <= 1.15x)"),
                        (DIRECT_WALK, "direct, trie walk / bare LPM hit")):
        lines.append(f"{label:<50}" + "".join(
            f"{t[n]['progs'][name] / cal[BARE_LPM]:>{w}.2f}x" for n, w in (("baseline", 9), ("this tree", 10))))
    lines += ["", f"{'map sync, s':<50}{'baseline':>10}{'this tree':>11}"]
    for name in t["baseline"]["sync"]:
        lines.append(f"{name:<50}{t['baseline']['sync'][name]:>10.3f}{t['this tree']['sync'][name]:>11.3f}")
    # CPU time, not wall: on a shared machine the wall time of one syscall swings with the load.
    lines.append(f"{'100k into empty map / batch update alone (cpu)':<50}" + "".join(
        f"{t[n]['sync']['100k into empty map (cpu)'] / t[n]['sync']['batch update alone (cpu)']:>{w}.2f}x"
        for n, w in (("baseline", 9), ("this tree", 10))))
    return "\n".join(lines)


# --- report ---------------------------------------------------------------------------------


def report(res: dict) -> str:
    lines = []
    if "traffic" in res:
        t = res["traffic"]
        k = t["kernel"]["gbps"]["median"]
        lines.append("pod-to-pod, one TCP stream (iperf3) and 1-byte TCP request/response (p50/p99 of 1,000 round "
                     "trips per round); median [min..max] over rounds")
        lines.append(f"{'mode':<14}{'Gbit/s':>26}{'vs kernel':>11}{'rr p50 us':>26}{'rr p99 us':>12}")
        for m, d in t.items():
            g, p, q = d["gbps"], d["p50_us"], d["p99_us"]
            lines.append(f"{m:<14}{g['median']:>8.2f} [{g['min']:6.2f}..{g['max']:6.2f}]{g['median'] / k:>10.2f}x"
                         f"{p['median']:>8.1f} [{p['min']:6.1f}..{p['max']:6.1f}]{q['median']:>12.1f}")
        wg = t["wireguard-go"]["gbps"]["median"]
        lines.append(f"fast path / wireguard-go throughput: {t['fastpath']['gbps']['median'] / wg:.1f}x")
    if "programs" in res:
        lines.append("")
        lines.append("BPF_PROG_TEST_RUN, ns/packet (median of 15 x 200 runs)")
        labels = list(res["programs"])
        lines.append(f"{'outcome':<28}" + "".join(f"{lb:>18}" for lb in labels))
        for name in res["programs"][labels[0]]:
            lines.append(f"{name:<28}" + "".join(f"{res['programs'][lb][name]:>18.0f}" for lb in labels))
    if "calibration" in res:
        lines += calibration_lines(res["calibration"])
    if "sync" in res:
        lines.append("")
        lines.append("map sync (s): median [min..max]")
        for name, s in res["sync"].items():
            lines.append(f"{name:<40}{s['median']:>8.3f} [{s['min']:.3f}..{s['max']:.3f}]")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--rr-rounds", type=int, default=30, help="request/response rounds (alternating)")
    ap.add_argument("--skip-traffic", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--against", metavar="REV", help="programs and sync only: this tree and REV side by side")
    ap.add_argument("--parts", action="store_true",
                    help="programs only: from_pod as shipped and with each part of the direct decision taken out")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker()
    loader.ensure_bpffs(PIN_ROOT)
    os.makedirs(PIN_ROOT, exist_ok=True)
    res: dict = {"load": os.getloadavg()}
    if args.parts:
        try:
            res["parts"] = parts_in_place(args.rounds)
        finally:
            subprocess.run(["rm", "-rf", PIN_ROOT], check=False)
        return finish(res, report_parts(res["parts"]), args.json)
    if args.against:
        try:
            res["versus"] = versus(args.against, args.rounds)
        finally:
            subprocess.run(["rm", "-rf", PIN_ROOT], check=False)
        print(report_versus(res["versus"]))
        print(f"load average before/after: {res['load'][0]:.2f} / {os.getloadavg()[0]:.2f}")
        if args.json:
            args.json.write_text(json.dumps(res, indent=1))
        return None
    tb = Testbed(f"{RUN}-")
    try:
        res["calibration"] = calibration()
        res["programs"] = prog_timings()
        res["sync"] = sync_timings()
        if not args.skip_traffic:
            with tempfile.TemporaryDirectory(prefix=f"{RUN}-") as tmp:
                tb.up(ipv6=False)
                res["traffic"] = traffic(tb, args.rounds, args.seconds, Path(tmp), args.rr_rounds)
    finally:
        unload_testbed(tb, PIN_ROOT)
        subprocess.run(["rm", "-rf", PIN_ROOT], check=False)
    finish(res, report(res), args.json)


def unload_testbed(tb: Testbed, pin_root: str) -> None:
    """Both nodes' programs unloaded (where their namespaces exist), then the testbed taken down."""
    for node in ("a", "b"):
        if netns.exists(tb.ns(node)):
            in_netns(tb.ns(node), lambda node=node: Datapath.unload(node, pin_root=pin_root))
    tb.down()


def finish(res: dict, text: str, json_path: Path | None) -> None:
    """The report and the load average around the run; the figures as JSON where asked."""
    res["load_after"] = os.getloadavg()
    print(text)
    print(f"load average before/after: {res['load'][0]:.2f} / {res['load_after'][0]:.2f}")
    if json_path:
        json_path.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
