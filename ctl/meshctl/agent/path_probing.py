# SPDX-License-Identifier: Apache-2.0
"""Path probing as the agent runs it: under `intra_subnet: auto` a prober (node/prober.py) probes
every eligible peer on every private rung this node can carry, and its verdicts (mesh/chooser.py)
are the path-state the next plan reads. A change of a pair's rung wakes the loop at once: the pair
leaves a dead rung without waiting for a reconcile pass.

Make before break: a pair this node already reaches, newly probed (a change of
`private_networks`, `intra_subnet` or granularity made it eligible), keeps the path it has until
its probes give a verdict (`keep_paths`): it never moves onto a rung no probe has seen deliver. A
node new to this one gets no such hold (its first probes come within a second).

The fixed intra_subnet modes: no prober, an empty path-state. `auto` where the prober cannot run
(IPv6 private addresses, no private interface): no encapsulated rung, which nothing would verify.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from meshctl.agent.status import ProbeResult
from meshctl.agent.steps import EncapCarrier
from meshctl.mesh.chooser import RUNG_KIND, Change, ProbeStatus, ProbeTuning, RungMove
from meshctl.mesh.ladder import probe_ladders
from meshctl.mesh.model import ENCAP_RUNGS, PRIVATE_RUNGS, Path, PathState, Rung, Topology
from meshctl.node.prober import Prober, Target, probe_address

log = logging.getLogger("meshctl.agent")

HISTORY_MOVES = 3  # the last moves of each pair the status carries

UNPROBED_RUNGS: frozenset[Rung] = frozenset({Path.DIRECT, Path.WIREGUARD_PRIVATE})


def keep_paths(state: PathState, ladders: Mapping[str, Sequence[Rung]], previous: Mapping[str, Path]) -> PathState:
    """`state` with every probed peer that has no verdict yet held on the path the last plan took
    to it (`previous`: the last plan's `paths`): that private rung, or none (its tunnel, a leader
    or a relay). A peer the last plan did not reach is left out (the plan assumes its rungs work)."""
    out = dict(state)
    for name in ladders:
        was = previous.get(name)
        if name not in out and was is not None:
            out[name] = frozenset({was}) if was in PRIVATE_RUNGS else frozenset()
    return out


def unprobed_state(ladders: dict[str, tuple[Rung, ...]]) -> PathState:
    """The path-state where no probe runs: the rungs that need no encapsulation (none verified)."""
    return {name: frozenset(r for r in lad if r in UNPROBED_RUNGS) for name, lad in ladders.items()}


class PathProbing:
    """Owns the prober; `state()` is the plan's path-state input."""

    def __init__(self, private_if: str | None, wake: Callable[[], None], tuning: ProbeTuning | None = None,
                 carriers: Iterable[EncapCarrier] = ()) -> None:
        self.private_if = private_if
        self.wake = wake
        self.tuning = tuning or ProbeTuning()
        self.carriers = list(carriers)
        self.prober: Prober | None = None
        self._key: tuple[Any, ...] | None = None
        self._ladders_of: Topology | None = None
        self._unprobed: PathState = {}
        self._ladders: dict[str, tuple[Rung, ...]] = {}  # the probed peers' ladders
        self._underlay = 4  # the IP version of this node's probed private address

    def local_rungs(self) -> frozenset[Rung]:
        """Direct and WireGuard always; an encapsulated rung when something here carries it."""
        out: set[Rung] = set(UNPROBED_RUNGS)
        for rung, kind in ENCAP_RUNGS.items():
            if any(c.available(kind, self._underlay) for c in self.carriers):
                out.add(rung)
        return frozenset(out)

    def update(self, topo: Topology, name: str) -> None:
        """Start, retarget or stop the prober for this admitted topology (cheap when unchanged)."""
        if topo is self._ladders_of:
            return
        self._ladders_of = topo
        me = topo.node(name)
        ladders = self._ladders = probe_ladders(topo, name)
        probe_ip = probe_address(me.pod_cidrs) if me is not None else None
        internal = me.internal_ip.ip if me is not None and me.internal_ip is not None else None
        if not ladders or probe_ip is None or internal is None or not self.private_if:
            self.stop()
            # Nothing verifies the rungs here (no private address, no pods, no private NIC): a pair
            # gets only the unprobed rungs, which need no encapsulation this node may lack.
            self._unprobed = unprobed_state(ladders)
            return
        # Probes cross the underlay of this node's first internal address (IPv4 where it has one),
        # to a peer's address of that family, and carry this node's first pod family.
        self._underlay = internal.version
        key = (internal, probe_ip)
        if self.prober is not None and self._key != key:
            self.stop()
        if self.prober is None:
            p = Prober(self.private_if, internal, probe_ip, self.local_rungs(), on_change=self.wake,
                       tuning=self.tuning)
            try:
                p.start()
            except OSError as e:
                log.warning("path probing off: %s", e)
                p.stop()
                self._unprobed = unprobed_state(ladders)
                return
            self.prober, self._key = p, key
            # The fast path may have finished loading while the prober started: its refresh_rungs
            # then found no prober, and this one would never carry the encapsulations it brought.
            self.refresh_rungs()
            log.info("probing %d peer(s) on the private rungs %s", len(ladders), sorted(p.chooser.local_rungs))
        targets = []
        unprobed: dict[str, tuple[Rung, ...]] = {}
        for n in topo.nodes:
            lad = ladders.get(n.qualified_name)
            if lad is None:
                continue
            pa = probe_address(n.pod_cidrs, probe_ip.version)
            peer = n.internal(internal.version)
            if pa is None or peer is None:
                # No address of the probed families to reach it at: nothing verifies its rungs, so
                # it gets the unprobed ones (never an encapsulation this node could not check).
                unprobed[n.qualified_name] = lad
                continue
            targets.append(Target(n.qualified_name, peer.ip, pa, lad))
        self._unprobed = unprobed_state(unprobed)
        self.prober.set_targets(targets)

    def refresh_rungs(self) -> None:
        """The carriers may have changed (the fast path finished loading): the prober's rungs
        follow (a no-op when they did not change)."""
        prober = self.prober
        if prober is not None and (rungs := self.local_rungs()) != prober.chooser.local_rungs:
            prober.set_local_rungs(rungs)

    def state(self, previous: Mapping[str, Path] | None = None) -> PathState:
        """The plan's path-state; with `previous` (the last plan's paths), a probed peer without a
        verdict keeps its path (keep_paths)."""
        if self.prober is None:
            return dict(self._unprobed)
        st = {**self._unprobed, **self.prober.path_state()}  # peers the prober cannot reach: unprobed rungs
        return keep_paths(st, self._ladders, previous) if previous else st

    def changes(self) -> list[Change]:
        return self.prober.changes() if self.prober is not None else []

    def status(self) -> ProbeStatus | None:
        """The prober's counters and verdicts now, each pair with its last moves; None when no
        prober runs."""
        if self.prober is None:
            return None
        return with_history(self.prober.status(), self.prober.changes(),
                            time.time() - time.monotonic())

    def probe(self, peer: str, rung: Path | None) -> ProbeResult:
        """One probe now towards `peer` of the kind that tests `rung` (the pair's rung), and
        whether it came back; for `tunnel`, of the pair's cheapest private rung (the result names
        the rung probed). A relay, a pair without private rungs or no prober give a result with
        `error` saying so, and nothing is sent."""
        timeout = self.tuning.timeout
        kind = RUNG_KIND.get(rung) if rung is not None else None
        if self.prober is None:
            return ProbeResult(peer, rung, kind, False, None, timeout,
                               "no path prober runs on this node (intra_subnet is not auto, or no private IPv4)")
        if kind is None and rung == Path.TUNNEL:
            # The tunnel is not probed (WireGuard's handshake is its evidence): the pair's cheapest
            # private rung is, which says whether the private network delivers again.
            pair = self.prober.status().pairs.get(peer)
            private = next((r for r in (pair.ladder if pair is not None else ()) if r in RUNG_KIND), None)
            kind = RUNG_KIND.get(private) if private is not None else None
            rung = private or Path.TUNNEL
        if kind is None:
            return ProbeResult(peer, rung, None, False, None, timeout,
                               f"rung {rung or 'none'} is not probed (only the private rungs are; "
                               "WireGuard's handshake is the tunnel's evidence)")
        try:
            rtt = self.prober.probe_once(peer, kind, timeout)
        except KeyError:
            return ProbeResult(peer, rung, kind, False, None, timeout, f"{peer} is not probed on {kind} from here")
        return ProbeResult(peer, rung, kind, rtt is not None, round(rtt * 1000, 3) if rtt is not None else None,
                           timeout)

    def stop(self) -> None:
        if self.prober is not None:
            self.prober.stop()
            self.prober = None
            self._key = None


def with_history(st: ProbeStatus, changes: Sequence[Change], wall_offset: float) -> ProbeStatus:
    """`st` with each pair's last HISTORY_MOVES rung changes (the chooser's times are monotonic:
    `wall_offset` turns them into wall-clock times)."""
    moves: dict[str, list[RungMove]] = {}
    for c in changes:
        if c.peer in st.pairs:
            moves.setdefault(c.peer, []).append(RungMove(c.old, c.new, c.reason, round(c.at + wall_offset, 3)))
    pairs = {name: dataclasses.replace(p, history=tuple(moves.get(name, ())[-HISTORY_MOVES:]))
             for name, p in st.pairs.items()}
    return dataclasses.replace(st, pairs=pairs)
