# SPDX-License-Identifier: Apache-2.0
"""Path benchmark: every rung of the path ladder between two pods on two namespace nodes, side by
side in one run.

    .venv/bin/python bench/paths.py [--rounds 5] [--seconds 3] [--rr-rounds 12] [--json out.json]

Two nodes on one L2 private network (bridge; every rung passes there) plus a "public" network for
the WireGuard tunnel. Modes, measured alternating round by round (the order reverses every round):

    kernel             no programs; the kernel routes pod packets raw over the private network
                       (the baseline every ratio is against)
    direct             eBPF fast path, raw (today's direct rung)
    direct+vxlan       eBPF fast path, VXLAN built with bpf_skb_adjust_room between the private
                       addresses, unwrapped by the receiver's program
    direct+ipip        the same with IP-in-IP (no ipip device needed)
    direct+vxlan(md)   the alternative not shipped: bpf_skb_set_tunnel_key and a redirect to a
                       collect-metadata VXLAN device on the sender (bench/vxlan_md.c), the shipped
                       from_private on the receiver
    kernel+vxlan       no programs; the kernel fallback's VXLAN device (meshctl.node.encap)
    wireguard-private  wireguard-go, peers at each other's private addresses
    tunnel             wireguard-go, peers at each other's public addresses

Figures: single-stream TCP throughput (iperf3) and request/response latency (1-byte TCP
ping-pong over one connection, client and server pinned to CPU 0), medians and min..max over the
rounds, and the ratios the issue sets goals for (encapsulated fast path >= 0.85x raw direct and
>= 15x wireguard-go). Runs as root; everything it makes is prefixed eab<pid>- (pins under
/sys/fs/bpf/eab<pid>) and removed at the end, pass or fail.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ctl"))

from datapath import PINGPONG_SERVER, WG_IP, WG_PORT, iperf, latency, run_names, spread  # noqa: E402  (bench/datapath.py)
from meshctl.datapath import Datapath, libbpf, links, loader  # noqa: E402
from meshctl.datapath.layout import VXLAN_OVERHEAD  # noqa: E402
from meshctl.lab.rigs import netns  # noqa: E402
from meshctl.lab.rigs.testbed import PODS, FabricTestbed  # noqa: E402
from meshctl.node import discovery  # noqa: E402
from meshctl.setns import in_netns  # noqa: E402

RUN, PIN_ROOT, WG = run_names("eab")
PUBLIC = {"a": "203.0.113.1", "b": "203.0.113.2"}
POD_NET = {"a": "10.42.1.0/24", "b": "10.42.2.0/24"}
ORDER = ["kernel", "direct", "direct+vxlan", "direct+ipip", "direct+vxlan(md)", "kernel+vxlan", "wireguard-private",
         "tunnel"]
MD_DEV = f"{RUN}md"
# The counter of node a that must move for a mode to count as carried by its path (in md mode a's
# programs only receive: the returning ACKs arrive as VXLAN from b's md_encap).
PROOF = {"direct": "direct", "direct+vxlan": "encap", "direct+ipip": "encap", "direct+vxlan(md)": "decap"}
OTHER = {"a": "b", "b": "a"}


class Paths:
    """Switches the testbed between the modes (see the module docstring)."""

    def __init__(self, tb: FabricTestbed, tmp: Path) -> None:
        self.tb = tb
        self.tmp = tmp
        self.keys: dict[str, str] = {}

    def up(self) -> None:
        p = self.tb.ns
        netns.add(p("pub"))
        self.tb.namespaces.insert(0, p("pub"))
        netns.bridge(p("pub"), "br0")
        for i, node in enumerate(("a", "b"), start=1):
            netns.veth(p(node), "eth0", p("pub"), f"pub{i}")
            netns.enslave(p("pub"), f"pub{i}", "br0")
            netns.addr(p(node), "eth0", f"{PUBLIC[node]}/24")
            dp = in_netns(p(node), lambda node=node: Datapath.open(node, pin_root=PIN_ROOT))
            if dp.mode != "ebpf":
                raise SystemExit(f"datapath of {node}: {dp.reason}")
            dp.close()
        self._wireguard()
        self._md_programs()

    def _md_programs(self) -> None:
        """Compile bench/vxlan_md.c for each node (bcc, in this process) and make its VXLAN device."""
        from bcc import BPF

        from meshctl.datapath.layout import VXLAN_PORT, VXLAN_VNI  # noqa: PLC0415

        self.md: dict[str, tuple[BPF, int]] = {}
        for node in ("a", "b"):
            other = OTHER[node]
            # Up only in md mode: a VXLAN device holds UDP port 4789 while it is up, and the kernel
            # fallback's meshvx0 (kernel+vxlan mode) cannot share it with a collect-metadata device.
            self.tb.sh(node, ["ip", "link", "add", MD_DEV, "type", "vxlan", "external", "dstport", str(VXLAN_PORT)])
            idx = netns.ifindex(self.tb.ns(node), MD_DEV)
            pod_net = int(ipaddress.ip_network(POD_NET[other]).network_address)
            remote = int(ipaddress.ip_address(self.tb.private(other)))
            b = BPF(src_file=str(Path(__file__).with_name("vxlan_md.c")).encode(),
                    cflags=[f"-DMD_POD_NET={pod_net:#x}", f"-DMD_REMOTE={remote:#x}", f"-DMD_IFINDEX={idx}",
                            f"-DMD_VNI={VXLAN_VNI:#x}"])
            self.md[node] = (b, b.load_func(b"md_encap", BPF.SCHED_CLS).fd)
        self.md_links: list[int] = []

    def _md_attach(self, node: str) -> None:
        """The shipped programs as in `direct` mode, but md_encap instead of from_pod on the pod veth."""
        with Datapath.open(node, pin_root=PIN_ROOT) as dp:
            dp.attach("eth1", None, ["vp1"], pods=discovery.pod_routes(["vp1"]),
                      private4=discovery.private_ipv4("eth1"))
            dp.sync(self.tb.fastpath(node, None), "eth1")
        vp1 = links.ifindex("vp1")
        links.detach_tcx(f"{PIN_ROOT}/{node}", "pod-in", vp1)
        self.tb.sh(node, ["ip", "link", "set", MD_DEV, "up"])
        self.md_links.append(links.create_link(self.md[node][1], vp1, libbpf.BPF_TCX_INGRESS))

    def _md_detach(self) -> None:
        for fd in self.md_links:
            os.close(fd)
        self.md_links = []
        for node in ("a", "b"):
            self.tb.sh(node, ["ip", "link", "set", MD_DEV, "down"], check=False)

    def _fastpath(self, node: str, kind: str | None) -> None:
        with Datapath.open(node, pin_root=PIN_ROOT) as dp:
            dp.attach("eth1", None, ["vp1"], pods=discovery.pod_routes(["vp1"]),
                      private4=discovery.private_ipv4("eth1"))
            dp.sync(self.tb.fastpath(node, kind), "eth1")

    def set(self, mode: str) -> None:
        self._md_detach()
        for node in ("a", "b"):
            in_netns(self.tb.ns(node), lambda node=node: links.detach_all(f"{PIN_ROOT}/{node}"))
            if mode in ("wireguard-private", "tunnel"):
                where = PUBLIC if mode == "tunnel" else {n: self.tb.private(n) for n in PUBLIC}
                self.tb.sh(node, ["wg", "set", WG[node], "peer", self.keys[OTHER[node]], "endpoint",
                                  f"{where[OTHER[node]]}:{WG_PORT}"])
                self.tb.route_pods(node, "raw")
                self.tb.sh(node, ["ip", "route", "replace", POD_NET[OTHER[node]], "dev", WG[node]])
            else:
                self.tb.route_pods(node, "vxlan" if mode == "kernel+vxlan" else "raw")
            if mode == "direct+vxlan(md)":
                in_netns(self.tb.ns(node), lambda node=node: self._md_attach(node))
            elif mode.startswith("direct"):
                kind = mode.split("+")[1] if "+" in mode else None
                in_netns(self.tb.ns(node), lambda node=node, kind=kind: self._fastpath(node, kind))
        for i, pod in enumerate(("a-p1", "b-p1"), start=1):
            # The VXLAN device drops what does not fit once encapsulated (DF): in md mode the pods'
            # route carries the lower MTU, as a CNI using such a device sets it.
            mtu = ["mtu", str(1500 - VXLAN_OVERHEAD)] if mode == "direct+vxlan(md)" else []
            self.tb.sh(pod, ["ip", "route", "replace", "default", "via", f"10.42.{i}.1", "dev", "eth0", *mtu])
            self.tb.sh(pod, ["ip", "route", "flush", "cache"])  # forget path MTUs learnt on another rung

    def counters(self) -> dict[str, int]:
        """Node a's fast-path packet counters."""
        def read() -> dict[str, int]:
            with Datapath.pinned("a", pin_root=PIN_ROOT) as dp:
                return {k: v[0] for k, v in dp.counters().items()}

        return in_netns(self.tb.ns("a"), read)

    def check(self, mode: str, before: dict[str, int]) -> None:
        """The mode carried the transfer as named: the fast path's counters moved for its rungs
        (PROOF), and not at all for the others."""
        after = self.counters()
        moved = {k: after[k] - before[k] for k in after if after[k] != before[k]}
        want = PROOF.get(mode)
        if (want is None and moved) or (want is not None and moved.get(want, 0) < 1000):
            raise SystemExit(f"{mode}: the fast path counters moved {moved}")

    def _wireguard(self) -> None:
        self.keys = self.tb.wireguard_go(WG, WG_IP, POD_NET, PUBLIC, WG_PORT, self.tmp)

    def down(self) -> None:
        self._md_detach()
        self.tb.wireguard_down(WG)


def measure(tb: FabricTestbed, rounds: int, seconds: int, rr_rounds: int, tmp: Path) -> dict:
    srv = tmp / "pingpong.py"
    srv.write_text(PINGPONG_SERVER)
    tb.spawn("b-p1", ["iperf3", "-s", "-p", "5201"])
    tb.spawn("b-p1", ["taskset", "-c", "0", "python3", str(srv), "9000"])  # see bench/datapath.py traffic()
    paths = Paths(tb, tmp)
    res: dict[str, dict[str, list[float]]] = {m: {"gbps": [], "p50_us": [], "p99_us": []} for m in ORDER}
    try:
        paths.up()
        for r in range(rounds):
            for m in ORDER if r % 2 == 0 else ORDER[::-1]:
                paths.set(m)
                tb.wait_port("a-p1", PODS["b"][0], 5201)
                before = paths.counters()
                res[m]["gbps"].append(iperf(tb, seconds))
                paths.check(m, before)
                print(f"  round {r + 1} {m:<18} {res[m]['gbps'][-1]:7.2f} Gbit/s", file=sys.stderr)
        for r in range(rr_rounds):
            for m in ORDER if r % 2 == 0 else ORDER[::-1]:
                paths.set(m)
                tb.wait_port("a-p1", PODS["b"][0], 9000)
                lat = latency(tb, n=1000, probes=1)
                res[m]["p50_us"].append(lat["p50_us"])
                res[m]["p99_us"].append(lat["p99_us"])
            print(f"  rr round {r + 1}: " + ", ".join(f"{m} {res[m]['p50_us'][-1]:.1f}" for m in ORDER) + " us",
                  file=sys.stderr)
    finally:
        paths.down()
    return res


def ratios(raw: dict[str, dict[str, list[float]]], a: str, b: str, key: str = "gbps") -> list[float]:
    """a/b per round, both measured in the same round: the machine's load swings from round to round
    (other work shares its 2 CPUs) and moves both modes of one round alike."""
    return [x / y for x, y in zip(raw[a][key], raw[b][key], strict=True)]


def paired(raw: dict[str, dict[str, list[float]]], a: str, b: str, key: str = "gbps") -> float:
    return statistics.median(ratios(raw, a, b, key))


def report(res: dict, raw: dict[str, dict[str, list[float]]]) -> list[str]:
    p50 = {m: res[m]["p50_us"]["median"] for m in ORDER}
    lines = [f"{'MODE':<18} {'TCP Gbit/s':>10} {'(min..max)':>14} {'x kernel':>9} {'RR p50 us':>10} {'p99 us':>8}",
             f"{'':<18} {'median':>10} {'':>14} {'(paired)':>9} {'median':>10} {'median':>8}"]
    for m in ORDER:
        t, vs_kernel = res[m]["gbps"], paired(raw, m, "kernel")
        lines.append(f"{m:<18} {t['median']:>10.2f} {t['min']:>6.2f}..{t['max']:<6.2f} {vs_kernel:>9.2f} "
                     f"{p50[m]:>10.1f} {res[m]['p99_us']['median']:>8.1f}")
    lines.append("")
    lines.append("ratios: median over rounds of the two modes' figures in the same round")
    for enc in ("direct+vxlan", "direct+ipip", "direct+vxlan(md)"):
        vs_direct, vs_wg = paired(raw, enc, "direct"), paired(raw, enc, "wireguard-private")
        r = ratios(raw, enc, "direct")
        lines.append(f"{enc}: {vs_direct:.2f}x direct [{min(r):.2f}..{max(r):.2f}] "
                     f"(goal >= 0.85: {'met' if vs_direct >= 0.85 else 'NOT met'}), "
                     f"{vs_wg:.1f}x wireguard-go (goal >= 15: {'met' if vs_wg >= 15 else 'NOT met'}), "
                     f"{paired(raw, enc, 'kernel+vxlan'):.2f}x kernel VXLAN device, "
                     f"RR p50 {paired(raw, enc, 'direct', 'p50_us'):.2f}x direct")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=3)
    ap.add_argument("--rr-rounds", type=int, default=12, help="request/response rounds (alternating)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    loader.ensure_bpffs(PIN_ROOT)
    os.makedirs(PIN_ROOT, exist_ok=True)
    tb = FabricTestbed(f"{RUN}-", fabric="l2")
    load_before = os.getloadavg()[0]
    try:
        with tempfile.TemporaryDirectory(prefix=f"{RUN}-") as tmp:
            tb.up()
            raw = measure(tb, args.rounds, args.seconds, args.rr_rounds, Path(tmp))
    finally:
        for node in ("a", "b"):
            if netns.exists(tb.ns(node)):
                in_netns(tb.ns(node), lambda node=node: Datapath.unload(node, pin_root=PIN_ROOT))
        tb.down()
        subprocess.run(["rm", "-rf", PIN_ROOT], check=False)
    res = {m: {k: spread(v) for k, v in d.items()} for m, d in raw.items()}
    print(f"paths: {args.rounds} rounds x {args.seconds} s iperf3, {args.rr_rounds} request/response rounds, "
          f"{os.cpu_count()} CPUs, load average before/after {load_before:.2f} / {os.getloadavg()[0]:.2f}")
    print("\n".join(report(res, raw)))
    if args.json:
        args.json.write_text(json.dumps({"summary": res, "rounds": raw}, indent=2))


if __name__ == "__main__":
    main()
