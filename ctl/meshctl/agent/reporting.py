# SPDX-License-Identifier: Apache-2.0
"""Building the agent's status (agent/status.py), on the loop's thread: `PassRecorder` turns each
pass into its `PassSummary`; `LiveReader` reads the live parts (counters, verdicts, the steps'
reports) for each snapshot the loop publishes (agent/snapshot.py). Both keep the pieces that cost
the most (a leader's peers as text, the node list, the warnings) while the plan or view they came
from is the same object (the identity rule: mesh.memo)."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from meshctl.agent.config import AgentConfig, fastpath_off
from meshctl.agent.observe import Observation
from meshctl.agent.path_probing import PathProbing
from meshctl.agent.snapshot import NodeRows
from meshctl.agent.status import (
    BackendBlocks,
    CniStatus,
    DatapathStatus,
    Interfaces,
    LastReconcile,
    LeadershipStatus,
    LiveStatus,
    NodeRow,
    PassSummary,
    PeerCounters,
    PeerRow,
    PodsStatus,
    ReconcileTotals,
    Rejected,
    Relay,
    RemotesStatus,
    RungChanges,
)
from meshctl.agent.steps import LivePeers, StepReport
from meshctl.backends.base import Backend, ClusterState
from meshctl.datapath import links
from meshctl.datapath.layout import overhead
from meshctl.errors import MeshError
from meshctl.mesh.admit import Rejection
from meshctl.mesh.checks import dead_tunnels, host_prefix_warnings
from meshctl.mesh.chooser import Change
from meshctl.mesh.model import ENCAP_RUNGS, Path, Topology
from meshctl.mesh.plan import NodePlan, PeerPlan
from meshctl.mesh.render import node_list
from meshctl.mesh.segments import Remote
from meshctl.node.discovery import DEFAULT_NIC_MTU, WG_OVERHEAD
from meshctl.node.wireguard import PeerStatus

log = logging.getLogger("meshctl.agent")

LIVE_PEERS_TTL_S = 1.0  # snapshots read WireGuard's counters at most this often
REJECTIONS_SEEN_MAX = 10000  # distinct (record, reason) pairs remembered for rejections_total


class PodInterfaces(Protocol):
    """The netlink watcher of pod interfaces (node.pods.PodInterfaceWatcher)."""

    @property
    def current(self) -> tuple[str, ...]: ...


class ErrorCounts:
    """Failures by part of the agent since start (`errors_total`), counted from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def count(self, part: str) -> None:
        with self._lock:
            self._counts[part] = self._counts.get(part, 0) + 1

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


@dataclass
class PassLog:
    """What the pass being run records for status: step timings, reused results, errors."""

    errors_total: ErrorCounts
    t0: float = field(default_factory=time.monotonic)
    cpu0: float = field(default_factory=time.thread_time)
    steps_ms: dict[str, float] = field(default_factory=dict)
    reused: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    full: bool = False

    def timed(self, part: str, since: float) -> None:
        """Add the time since `since` to `part`'s (a step is timed in its sync and its retire)."""
        self.steps_ms[part] = round(self.steps_ms.get(part, 0.0) + 1000 * (time.monotonic() - since), 2)

    def fail(self, part: str, reason: str) -> None:
        self.errors[part] = reason
        self.errors_total.count(part)


@dataclass(frozen=True)
class PassOutcome:
    """What a pass hands the recorder: the backend's view, the plan in force (None: none yet),
    the rejections, whether this pass applied it, and the admitted topology (None when the pass
    stopped before admission: the node count and warnings of the last one stay)."""

    state: ClusterState
    plan: NodePlan | None
    rejections: list[Rejection]
    applied: bool
    topo: Topology | None
    observed: Observation
    pod_ifs: tuple[str, ...]
    full_total: int
    remotes: RemotesStatus | None
    leaders: LeadershipStatus | None = None


class PassRecorder:
    """Turns each pass into its PassSummary; counts passes and distinct rejections. `head`:
    whether the backend was ready at the last pass (and why not), and that pass's summary (None
    before the first), swapped as one value so a reader never sees halves of two passes."""

    def __init__(self, cfg: AgentConfig, errors_total: ErrorCounts) -> None:
        self.cfg = cfg
        self.errors_total = errors_total
        self.head: tuple[bool, str, PassSummary | None] = (False, "starting", None)
        self._ok_total = 0
        self._failed_total = 0
        self._rejections_seen: set[tuple[str, str]] = set()
        self._warnings: tuple[Topology, tuple[str, ...]] | None = None

    def _log_rejections(self, rejections: list[Rejection]) -> None:
        for r in rejections:
            key = (r.name, r.reason)
            if key not in self._rejections_seen:
                self._rejections_seen.add(key)
                log.warning("rejected %s: %s", r.name, r.reason)
        if len(self._rejections_seen) > REJECTIONS_SEEN_MAX:
            self._rejections_seen = {(r.name, r.reason) for r in rejections}

    def finish(self, run: PassLog, out: PassOutcome) -> PassSummary:
        """The summary of the pass `run` with outcome `out` (also kept in `head`)."""
        dt, cpu = time.monotonic() - run.t0, time.thread_time() - run.cpu0
        self._log_rejections(out.rejections)
        if run.errors:
            self._failed_total += 1
        else:
            self._ok_total += 1
        plan, state, prev = out.plan, out.state, self.head[2]
        summary = PassSummary(
            cluster=state.cluster.name, backend=self.cfg.backend, revision=state.revision,
            records=state.records, granularity=plan.granularity if plan else None,
            mesh=state.mesh, leader=plan.leader if plan else None,
            is_leader=bool(plan and plan.leader == self.cfg.node_name),
            wireguard_ip=(",".join(map(str, plan.device_addresses)) or None) if plan else None,
            nodes=len(out.topo.nodes) if out.topo else (prev.nodes if prev else 0),
            routes=len(plan.routes) if plan else 0, paths=dict(plan.paths) if plan else {},
            relays={n: Relay(via, why) for n, (via, why) in plan.relays.items()} if plan else {},
            discovered_endpoints={n: str(ep) for n, ep in out.observed[0]}, unreached_peers=tuple(out.observed[1]),
            rejections=tuple(Rejected(r.name, r.reason) for r in out.rejections),
            rejections_total=len(self._rejections_seen), pod_interfaces=out.pod_ifs,
            warnings=self._warnings_of(out.topo, prev),
            last_reconcile=LastReconcile(time.time(), round(dt, 6), round(cpu, 6), out.applied, run.full,
                                         tuple(run.reused), dict(run.errors), dict(run.steps_ms)),
            reconcile=ReconcileTotals(self._ok_total, self._failed_total, out.full_total),
            errors_total=self.errors_total.snapshot(), pid=os.getpid(), remotes=out.remotes,
            interfaces=Interfaces(self.cfg.private_interface, self.cfg.wg_interface),
            path_mtu=rung_mtus(_mtu_of(self.cfg.private_interface), _underlay(out.topo, self.cfg.node_name)),
            leaders=out.leaders if out.leaders is not None or prev is None else prev.leaders)
        self.head = (state.ready, state.reason, summary)
        return summary

    def _warnings_of(self, topo: Topology | None, prev: PassSummary | None) -> tuple[str, ...]:
        """What is safe but cannot work, from this node's side (mesh.checks): its tunnels that can
        never start, its own host-prefix internal address. Recomputed only for a new admitted view."""
        if topo is None:
            return prev.warnings if prev else ()
        memo = self._warnings
        if memo is None or memo[0] is not topo:
            me = topo.node(self.cfg.node_name)
            found = dead_tunnels(topo, only=self.cfg.node_name)
            if me is not None:
                found += ["internal_ip: " + w.split(": ", 1)[1]
                          for w in host_prefix_warnings(topo, only=self.cfg.node_name)]
            memo = self._warnings = (topo, tuple(found))
        return memo[1]


def _underlay(topo: Topology | None, name: str) -> int:
    """The IP version of the node's first internal address (4 without one)."""
    me = topo.node(name) if topo is not None else None
    return me.internal_ip.version if me is not None and me.internal_ip is not None else 4


def rung_mtus(private_mtu: int | None, underlay: int = 4) -> dict[Path, int]:
    """The largest packet each rung carries from a node whose private NIC has `private_mtu`
    (None: no private NIC; then the WireGuard rungs as over a 1500-byte one): the NIC's MTU,
    less each encapsulation's overhead over that underlay (IPv6's outer header is 20 bytes
    longer), and WireGuard's device MTU for its two rungs."""
    out: dict[Path, int] = {}
    if private_mtu is not None:
        out[Path.DIRECT] = private_mtu
        out.update({rung: private_mtu - overhead(kind, underlay) for rung, kind in ENCAP_RUNGS.items()})
    wg = (private_mtu or DEFAULT_NIC_MTU) - WG_OVERHEAD
    out.update({Path.WIREGUARD_PRIVATE: wg, Path.TUNNEL: wg})
    return out


def _mtu_of(dev: str | None) -> int | None:
    if not dev:
        return None
    try:
        return links.mtu(dev)
    except MeshError:
        return None


View = tuple[Topology, list[Remote], NodePlan]


class LiveReader:
    """Reads the live parts of the status (LiveStatus, without the node list: `node_rows`) for the
    loop's snapshots; only the loop's thread calls it."""

    def __init__(self, cfg: AgentConfig, backend: Backend, paths: PathProbing, peers: LivePeers | None,
                 step_report: Callable[[], StepReport], pods: Callable[[], PodInterfaces | None]) -> None:
        self.cfg = cfg
        self.backend = backend
        self.paths = paths
        self.peers = peers
        self.step_report = step_report
        self.pods = pods
        self._peer_rows: tuple[Sequence[PeerPlan], tuple[PeerRow, ...]] | None = None
        self._live_peers: tuple[float, dict[str, PeerCounters]] = (0.0, {})
        self._node_rows: tuple[View, NodeRows] | None = None

    def read(self, plan: NodePlan | None) -> LiveStatus:
        rep = self.step_report()
        datapath = rep.datapath or DatapathStatus(None, fastpath_off(self.cfg) or "loading")
        return LiveStatus(
            datapath=datapath,
            # Read for every snapshot, not once per pass: a rung change between passes is the point of probing.
            path_probe=self.paths.status(), path_changes=change_counts(self.paths.changes()),
            wireguard_mode=rep.wireguard_mode,
            pods=self._pods(datapath, rep.carrying), cni=rep.cni or CniStatus(self.cfg.cni),
            peers=self._peer_status(plan) if plan else (),
            node_list=None,
            backend=self._backend_blocks())

    def _backend_blocks(self) -> BackendBlocks:
        try:
            st = self.backend.status()
            return BackendBlocks(st.own_record, st.lapsed, st.kvstore)
        except Exception as e:  # noqa: BLE001 - status must always answer
            return BackendBlocks(backend_error=str(e))

    def _pods(self, dp: DatapathStatus, carrying: tuple[str, ...]) -> PodsStatus:
        """How many pod interfaces carry the fast path, and a warning when this node has pods and
        none do (the fast path silently off is the failure this exists to show)."""
        watch = self.pods()
        found = tuple(watch.current) if watch is not None else ()
        warning = None
        # else the datapath line says why (off, or idle without a private interface)
        if found and not carrying and fastpath_off(self.cfg) is None and self.cfg.private_interface:
            why = "the fast path is not loaded" if dp.mode != "ebpf" else \
                f"--pod-interfaces {self.cfg.pod_interfaces!r} matches none of them"
            warning = f"{len(found)} pod interface(s) on this node and none carry the fast path: {why}"
        return PodsStatus("flag" if self.cfg.pod_interfaces else "netlink", found, carrying, warning)

    def _peer_status(self, plan: NodePlan) -> tuple[PeerRow, ...]:
        """The plan's peers (built once per plan: a leader's allowed IPs as text are many) with
        WireGuard's live counters (read at most every LIVE_PEERS_TTL_S, without allowed IPs)."""
        rows = self._peer_rows
        if rows is None or not (rows[0] is plan.peers or rows[0] == plan.peers):
            # A peer the plan hands out as the same object keeps its row (its allowed IPs as text:
            # a leader's are 100,000; a join changes a few peers, not all).
            before = dict(zip(map(id, rows[0]), rows[1], strict=True)) if rows is not None else {}
            rows = self._peer_rows = (plan.peers, tuple(
                before.get(id(p)) or PeerRow(p.name, p.kind, p.public_key, p.endpoint,
                                             tuple(str(a) for a in p.allowed_ips))
                for p in plan.peers))
        at, live = self._live_peers
        if self.peers is not None and time.monotonic() - at >= LIVE_PEERS_TTL_S:
            try:
                shown = self.peers.peers_now()
                if shown is not None:
                    live = peers_by_key(shown)
            except Exception as e:  # noqa: BLE001 - status must always answer
                shown = []  # keep the last counters until the next try
                log.debug("wireguard show: %s", e)
            if shown is not None:  # None: no device yet
                self._live_peers = (time.monotonic(), live)
        now = time.time()
        return tuple(PeerRow(r.name, r.kind, r.public_key, r.endpoint, r.allowed_ips,
                             _aged(live.get(r.public_key), now)) for r in rows[1])

    def node_rows(self, view: View) -> NodeRows:
        """render.node_rows of the last applied view, built on a reader's first ask, once per
        view. The same admitted topology and plan object also mean the same (empty) remotes: the
        plan is reused only without remote clusters."""
        cached = self._node_rows
        if cached is None or cached[0][0] is not view[0] or cached[0][2] is not view[2]:
            def build(view: View = view) -> tuple[NodeRow, ...]:
                return tuple(node_list(*view, fastpath=True))
            cached = self._node_rows = (view, NodeRows(build))
        return cached[1]


def change_counts(changes: Sequence[Change]) -> tuple[RungChanges, ...]:
    """Rung changes since start, counted by (from, to, reason)."""
    counts: dict[tuple[Path, Path, str], int] = {}
    for c in changes:
        key = (c.old or Path.NONE, c.new, c.reason)
        counts[key] = counts.get(key, 0) + 1
    return tuple(RungChanges(a, b, r, n) for (a, b, r), n in sorted(counts.items()))


def _aged(c: PeerCounters | None, now: float) -> PeerCounters | None:
    """`c` with its handshake's age at `now` (None without a handshake)."""
    if c is None or not c.last_handshake:
        return c
    return dataclasses.replace(c, handshake_age_s=round(max(0.0, now - c.last_handshake), 3))


def peers_by_key(peers: list[PeerStatus]) -> dict[str, PeerCounters]:
    """WireGuard's peers by public key: bytes each way, last handshake (0: none), live endpoint."""
    return {p.public_key: PeerCounters(p.rx_bytes, p.tx_bytes, p.last_handshake or 0, p.endpoint) for p in peers}
