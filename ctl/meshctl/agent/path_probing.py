# SPDX-License-Identifier: Apache-2.0
"""Path probing as the agent runs it: under `intra_subnet: auto` a prober (node/prober.py) probes
every eligible peer on every private rung this node can carry, and its verdicts (mesh/chooser.py)
are the path-state the next plan reads. A change of a pair's rung wakes the loop at once: the pair
leaves a dead rung without waiting for a reconcile pass.

The fixed intra_subnet modes: no prober, an empty path-state. `auto` where the prober cannot run
(IPv6 private addresses, no private interface): no encapsulated rung, which nothing would verify.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from meshctl.agent.status import ProbeStatus
from meshctl.mesh.chooser import Change, ProbeTuning
from meshctl.mesh.ladder import probe_ladders
from meshctl.mesh.model import ENCAP_RUNGS, PathState, Rung, Topology
from meshctl.node.prober import Prober, Target, probe_address

log = logging.getLogger("meshctl.agent")

UNPROBED_RUNGS: frozenset[str] = frozenset({"direct", "wireguard-private"})


def unprobed_state(ladders: dict[str, tuple[Rung, ...]]) -> PathState:
    """The path-state where no probe runs: the rungs that need no encapsulation (none verified)."""
    return {name: frozenset(r for r in lad if r in UNPROBED_RUNGS) for name, lad in ladders.items()}


class EncapCarrier(Protocol):
    """Something that carries encapsulated entries on this node (the eBPF fast path, or the
    tunnel devices of the kernel fallback)."""

    def available(self, kind: str) -> bool:
        """Whether this node can send and receive `kind` ("vxlan", "ipip")."""
        ...


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

    def local_rungs(self) -> frozenset[Rung]:
        """Direct and WireGuard always; an encapsulated rung when something here carries it."""
        out: set[Rung] = {"direct", "wireguard-private"}
        for rung, kind in ENCAP_RUNGS.items():
            if any(c.available(kind) for c in self.carriers):
                out.add(rung)
        return frozenset(out)

    def update(self, topo: Topology, name: str) -> None:
        """Start, retarget or stop the prober for this admitted topology (cheap when unchanged)."""
        if topo is self._ladders_of:
            return
        self._ladders_of = topo
        me = topo.node(name)
        ladders = probe_ladders(topo, name)
        probe_ip = probe_address(me.pod_cidr) if me is not None else None
        internal = me.internal_ip.ip if me is not None and me.internal_ip is not None else None
        if not ladders or probe_ip is None or not isinstance(internal, ipaddress.IPv4Address) or not self.private_if:
            self.stop()
            # Nothing verifies the rungs here (IPv6, no private NIC): a pair gets only the unprobed
            # rungs, which need no encapsulation this node may lack.
            self._unprobed = unprobed_state(ladders)
            return
        self._unprobed = {}
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
            log.info("probing %d peer(s) on the private rungs %s", len(ladders), sorted(p.chooser.local_rungs))
        targets = []
        for n in topo.nodes:
            lad = ladders.get(n.qualified_name)
            pa = probe_address(n.pod_cidr)
            if lad is None or pa is None or n.internal_ip is None or n.internal_ip.version != 4:
                continue
            targets.append(Target(n.qualified_name, n.internal_ip.ip, pa, lad))
        self.prober.set_targets(targets)

    def refresh_rungs(self) -> None:
        """The carriers may have changed (the fast path finished loading)."""
        if self.prober is not None:
            self.prober.set_local_rungs(self.local_rungs())

    def state(self) -> PathState:
        return self.prober.path_state() if self.prober is not None else dict(self._unprobed)

    def changes(self) -> list[Change]:
        return self.prober.changes() if self.prober is not None else []

    def status(self) -> ProbeStatus | None:
        """The prober's counters and verdicts now; None when no prober runs."""
        return ProbeStatus.from_json(self.prober.status()) if self.prober is not None else None

    def stop(self) -> None:
        if self.prober is not None:
            self.prober.stop()
            self.prober = None
            self._key = None
