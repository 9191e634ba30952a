# SPDX-License-Identifier: Apache-2.0
"""What the leader tests share (tests/lab/test_leaders*.py): the three-by-three lab, a 20 pps ping
between every pair of pods in different locations, and a break of a leader followed through:
every agent moves the location to the next leader, every pair recovers, the plans agree; the
break undone, the old leader leads again after the hold."""

from __future__ import annotations

import copy
import itertools
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

from meshctl.backends.file import load_yaml
from meshctl.lab.namespaces import build, faults
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.namespaces.state import LabState
from tests.names import unique
from tests.pinging import IN_FLIGHT_S, PingResult, PodPing, node_log_lines
from tests.waiting import wait_until

PPS_INTERVAL = 0.05  # 20 pings a second per pair
HOLD = 10  # mesh.leader_hold of the lab file (s)
# Bounds generous for a loaded 2-core machine; the figures are measured in bench/leaders.py.
RECOVER_BOUND_S = 10.0
RETURN_LOSS_BOUND_S = 1.0  # the issue's own bound: the old leader back loses at most 1 s on any pair


def lab_doc(**lab: Any) -> dict[str, Any]:
    doc = load_yaml(str(files("meshctl") / "lab" / "labs" / "leaders.yaml"))
    doc = copy.deepcopy(doc)
    doc["lab"].update(lab)
    return doc


def two_member_doc(**lab: Any) -> dict[str, Any]:
    """The leaders lab with two members per location (x1, x2: the x3 of each left out): each
    location's only other witnesses of its leader are the other locations' leaders."""
    doc = lab_doc(**lab)
    doc["nodes"] = [n for n in doc["nodes"] if not n["name"].endswith("3")]
    return doc


@contextmanager
def leaders_lab(doc: dict[str, Any], prefix: str = "ld") -> Iterator[LabState]:
    """The lab `doc` up under a unique name starting with `prefix`, every agent on the documented
    order; taken down after."""
    prefix = unique(prefix) + "-"
    name = labstate.lab_name(prefix)
    try:
        st = build.up(parse_lab(doc), prefix=prefix, wait=120)
        # Every agent plans with the documented order and every member has reported.
        wait_until(lambda: labcheck.leaders_view(st).agreed() == STATIC, 60, "every agent on the documented order")
        yield st
    finally:
        build.down(name)


STATIC = {"loc-a": ("a1",), "loc-b": ("b1",), "loc-c": ("c1",)}


def pod_of(st: LabState, node: str) -> str:
    return next(n.pods[0].ip for _, n in st.nodes() if n.name == node)


def cross_pairs(st: LabState) -> list[tuple[str, str]]:
    nodes = [n for _, n in st.nodes()]
    return [(a.name, b.name) for a, b in itertools.combinations(nodes, 2) if a.location != b.location]


class CrossPings:
    """A 20 pps ping between every pair of pods in different locations, in the background."""

    def __init__(self, st: LabState, seconds: float) -> None:
        self.pairs = cross_pairs(st)
        self.pings = {p: PodPing(st, p[0], p[1], seconds, PPS_INTERVAL, through_errors=True) for p in self.pairs}

    def replies(self, pair: tuple[str, str]) -> int:
        """Replies so far (read without moving the file ping writes)."""
        f = self.pings[pair].out
        return os.pread(f.fileno(), 1 << 22, 0).count(b" bytes from ")

    def all_answering(self) -> bool:
        """Every pair has had a reply."""
        return all(self.replies(p) > 0 for p in self.pairs)

    def counts(self) -> dict[tuple[str, str], int]:
        return {p: self.replies(p) for p in self.pairs}

    def results(self, until: float | None = None) -> dict[tuple[str, str], PingResult]:
        """Every pair's result; with `until` (wall clock), the pings end then rather than at their
        deadline (`window_end`: what `report` reads is over by then)."""
        if until is not None:
            time.sleep(max(0.0, until - time.time()))  # the experiment: the window report reads
            for ping in self.pings.values():
                ping.stop()
        return {p: ping.result() for p, ping in self.pings.items()}


def lost_between(r: PingResult, start: float, end: float) -> list[float]:
    return [t for t in r.lost_at if start <= t < end]


@dataclass
class Followed:
    """What one break showed: when (wall clock) it began, when every agent planned with the next
    leader, when it was undone and when the old leader led again on every agent."""

    broke: float
    moved: float
    undone: float
    back: float


def follow_break(st: LabState, location: str, leader: str, successor: str, brk: Callable[[], None],
                 undo: Callable[[], None], pings: CrossPings, crossing: list[tuple[str, str]],
                 before_undo: Callable[[], object] | None = None) -> Followed:
    """Break `leader`; wait for every agent to plan `location` with `successor` (plans compared:
    the same leaders everywhere, every WireGuard peer answered); wait for the pairs in `crossing`
    to answer again (and for `before_undo`); undo; wait for every agent to plan with `leader`
    again."""
    before = pings.counts()
    broke = time.time()
    brk()
    view = wait_until(lambda: (v := labcheck.leaders_view(st)).agreed() and
                      v.agreed().get(location) == (successor,) and v, 30,  # type: ignore[union-attr]
                      f"every agent planning {location} with {successor}")
    moved = time.time()
    print(f"{location}: every agent on {successor} {moved - broke:.2f} s after the break")
    assert view.asymmetric() == [], view.asymmetric()
    wait_until(lambda: all(pings.replies(p) > before[p] + 5 for p in crossing), 30,
               "every crossing pair answering again")
    if before_undo is not None:
        before_undo()
    undone = time.time()
    undo()
    view = wait_until(lambda: (v := labcheck.leaders_view(st)).agreed() and
                      v.agreed().get(location) == (leader,) and v, HOLD + 40,  # type: ignore[union-attr]
                      f"every agent planning {location} with {leader} again")
    back = time.time()
    print(f"{location}: {leader} leads again {back - undone:.2f} s after the break was undone (hold {HOLD} s)")
    assert view.asymmetric() == [], view.asymmetric()
    return Followed(broke, moved, undone, back)


RETURN_WINDOW_S = 5.0  # what `report` counts as lost around the return: until this long after it


def window_end(f: Followed) -> float:
    """When the last ping `report` reads has been answered or counted lost (wall clock)."""
    return f.back + RETURN_WINDOW_S + IN_FLIGHT_S + 1.0


def report(results: dict[tuple[str, str], PingResult], f: Followed, crossing: list[tuple[str, str]]
           ) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float]]:
    """Per pair: the seconds from the break to its last lost ping (0: none lost), and the seconds
    of pings lost around the return; printed as a table."""
    recovered, returned = {}, {}
    print(f"{'PAIR':<10} {'CROSSES':<8} {'LOST AT BREAK':>14} {'RECOVERED S':>12} {'LOST AT RETURN S':>17}")
    for pair, r in sorted(results.items()):
        at_break = lost_between(r, f.broke - 0.5, f.undone)
        at_return = lost_between(r, f.undone, f.back + RETURN_WINDOW_S)
        recovered[pair] = max(at_break) - f.broke + PPS_INTERVAL if at_break else 0.0
        returned[pair] = len(at_return) * PPS_INTERVAL
        print(f"{pair[0] + '-' + pair[1]:<10} {'yes' if pair in crossing else 'no':<8} {len(at_break):>14} "
              f"{recovered[pair]:>12.2f} {returned[pair]:>17.2f}")
    return recovered, returned


def wireguard_evidence(st: LabState, nodes: tuple[str, ...], since: float) -> str:
    """What a recovery over its bound is read with: each of `nodes`' WireGuard peer changes logged
    since `since` (wall clock: added, added anew after crossed handshakes, updated, removed) and
    its agent's peers now (name, kind, endpoint, last handshake)."""
    out = []
    for name in nodes:
        n = st.lookup(name)[1]
        out += node_log_lines(st, (name,), since, pick={"agent.log": (" peers: ",)})
        doc = labcheck.agent_status(n, fresh=True) or {}
        out += [f"{name} peer: {p.get('name')} {p.get('kind')} {p.get('endpoint')} handshake {p.get('last_handshake')}"
                for p in doc.get("peers", ())]
    return "\n".join(out)


def assert_recovered(st: LabState, recovered: dict[tuple[str, str], float], crossing: list[tuple[str, str]],
                     f: Followed) -> None:
    """Every pair in `crossing` answered again within RECOVER_BOUND_S of the break; when one did
    not, the message carries the new leader's and the far leaders' WireGuard evidence."""
    if not all(recovered[p] <= RECOVER_BOUND_S for p in crossing):
        raise AssertionError(f"{recovered}\n{wireguard_evidence(st, ('a2', 'b1', 'c1'), f.broke)}")


def forwarding_fault(st: LabState, node: str) -> tuple[Callable[[], None], Callable[[], None]]:
    n = st.lookup(node)[1]
    return (lambda: faults.forwarding(st.prefix, n, False)), (lambda: faults.forwarding(st.prefix, n, True))


def standby_sessions(st: LabState, leader: str, far: tuple[str, ...]) -> Callable[[], object]:
    """Waits until each of the `far` leaders holds a session with `leader` standing by (a standby
    peer with a handshake: docs/mesh.md, "Standby peers"), so that its return needs none."""
    def up(name: str) -> bool:
        doc = labcheck.agent_status(st.lookup(name)[1], fresh=True) or {}
        return any(p["name"] == leader and p["kind"] == "standby" and p.get("last_handshake")
                   for p in doc.get("peers", ()))
    return lambda: wait_until(lambda: all(up(n) for n in far), 20, f"{', '.join(far)} holding a session with {leader}")


def partition_fault(st: LabState, node: str) -> tuple[Callable[[], None], Callable[[], None]]:
    n = st.lookup(node)[1]
    return (lambda: faults.partition(st, n, True)), (lambda: faults.partition(st, n, False))
