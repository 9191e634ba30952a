"""The agent: ONE reconcile loop that turns the backend's view into this node's state.

    snapshot -> admit (validate.admit_nodes, older records first) -> plan.plan_node
             -> appliers (WireGuard, routes, NAT, sysctls, datapath) -> status/metrics

The loop runs in one thread, woken by the backend (debounced a few ms so a burst of records costs
one pass) and every `resync_interval` to repair drift. Each applier's failure is logged and
counted and never stops the others. When the backend is not ready (etcd away) nothing is applied:
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
from collections.abc import Callable
from typing import Any

from .. import validate as v
from ..backend import Backend, ClusterState
from ..errors import InputError, MeshError
from ..model import IPNetwork, MeshSettings, Node, Topology, gc_paused
from ..plan import NodePlan, Remote, plan_node
from ..render import node_rows
from ..validate import Rejection
from .config import AgentConfig
from .metrics import StatusServer

log = logging.getLogger("meshctl.agent")

DEBOUNCE_S = 0.005
POD_SCAN_S = 1.0
PODS_SETTLE_S = 10.0  # after pod interfaces change, re-read pod routes for this long ...
PODS_SETTLE_STEP_S = 2.0  # ... every this often
LIVE_PEERS_TTL_S = 1.0  # /status and /metrics read WireGuard's counters at most this often
APPLIER_ATTRS = {"wireguard": "_wg", "routes": "_routes", "nat": "_nat"}  # appliers that remember state


def local_interfaces() -> list[str]:
    """Interface names of the namespace this process runs in."""
    return [name for _, name in socket.if_nameindex()]


def pod_interfaces(pattern: str | None) -> list[str]:
    if not pattern:
        return []
    return sorted(n for n in local_interfaces() if fnmatch.fnmatchcase(n, pattern))


def mesh_cidrs(topo: Topology, remotes: list[Remote]) -> frozenset[IPNetwork]:
    """Everything inside the mesh (never masqueraded): pod CIDRs, the WireGuard subnet, location
    IPs and extra peers' allowed IPs, of this cluster and admitted remote ones. A set, not a sorted
    list: sorting 5,000 networks cost a reconcile ~50 ms, and the NAT applier diffs sets anyway."""
    out: set[IPNetwork] = {topo.mesh.subnet}
    for n in [*topo.nodes, *(n for r in remotes for n in r.nodes)]:
        out.add(n.pod_cidr)
        out.update(n.allowed_location_ips)
    for r in remotes:
        out.add(r.topology.mesh.subnet)
    for p in topo.peers:
        out.update(p.allowed_ips)
    return frozenset(out)


def _same_items(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    """The same objects in the same order. The backend hands out the same parsed Node for an
    unchanged record, so this tells "nothing changed" in well under a millisecond, where `==` on
    5,000 nodes compares every field of every address (~0.3 s)."""
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


class Agent:
    """One node's agent. `backend` gives records; `remotes` (a clustermesh_watch.RemoteClusters or
    None) gives other clusters. `appliers` may inject ready-made appliers (tests, the lab)."""

    def __init__(self, cfg: AgentConfig, backend: Backend, *, remotes: Any = None,
                 remotes_factory: Callable[[Callable[[], None]], Any] | None = None) -> None:
        self.cfg = cfg
        self.backend = backend
        self.remotes = remotes
        self._remotes_factory = remotes_factory
        self.stop_event = threading.Event()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._status: dict[str, Any] = {"node": cfg.node_name, "ready": False, "reason": "starting"}
        self._errors: dict[str, int] = {}
        self._ok_total = 0
        self._failed_total = 0
        self._rejections_seen: set[tuple[str, str]] = set()
        self._last_loop = time.monotonic()
        self._published: Node | None = None
        self._private_key: str | None = None
        self._public_key: str | None = None
        self._wg: Any = None
        self._routes: Any = None
        self._nat: Any = None
        self._datapath: Any = None
        self._datapath_thread: threading.Thread | None = None
        self._attached: tuple[str, ...] | None = None
        self._sysctls_done = False
        self._pod_ifs: list[str] = []
        self._pods_settle_until = 0.0
        self._last_pass = 0.0
        self._settle_pass = False  # this pass only re-reads pod routes while pod interfaces settle
        self._dp_synced = False
        self._last_plan: NodePlan | None = None
        self._last_good: ClusterState | None = None
        self._threads: list[threading.Thread] = []
        self.server: StatusServer | None = None
        self.reconciles = 0
        self._steps: dict[str, float] = {}
        self._applied: dict[str, Any] = {}
        self._full_due = 0.0
        self._timer_pass = True  # the loop's own tick (not a change) started this pass
        self._full = False
        self._reused: list[str] = []
        self._cpu0 = 0.0
        # Memos of the pure part: admission is redone only when a record, the mesh or our own
        # record changed (same objects from the backend = unchanged); the plan only for a new
        # admitted topology (or any remote cluster).
        self._admit_memo: tuple[Any, ...] | None = None
        self._plan_memo: tuple[Topology, NodePlan] | None = None
        self._cidrs_memo: tuple[Topology, frozenset[IPNetwork]] | None = None
        self._peer_static: tuple[tuple[Any, ...], list[dict[str, Any]]] | None = None
        self._live_peers: tuple[float, dict[str, Any]] = (0.0, {})
        self._node_rows: tuple[Any, list[dict[str, Any]]] | None = None

    # --- life cycle ------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.set()

    def start(self) -> None:
        """Keys, the status server, the backend watch, the datapath loader and the loop."""
        from .. import keys

        self._private_key = keys.load_or_create_private_key(self.cfg.state_dir)
        self._public_key = keys.public_key(self._private_key)
        self.server = StatusServer(self.cfg.metrics_addr, self.status, self.healthy)
        self.server.start()
        if self.remotes is None and self._remotes_factory is not None:
            self.remotes = self._remotes_factory(self.wake)
        if self.remotes is not None:
            self.remotes.start()
        self._spawn("backend", lambda: self.backend.run(self.stop_event, self.wake))
        self._spawn("reconcile", self._loop)
        self._datapath_thread = self._spawn("datapath-open", self._open_datapath)
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
        if self._datapath is not None:
            try:
                self._datapath.close()
            except Exception as e:  # noqa: BLE001
                log.warning("closing the datapath: %s", e)
        if self.server is not None:
            self.server.stop()

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
                ifs = pod_interfaces(self.cfg.pod_interfaces)
                due = now >= next_scan
                # A CNI adds a pod's route a moment after its veth: for a while after the pod
                # interfaces change, pass again every few seconds so the local-pod map catches up.
                settling = now < self._pods_settle_until and now - self._last_pass >= PODS_SETTLE_STEP_S
                if ifs == self._pod_ifs and not due and not settling:
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

    def _count(self, part: str) -> None:
        with self._lock:
            self._errors[part] = self._errors.get(part, 0) + 1

    def _open_datapath(self) -> None:
        """Load the fast path off the loop: compiling takes about a second, and a joining node must
        be reachable (through kernel routes) before that."""
        try:
            from ..datapath import Datapath

            dp = Datapath.open(self.cfg.node_name, pin_root=self.cfg.bpf_pin_root, enabled=self.cfg.fastpath)
        except Exception as e:  # noqa: BLE001
            log.error("datapath: %s", e)
            self._count("datapath")
            return
        log.info("datapath mode %s%s", dp.mode, f" ({dp.reason})" if dp.reason else "")
        self._datapath = dp
        self.wake()

    # --- one pass --------------------------------------------------------------------------

    def discover(self, mesh: MeshSettings) -> Node:
        """This node's record from flags and interfaces (discovery with overrides)."""
        from .. import discovery

        cfg = self.cfg
        internal = discovery.discover_internal_ip(
            cfg.private_interface, str(cfg.internal_cidr) if cfg.internal_cidr else None,
            str(cfg.force_internal_ip) if cfg.force_internal_ip else None)
        endpoint = discovery.discover_endpoint(cfg.endpoint, cfg.public_interface, mesh.port)
        assert self._public_key is not None
        return Node(
            name=cfg.node_name, pod_cidr=cfg.pod_cidr, public_key=self._public_key, location=cfg.location,
            internal_ip=internal, endpoint=endpoint, leader=cfg.leader,
            persistent_keepalive=cfg.persistent_keepalive, allowed_location_ips=cfg.allowed_location_ips,
        )

    def reconcile(self) -> NodePlan | None:
        """One pass; returns the plan applied (None when nothing was applied).

        The cyclic GC is paused for the pass (see model.gc_paused): at 5,000 records ~200,000
        objects are alive, and the collections a pass's allocations triggered took 15-60 ms of it
        (a full one ~100 ms); the data is acyclic and freed by reference counting anyway."""
        with gc_paused():
            return self._reconcile()

    def _reconcile(self) -> NodePlan | None:
        t0 = time.monotonic()
        self._cpu0 = time.thread_time()
        self.reconciles += 1
        self._steps = {}
        self._reused = []
        self._full = False
        errors: dict[str, str] = {}
        state = self.backend.snapshot()
        self._steps["snapshot"] = round(1000 * (time.monotonic() - t0), 2)
        if state.ready:
            self._last_good = state
        mesh = state.mesh if state.ready or self._last_good is None else self._last_good.mesh

        me: Node | None = None
        try:
            me = self.discover(mesh)
        except (InputError, MeshError) as e:
            errors["discovery"] = str(e)
            self._count("discovery")
        if me is not None and me != self._published:
            try:
                self.backend.publish(me)
                self._published = me
            except MeshError as e:
                errors["publish"] = str(e)
                self._count("publish")

        base = self._last_good if not state.ready else state
        if base is None or me is None:
            self._finish(t0, state, None, [], errors, applied=False)
            return None
        if not state.ready:
            # etcd away: keep what is installed, report it.
            self._finish(t0, state, self._last_plan, list(self._status.get("_rejections", [])), errors,
                         applied=False)
            return None

        t1 = time.monotonic()
        topo, remotes, rejections = self._admit(state, me)
        self._steps["admit"] = round(1000 * (time.monotonic() - t1), 2)
        if topo.node(me.name) is None:
            errors["admission"] = next((r.reason for r in rejections if r.name == me.name), "own record rejected")
            self._count("admission")
            self._finish(t0, state, self._last_plan, rejections, errors, applied=False)
            return None
        t1 = time.monotonic()
        try:
            memo = self._plan_memo
            if not remotes and memo is not None and memo[0] is topo:
                plan = memo[1]
                self._reused.append("plan")
            else:
                plan = plan_node(topo, me.name, remotes)
                self._plan_memo = None if remotes else (topo, plan)
            self._steps["plan"] = round(1000 * (time.monotonic() - t1), 2)
        except InputError as e:
            errors["plan"] = str(e)
            self._count("plan")
            self._finish(t0, state, self._last_plan, rejections, errors, applied=False)
            return None
        self._apply(plan, topo, remotes, me, errors)
        self._last_plan = plan
        self._last_view = (topo, remotes, plan)
        self._finish(t0, state, plan, rejections, errors, applied=True, topo=topo)
        return plan

    def _admit(self, state: ClusterState, me: Node) -> tuple[Topology, list[Remote], list[Rejection]]:
        """Our own record as discovered replaces the stored one (the store may lag behind); then
        the pure core decides who is in."""
        key = (state.cluster, state.mesh, me)
        memo = self._admit_memo
        if memo is not None and memo[0] == key and _same_items(memo[1], state.nodes) \
                and _same_items(memo[2], state.peers):
            topo, local_rejections = memo[3], memo[4]
            self._reused.append("admission")
        else:
            nodes = [me if n.name == me.name else n for n in state.nodes]
            if all(n.name != me.name for n in nodes):
                nodes.append(me)
            claims = v.Claims()
            admitted, rejected = v.admit_nodes(nodes, state.mesh.subnet, claims=claims)
            peers, rejected_peers = v.admit_peers(state.peers, claims)
            topo = Topology(cluster=state.cluster, mesh=state.mesh, nodes=tuple(admitted), peers=tuple(peers))
            local_rejections = [*rejected, *rejected_peers]
            self._admit_memo = (key, state.nodes, state.peers, topo, local_rejections)
        rejections = [*state.rejections, *local_rejections]
        remotes: list[Remote] = []
        if self.remotes is not None:
            try:
                if hasattr(self.remotes, "admit"):
                    remotes, rej = self.remotes.admit(topo)
                else:
                    from ..clustermesh import admit_remotes

                    remotes, rej = admit_remotes(topo, [s.topology() for s in self.remotes.states()])
                rejections += rej
            except Exception as e:  # noqa: BLE001 - a remote cluster must not stop the local plan
                log.warning("remote clusters: %s", e)
                self._count("remotes")
        return topo, remotes, rejections

    def _apply(self, plan: NodePlan, topo: Topology, remotes: list[Remote], me: Node,
               errors: dict[str, str]) -> None:
        cfg = self.cfg

        # Full passes (appliers read the kernel again) come from the loop's own tick, so they do not
        # slow down the pass that applies a change, unless changes keep coming for two intervals.
        now = time.monotonic()
        full = now >= self._full_due and (self._timer_pass or now >= self._full_due + self.cfg.resync_interval)
        self._full = full
        if full:
            self._full_due = time.monotonic() + self.cfg.resync_interval
            # The appliers diff against what they last applied; a full pass makes them read the
            # kernel/device again, which repairs drift made behind the agent's back.
            for part in APPLIER_ATTRS:
                self._forget(part)

        def step(part: str, fn: Callable[[], None], inputs: Any = None) -> None:
            # An applier whose inputs did not change since it last succeeded is skipped; every
            # resync interval all of them run, which repairs drift made behind the agent's back.
            if inputs is not None and not full and self._applied.get(part) == inputs:
                self._steps[part] = 0.0
                return
            self._applied.pop(part, None)
            t = time.monotonic()
            try:
                fn()
                if inputs is not None:
                    self._applied[part] = inputs
            except Exception as e:  # noqa: BLE001 - one applier's failure must not stop the others
                errors[part] = str(e) or type(e).__name__
                self._count(part)
                log.warning("%s: %s", part, errors[part])
                self._forget(part)  # its memory of the device may be wrong now: read it next time
            finally:
                self._steps[part] = round(1000 * (time.monotonic() - t), 2)

        def wireguard() -> None:
            from .. import discovery, wireguard

            if self._wg is None:
                self._wg = wireguard.WireGuard(ifname=cfg.wg_interface, run_dir=str(cfg.wg_run_dir))
            mtu = discovery.wg_mtu(cfg.private_interface)
            if self._wg.ensure_device(self._private_key, topo.mesh.port, plan.wireguard_ip, mtu):
                # A device made anew or re-addressed has lost its routes (the kernel flushes them
                # without telling anyone): the route step runs and reads the kernel again.
                self._forget("routes")
                self._applied.pop("routes", None)
            self._wg.sync_peers(plan.peers)

        def routes() -> None:
            from .. import routes

            if self._routes is None:
                self._routes = routes.RouteApplier(cfg.private_interface, cfg.wg_interface)
            self._routes.sync(plan.routes)

        def sysctls() -> None:
            from .. import sysctls

            if not self._sysctls_done:
                sysctls.ensure_sysctls(cfg.private_interface, cfg.wg_interface)
                self._sysctls_done = True

        self._pod_ifs = pod_interfaces(cfg.pod_interfaces)
        if remotes or self._cidrs_memo is None or self._cidrs_memo[0] is not topo:
            self._cidrs_memo = (topo, mesh_cidrs(topo, remotes))
        cidrs = self._cidrs_memo[1]

        def nat() -> None:
            from .. import nat

            if self._nat is None:
                self._nat = nat.NatApplier(cfg.nat_prefix)
            forward = [i for i in (cfg.private_interface, cfg.wg_interface) if i] + self._pod_ifs
            self._nat.sync([me.pod_cidr], cidrs, forward)

        def datapath() -> None:
            dp = self._datapath
            if dp is None or not cfg.private_interface:
                return
            want = tuple(self._pod_ifs)
            now = time.monotonic()
            if self._attached != want:
                self._pods_settle_until = now + PODS_SETTLE_S
            if self._attached != want or self._timer_pass or self._settle_pass:
                dp.attach(cfg.private_interface, cfg.wg_interface, list(want))  # also re-reads pod routes
                self._attached = want
            dp.sync(plan.fastpath, cfg.private_interface)
            self._dp_synced = True

        mtu_src = cfg.private_interface
        step("wireguard", wireguard, (plan.peers, plan.wireguard_ip, topo.mesh.port, mtu_src))
        step("routes", routes, plan.routes)
        step("sysctls", sysctls)
        step("nat", nat, (me.pod_cidr, cidrs, tuple(self._pod_ifs)))
        settling = self._settle_pass or tuple(self._pod_ifs) != self._attached
        step("datapath", datapath,
             None if settling else (plan.fastpath, tuple(self._pod_ifs), self._datapath is not None))

    def _forget(self, part: str) -> None:
        applier = getattr(self, APPLIER_ATTRS.get(part, ""), None)
        if applier is not None:
            applier.forget()

    # --- status ----------------------------------------------------------------------------

    def _finish(self, t0: float, state: ClusterState, plan: NodePlan | None, rejections: list[Rejection],
                errors: dict[str, str], *, applied: bool, topo: Topology | None = None) -> None:
        dt = time.monotonic() - t0
        cpu = time.thread_time() - self._cpu0
        ok = not errors
        for r in rejections:
            key = (r.name, r.reason)
            if key not in self._rejections_seen:
                self._rejections_seen.add(key)
                log.warning("rejected %s: %s", r.name, r.reason)
        if len(self._rejections_seen) > 10000:
            self._rejections_seen = {(r.name, r.reason) for r in rejections}
        with self._lock:
            if ok:
                self._ok_total += 1
            else:
                self._failed_total += 1
        if self.server is not None:
            self.server.reconcile_seconds.observe(dt)
        prev = self._status
        st: dict[str, Any] = {
            "node": self.cfg.node_name,
            "cluster": state.cluster.name,
            "backend": self.cfg.backend,
            "ready": state.ready,
            "reason": state.reason,
            "revision": state.revision,
            "records": state.extra.get("records"),
            "granularity": plan.granularity if plan else None,
            "mesh": v.mesh_to_record(state.mesh),
            "leader": plan.leader if plan else None,
            "is_leader": bool(plan and plan.leader == self.cfg.node_name),
            "wireguard_ip": str(plan.wireguard_ip) if plan and plan.wireguard_ip else None,
            "nodes": len(topo.nodes) if topo else prev.get("nodes", 0),
            "routes": len(plan.routes) if plan else 0,
            "paths": dict(plan.paths) if plan else {},
            "peers": [],  # filled in by status() from the last plan: its live part is read on request
            "rejections": [{"name": r.name, "reason": r.reason} for r in rejections],
            "rejections_total": len(self._rejections_seen),
            "datapath": self._datapath_status(),
            "pod_interfaces": list(self._pod_ifs),
            "last_reconcile": {"time": time.time(), "duration_s": round(dt, 6), "cpu_s": round(cpu, 6),
                               "applied": applied, "full": self._full, "reused": list(self._reused),
                               "errors": errors, "steps_ms": dict(self._steps)},
            "reconcile": {"ok_total": self._ok_total, "failed_total": self._failed_total},
            "errors_total": dict(self._errors),
            "pid": os.getpid(),
        }
        if self.remotes is not None:
            try:
                st["remotes"] = self.remotes.status()
            except Exception as e:  # noqa: BLE001
                st["remotes"] = {"error": str(e)}
        st["_rejections"] = rejections
        self._status = st

    def _peer_status(self, plan: NodePlan | None) -> list[dict[str, Any]]:
        """The plan's peers (built once per plan: a leader's 10,000 allowed IPs as text cost
        ~10 ms) with WireGuard's live counters (read at most every LIVE_PEERS_TTL_S, without
        parsing allowed IPs): /status and /metrics scrapes must not compete with the loop."""
        if plan is None:
            return []
        static = self._peer_static
        if static is None or not (static[0] is plan.peers or static[0] == plan.peers):
            static = (plan.peers, [{"name": p.name, "kind": p.kind, "public_key": p.public_key,
                                    "endpoint": p.endpoint, "allowed_ips": [str(a) for a in p.allowed_ips]}
                                   for p in plan.peers])
            self._peer_static = static
        at, live = self._live_peers
        if self._wg is not None and time.monotonic() - at >= LIVE_PEERS_TTL_S:
            try:
                live = _peers_by_key(self._wg.show(allowed_ips=False))
            except Exception as e:  # noqa: BLE001
                log.debug("wireguard show: %s", e)
            self._live_peers = (time.monotonic(), live)
        return [{**d, **live.get(d["public_key"], {})} for d in static[1]]

    def _datapath_status(self) -> dict[str, Any]:
        dp = self._datapath
        if dp is None:
            return {"mode": None, "reason": "loading" if self.cfg.fastpath else "disabled", "counters": {}}
        try:
            counters = {k: list(v) for k, v in dp.counters().items()}
        except Exception as e:  # noqa: BLE001
            counters = {}
            log.debug("datapath counters: %s", e)
        # synced: the maps hold a plan (until then an ebpf datapath passes everything to the kernel)
        return {"mode": dp.mode, "reason": getattr(dp, "reason", ""), "counters": counters,
                "synced": self._dp_synced}

    def status(self) -> dict[str, Any]:
        """The /status JSON (also what the metrics collector reads)."""
        st = {k: val for k, val in self._status.items() if not k.startswith("_")}
        st["datapath"] = self._datapath_status()
        wg = getattr(self, "_wg", None)
        st["wireguard_mode"] = wg.mode if wg is not None and wg.exists() else None  # kernel | wireguard-go
        st["peers"] = self._peer_status(self._last_plan) if self._last_plan else st.get("peers", [])
        view = getattr(self, "_last_view", None)
        if view is not None:  # built on request: with thousands of nodes it is not free
            st["node_list"] = self._node_list(view)
        mirror = getattr(self.backend, "mirror", None)  # --kvstore: this cluster published for the mesh
        if mirror is not None:
            try:
                st["kvstore"] = mirror.status()
            except Exception as e:  # noqa: BLE001 - status must always answer
                st["kvstore"] = {"error": str(e)}
        return st

    def _node_list(self, view: tuple[Topology, list[Remote], NodePlan]) -> list[dict[str, Any]]:
        """render.node_rows of the last applied view, built once per view (a /status poll at 5,000
        nodes would otherwise rebuild it each time, competing with the loop for the GIL)."""
        cached = self._node_rows
        # The same admitted topology and plan object (the plan is only reused without remote
        # clusters, so the same plan also means the same, empty, remotes).
        if cached is None or cached[0][0] is not view[0] or cached[0][2] is not view[2]:
            cached = (view, node_rows(*view))
            self._node_rows = cached
        return cached[1]


def _peers_by_key(show: Any) -> dict[str, dict[str, Any]]:
    """WireGuard.show() as {public_key: {rx_bytes, tx_bytes, last_handshake, live_endpoint}}."""
    peers = getattr(show, "peers", show)
    if isinstance(peers, dict):
        peers = list(peers.values())
    out: dict[str, dict[str, Any]] = {}
    for p in peers or []:
        get = p.get if isinstance(p, dict) else (lambda k, p=p: getattr(p, k, None))
        key = get("public_key")
        if not key:
            continue
        ep = get("endpoint")
        if isinstance(ep, tuple):
            ep = f"{ep[0]}:{ep[1]}" if ":" not in ep[0] else f"[{ep[0]}]:{ep[1]}"
        out[key] = {"rx_bytes": get("rx_bytes") or 0, "tx_bytes": get("tx_bytes") or 0,
                    "last_handshake": get("last_handshake") or 0, "live_endpoint": ep}
    return out
