# SPDX-License-Identifier: Apache-2.0
"""The node appliers at scale, in a namespace of their own: the route applier and the masquerade
ipset at 5,000 nodes, and the WireGuard peer sync at 500 peers (wireguard-go). For each, the
first install (the baseline, measured side by side in the same run) and what a reconcile costs
when nothing changed, when one node joined and when one node left; medians of `--rounds`.

    .venv/bin/python bench/appliers.py [--routes 5000] [--peers 500] [--rounds 5] [--prefix mba]

Goal (the agent's pass budget): a no-op or one-node change < 0.5 s at 5,000 routes; a no-op sync
of 500 peers well under the first (tests/node/test_scale.py and test_wireguard.py hold the
behaviour: what each sync changes)."""

from __future__ import annotations

import argparse
import base64
import functools
import ipaddress
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from meshctl.lab.rigs import netns
from meshctl.mesh.plan import PeerPlan, Route
from meshctl.node.keys import generate_private_key, public_key
from meshctl.node.masquerade import NatApplier
from meshctl.node.routes import RouteApplier
from meshctl.node.wireguard import WireGuard
from meshctl.setns import in_netns

T = TypeVar("T")
N = ipaddress.ip_network
PORT = 51899


def in_ns(ns: str, fn: Callable[..., T], *args: Any) -> T:
    return in_netns(ns, functools.partial(fn, *args))


def timed(fn: Callable[..., T], *args: Any) -> tuple[T, float]:
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def routes_and_sets(ns: str, count: int, nat_prefix: str) -> dict[str, float]:
    """Seconds of each sync of the route applier and the ipset at `count` routes."""
    netns.run(ns, ["ip", "link", "add", "pv", "type", "veth", "peer", "name", "pvx"])
    netns.run(ns, ["ip", "link", "set", "pv", "up"])
    netns.run(ns, ["ip", "addr", "add", "10.20.0.1/16", "dev", "pv"])
    plan = [Route(N(f"10.{64 + i // 256}.{i % 256}.0/24"), ipaddress.ip_address(f"10.20.{i // 250}.{i % 250 + 2}"),
                  "private") for i in range(count)]
    joined = [*plan, Route(N("10.99.0.0/24"), ipaddress.ip_address("10.20.0.9"), "private")]
    ra = in_ns(ns, RouteApplier, "pv", "kilo0")
    nat = in_ns(ns, NatApplier, nat_prefix)
    out: dict[str, float] = {}
    try:
        _, out["routes first"] = timed(in_ns, ns, ra.sync, plan)
        _, out["routes no-op"] = timed(in_ns, ns, ra.sync, plan)
        _, out["routes one joined"] = timed(in_ns, ns, ra.sync, joined)
        _, out["routes one left"] = timed(in_ns, ns, ra.sync, plan)
        mesh = [r.dst for r in joined]
        own, ifs = [N("10.42.1.0/24")], ["pv", "kilo0"]
        _, out["ipset first"] = timed(in_ns, ns, nat.sync, own, mesh[:-1], ifs)
        _, out["ipset no-op"] = timed(in_ns, ns, nat.sync, own, mesh[:-1], ifs)
        _, out["ipset one joined"] = timed(in_ns, ns, nat.sync, own, mesh, ifs)
        _, out["ipset one left"] = timed(in_ns, ns, nat.sync, own, mesh[:-1], ifs)
    finally:
        in_ns(ns, ra.flush)
        in_ns(ns, nat.cleanup)
    return out


def _fake_key(i: int) -> str:
    """A distinct valid-looking public key without the cost of an X25519 per peer."""
    return base64.b64encode(i.to_bytes(4, "big") * 8).decode()


def peers(ns: str, count: int, run_dir: Path) -> dict[str, float]:
    """Seconds of each WireGuard peer sync at `count` peers (one wireguard-go device, made anew)."""
    w = in_netns(ns, functools.partial(WireGuard, "kilo0", run_dir=str(run_dir), mode="wireguard-go"))
    in_ns(ns, w.ensure_device, generate_private_key(), PORT, None, 1420)
    plan = [PeerPlan(f"n{i}", "node", _fake_key(i + 1), f"198.51.100.{i % 250 + 1}:{PORT}",
                     (N(f"10.{64 + i // 256}.{i % 256}.0/24"),), 0) for i in range(count)]
    changed = [*plan[:1], PeerPlan("n0", "node", plan[0].public_key, plan[0].endpoint, (N("10.99.0.0/24"),), 0),
               *plan[2:]][1:]
    extra = PeerPlan("x", "node", public_key(generate_private_key()), f"198.51.100.251:{PORT}", (N("10.98.0.0/24"),), 0)
    out: dict[str, float] = {}
    try:
        _, out["peers first"] = timed(in_ns, ns, w.sync_peers, plan)
        _, out["peers no-op"] = timed(in_ns, ns, w.sync_peers, plan)
        _, out["peers one changed"] = timed(in_ns, ns, w.sync_peers, changed)
        _, out["peers one joined"] = timed(in_ns, ns, w.sync_peers, [*changed, extra])
    finally:
        in_ns(ns, w.delete)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--routes", type=int, default=5000)
    ap.add_argument("--peers", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prefix", default="mba")
    args = ap.parse_args()
    ns = f"{args.prefix}{os.getpid() % 10000}"
    tmp = Path(tempfile.mkdtemp(prefix=f"{ns}-"))
    runs: list[dict[str, float]] = []
    try:
        for i in range(args.rounds):
            netns.add(ns)
            try:
                runs.append({**routes_and_sets(ns, args.routes, f"{ns}nat"),
                             **peers(ns, args.peers, tmp / f"run{i}")})
            finally:
                netns.delete(ns)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(f"{args.routes} routes and ipset entries, {args.peers} WireGuard peers; medians of {args.rounds} "
          f"(load {os.getloadavg()[0]:.1f})")
    print(f"{'sync':<20} {'median':>10} {'vs first':>9}")
    for k, v in med.items():
        first = med[f"{k.split()[0]} first"]
        print(f"{k:<20} {v * 1000:>8.1f} ms {v / first:>8.3f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
