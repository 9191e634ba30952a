# SPDX-License-Identifier: Apache-2.0
"""Mesh settings switched live under pings, shared by tests/paths/test_live_switch.py and
bench/live_switch.py: the default lab's pair types pinged at 20 pps while `meshctl mesh set`
changes the mesh record, and each pair's losses and ICMP errors counted per switch.

Which pairs a switch moves is read from the switch's own `mesh set -o json` diff (the plans
before and after, node by node): a pair moves when, on its two ends or a node of their locations
(a leader on the way), a route, a fast-path entry or a WireGuard peer covering the other end's
pod CIDR (or this end's, on a node between them) changed, or the rung one end takes to the other.
A pair no such item of changed keeps its path, and must lose nothing. A change of the WireGuard
port moves every pair between locations (their tunnels' endpoints change, which the diff does
not show: the lab's endpoints are the ones the agents discover and publish)."""

from __future__ import annotations

import ipaddress
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces.state import LabState, NodeState
from tests.pinging import PingResult, PodPing, node_log_lines

PPS = 20
INTERVAL = 1 / PPS
MOVING_LOSS_MAX = 10  # pings at 20 pps: < 0.5 s of loss on a pair whose path moves
ENDPOINT_SETTINGS = ("port",)  # mesh settings that move every WireGuard endpoint

# The default lab's pair types (ctl/meshctl/lab/labs/default.yaml): loc-a (a1 leader, a2) and loc-b
# (b1 leader, b2) each share a private /24; c1 is alone in loc-c.
PAIRS: dict[str, tuple[str, str]] = {
    "same subnet a2-a1": ("a2", "a1"),
    "same subnet b2-b1": ("b2", "b1"),
    "via leaders a2-b2": ("a2", "b2"),
    "tunnel a1-b1": ("a1", "b1"),
    "tunnel a1-c1": ("a1", "c1"),
    "via leader b2-c1": ("b2", "c1"),
}
# The NAT lab's (ctl/meshctl/lab/labs/nat.yaml): public pa, pb; cone-NATed ca, cb; symmetric sa, sb,
# each in a location of its own; sa and sb reach each other through the relay pa.
NAT_PAIRS: dict[str, tuple[str, str]] = {
    "relay sa-sb": ("sa", "sb"),
    "tunnel ca-cb": ("ca", "cb"),
    "tunnel pa-pb": ("pa", "pb"),
    "tunnel pb-ca": ("pb", "ca"),
}
TRANSIT: dict[str, tuple[str, ...]] = {"relay sa-sb": ("pa",)}  # nodes on a pair's way outside its locations


@dataclass(frozen=True)
class Switch:
    """One `mesh set` of the run: what it set, when (wall clock), and the pairs its diff moves."""

    assignment: str
    at: float
    moving: frozenset[str]


@dataclass
class Window:
    """One pair over one switch's window (or the quiet time before the first: switch None)."""

    pair: str
    switch: str
    moving: bool
    lost: int = 0
    errors: list[str] = field(default_factory=list)


def _nets(item: Mapping[str, Any]) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    """The prefixes a diff item covers: a route's dst, a fast-path entry's prefix, a peer's allowed IPs."""
    texts = [item["dst"]] if "dst" in item else [item["prefix"]] if "prefix" in item else item.get("allowed_ips", [])
    return [ipaddress.ip_network(t) for t in texts]


def _items(part: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    yield from part["added"]
    yield from part["removed"]
    for c in part["changed"]:
        yield c["before"]
        yield c["after"]


def _touches(node_diff: Mapping[str, Any], cidrs: list[ipaddress.IPv4Network | ipaddress.IPv6Network],
             others: set[str]) -> bool:
    """Whether a node's diff changes how it reaches `cidrs` (or the rung to a node of `others`)."""
    for part in ("routes", "fastpath", "peers"):
        for item in _items(node_diff[part]):
            if any(n.overlaps(c) for n in _nets(item) for c in cidrs):
                return True
    return any(r["node"] in others for r in node_diff["rungs"])


def moving_pairs(diff: Mapping[str, Any], nodes: Mapping[str, NodeState], pairs: Mapping[str, tuple[str, str]],
                 transit: Mapping[str, tuple[str, ...]] = TRANSIT) -> frozenset[str]:
    """The pairs whose path the `mesh set -o json` diff changes (see the module docstring)."""
    by_node = {d["node"]: d for d in diff["nodes"]}
    moving = set()
    for label, (src, dst) in pairs.items():
        cidr = {n: [ipaddress.ip_network(c) for c in nodes[n].pod_cidrs] for n in (src, dst)}
        locations = {nodes[src].location, nodes[dst].location}
        on_way = {n for n, st in nodes.items() if st.location in locations} | set(transit.get(label, ()))
        on_way -= {src, dst}
        checks = [(src, cidr[dst], {dst}), (dst, cidr[src], {src})]
        checks += [(n, cidr[src] + cidr[dst], {src, dst}) for n in on_way]
        if any(n in by_node and _touches(by_node[n], c, o) for n, c, o in checks):
            moving.add(label)
    return frozenset(moving)


def mesh_set(lab: str, assignment: str) -> dict[str, Any]:
    """`meshctl mesh set ASSIGNMENT --lab LAB -o json`: the diff it printed (it wrote the record)."""
    p = subprocess.run([sys.executable, "-m", "meshctl.cli", "mesh", "set", assignment, "--lab", lab, "-o", "json"],
                       capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise AssertionError(f"mesh set {assignment}: {p.stderr.strip() or p.stdout.strip()}")
    return json.loads(p.stdout)


def warm_up(st: LabState, pairs: list[tuple[str, str]], tries: int = 5) -> None:
    """Ping every pair both ways until each answers (a tunnel's first packets wait for WireGuard's
    handshake: that is the lab coming up, not a switch)."""
    todo = pairs + [(b, a) for a, b in pairs]
    for _ in range(tries):
        todo = [(r.src, r.dst) for r in labcheck.check(st, count=2, pairs=todo) if r.received < r.sent]
        if not todo:
            return
    raise AssertionError(f"pairs still losing pings after warm-up: {todo}")


def lab_switch(st: LabState, pairs: Mapping[str, tuple[str, str]]) -> Callable[[str], frozenset[str]]:
    """The switch of an etcd lab: `mesh set --lab`, the pairs moving read off its diff."""
    nodes = {n.name: n for _, n in st.nodes()}

    def switch(a: str) -> frozenset[str]:
        moving = set(moving_pairs(mesh_set(st.name, a), nodes, pairs))
        if a.partition("=")[0] in ENDPOINT_SETTINGS:
            moving |= {label for label, (src, dst) in pairs.items() if nodes[src].location != nodes[dst].location}
        return frozenset(moving)

    return switch


APPLY_MAX_S = 60.0  # what one switch itself may take (a `mesh set` process on a loaded machine)


def run(st: LabState, assignments: list[str], *, settle: float, quiet: float = 2.0,
        pairs: Mapping[str, tuple[str, str]] = PAIRS, switch: Callable[[str], frozenset[str]] | None = None
        ) -> tuple[list[Switch], dict[str, PingResult], list[Window]]:
    """Ping every pair at PPS through `quiet` seconds, then each assignment in turn with `settle`
    seconds after it took effect; the switches, each pair's ping and every (pair, window) counted.
    `switch` applies an assignment and says which pairs it moves (None: `lab_switch`).

    A window runs from one switch's start to the next's: the switch itself (a `mesh set` process,
    seconds on a loaded machine) and then `settle`. Counted from the switch's start instead, a slow
    `mesh set` left the agents less than `settle`, and what the switch moved lost its packets in the
    next switch's window, as if that switch had broken a pair it kept."""
    apply = switch or lab_switch(st, pairs)
    warm_up(st, list(pairs.values()))
    seconds = quiet + (APPLY_MAX_S + settle) * len(assignments) + 1  # stopped after the last window
    pings = {label: PodPing(st, src, dst, seconds, interval=INTERVAL) for label, (src, dst) in pairs.items()}
    switches: list[Switch] = []
    time.sleep(quiet)  # the experiment: a window with no switch
    for a in assignments:
        at = time.time()
        switches.append(Switch(a, at, apply(a)))
        time.sleep(settle)  # the experiment: the agents' passes and handshakes after the switch
    time.sleep(1)
    for p in pings.values():
        p.stop()
    results = {label: p.result() for label, p in pings.items()}
    return switches, results, windows(switches, results)


def windows(switches: list[Switch], results: Mapping[str, PingResult]) -> list[Window]:
    """Each pair's losses and errors by the window they fell in: before the first switch (`quiet`),
    or from one switch to the next."""
    bounds = [s.at for s in switches]
    out: list[Window] = []
    for label, r in results.items():
        per = [Window(label, "quiet", False)] + [Window(label, s.assignment, label in s.moving) for s in switches]
        for t in r.lost_at:
            per[_index(bounds, t)].lost += 1
        for t, e in zip(r.errors_at, r.errors, strict=True):
            per[_index(bounds, t)].errors.append(e)
        out += per
    return out


def gap_window(switches: list[Switch], r: PingResult) -> str:
    """The window a ping's longest gap began in: `quiet` or the switch before it."""
    i = _index([s.at for s in switches], r.gap_at)
    return "quiet" if i == 0 else switches[i - 1].assignment


def _index(bounds: list[float], t: float) -> int:
    """0 before the first switch, i after the i-th."""
    return sum(1 for b in bounds if t >= b)


def evidence(st: LabState, src: str, dst: str, since: float) -> str:
    """What the two ends of a pair logged since `since` (wall clock) about WireGuard: the agents'
    peer changes and warnings, and wireguard-go's own log (its handshakes with LOG_LEVEL=verbose),
    for a failed window's message: a pair that lost seconds on one CI run is explained by its logs."""
    return "\n".join(node_log_lines(st, (src, dst), since - 1, tail=60,
                                    pick={"agent.log": ("kilo0", "WARNING", "ERROR"),
                                          "wg/kilo0.log": ("andshake", "eypair", "ailed", "nvalid")}))


def table(ws: list[Window]) -> str:
    """One line per (pair, window): moving or kept, lost pings (and their seconds), errors."""
    lines = [f"{'pair':<20} {'switch':<28} {'path':<6} {'lost':>4} {'lost s':>6} {'errors':>6}"]
    for w in ws:
        lines.append(f"{w.pair:<20} {w.switch:<28} {'moves' if w.moving else 'kept':<6} {w.lost:>4} "
                     f"{w.lost * INTERVAL:>6.2f} {len(w.errors):>6}" + (f"  {w.errors[:2]}" if w.errors else ""))
    return "\n".join(lines)
