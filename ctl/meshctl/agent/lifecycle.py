# SPDX-License-Identifier: Apache-2.0
"""The agent's life cycle: what it makes at start (keys, steps, the loop, the status server, the
watchers, the datapath loader) and how it stops. Stopping (SIGTERM) leaves routes, WireGuard and
pinned maps in place; `meshctl cleanup` removes them."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import generate_latest

from meshctl.agent.config import AgentConfig, FlagSettings, OwnSettings, fastpath_off
from meshctl.agent.leadership import ForwardingStore, ForwardProbing
from meshctl.agent.loop import PassDriver, ReconcileLoop, RemoteSource, Wake, pod_interfaces
from meshctl.agent.path_probing import PathProbing
from meshctl.agent.reporting import ErrorCounts, LiveReader
from meshctl.agent.secure_metrics import MetricsAuthority, NoAuthority, SecureMetricsServer, self_signed
from meshctl.agent.seen import SeenStore, publish_loop
from meshctl.agent.server import StatusServer
from meshctl.agent.snapshot import StatusBoard
from meshctl.agent.status import AgentStatus, PassSummary, ProbeResult
from meshctl.agent.step_runner import StepRunner
from meshctl.agent.steps import (
    CniStep,
    DatapathStep,
    FlannelStep,
    GlobalRangesStep,
    LoadedDatapath,
    NatStep,
    RoutesStep,
    SysctlsStep,
    TunnelsStep,
    WireGuardStep,
)
from meshctl.backends.base import Backend
from meshctl.datapath import Datapath
from meshctl.mesh.chooser import ProbeTuning
from meshctl.node import keys
from meshctl.node.pods import PodInterfaceWatcher
from meshctl.node.wireguard.psk import SecretSource

log = logging.getLogger("meshctl.agent")

BACKEND_CLOSE_WAIT_S = 0.5  # a restarting agent must be back before its lease runs out
LOOP_JOIN_WAIT_S = 2.0


@dataclass
class _Running:
    """What start() made."""

    passes: PassDriver
    loop: ReconcileLoop
    board: StatusBoard
    server: StatusServer
    secure: SecureMetricsServer | None = None


class Agent:
    """One node's agent. `backend` gives records; `own` this node's settings (default: the flags');
    `remotes` (or `remotes_factory`, called with the agent's wake function) gives other clusters;
    `on_pass` is called with each pass's summary."""

    def __init__(self, cfg: AgentConfig, backend: Backend, *, remotes: RemoteSource | None = None,
                 remotes_factory: Callable[[Callable[[], None]], RemoteSource] | None = None,
                 on_pass: Callable[[PassSummary], None] | None = None, own: OwnSettings | None = None) -> None:
        self.cfg = cfg
        self.backend = backend
        self.own = own or FlagSettings(cfg)
        self.remotes = remotes
        self._remotes_factory = remotes_factory
        self._on_pass = on_pass
        self.errors = ErrorCounts()
        self.stop_event = threading.Event()
        self._wake = Wake()
        self.pod_watch: PodInterfaceWatcher | None = None
        self.paths: PathProbing | None = None
        self.forwarding: ForwardProbing | None = None
        self._running: _Running | None = None
        self._datapath: Datapath | None = None
        self._datapath_slot = LoadedDatapath()  # the datapath step's: filled by the loader thread
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        """Keys, the steps, the loop, the status server, the backend watch, the datapath loader."""
        private_key = keys.load_or_create_private_key(self.cfg.state_dir)
        secrets = self.backend if isinstance(self.backend, SecretSource) else None
        # The order is the runner's, from what each step provides and needs (step_runner.step_order).
        runner = StepRunner([WireGuardStep(self.cfg, private_key, secrets), TunnelsStep(self.cfg),
                             FlannelStep(self.cfg), RoutesStep(self.cfg), SysctlsStep(self.cfg), NatStep(self.cfg),
                             DatapathStep(self.cfg, self._datapath_slot),
                             GlobalRangesStep(self.cfg, self._datapath_slot), CniStep(self.cfg)],
                            self.cfg.resync_interval, pending=self._wake.is_set)
        if self.remotes is None and self._remotes_factory is not None:
            self.remotes = self._remotes_factory(self.wake)
        self.paths = PathProbing(self.cfg.private_interface, self.wake, ProbeTuning(hold=self.cfg.path_hold),
                                 carriers=runner.carriers())
        peers = runner.live_peers()
        live = LiveReader(self.cfg, self.backend, self.paths, peers, runner.report, lambda: self.pod_watch)
        board = StatusBoard(self._wake.nudge)
        if self.cfg.forwarding_probes and isinstance(self.backend, ForwardingStore):  # etcd and Kubernetes keep reports
            self.forwarding = ForwardProbing(self.cfg.private_interface, self.cfg.node_name, self.cfg.cluster_name,
                                             self.backend, self.stop_event)
        passes = PassDriver(self.cfg, self.backend, self.remotes, runner, self.paths, self._pod_interfaces,
                            keys.public_key(private_key), self.errors, self._passed, own=self.own, live=live,
                            board=board, forwarding=self.forwarding)
        loop = ReconcileLoop(passes, peers, self._wake, self.stop_event, self.errors)
        server = StatusServer(self.cfg.metrics_addr, self.status, self.healthy, self.ready, self.probe)
        secure = self._secure_metrics(server)
        self._running = _Running(passes, loop, board, server, secure)
        server.start()
        if secure is not None:
            secure.start()
        if self.remotes is not None:
            self.remotes.start()
        self._watch_pods()
        self._spawn("backend", lambda: self.backend.run(self.stop_event, self.wake))
        self._spawn("reconcile", loop.run)
        self._spawn("datapath-open", self._open_datapath)
        if isinstance(self.backend, SeenStore):
            store = self.backend
            self._spawn("seen", lambda: publish_loop(store, lambda: self.status(node_list=False), self.cfg.cluster_name,
                                                      self.stop_event))
        self.wake()

    def _secure_metrics(self, server: StatusServer) -> SecureMetricsServer | None:
        """--secure-metrics-addr: /healthz, /readyz and /metrics (for tokens the cluster's RBAC
        allows) over TLS; with a backend that cannot ask a cluster who a token is (etcd, file), the
        probes only, and /metrics refused in one line."""
        if not self.cfg.secure_metrics_addr:
            return None
        auth = self.backend.metrics_auth() if isinstance(self.backend, MetricsAuthority) else NoAuthority(
            f"the {self.cfg.backend} backend cannot check a token: /metrics is served on --metrics-addr only")
        cert, key = self_signed(Path(self.cfg.state_dir) / "metrics-tls", f"meshctl-agent.{self.cfg.node_name}")
        return SecureMetricsServer(self.cfg.secure_metrics_addr, cert, key, lambda: generate_latest(server.registry),
                                   auth, self.healthy, self.ready)

    def _watch_pods(self) -> None:
        pod_cidrs = self.own.current().pod_cidrs
        if not pod_cidrs:
            return
        try:
            self.pod_watch = PodInterfaceWatcher(pod_cidrs, self.wake).start()
        except Exception as e:  # noqa: BLE001 - without it, --pod-interfaces still works
            log.error("pod interface watcher: %s", e)
            self.errors.count("pods")

    def _spawn(self, name: str, fn: Callable[[], None]) -> None:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _pod_interfaces(self) -> tuple[str, ...]:
        """Where the fast path attaches for pods: --pod-interfaces when given, else what the
        netlink watcher found."""
        if self.cfg.pod_interfaces:
            return tuple(pod_interfaces(self.cfg.pod_interfaces))
        if self.pod_watch is None:
            return ()
        self.pod_watch.retarget(self.own.current().pod_cidrs)  # --cni calico|cilium: the IPAM's blocks change
        return self.pod_watch.current

    def _open_datapath(self) -> None:
        """Load the fast path off the loop (a joining node must be reachable through kernel routes
        before it is compiled and loaded) into the datapath step's slot."""
        try:
            off = fastpath_off(self.cfg)
            dp = Datapath.open(self.cfg.node_name, pin_root=self.cfg.bpf_pin_root, enabled=off is None,
                               why_off=off or "")
        except Exception as e:  # noqa: BLE001
            log.error("datapath: %s", e)
            self.errors.count("datapath")
            return
        log.info("datapath mode %s%s", dp.mode, f" ({dp.reason})" if dp.reason else "")
        self._datapath = dp
        self._datapath_slot.put(dp)
        if self.paths is not None:
            self.paths.refresh_rungs()  # a loaded fast path carries the encapsulated rungs itself
        self.wake()

    def _passed(self, summary: PassSummary) -> None:
        if self._running is not None:
            self._running.server.reconcile_seconds.observe(summary.last_reconcile.duration_s)
        if self._on_pass is not None:
            self._on_pass(summary)

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        """Leave routes, WireGuard and pinned maps in place; just stop watching and serving."""
        run = self._running
        self.stop_event.set()
        self._wake.set()
        # Closing a stream another thread reads can block on its socket: never wait long for it.
        closer = threading.Thread(target=self.backend.close, name="backend-close", daemon=True)
        closer.start()
        for t in self._threads:
            if t.name == "reconcile":
                t.join(timeout=LOOP_JOIN_WAIT_S)
        closer.join(timeout=BACKEND_CLOSE_WAIT_S)
        if self.remotes is not None:
            try:
                self.remotes.stop()
            except Exception as e:  # noqa: BLE001 - stopping must go on
                log.warning("stopping remote clusters: %s", e)
        if self.paths is not None:
            self.paths.stop()
        if self.forwarding is not None:
            self.forwarding.stop()
        if self._datapath is not None:
            try:
                self._datapath.close()
            except Exception as e:  # noqa: BLE001
                log.warning("closing the datapath: %s", e)
        if run is not None:
            run.server.stop()
            if run.secure is not None:
                run.secure.stop()
        if self.pod_watch is not None:
            self.pod_watch.stop()

    def ready(self) -> bool:
        """A plan has been applied since the agent started (readiness, /readyz)."""
        snap = self._running.board.latest() if self._running is not None else None
        return snap is not None and snap.plan_applied

    def healthy(self) -> bool:
        """The loop is alive (it ticks at least every resync interval)."""
        if self._running is None:
            return False
        return time.monotonic() - self._running.loop.last_loop < max(3 * self.cfg.resync_interval, 10)

    def probe(self, peer: str) -> ProbeResult:
        """One probe now to `peer` on the rung the last pass chose for it (/probe)."""
        snap = self._running.board.latest() if self._running is not None else None
        summary = snap.status.summary if snap is not None else None
        rung = summary.paths.get(peer) if summary is not None else None
        if self.paths is None or summary is None or rung is None:
            return ProbeResult(peer, rung, None, False, None, 0.0, f"{peer} is not a node of this agent's plan")
        return self.paths.probe(peer, rung)

    def status(self, node_list: bool = True) -> AgentStatus:
        """The status snapshot the loop publishes (agent/snapshot.py), with counters read after this
        call began unless the loop is busy for longer than snapshot.FRESH_WAIT_S (the /status
        document, the metrics); without `node_list`, the node list is left out (None): the summary
        publisher needs no node rows, and building them for every new view at 50,000 nodes would
        compete with the loop for the interpreter right when a change is applied."""
        snap = self._running.board.fresh() if self._running is not None else None
        if snap is None:
            raise RuntimeError("the agent has not started")
        return snap.document(node_list)
