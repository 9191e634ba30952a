# SPDX-License-Identifier: Apache-2.0
"""What the monitor's event path costs: this tree's programs against another revision's, same-subnet.

    .venv/bin/python bench/monitor.py [--against main] [--rounds 5] [--seconds 2] [--rr-rounds 12]

Between two namespace nodes on one private bridge (the testbed of bench/datapath.py), pod-to-pod
TCP throughput (iperf3, one stream) and 1-byte TCP request/response p50, in three modes measured
side by side, alternating round by round:

  before    the programs of revision --against (its bpf/, compiled here with bcc; the maps the
            same layout), no monitor
  after     this tree's programs, no monitor (the event path behind its one gate lookup)
  monitor   this tree's programs with `meshctl monitor` attached on the sending node at the
            default rate, no filter (every packet an event, 1,000 a second let through)

Switching a mode moves the tc links only. Then, less exposed to the machine's other work, the
programs' own cost: BPF_PROG_TEST_RUN ns per packet of from_pod's direct decision, before and
after, and after with a monitor slot claimed (rate 1,000: nearly every run is refused by the
bucket and counted, the costliest steady state of the event path), alternating.

Prints each mode's medians and the ratios after/before and monitor/before (the goal for after:
>= 0.99x throughput). Runs as root; everything it makes is prefixed mmb<pid>- and removed at the
end, pass or fail.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "ctl"))
sys.path.insert(0, str(ROOT / "bench"))

import datapath as dbench  # noqa: E402 - bench/datapath.py: iperf(), latency(), the ping-pong server
from meshctl.datapath import Datapath, features, layout, libbpf, links, loader  # noqa: E402
from meshctl.lab.rigs import netns  # noqa: E402
from meshctl.lab.rigs.testbed import PODS, Testbed  # noqa: E402
from meshctl.node import discovery  # noqa: E402
from meshctl.setns import in_netns  # noqa: E402

RUN = f"mmb{os.getpid() % 10000}"
ROOTS = {"before": f"/sys/fs/bpf/{RUN}old", "after": f"/sys/fs/bpf/{RUN}new"}
MODES = ("before", "after", "monitor")
BPF_MAP_TYPE_PERCPU_ARRAY = 6
NEWER_MAPS = {"route_cache": (BPF_MAP_TYPE_PERCPU_ARRAY, layout.ROUTE_CACHE_SLOTS)}  # name -> (type, max entries)


def compile_old(src: Path, pin_dir: str) -> None:
    """Revision --against's programs, compiled from `src` (its bpf/) and pinned under `pin_dir`
    with their own maps, as its loader would have: the load-time settings of this tree (a setting
    the old header does not know is an unused -D)."""
    from bcc import BPF

    os.makedirs(pin_dir, exist_ok=True)
    cflags = [f"-I{src}", "-Wno-unused-function", *layout.cflags(pin_dir), *features.probe().cflags()]
    b = BPF(src_file=str(src / loader.SOURCE).encode(), cflags=cflags)
    try:
        for name in loader.PROGRAMS:
            fn = b.load_func(name.encode(), BPF.SCHED_CLS)
            libbpf.unpin(loader.prog_path(pin_dir, name))
            libbpf.obj_pin(fn.fd, loader.prog_path(pin_dir, name))
    finally:
        b.cleanup()
    fd = libbpf.obj_get(f"{pin_dir}/config")
    try:
        libbpf.update(fd, layout.U32.pack(layout.CFG_LAYOUT), layout.CONFIG_VALUE.pack(layout.LAYOUT_VERSION))
    finally:
        os.close(fd)
    # Maps this tree's Python opens that older programs did not declare: made empty, so this tree's
    # Datapath can sync the old programs' maps (which never read them).
    for name, (map_type, max_entries) in NEWER_MAPS.items():
        if not os.path.exists(f"{pin_dir}/{name}"):
            fd = libbpf.map_create(name, map_type, *layout.MAP_SIZES[name], max_entries, 0)
            try:
                libbpf.obj_pin(fd, f"{pin_dir}/{name}")
            finally:
                os.close(fd)


class Modes:
    """The tc links of both nodes on one root's programs, and the monitor process."""

    def __init__(self, tb: Testbed) -> None:
        self.tb = tb
        self.monitor: subprocess.Popen | None = None

    def _attach(self, node: str, root: str) -> None:
        dp = Datapath.pinned(node, pin_root=root) if root == ROOTS["before"] else Datapath.open(node, pin_root=root)
        try:
            dp.attach("eth1", "kilo0" if node == "a" else None, ["vp1"], pods=discovery.pod_routes(["vp1"]),
                      private4=discovery.private_ipv4("eth1"))
            dp.sync(self.tb.fastpath(node), "eth1")
        finally:
            dp.close()

    def set(self, mode: str) -> None:
        self._stop_monitor()
        root = ROOTS["before" if mode == "before" else "after"]
        for node in ("a", "b"):
            def switch(node: str = node) -> None:
                for r in ROOTS.values():
                    links.detach_all(f"{r}/{node}")
                self._attach(node, root)

            in_netns(self.tb.ns(node), switch)
        if mode == "monitor":
            self.monitor = subprocess.Popen(
                [sys.executable, "-m", "meshctl.cli", "monitor", "--node", "a", "--bpf-pin-root", ROOTS["after"],
                 "--netns", self.tb.ns("a"), "-o", "json"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 20
            while not self._gate():
                if self.monitor.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the monitor did not attach")
                time.sleep(0.05)

    def _gate(self) -> int:
        """Node a's monitor gate (0: no monitor attached)."""
        def read() -> int:
            with contextlib.closing(Datapath.pinned("a", pin_root=ROOTS["after"])) as dp:
                return dp.maps.config_get(layout.CFG_MONITOR) if dp.maps is not None else 0

        return in_netns(self.tb.ns("a"), read)

    def _stop_monitor(self) -> None:
        if self.monitor is not None:
            self.monitor.send_signal(signal.SIGINT)
            try:
                self.monitor.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.monitor.kill()
                self.monitor.wait()
            self.monitor = None


def measure(tb: Testbed, rounds: int, seconds: int, rr_rounds: int, tmp: Path) -> dict[str, dict[str, list[float]]]:
    srv = tmp / "pingpong.py"
    srv.write_text(dbench.PINGPONG_SERVER)
    tb.spawn("b-p1", ["iperf3", "-s", "-p", "5201"])
    tb.spawn("b-p1", ["taskset", "-c", "0", "python3", str(srv), "9000"])
    tb.wait_port("a-p1", PODS["b"][0], 5201)
    modes = Modes(tb)
    res: dict[str, dict[str, list[float]]] = {m: {"gbps": [], "p50_us": []} for m in MODES}
    try:
        for r in range(rounds):
            for m in MODES if r % 2 == 0 else MODES[::-1]:
                modes.set(m)
                tb.wait_port("a-p1", PODS["b"][0], 5201)
                res[m]["gbps"].append(dbench.iperf(tb, seconds))
                print(f"  round {r + 1} {m:<8} {res[m]['gbps'][-1]:7.2f} Gbit/s", file=sys.stderr)
        for r in range(rr_rounds):
            for m in MODES if r % 2 == 0 else MODES[::-1]:
                modes.set(m)
                tb.wait_port("a-p1", PODS["b"][0], 9000)
                res[m]["p50_us"].append(dbench.latency(tb, n=1000, probes=1)["p50_us"])
            print(f"  rr round {r + 1}: " + ", ".join(f"{m} {res[m]['p50_us'][-1]:.1f}" for m in MODES) + " us",
                  file=sys.stderr)
    finally:
        modes.set("before")
        modes._stop_monitor()
    return res


def prog_costs(old: Path, rounds: int) -> dict[str, list[float]]:
    """ns/packet of from_pod's direct decision under each mode (see the module doc)."""
    import ipaddress

    from meshctl.datapath import monitor as mon
    from meshctl.lab.rigs.testrun import frame, ns_per_packet, run
    from meshctl.mesh.plan import FastPathEntry

    entries = [FastPathEntry(ipaddress.ip_network("10.42.2.0/24"), "direct", ipaddress.ip_address("192.168.0.2"))]
    compile_old(old, f"{ROOTS['before']}/unit")
    dps = {"before": Datapath.pinned("unit", pin_root=ROOTS["before"]),
           "after": Datapath.open("unit", pin_root=ROOTS["after"])}
    pkt = frame("10.42.1.5", "10.42.2.7", ttl=255)
    out: dict[str, list[float]] = {m: [] for m in MODES}
    try:
        for dp in dps.values():
            dp.sync(entries, "lo")
        for r in range(rounds):
            for m in MODES if r % 2 == 0 else MODES[::-1]:
                fd = dps["before" if m == "before" else "after"].programs["from_pod"]
                session = mon.Session(dps["after"].pin_dir, mon.parse_filter(None, None, "all", "1000")) \
                    if m == "monitor" else None
                try:
                    assert run(fd, pkt).verdict == "redirect"
                    out[m].append(ns_per_packet(fd, pkt))
                finally:
                    if session is not None:
                        session.close()
    finally:
        for dp in dps.values():
            dp.close()
    return out


def report(res: dict[str, dict[str, list[float]]], against: str) -> str:
    nan = float("nan")
    med = {m: {k: statistics.median(d[k]) if d.get(k) else nan for k in ("gbps", "p50_us", "ns")}
           for m, d in res.items()}
    lines = [f"same-subnet pod to pod, medians (before: {against}'s programs)",
             f"  {'mode':<8} {'Gbit/s':>8} {'TCP_RR p50 us':>14} {'from_pod ns':>12}"]
    lines += [f"  {m:<8} {med[m]['gbps']:8.2f} {med[m]['p50_us']:14.1f} {med[m]['ns']:12.1f}" for m in MODES]
    for m in ("after", "monitor"):
        lines.append(f"  {m}/before: throughput {med[m]['gbps'] / med['before']['gbps']:.3f}x, "
                     f"p50 {med[m]['p50_us'] / med['before']['p50_us']:.3f}x, "
                     f"from_pod {med[m]['ns'] / med['before']['ns']:.3f}x")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", default="main", help="the revision whose programs are the baseline")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=2)
    ap.add_argument("--rr-rounds", type=int, default=12)
    ap.add_argument("--skip-traffic", action="store_true", help="only the programs' test-run cost")
    args = ap.parse_args()
    tb = Testbed(f"{RUN}-")
    with tempfile.TemporaryDirectory(prefix=f"{RUN}-") as tmp:
        old = Path(tmp) / "old"
        old.mkdir()
        archive = subprocess.run(["git", "archive", args.against, "bpf"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        try:
            for r in ROOTS.values():
                loader.ensure_bpffs(r)
                os.makedirs(r, exist_ok=True)
            res: dict[str, dict[str, list[float]]] = {m: {} for m in MODES}
            if not args.skip_traffic:
                tb.up(ipv6=False)
                for node in ("a", "b"):
                    in_netns(tb.ns(node), lambda node=node: compile_old(old / "bpf", f"{ROOTS['before']}/{node}"))
                res = measure(tb, args.rounds, args.seconds, args.rr_rounds, Path(tmp))
            for m, ns in prog_costs(old / "bpf", args.rounds * 2).items():
                res[m]["ns"] = ns
        finally:
            for node in ("a", "b"):
                for r in ROOTS.values():
                    if netns.exists(tb.ns(node)):
                        with contextlib.suppress(Exception):
                            in_netns(tb.ns(node), lambda node=node, r=r: Datapath.unload(node, pin_root=r))
            for r in ROOTS.values():
                with contextlib.suppress(Exception):
                    Datapath.unload("unit", pin_root=r)
            tb.down()
            for r in ROOTS.values():
                subprocess.run(["rm", "-rf", r], check=False)
    print(report(res, args.against))
    print(f"load average: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
