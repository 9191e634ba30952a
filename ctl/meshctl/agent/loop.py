"""The agent: ONE reconcile loop that turns the backend's view into this node's state.

    backend.snapshot -> admit (mesh.admit, older records first; remote clusters after)
        -> mesh.plan.plan_node -> steps (WireGuard, routes, sysctls, NAT, datapath) -> status/metrics

The loop runs in one thread, woken by the backend (debounced a few ms so a burst of records costs
one pass) and every `resync_interval` to repair drift. Each step's failure is logged and counted
and never stops the others. When the backend is not ready (etcd away) nothing is applied:
routes, WireGuard and maps stay as they are, which is what keeps traffic flowing.

Stopping (SIGTERM) leaves routes, WireGuard and pinned maps in place; `meshctl cleanup` removes them.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from meshctl.agent.config import AgentConfig
from meshctl.agent.observe import HandshakeObserver, Observation
from meshctl.agent.paths import PathProbing
from meshctl.agent.server import StatusServer
from meshctl.agent.steps import (
    PODS_SETTLE_STEP_S,
    CniStep,
    DatapathStep,
    NatStep,
    PassInput,
    RoutesStep,
    Step,
    SysctlsStep,
    TunnelsStep,
    WireGuardStep,
)
from meshctl.backends.base import Backend, ClusterState
from meshctl.errors import InputError, MeshError
from meshctl.mesh import admit, records
from meshctl.mesh.admit import Rejection
from meshctl.mesh.checks import dead_tunnels, host_prefix_warnings
from meshctl.mesh.chooser import ProbeTuning
from meshctl.mesh.model import IPNetwork, MeshSettings, Node, PathState, Topology
from meshctl.mesh.plan import NodePlan, mesh_cidrs, plan_node
from meshctl.mesh.render import node_rows
from meshctl.mesh.segments import Remote
from meshctl.node import discovery, keys
from meshctl.node.pods import PodInterfaceWatcher
from meshctl.node.wireguard import PeerStatus
from meshctl.node.wireguard.psk import SecretSource
from meshctl.process import gc_paused

log = logging.getLogger("meshctl.agent")

DEBOUNCE_S = 0.005
POD_SCAN_S = 1.0
LIVE_PEERS_TTL_S = 1.0  # /status and /metrics read WireGuard's counters at most this often


class RemoteSource(Protocol):
    """Other clusters, as the cluster-mesh watcher (backends.clustermesh.RemoteClusters) gives them."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def admit(self, local: Topology) -> tuple[list[Remote], list[Rejection]]:
        """The remote clusters' records that may join this cluster's plan, and the rejections."""
        ...

    def status(self) -> dict[str, Any]: ...


def local_interfaces() -> list[str]:
    """Interface names of the namespace this process runs in."""
    return [name for _, name in socket.if_nameindex()]


def pod_interfaces(pattern: str | None) -> list[str]:
    if not pattern:
        return []
    return sorted(n for n in local_interfaces() if fnmatch.fnmatchcase(n, pattern))


def _same_items(a: Sequence[object], b: Sequence[object]) -> bool:
    """The same objects in the same order. The backend hands out the same parsed Node for an
    unchanged record, so this tells "nothing changed" in well under a millisecond, where `==` on
    5,000 nodes compares every field of every address (~0.3 s)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


@dataclass
class _Admitted:
    """The last local admission and what it was computed from (same objects = unchanged)."""

    key: tuple[object, ...]
    nodes: tuple[Node, ...]
    peers: tuple[object, ...]
    topo: Topology
    rejections: list[Rejection]


@dataclass
class _Memos:
    """Results of the pure part kept while their inputs are the same objects: admission is redone
    only when a record, the mesh or our own record changed; the plan and the mesh CIDRs only for
    a new admitted topology (or any remote cluster); status pieces once per plan or view."""

    admitted: _Admitted | None = None
    plan: tuple[Topology, PathState, NodePlan] | None = None
    cidrs: tuple[Topology, frozenset[IPNetwork]] | None = None
    peer_static: tuple[object, list[dict[str, Any]]] | None = None
    live_peers: tuple[float, dict[str, dict[str, Any]]] = (0.0, {})
    node_rows: tuple[tuple[Topology, list[Remote], NodePlan], list[dict[str, Any]]] | None = None
    warnings: tuple[Topology, list[str]] | None = None


@dataclass
class _PassLog:
    """What the pass being run records for status: step timings, reused results, errors."""

    t0: float = 0.0
    cpu0: float = 0.0
    steps_ms: dict[str, float] = field(default_factory=dict)
    reused: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    full: bool = False


class Agent:
    """One node's agent. `backend` gives records; `remotes` (or `remotes_factory`, called with the
    agent's wake function) gives other clusters."""

    def __init__(self, cfg: AgentConfig, backend: Backend, *, remotes: RemoteSource | None = None,
                 remotes_factory: Callable[[Callable[[], None]], RemoteSource] | None = None) -> None:
        self.cfg = cfg
        self.backend = backend
        self.remotes = remotes
        self._remotes_factory = remotes_factory
        self.stop_event = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.server: StatusServer | None = None
        self.reconciles = 0
        # the pass
        self.steps: list[Step] = []
        self.datapath_step = DatapathStep(cfg)
        self.cni_step = CniStep(cfg)
        self._wireguard: WireGuardStep | None = None
        self._applied: dict[str, Hashable] = {}
        self._full_due = 0.0
        self._timer_pass = True  # the loop's own tick (not a change) started this pass
        self._settle_pass = False  # this pass only re-reads pod routes while pod interfaces settle
        self._pod_ifs: tuple[str, ...] = ()
        # Pod interfaces found from netlink (node.pods); --pod-interfaces overrides what is attached.
        self.pod_watch: PodInterfaceWatcher | None = None
        self._last_pass = 0.0
        self._last_loop = time.monotonic()
        self._pass = _PassLog()
        self._memo = _Memos()
        self.tunnels_step = TunnelsStep(cfg)
        self.paths = PathProbing(cfg.private_interface, self.wake, ProbeTuning(hold=cfg.path_hold),
                                 carriers=(self.tunnels_step, self.datapath_step))
        # what the last passes left
        self._published: Node | None = None
        self._last_good: ClusterState | None = None
        self._last_plan: NodePlan | None = None
        self._last_view: tuple[Topology, list[Remote], NodePlan] | None = None
        self._status: dict[str, Any] = {"node": cfg.node_name, "ready": False, "reason": "starting"}
        self._rejections: list[Rejection] = []
        self._rejections_seen: set[tuple[str, str]] = set()
        self._errors: dict[str, int] = {}
        self._ok_total = 0
        self._failed_total = 0
        self._public_key: str | None = None
        self._observer = HandshakeObserver(cfg.direct_wait)
        self._observed: Observation = ((), ())
        self._full_total = 0

    # --- life cycle ------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        """Keys, the steps, the status server, the backend watch, the datapath loader and the loop."""
        private_key = keys.load_or_create_private_key(self.cfg.state_dir)
        self._public_key = keys.public_key(private_key)
        secrets = self.backend if isinstance(self.backend, SecretSource) else None
        self._wireguard = WireGuardStep(self.cfg, private_key, secrets)
        # Tunnels before routes: a pair leaving an encapsulated rung frees its pod CIDR's tunnel route
        # before the route step installs the direct one (the other way, a tunnel route replaces it).
        self.steps = [self._wireguard, self.tunnels_step, RoutesStep(self.cfg), SysctlsStep(self.cfg),
                      NatStep(self.cfg), self.datapath_step, self.cni_step]
        self.server = StatusServer(self.cfg.metrics_addr, self.status, self.healthy, self.ready)
        self.server.start()
        if self.remotes is None and self._remotes_factory is not None:
            self.remotes = self._remotes_factory(self.wake)
        if self.remotes is not None:
            self.remotes.start()
        if self.cfg.pod_cidr is not None:
            try:
                self.pod_watch = PodInterfaceWatcher(self.cfg.pod_cidr, self.wake).start()
            except Exception as e:  # noqa: BLE001 - without it, --pod-interfaces still works
                log.error("pod interface watcher: %s", e)
                self._count("pods")
        self._spawn("backend", lambda: self.backend.run(self.stop_event, self.wake))
        self._spawn("reconcile", self._loop)
        self._spawn("datapath-open", self._open_datapath)
        self.wake()

    def _spawn(self, name: str, fn: Callable[[], None]) -> threading.Thread:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)
        return t

    def stop(self) -> None:
        """Leave routes, WireGuard and pinned maps in place; just stop watching and serving."""
        self.stop_event.set()
        self._wake.set()
        # Closing a stream another thread reads can block on its socket: never wait long for it,
        # a restarting agent must be back before its lease runs out.
        closer = threading.Thread(target=self.backend.close, name="backend-close", daemon=True)
        closer.start()
        for t in self._threads:
            if t.name == "reconcile":
                t.join(timeout=2)
        closer.join(timeout=0.5)
        if self.remotes is not None:
            try:
                self.remotes.stop()
            except Exception as e:  # noqa: BLE001 - stopping must go on
                log.warning("stopping remote clusters: %s", e)
        self.paths.stop()
        dp = self.datapath_step.datapath
        if dp is not None:
            try:
                dp.close()
            except Exception as e:  # noqa: BLE001
                log.warning("closing the datapath: %s", e)
        if self.server is not None:
            self.server.stop()
        if self.pod_watch is not None:
            self.pod_watch.stop()

    def ready(self) -> bool:
        """A plan has been applied since the agent started (readiness, /readyz)."""
        return self._last_plan is not None

    def healthy(self) -> bool:
        """The loop is alive (it ticks at least every resync interval)."""
        return time.monotonic() - self._last_loop < max(3 * self.cfg.resync_interval, 10)

    # --- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        next_scan = 0.0
        while not self.stop_event.is_set():
            woke = self._wake.wait(timeout=min(POD_SCAN_S, self.cfg.resync_interval))
            self._last_loop = time.monotonic()
            if self.stop_event.is_set():
                return
            if not woke:
                now = time.monotonic()
                ifs = tuple(self._pod_interfaces())
                due = now >= next_scan
                # While pod interfaces settle, pass again every few seconds so the local-pod map
                # catches up with the routes a CNI adds a moment after the veth.
                settling = now < self.datapath_step.settle_until and now - self._last_pass >= PODS_SETTLE_STEP_S
                observed = self._observe()
                if ifs == self._pod_ifs and not due and not settling and not observed:
                    continue
                self._settle_pass = settling and ifs == self._pod_ifs and not due
            else:
                self._settle_pass = False
            time.sleep(DEBOUNCE_S)
            self._wake.clear()
            self._timer_pass = not woke
            self._last_pass = time.monotonic()
            try:
                self.reconcile()
            except Exception as e:  # noqa: BLE001 - the loop must survive anything
                log.exception("reconcile failed: %s", e)
                self._count("reconcile")
            next_scan = time.monotonic() + self.cfg.resync_interval

    def _pod_interfaces(self) -> tuple[str, ...]:
        """Where the fast path attaches for pods: --pod-interfaces when given, else what the
        netlink watcher found."""
        if self.cfg.pod_interfaces:
            return tuple(pod_interfaces(self.cfg.pod_interfaces))
        return self.pod_watch.current if self.pod_watch is not None else ()

    def _pods_status(self) -> dict[str, Any]:
        """How many pod interfaces carry the fast path, and a warning when this node has pods and
        none do (the fast path silently off is the failure this exists to show)."""
        found = list(self.pod_watch.current) if self.pod_watch is not None else []
        dp = self.datapath_step.datapath
        carrying = list(self.datapath_step.attached) if dp is not None and dp.mode == "ebpf" else []
        out: dict[str, Any] = {"source": "flag" if self.cfg.pod_interfaces else "netlink", "found": found,
                               "fastpath": carrying}
        if found and not carrying:
            why = "the fast path is not loaded" if dp is None or dp.mode != "ebpf" else \
                f"--pod-interfaces {self.cfg.pod_interfaces!r} matches none of them"
            out["warning"] = f"{len(found)} pod interface(s) on this node and none carry the fast path: {why}"
        return out

    def _count(self, part: str) -> None:
        with self._lock:
            self._errors[part] = self._errors.get(part, 0) + 1

    def _open_datapath(self) -> None:
        """Load the fast path off the loop: compiling takes about a second, and a joining node must
        be reachable (through kernel routes) before that."""
        from meshctl.datapath import Datapath

        try:
            dp = Datapath.open(self.cfg.node_name, pin_root=self.cfg.bpf_pin_root, enabled=self.cfg.fastpath)
        except Exception as e:  # noqa: BLE001
            log.error("datapath: %s", e)
            self._count("datapath")
            return
        log.info("datapath mode %s%s", dp.mode, f" ({dp.reason})" if dp.reason else "")
        self.datapath_step.datapath = dp
        self.paths.refresh_rungs()  # a loaded fast path carries the encapsulated rungs itself
        self.wake()

    # --- one pass --------------------------------------------------------------------------

    def _observe(self) -> bool:
        """Read WireGuard's handshakes (without allowed IPs); True when what this node would
        publish about its NATed peers changed (the next pass publishes it)."""
        device = self._wireguard.device if self._wireguard is not None else None
        if device is None or self._last_plan is None or not self._observer.watches(self._last_plan):
            changed = self._observed != ((), ())
            self._observed = ((), ())
            return changed
        try:
            seen = self._observer.observe(self._last_plan, device.show(allowed_ips=False))
        except Exception as e:  # noqa: BLE001 - observing must never stop the loop
            log.debug("wireguard handshakes: %s", e)
            return False
        changed = seen != self._observed
        self._observed = seen
        return changed

    def discover(self, mesh: MeshSettings) -> Node:
        """This node's record from flags and interfaces (discovery with overrides)."""
        cfg = self.cfg
        internal = discovery.discover_internal_ip(
            cfg.private_interface, str(cfg.internal_cidr) if cfg.internal_cidr else None,
            str(cfg.force_internal_ip) if cfg.force_internal_ip else None)
        endpoint = discovery.discover_endpoint(cfg.endpoint, cfg.public_interface, mesh.port)
        if self._public_key is None:
            raise MeshError("the agent has no key yet (start() makes it)")
        if cfg.pod_cidr is None:
            raise InputError("--pod-cidr", "", "is not known yet")
        return Node(
            name=cfg.node_name, pod_cidr=cfg.pod_cidr, public_key=self._public_key, location=cfg.location,
            internal_ip=internal, endpoint=endpoint, leader=cfg.leader,
            persistent_keepalive=cfg.persistent_keepalive, allowed_location_ips=cfg.allowed_location_ips,
            discovered_endpoints=self._observed[0], unreached_peers=self._observed[1],
        )

    def reconcile(self) -> NodePlan | None:
        """One pass; returns the plan applied (None when nothing was applied).

        The cyclic GC is paused for the pass (see meshctl.process): at 5,000 records ~200,000
        objects are alive, and the collections a pass's allocations triggered took 15-60 ms of it
        (a full one ~100 ms); the data is acyclic and freed by reference counting anyway."""
        with gc_paused():
            return self._reconcile()

    def _reconcile(self) -> NodePlan | None:
        self.reconciles += 1
        run = self._pass = _PassLog(t0=time.monotonic(), cpu0=time.thread_time())
        state = self.backend.snapshot()
        self._timed("snapshot", run.t0)
        if state.ready:
            self._last_good = state
        mesh = state.mesh if state.ready or self._last_good is None else self._last_good.mesh

        me = self._publish_self(mesh)
        base = self._last_good if not state.ready else state
        if base is None or me is None:
            self._finish(state, None, [], applied=False)
            return None
        if not state.ready:  # etcd away: keep what is installed, report it
            self._finish(state, self._last_plan, self._rejections, applied=False)
            return None

        t = time.monotonic()
        topo, remotes, rejections = self._admit(state, me)
        self._timed("admit", t)
        if topo.node(me.name) is None:
            self._fail("admission", next((r.reason for r in rejections if r.name == me.name), "own record rejected"))
            self._finish(state, self._last_plan, rejections, applied=False)
            return None
        t = time.monotonic()
        try:
            self.paths.update(topo, me.name)
            plan = self._plan(topo, me, remotes, self.paths.state())
        except InputError as e:
            self._fail("plan", str(e))
            self._finish(state, self._last_plan, rejections, applied=False)
            return None
        self._timed("plan", t)
        self._apply(PassInput(plan=plan, topo=topo, me=me, mesh_cidrs=self._mesh_cidrs(topo, remotes),
                              pod_ifs=self._pod_ifs, timer_pass=self._timer_pass, settle_pass=self._settle_pass))
        self._last_plan = plan
        self._last_view = (topo, remotes, plan)
        self._finish(state, plan, rejections, applied=True, topo=topo)
        return plan

    def _timed(self, part: str, since: float) -> None:
        self._pass.steps_ms[part] = round(1000 * (time.monotonic() - since), 2)

    def _fail(self, part: str, reason: str) -> None:
        self._pass.errors[part] = reason
        self._count(part)

    def _publish_self(self, mesh: MeshSettings) -> Node | None:
        """Our record as discovered now, published when it changed; None when discovery failed."""
        try:
            me = self.discover(mesh)
        except (InputError, MeshError) as e:
            self._fail("discovery", str(e))
            return None
        if me != self._published:
            try:
                self.backend.publish(me)
                self._published = me
            except MeshError as e:
                self._fail("publish", str(e))
        return me

    def _admit(self, state: ClusterState, me: Node) -> tuple[Topology, list[Remote], list[Rejection]]:
        """Our own record as discovered replaces the stored one (the store may lag behind); then
        the pure core decides who is in."""
        key = (state.cluster, state.mesh, me)
        memo = self._memo.admitted
        if memo is not None and memo.key == key and _same_items(memo.nodes, state.nodes) \
                and _same_items(memo.peers, state.peers):
            topo, local_rejections = memo.topo, memo.rejections
            self._pass.reused.append("admission")
        else:
            nodes = [me if n.name == me.name else n for n in state.nodes]
            if all(n.name != me.name for n in nodes):
                nodes.append(me)
            topo, local_rejections = admit.admit_local(
                Topology(cluster=state.cluster, mesh=state.mesh, nodes=tuple(nodes), peers=state.peers))
            self._memo.admitted = _Admitted(key, state.nodes, state.peers, topo, local_rejections)
        rejections = [*state.rejections, *local_rejections]
        remotes: list[Remote] = []
        if self.remotes is not None:
            try:
                remotes, rej = self.remotes.admit(topo)
                rejections += rej
            except Exception as e:  # noqa: BLE001 - a remote cluster must not stop the local plan
                log.warning("remote clusters: %s", e)
                self._count("remotes")
        return topo, remotes, rejections

    def _plan(self, topo: Topology, me: Node, remotes: list[Remote], path_state: PathState) -> NodePlan:
        """plan_node, reused while the admitted topology is the same object and the probes' verdicts
        are the same (and no remote cluster)."""
        memo = self._memo.plan
        if not remotes and memo is not None and memo[0] is topo and memo[1] == path_state:
            self._pass.reused.append("plan")
            return memo[2]
        plan = plan_node(topo, me.name, remotes, path_state=path_state)
        self._memo.plan = None if remotes else (topo, path_state, plan)
        return plan

    def _mesh_cidrs(self, topo: Topology, remotes: list[Remote]) -> frozenset[IPNetwork]:
        self._pod_ifs = tuple(self._pod_interfaces())
        memo = self._memo.cidrs
        if remotes or memo is None or memo[0] is not topo:
            memo = self._memo.cidrs = (topo, mesh_cidrs(topo, remotes))
        return memo[1]

    def _full_pass_due(self) -> bool:
        """Full passes (every step reads the kernel again) come from the loop's own tick, so they do
        not slow down the pass that applies a change, unless changes keep coming for two intervals."""
        now = time.monotonic()
        full = now >= self._full_due and (self._timer_pass or now >= self._full_due + self.cfg.resync_interval)
        if full:
            self._full_due = now + self.cfg.resync_interval
        return full

    def _apply(self, p: PassInput) -> None:
        """Run every step in order. A step whose inputs did not change since it last succeeded is
        skipped, except on a full pass; a failing step is counted, logged and made to forget, and
        never stops the others."""
        full = self._pass.full = self._full_pass_due()
        if full:
            self._full_total += 1
            for s in self.steps:
                s.forget()
            self._applied.clear()
        by_name = {s.name: s for s in self.steps}
        for s in self.steps:
            inputs = s.inputs(p)
            if inputs is not None and not full and self._applied.get(s.name) == inputs:
                self._pass.steps_ms[s.name] = 0.0
                continue
            self._applied.pop(s.name, None)
            t = time.monotonic()
            try:
                for other in s.sync(p):
                    by_name[other].forget()
                    self._applied.pop(other, None)
                if inputs is not None:
                    self._applied[s.name] = inputs
            except Exception as e:  # noqa: BLE001 - one step's failure must not stop the others
                self._fail(s.name, str(e) or type(e).__name__)
                log.warning("%s: %s", s.name, self._pass.errors[s.name])
                s.forget()  # its memory of the kernel may be wrong now: read it next time
            finally:
                self._timed(s.name, t)

    # --- status ----------------------------------------------------------------------------

    def _finish(self, state: ClusterState, plan: NodePlan | None, rejections: list[Rejection], *,
                applied: bool, topo: Topology | None = None) -> None:
        """Record the pass for /status and /metrics: one flat dict built in one place, so the status
        JSON's shape is read off a single literal (long for that reason only)."""
        run = self._pass
        dt = time.monotonic() - run.t0
        cpu = time.thread_time() - run.cpu0
        for r in rejections:
            key = (r.name, r.reason)
            if key not in self._rejections_seen:
                self._rejections_seen.add(key)
                log.warning("rejected %s: %s", r.name, r.reason)
        if len(self._rejections_seen) > 10000:
            self._rejections_seen = {(r.name, r.reason) for r in rejections}
        with self._lock:
            if run.errors:
                self._failed_total += 1
            else:
                self._ok_total += 1
        if self.server is not None:
            self.server.reconcile_seconds.observe(dt)
        self._rejections = rejections
        self._status = {
            "node": self.cfg.node_name,
            "cluster": state.cluster.name,
            "backend": self.cfg.backend,
            "ready": state.ready,
            "reason": state.reason,
            "revision": state.revision,
            "records": state.extra.get("records"),
            "granularity": plan.granularity if plan else None,
            "mesh": records.mesh_to_record(state.mesh),
            "leader": plan.leader if plan else None,
            "is_leader": bool(plan and plan.leader == self.cfg.node_name),
            "wireguard_ip": str(plan.wireguard_ip) if plan and plan.wireguard_ip else None,
            "nodes": len(topo.nodes) if topo else self._status.get("nodes", 0),
            "routes": len(plan.routes) if plan else 0,
            "paths": dict(plan.paths) if plan else {},
            "relays": {n: {"via": via, "reason": why} for n, (via, why) in plan.relays.items()} if plan else {},
            "discovered_endpoints": {n: str(ep) for n, ep in self._observed[0]},
            "unreached_peers": list(self._observed[1]),
            "rejections": [{"name": r.name, "reason": r.reason} for r in rejections],
            "rejections_total": len(self._rejections_seen),
            "pod_interfaces": list(self._pod_ifs),
            "warnings": self._warnings(topo),
            "last_reconcile": {"time": time.time(), "duration_s": round(dt, 6), "cpu_s": round(cpu, 6),
                               "applied": applied, "full": run.full, "reused": list(run.reused),
                               "errors": dict(run.errors), "steps_ms": dict(run.steps_ms)},
            "reconcile": {"ok_total": self._ok_total, "failed_total": self._failed_total,
                          "full_total": self._full_total},
            "errors_total": dict(self._errors),
            "pid": os.getpid(),
        }
        if self.remotes is not None:
            try:
                self._status["remotes"] = self.remotes.status()
            except Exception as e:  # noqa: BLE001
                self._status["remotes"] = {"error": str(e)}

    def _warnings(self, topo: Topology | None) -> list[str]:
        """What is safe but cannot work, from this node's side (mesh.checks): its tunnels that can
        never start, its own host-prefix internal address. Recomputed only for a new admitted view."""
        if topo is None:
            return list(self._status.get("warnings") or [])
        memo = self._memo.warnings
        if memo is None or memo[0] is not topo:
            me = topo.node(self.cfg.node_name)
            found = dead_tunnels(topo, only=self.cfg.node_name)
            if me is not None:
                found += ["internal_ip: " + w.split(": ", 1)[1] for w in host_prefix_warnings([me])]
            memo = self._memo.warnings = (topo, found)
        return memo[1]

    def _peer_status(self, plan: NodePlan) -> list[dict[str, Any]]:
        """The plan's peers (built once per plan: a leader's 10,000 allowed IPs as text cost
        ~10 ms) with WireGuard's live counters (read at most every LIVE_PEERS_TTL_S, without
        parsing allowed IPs): /status and /metrics scrapes must not compete with the loop."""
        static = self._memo.peer_static
        if static is None or not (static[0] is plan.peers or static[0] == plan.peers):
            static = (plan.peers, [{"name": p.name, "kind": p.kind, "public_key": p.public_key,
                                    "endpoint": p.endpoint, "allowed_ips": [str(a) for a in p.allowed_ips]}
                                   for p in plan.peers])
            self._memo.peer_static = static
        at, live = self._memo.live_peers
        device = self._wireguard.device if self._wireguard is not None else None
        if device is not None and time.monotonic() - at >= LIVE_PEERS_TTL_S:
            try:
                live = _peers_by_key(device.show(allowed_ips=False))
            except Exception as e:  # noqa: BLE001
                log.debug("wireguard show: %s", e)
            self._memo.live_peers = (time.monotonic(), live)
        return [{**d, **live.get(d["public_key"], {})} for d in static[1]]

    def _datapath_status(self) -> dict[str, Any]:
        dp = self.datapath_step.datapath
        if dp is None:
            return {"mode": None, "reason": "loading" if self.cfg.fastpath else "disabled", "counters": {}}
        try:
            counters = {k: list(v) for k, v in dp.counters().items()}
        except Exception as e:  # noqa: BLE001
            counters = {}
            log.debug("datapath counters: %s", e)
        # synced: the maps hold a plan (until then an ebpf datapath passes everything to the kernel)
        out = {"mode": dp.mode, "reason": dp.reason, "counters": counters, "synced": self.datapath_step.synced}
        if dp.mode == "ebpf":
            from meshctl.datapath.features import probe

            # how the programs hook in and which helpers they do without here (older kernels)
            out.update(attach="clsact" if dp.clsact else "tcx", fallbacks=probe().fallbacks())
        return out

    def status(self) -> dict[str, Any]:
        """The /status JSON (also what the metrics collector reads)."""
        st = dict(self._status)
        st["datapath"] = self._datapath_status()
        # Live, not from the last pass: a rung change between passes is the point of probing.
        st["path_probe"] = self.paths.status()
        st["path_changes"] = _change_counts(self.paths.changes())
        device = self._wireguard.device if self._wireguard is not None else None
        st["wireguard_mode"] = device.mode if device is not None else None  # kernel | wireguard-go
        st["pods"] = self._pods_status()
        st["cni"] = {"mode": self.cfg.cni, **({"warning": self.cni_step.warning} if self.cni_step.warning else {})}
        st["peers"] = self._peer_status(self._last_plan) if self._last_plan else []
        if self._last_view is not None:  # built on request: with thousands of nodes it is not free
            st["node_list"] = self._node_list(self._last_view)
        try:
            st.update(self.backend.status())
        except Exception as e:  # noqa: BLE001 - status must always answer
            st["backend_error"] = str(e)
        return st

    def _node_list(self, view: tuple[Topology, list[Remote], NodePlan]) -> list[dict[str, Any]]:
        """render.node_rows of the last applied view, built once per view (a /status poll at 5,000
        nodes would otherwise rebuild it each time, competing with the loop for the GIL)."""
        cached = self._memo.node_rows
        # The same admitted topology and plan object (the plan is only reused without remote
        # clusters, so the same plan also means the same, empty, remotes).
        if cached is None or cached[0][0] is not view[0] or cached[0][2] is not view[2]:
            cached = self._memo.node_rows = (view, node_rows(*view))
        return cached[1]


def _change_counts(changes: Sequence[Any]) -> list[dict[str, Any]]:
    """Rung changes since start, counted by (from, to, reason), for /status and the metrics."""
    counts: dict[tuple[str, str, str], int] = {}
    for c in changes:
        key = (c.old or "none", c.new, c.reason)
        counts[key] = counts.get(key, 0) + 1
    return [{"from": a, "to": b, "reason": r, "count": n} for (a, b, r), n in sorted(counts.items())]


def _peers_by_key(peers: list[PeerStatus]) -> dict[str, dict[str, Any]]:
    """WireGuard.show() as {public_key: {rx_bytes, tx_bytes, last_handshake, live_endpoint}}."""
    return {p.public_key: {"rx_bytes": p.rx_bytes, "tx_bytes": p.tx_bytes, "last_handshake": p.last_handshake or 0,
                           "live_endpoint": p.endpoint} for p in peers}
