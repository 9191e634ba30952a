# SPDX-License-Identifier: Apache-2.0
"""The summary a node publishes of what it observes (mesh.observed.NodeSeen), and the thread that
publishes it at a bounded rate.

`summarise` is pure: one AgentStatus in, one NodeSeen out (per peer of the plan: the rung in use
now, the rung its ladder starts at, the last probe RTT and loss, the WireGuard handshake's age).
`SeenPublisher.due` decides whether a summary is worth a write: never sooner than MIN_INTERVAL_S
after the last write, however much changes (a flapping pair in a 5,000-node mesh must not become
5,000 writes a second), at once after that when what a picture shows changed (a rung, a fall-back,
a loss bucket), and every HEARTBEAT_S regardless, so a reader can tell a live summary from a stale
one (STALE_AFTER_S).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from meshctl.agent.status import AgentStatus
from meshctl.mesh.chooser import RUNG_KIND, ProbeTuning
from meshctl.mesh.model import Path
from meshctl.mesh.observed import MAX_PEERS, NodeSeen, PeerSeen

log = logging.getLogger("meshctl.agent.seen")

MIN_INTERVAL_S = 5.0     # at most one write per node this often
HEARTBEAT_S = 60.0       # a write at least this often, changed or not
STALE_AFTER_S = 3 * HEARTBEAT_S  # a summary older than this no longer says what the node sees
CHECK_INTERVAL_S = 2.0   # how often the publisher reads the status
LOSS_BUCKETS = 4         # loss is compared in quarters: jitter in one lost probe is no change
_LOST_FULL = ProbeTuning().down_probes  # this many probes lost in a row: loss 1.0 (the kind is down)


@runtime_checkable
class SeenStore(Protocol):
    """A backend that keeps node summaries beside the records (the etcd backend)."""

    def publish_seen(self, seen: NodeSeen) -> None:
        """Write this node's summary; it must go with the node's record when the agent dies."""


def summarise(status: AgentStatus, cluster: str, now: float, limit: int = MAX_PEERS) -> NodeSeen:
    """What the node sees of each peer of its last plan. A peer the plan left unreached has no rung;
    a probed pair's rung is the prober's choice (its ladder's first rung is `first`), an unprobed
    one's the plan's.

    At most `limit` peers (a summary's bound, mesh.observed.MAX_PEERS): past it (a cluster mesh of
    tens of thousands of nodes) the peers something was observed of come first (probed, a
    WireGuard handshake, unreached), then this cluster's nodes, by name; a peer left out is drawn on
    its plan's rung, as a pair no end reports always is."""
    summary, live = status.summary, status.live
    if summary is None:
        return NodeSeen(status.node, cluster, now)
    pairs = live.path_probe.pairs if live.path_probe is not None else {}
    handshakes = {p.name: p.live.handshake_age_s for p in live.peers if p.live is not None}
    unreached = set(summary.unreached_peers)
    names = [n for n, planned in summary.paths.items() if planned != Path.LOCAL]
    if len(names) > limit:
        names = _first(names, limit, lambda n: n in pairs or n in unreached or
                       handshakes.get(n.rsplit("/", 1)[-1]) is not None)
    peers: dict[str, PeerSeen] = {}
    for name in names:
        planned = summary.paths[name]
        pair = pairs.get(name)
        rung = None if name in unreached else (pair.rung or planned if pair is not None else planned)
        first = pair.ladder[0] if pair is not None and pair.ladder else planned
        rtt = loss = None
        if pair is not None and pair.rung is not None:
            verdict = pair.probes.get(RUNG_KIND.get(pair.rung, ""))
            if verdict is not None:
                rtt = verdict.last_rtt_ms if verdict.last_rtt_ms is not None else verdict.rtt_ms
                loss = 1.0 if verdict.up is False else min(1.0, verdict.lost / _LOST_FULL)
        peers[name] = PeerSeen(rung, first, None if rtt is None else round(rtt, 3), loss,
                               handshakes.get(name.rsplit("/", 1)[-1]))
    return NodeSeen(status.node, cluster, round(now, 3), peers)


def _first(names: list[str], limit: int, observed: Callable[[str], bool]) -> list[str]:
    """The first `limit` of `names` ordered by (not observed, remote, name), without a sort key
    per name: at 50,000 peers the few observed ones are sorted, and the rest picked smallest
    first (heapq) only as far as the limit reaches."""
    seen = [n for n in names if observed(n)]
    if len(seen) >= limit:
        return sorted(seen, key=lambda n: ("/" in n, n))[:limit]
    taken = set(seen)
    out = sorted(seen, key=lambda n: ("/" in n, n))
    for remote in (False, True):
        rest = (n for n in names if ("/" in n) is remote and n not in taken)
        out += heapq.nsmallest(limit - len(out), rest)
    return out


def _shape(seen: NodeSeen) -> tuple[tuple[str, Path | None, Path | None, int], ...]:
    """What a picture draws of a summary: per peer its rung, ladder start and loss bucket."""
    return tuple((n, p.rung, p.first, round((p.loss or 0.0) * LOSS_BUCKETS)) for n, p in sorted(seen.peers.items()))


class SeenPublisher:
    """Decides when a summary is written (see the module doc) and remembers the last one written."""

    def __init__(self, min_interval: float = MIN_INTERVAL_S, heartbeat: float = HEARTBEAT_S) -> None:
        self.min_interval, self.heartbeat = min_interval, heartbeat
        self._last_at: float | None = None
        self._last_shape: tuple[tuple[str, str | None, str | None, int], ...] | None = None
        self.writes = 0

    def due(self, seen: NodeSeen, now: float) -> bool:
        if self._last_at is None:
            return True
        since = now - self._last_at
        if since < self.min_interval:
            return False
        return since >= self.heartbeat or _shape(seen) != self._last_shape

    def wrote(self, seen: NodeSeen, now: float) -> None:
        self._last_at, self._last_shape = now, _shape(seen)
        self.writes += 1


def publish_loop(store: SeenStore, status: Callable[[], AgentStatus], cluster: str, stop: threading.Event,
                 clock: Callable[[], float] = time.time, interval: float = CHECK_INTERVAL_S,
                 publisher: SeenPublisher | None = None) -> None:
    """Read the status every `interval` and write the summary when `publisher` says it is due. A
    failed write (etcd away) is logged and tried again at the next check; it never stops the loop."""
    pub = publisher or SeenPublisher()
    while not stop.wait(interval):
        try:
            st = status()
            if st.summary is None:
                continue
            now = clock()
            seen = summarise(st, cluster, now)
            if pub.due(seen, now):
                store.publish_seen(seen)
                pub.wrote(seen, now)
        except Exception as e:  # noqa: BLE001 - a summary is best effort: the next check tries again
            log.warning("publishing the observed summary: %s", e)
