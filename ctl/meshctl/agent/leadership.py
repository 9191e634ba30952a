# SPDX-License-Identifier: Apache-2.0
"""Leaders that forward, as the agent runs it (docs/mesh.md, "Leaders that do not forward").

`ForwardProbing` probes, through each other member of this node's location and (while it leads)
through each other location's leader it peers, whether that node forwards (node/forward_prober.py)
and publishes this node's report (mesh.leaders.ForwardingReport)
into the backend: at once when a verdict changes, and every HEARTBEAT_S regardless, so readers
can tell a live report from a stale one. A changed report wakes every agent (the etcd backend
watches it with the records; the Kubernetes backend watches the reports' ConfigMaps).

`Leadership` is the pass's part: the admitted topology and every published report in, the
topology planning with the chosen leaders out (the same object while the choice is the same, so
the plan's memo holds), and the moves it saw, counted per location (`meshctl_leader_moves_total`).
Every agent makes the same choice from the same reports, so every agent counts the same moves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from meshctl.agent.status import LeaderMove, LeadershipStatus
from meshctl.mesh.leaders import (
    HEARTBEAT_S,
    ForwardingReport,
    Leaders,
    LeaderTarget,
    LocationLeaders,
    choose_leaders,
    leader_targets,
    with_leaders,
)
from meshctl.mesh.model import Topology
from meshctl.mesh.segments import segment_key
from meshctl.node.forward_prober import ForwardProber

log = logging.getLogger("meshctl.agent.leadership")

LAST_MOVES = 5  # the moves the status keeps


@runtime_checkable
class ForwardingStore(Protocol):
    """A backend that keeps forwarding reports beside the records and watches them (etcd:
    `/meshctl/<cluster>/forwarding/<node>`; Kubernetes: ConfigMap `meshctl-forwarding-<node>`)."""

    def publish_forwarding(self, report: ForwardingReport) -> None:
        """Write this node's report where only its credentials may; a dead agent's report must
        stop counting with its record (etcd: on the record's lease; Kubernetes: a node whose
        last-seen aged out is no admitted member, and only members' reports count)."""


class ForwardProbing:
    """The forward prober of this node and the thread that publishes its report."""

    def __init__(self, private_if: str | None, node: str, cluster: str, store: ForwardingStore,
                 stop: threading.Event) -> None:
        self.private_if = private_if
        self.node = node
        self.cluster = cluster
        self.store = store
        self.stop_event = stop
        self.prober: ForwardProber | None = None
        self._own: str | None = None
        self._of: Topology | None = None
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None
        self.writes = 0

    def update(self, topo: Topology) -> None:
        """Probe the other members of this node's location (location granularity, an IPv4 private
        address, a private NIC) and, while this node leads, the other locations' leaders it peers
        (`topo`: the topology planning with the chosen leaders); stop when there is nothing to
        probe (cheap when the topology is the same)."""
        if topo is self._of:
            return
        self._of = topo
        me = topo.node(self.node)
        own = me.internal(4) if me is not None else None
        members: dict[str, str] = {}
        leaders: dict[str, LeaderTarget] = {}
        keep: list[str] = []
        if me is not None and topo.mesh.granularity == "location":
            key = segment_key(me, "location")
            for n in topo.nodes:
                addr = n.internal(4)
                if n.name != me.name and addr is not None and segment_key(n, "location") == key:
                    if own is not None and self.private_if:
                        members[n.name] = str(addr.ip)
                elif n.name != me.name:
                    keep.append(n.name)
            leaders = leader_targets(topo, me.name)
        if not members and not leaders:
            self.stop()
            return
        own_ip = str(own.ip) if own is not None and members else None  # hairpins need it
        if self.prober is not None and self._own != own_ip:
            self.stop()
        if self.prober is None:
            p = ForwardProber(self.private_if if own_ip else None, own_ip, topo.mesh.leader_hold,
                              on_change=self._changed.set)
            try:
                p.start()
            except OSError as e:
                log.warning("forwarding probes off: %s", e)
                return
            self.prober, self._own = p, own_ip
            log.info("probing whether %d member(s) of location %s and %d other location(s)' leader(s) forward",
                     len(members), me.location if me is not None else "", len(leaders))
            if self._thread is None:
                self._thread = threading.Thread(target=self._publish_loop, name="forwarding", daemon=True)
                self._thread.start()
        self.prober.set_hold(topo.mesh.leader_hold)
        self.prober.set_targets(members, leaders, keep)
        self._changed.set()  # a leader no longer probed may leave the report

    def report(self) -> ForwardingReport | None:
        if self.prober is None:
            return None
        return self.prober.report(self.node, self.cluster, round(time.time(), 3))

    def _publish_loop(self) -> None:
        """Publish at once when a verdict changed, else every HEARTBEAT_S; a failed write (etcd
        away) is tried again at the next change or heartbeat."""
        last: ForwardingReport | None = None
        last_at = 0.0
        while not self.stop_event.is_set():
            self._changed.wait(timeout=max(0.05, HEARTBEAT_S - (time.monotonic() - last_at)))
            self._changed.clear()
            if self.stop_event.is_set():
                return
            r = self.report()
            if r is None:
                continue
            if r.same_verdicts(last) and time.monotonic() - last_at < HEARTBEAT_S:
                continue
            try:
                self.store.publish_forwarding(r)
                last, last_at = r, time.monotonic()
                self.writes += 1
            except Exception as e:  # noqa: BLE001 - a report is tried again; it never stops the agent
                log.warning("publishing the forwarding report: %s", e)

    def verdicts_json(self) -> dict[str, dict[str, object]] | None:
        p = self.prober
        return None if p is None else {n: v.to_json() for n, v in p.verdicts().items()}

    def stop(self) -> None:
        if self.prober is not None:
            self.prober.stop()
            self.prober = None
            self._own = None


def move_reason(was: LocationLeaders, now: LocationLeaders) -> str:
    """Why a location's leaders changed, in one line."""
    if now.moved:
        return now.reason
    if was.static != now.static:
        return "the documented order changed (a member joined or left)"
    back = [n for n in now.leaders if n not in was.leaders]
    return f"{', '.join(back)} forward{'s' if len(back) == 1 else ''} again: back to the documented order"


class Leadership:
    """Each pass's leader choice, and the moves between passes."""

    def __init__(self) -> None:
        self.decision: Leaders | None = None
        self.moves: dict[str, int] = {}
        self.last_moves: list[LeaderMove] = []
        self._memo: tuple[Topology, Topology] | None = None  # (admitted, planning)

    def apply(self, topo: Topology, reports: Mapping[str, ForwardingReport]) -> Topology:
        """The admitted `topo` planning with the leaders the reports choose; counts the moves."""
        decision = choose_leaders(topo, reports)
        prev = self.decision
        self.decision = decision
        if prev is not None:
            for key, loc in decision.locations.items():
                was = prev.locations.get(key)
                if was is not None and was.leaders != loc.leaders:
                    self.moves[loc.location] = self.moves.get(loc.location, 0) + 1
                    why = move_reason(was, loc)
                    move = LeaderMove(loc.location, round(time.time(), 3), was.leaders, loc.leaders, why)
                    self.last_moves = [*self.last_moves, move][-LAST_MOVES:]
                    log.warning("location %s: leaders %s -> %s (%s)", loc.location, ",".join(was.leaders),
                                ",".join(loc.leaders), why)
        memo = self._memo
        if memo is not None and memo[0] is topo and with_leaders(memo[1], decision) is memo[1]:
            return memo[1]
        planning = with_leaders(topo, decision)
        self._memo = (topo, planning)
        return planning

    def status(self, forwarding: dict[str, dict[str, object]] | None) -> LeadershipStatus | None:
        d = self.decision
        if d is None or not d.locations:
            return None
        return LeadershipStatus(tuple(loc.to_json() for _, loc in sorted(d.locations.items())), dict(self.moves),
                                tuple(self.last_moves), forwarding)
