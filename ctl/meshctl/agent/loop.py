# SPDX-License-Identifier: Apache-2.0
"""The agent's ONE reconcile loop: it turns the backend's view into this node's state.

    backend.snapshot -> admit (mesh.admit, older records first; remote clusters after)
        -> mesh.plan.plan_node -> steps (WireGuard, routes, sysctls, NAT, datapath) -> status/metrics

The loop runs in one thread, woken by the backend (debounced a few ms so a burst of records costs
one pass) and every `resync_interval` to repair drift (a full pass; a change that arrives during
one is applied first and the loop's next tick finishes it: agent/step_runner.py). Each step's
failure is logged and counted and never stops the others. When the backend is not ready (etcd
away) nothing is applied: routes, WireGuard and maps stay as they are, which is what keeps
traffic flowing.

`ReconcileLoop` is the thread (when to pass), `PassDriver` one pass. The pass drives its steps
through a StepRunner and never reads or assigns a step's attributes; what the loop needs of
WireGuard (the handshakes it observes) comes through the LivePeers protocol.

Status: after every pass, and between passes when a reader asks for one (`Wake.nudge`), the
pass driver publishes one Snapshot (agent/snapshot.py) built from the pass's summary and the live
blocks it reads on this thread; readers read nothing else.
"""

from __future__ import annotations

import fnmatch
import logging
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from meshctl.agent.config import AgentConfig, FlagSettings, OwnSettings
from meshctl.agent.leadership import ForwardProbing, Leadership
from meshctl.agent.memos import PureMemos
from meshctl.agent.observe import HandshakeObserver, Observation
from meshctl.agent.path_probing import PathProbing
from meshctl.agent.reporting import ErrorCounts, LiveReader, PassLog, PassOutcome, PassRecorder
from meshctl.agent.snapshot import Snapshot, StatusBoard
from meshctl.agent.status import AgentStatus, PassSummary
from meshctl.agent.step_runner import StepRunner
from meshctl.agent.steps import LivePeers, PassInput
from meshctl.backends.base import Backend, ClusterState
from meshctl.backends.remote_status import RemotesStatus
from meshctl.errors import InputError, MeshError
from meshctl.mesh.admit import Rejection
from meshctl.mesh.model import MeshSettings, Node, Topology
from meshctl.mesh.plan import NodePlan
from meshctl.mesh.segments import Remote
from meshctl.node import discovery, flannel
from meshctl.process import gc_paused

log = logging.getLogger("meshctl.agent")

DEBOUNCE_S = 0.005
POD_SCAN_S = 1.0
NOT_OBSERVED: Observation = ((), ())


class RemoteSource(Protocol):
    """Other clusters, as the cluster-mesh watcher (backends.clustermesh.RemoteClusters) gives them."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def admit(self, local: Topology) -> tuple[list[Remote], list[Rejection]]:
        """The remote clusters' records that may join this cluster's plan, and the rejections."""
        ...

    def report(self) -> RemotesStatus:
        """The ClusterMesh block of the status."""
        ...


def local_interfaces() -> list[str]:
    """Interface names of the namespace this process runs in."""
    return [name for _, name in socket.if_nameindex()]


def pod_interfaces(pattern: str | None) -> list[str]:
    if not pattern:
        return []
    return sorted(n for n in local_interfaces() if fnmatch.fnmatchcase(n, pattern))


class Wake:
    """The loop's bell: `set` (a change: a pass is due; `is_set` says one waits), and `nudge`
    (a reader wants a status snapshot: no reason for a pass). A threading.Event with a second,
    weaker ring."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._flag = False
        self._nudged = False

    def set(self) -> None:
        with self._cond:
            self._flag = True
            self._cond.notify_all()

    def is_set(self) -> bool:
        return self._flag

    def clear(self) -> None:
        with self._cond:
            self._flag = False

    def nudge(self) -> None:
        with self._cond:
            self._nudged = True
            self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Until set, nudged or `timeout`; whether it is set."""
        with self._cond:
            if not self._flag and not self._nudged:
                self._cond.wait(timeout)
            return self._flag

    def take_nudge(self) -> bool:
        """Whether a reader nudged since the last call."""
        with self._cond:
            nudged, self._nudged = self._nudged, False
            return nudged


@dataclass(frozen=True)
class PassCause:
    """Why a pass runs and what the tick saw: `timer_pass`, the loop's own tick started it (not a
    change); `settle_pass`, a step asked for it (Step.wants_pass); `observed`, what WireGuard's
    handshakes say of this node's NATed peers (published in its record)."""

    timer_pass: bool = True
    settle_pass: bool = False
    observed: Observation = NOT_OBSERVED


class ReconcileLoop:
    """The loop thread: waits for a reason to pass (`wake` set, a step asking, pod interfaces or
    NATed peers changed, the resync interval) and has `passes` run one; returns once `stop` is set."""

    def __init__(self, passes: PassDriver, peers: LivePeers, wake: Wake, stop: threading.Event,
                 errors: ErrorCounts) -> None:
        self.passes = passes
        self.peers = peers
        self.wake_event = wake
        self.stop_event = stop
        self.errors = errors
        self.last_loop = time.monotonic()
        self._observer = HandshakeObserver(passes.cfg.direct_wait)
        self._observed: Observation = NOT_OBSERVED

    def run(self) -> None:
        resync = self.passes.cfg.resync_interval
        next_scan = last_pass = 0.0
        self.passes.publish_status()
        while not self.stop_event.is_set():
            woke = self.wake_event.wait(timeout=min(POD_SCAN_S, resync))
            self.last_loop = time.monotonic()
            if self.stop_event.is_set():
                return
            if self.wake_event.take_nudge() and not woke:
                self.passes.publish_status()  # a reader waits for counters as of now
            settle = False
            if not woke:
                now = time.monotonic()
                same_ifs = not self.passes.pods_moved()
                due = now >= next_scan
                settling = self.passes.wants_pass(now, last_pass)
                owing = self.passes.full_owed()  # a full pass a change cut short: finish it
                observed = self._observe()
                if same_ifs and not due and not settling and not observed and not owing:
                    continue
                settle = settling and same_ifs and not due
            time.sleep(DEBOUNCE_S)
            self.wake_event.clear()
            last_pass = time.monotonic()
            try:
                self.passes.reconcile(PassCause(timer_pass=not woke, settle_pass=settle, observed=self._observed))
            except Exception as e:  # noqa: BLE001 - the loop must survive anything
                log.exception("reconcile failed: %s", e)
                self.errors.count("reconcile")
            next_scan = time.monotonic() + resync

    def _observe(self) -> bool:
        """Read WireGuard's handshakes (without allowed IPs); True when what this node would
        publish about its NATed peers changed (the next pass publishes it)."""
        plan = self.passes.plan_in_force()
        try:
            live = self.peers.peers_now() if plan is not None and self._observer.watches(plan) else None
            seen = self._observer.observe(plan, live) if plan is not None and live is not None else NOT_OBSERVED
        except Exception as e:  # noqa: BLE001 - observing must never stop the loop
            log.debug("wireguard handshakes: %s", e)
            return False
        changed = seen != self._observed
        self._observed = seen
        return changed


class PassDriver:
    """One reconcile pass, and what the last passes left (the plan in force, the view it was
    planned from, our published record, the backend's last good view). `pods` says where the fast
    path attaches for pods now; `own` this node's settings (read after each snapshot); `on_pass`
    is called with every pass's summary."""

    def __init__(self, cfg: AgentConfig, backend: Backend, remotes: RemoteSource | None, runner: StepRunner,
                 paths: PathProbing, pods: Callable[[], tuple[str, ...]], public_key: str, errors: ErrorCounts,
                 on_pass: Callable[[PassSummary], None] | None = None, own: OwnSettings | None = None, *,
                 live: LiveReader, board: StatusBoard,
                 forwarding: ForwardProbing | None = None) -> None:
        self.cfg = cfg
        self.own = own or FlagSettings(cfg)
        self.backend = backend
        self.remotes = remotes
        self._runner = runner
        self.paths = paths
        self._pods = pods
        self.public_key = public_key
        self.errors = errors
        self.on_pass = on_pass
        self.live = live
        self.board = board
        self.recorder = PassRecorder(cfg, errors)
        self.memos = PureMemos(flannel=cfg.cni == "flannel")  # flannel carries its nodes' pod traffic
        self._last_plan: NodePlan | None = None
        self._last_view: tuple[Topology, list[Remote], NodePlan] | None = None
        self.pod_ifs: tuple[str, ...] = ()  # the pod interfaces the last applied pass used
        self._cause = PassCause()
        self._published: Node | None = None
        self._last_good: ClusterState | None = None
        self._rejections: list[Rejection] = []
        # Which members lead each location (mesh/leaders.py), and this node's forwarding probes.
        self.leadership = Leadership()
        self.forwarding = forwarding

    # --- what the loop asks between passes ------------------------------------------------

    def pods_moved(self) -> bool:
        """The pod interfaces differ from those the last applied pass used."""
        return self._pods() != self.pod_ifs

    def wants_pass(self, now: float, last_pass: float) -> bool:
        """A step asks for a pass although nothing changed (Step.wants_pass)."""
        return self._runner.wants_pass(now, last_pass)

    def full_owed(self) -> bool:
        """A full pass a change cut short waits to be finished (StepRunner.full_owed)."""
        return self._runner.full_owed()

    def plan_in_force(self) -> NodePlan | None:
        """The plan the last applied pass applied (None before one)."""
        return self._last_plan

    # --- one pass --------------------------------------------------------------------------

    def discover(self, mesh: MeshSettings) -> Node:
        """This node's record from its settings and interfaces (discovery with overrides)."""
        cfg, own = self.cfg, self.own.current()
        internal = discovery.discover_internal_ips(cfg.private_interface, cfg.internal_cidr, own.force_internal_ip,
                                                   mesh.private_networks)
        endpoints = discovery.discover_endpoints(own.endpoint, cfg.public_interface, mesh.port)
        if not own.pod_cidrs:
            raise InputError("--pod-cidr", "", "is not known yet")
        return Node(
            name=cfg.node_name, pod_cidrs=own.pod_cidrs, public_key=self.public_key, location=own.location,
            internal_ips=internal, endpoints=endpoints, leader=own.leader,
            persistent_keepalive=own.persistent_keepalive, allowed_location_ips=own.allowed_location_ips,
            discovered_endpoints=self._cause.observed[0], unreached_peers=self._cause.observed[1],
        )

    def reconcile(self, cause: PassCause | None = None) -> NodePlan | None:
        """One pass; returns the plan applied (None when nothing was applied).

        The cyclic GC is paused for the pass (see meshctl.process): the pass allocates many
        objects, all acyclic and freed by reference counting, so a collection those allocations
        trigger frees nothing yet walks every live object (with thousands of records, many)."""
        self._cause = cause or PassCause()
        with gc_paused():
            return self._reconcile()

    def _reconcile(self) -> NodePlan | None:
        run = PassLog(self.errors)
        state = self.backend.snapshot()
        run.timed("snapshot", run.t0)
        if state.ready:
            self._last_good = state
        mesh = state.mesh if state.ready or self._last_good is None else self._last_good.mesh
        me = self._publish_self(mesh, run)
        base = self._last_good if not state.ready else state
        if base is None or me is None:
            self._finish(run, state, None, [], applied=False)
            return None
        if not state.ready:  # etcd away: keep what is installed, report it
            self._finish(run, state, self._last_plan, self._rejections, applied=False)
            return None
        t = time.monotonic()
        topo, remotes, rejections = self._admit(state, me, run)
        run.timed("admit", t)
        if topo.node(me.name) is None:
            run.fail("admission", next((r.reason for r in rejections if r.name == me.name), "own record rejected"))
            self._finish(run, state, self._last_plan, rejections, applied=False)
            return None
        topo = self.leadership.apply(topo, state.forwarding)
        if self.forwarding is not None:
            self.forwarding.update(topo)  # with the chosen leaders: a leader probes the others' leaders
        t = time.monotonic()
        try:
            self.paths.update(topo, me.name)
            previous = self._last_plan.rung_paths if self._last_plan is not None else None
            plan, reused = self.memos.plan(topo, me.name, remotes, self.paths.state(previous))
        except InputError as e:
            run.fail("plan", str(e))
            self._finish(run, state, self._last_plan, rejections, applied=False)
            return None
        if reused:
            run.reused.append("plan")
        run.timed("plan", t)
        cidrs = self.memos.mesh_cidrs(topo, remotes)
        self.pod_ifs = self._pods()
        handed = flannel.plan_flannel(plan, topo, state.flannel) if self.cfg.cni == "flannel" else None
        self._runner.run(PassInput(plan=plan, topo=topo, me=me, mesh_cidrs=cidrs, pod_ifs=self.pod_ifs,
                                  timer_pass=self._cause.timer_pass, settle_pass=self._cause.settle_pass,
                                  flannel=handed), run)
        self._last_plan = plan
        self._last_view = (topo, remotes, plan)
        self._finish(run, state, plan, rejections, applied=True, topo=topo)
        return plan

    def _publish_self(self, mesh: MeshSettings, run: PassLog) -> Node | None:
        """Our record as discovered now, published when it changed; None when discovery failed."""
        try:
            me = self.discover(mesh)
        except (InputError, MeshError) as e:
            run.fail("discovery", str(e))
            return None
        if me != self._published:
            try:
                self.backend.publish(me)
                self._published = me
            except MeshError as e:
                run.fail("publish", str(e))
        return me

    def _admit(self, state: ClusterState, me: Node, run: PassLog) -> tuple[Topology, list[Remote], list[Rejection]]:
        """Our own record as discovered replaces the stored one; then the pure core decides who is
        in, this cluster first, remote clusters after."""
        topo, local_rejections, reused = self.memos.admit_local(state, me)
        if reused:
            run.reused.append("admission")
        rejections = [*state.rejections, *local_rejections]
        remotes: list[Remote] = []
        if self.remotes is not None:
            try:
                remotes, rej = self.remotes.admit(topo)
                rejections += rej
            except Exception as e:  # noqa: BLE001 - a remote cluster must not stop the local plan
                log.warning("remote clusters: %s", e)
                self.errors.count("remotes")
        return topo, remotes, rejections

    def _finish(self, run: PassLog, state: ClusterState, plan: NodePlan | None, rejections: list[Rejection], *,
                applied: bool, topo: Topology | None = None) -> None:
        """Record the pass for the status and the metrics."""
        self._rejections = rejections
        summary = self.recorder.finish(run, PassOutcome(
            state=state, plan=plan, rejections=rejections, applied=applied, topo=topo, observed=self._cause.observed,
            pod_ifs=self.pod_ifs, full_total=self._runner.full_total, remotes=self._remotes_status(),
            leaders=self.leadership.status(self.forwarding.verdicts_json() if self.forwarding else None)))
        self.publish_status()
        if self.on_pass is not None:
            self.on_pass(summary)

    def publish_status(self) -> None:
        """Publish the status snapshot: the last pass's summary with the live blocks read now."""
        ready, reason, summary = self.recorder.head
        at = time.monotonic()
        last = self.board.latest()
        try:
            live = self.live.read(self._last_plan)
        except Exception as e:  # noqa: BLE001 - the pass's summary is published whatever the live parts do
            log.warning("status: %s", e)
            self.errors.count("status")
            if last is None:
                return
            live = last.status.live
        self.board.publish(Snapshot(AgentStatus(self.cfg.node_name, ready, reason, summary, live),
                                    self.live.node_rows(self._last_view) if self._last_view is not None else None,
                                    self._last_plan is not None, at))

    def _remotes_status(self) -> RemotesStatus | None:
        if self.remotes is None:
            return None
        try:
            return self.remotes.report()
        except Exception as e:  # noqa: BLE001 - status must always answer
            return RemotesStatus(error=str(e))
