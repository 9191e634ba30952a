# SPDX-License-Identifier: Apache-2.0
"""What an agent reports about itself: one `AgentStatus`, the value behind `/status`, the metrics
and `meshctl status`.

`PassSummary` is built once per reconcile pass (what the pass saw, decided and applied);
`LiveStatus` is read on request (fast-path counters, WireGuard's counters, probe verdicts), since
a rung change or a handshake between passes is what an operator asks about. `to_json()` is the
`/status` document; `from_json()` reads one back (the CLI and the lab read an agent over HTTP).
The JSON keys are a published interface (operators' scripts read them): a key is present or
absent exactly as documented per field, and `from_json(x).to_json() == x` for any document an
agent serves. `from_json` fills a missing key with its field's default, so a reader keeps
working against an agent that does not serve every block.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshctl.backends.base import KvstoreStatus, OwnRecord
from meshctl.backends.remote_status import Rejected, RemotesStatus
from meshctl.datapath.status import JSON, DatapathStatus, opt_key
from meshctl.mesh.chooser import ProbeStatus, opt_path
from meshctl.mesh.model import MeshSettings, Path, path_of
from meshctl.mesh.records import mesh_to_record, parse_mesh
from meshctl.mesh.render import NodeRow


@dataclass(frozen=True)
class Relay:
    """A node reached through another (path `relay`): through which node, and why."""

    via: str
    reason: str


@dataclass(frozen=True)
class LastReconcile:
    """The last pass: when, how long (wall and CPU), whether it applied a plan, whether it was a
    full pass, which pure results it reused, its errors by part and each part's time."""

    time: float
    duration_s: float
    cpu_s: float
    applied: bool
    full: bool
    reused: tuple[str, ...]
    errors: dict[str, str]
    steps_ms: dict[str, float]

    def to_json(self) -> JSON:
        return {"time": self.time, "duration_s": self.duration_s, "cpu_s": self.cpu_s, "applied": self.applied,
                "full": self.full, "reused": list(self.reused), "errors": dict(self.errors),
                "steps_ms": dict(self.steps_ms)}

    @classmethod
    def from_json(cls, d: JSON) -> LastReconcile:
        return cls(d.get("time", 0.0), d.get("duration_s", 0.0), d.get("cpu_s", 0.0), bool(d.get("applied")),
                   bool(d.get("full")), tuple(d.get("reused") or ()), dict(d.get("errors") or {}),
                   dict(d.get("steps_ms") or {}))


@dataclass(frozen=True)
class ReconcileTotals:
    """Passes since start: without errors, with errors, full passes."""

    ok_total: int = 0
    failed_total: int = 0
    full_total: int = 0


@dataclass(frozen=True)
class Interfaces:
    """The devices this node's traffic leaves on: the private NIC (None: none known) and the
    WireGuard device."""

    private: str | None
    wireguard: str

    def to_json(self) -> JSON:
        return {"private": self.private, "wireguard": self.wireguard}

    @classmethod
    def from_json(cls, d: JSON) -> Interfaces:
        return cls(d.get("private"), str(d.get("wireguard", "")))


@dataclass(frozen=True)
class PassSummary:
    """What the last reconcile pass recorded (built once per pass). `remotes` is None when the
    agent has no cluster mesh (the key is then absent); `interfaces` and `path_mtu` (the largest
    packet each rung carries from this node, by rung) are absent from an agent that does not
    report them."""

    cluster: str
    backend: str
    revision: int
    records: int | None
    granularity: str | None
    mesh: MeshSettings
    leader: str | None
    is_leader: bool
    wireguard_ip: str | None
    nodes: int
    routes: int
    paths: dict[str, Path]
    relays: dict[str, Relay]
    discovered_endpoints: dict[str, str]
    unreached_peers: tuple[str, ...]
    rejections: tuple[Rejected, ...]
    rejections_total: int
    pod_interfaces: tuple[str, ...]
    warnings: tuple[str, ...]
    last_reconcile: LastReconcile
    reconcile: ReconcileTotals
    errors_total: dict[str, int]
    pid: int
    remotes: RemotesStatus | None = None
    interfaces: Interfaces | None = None
    path_mtu: dict[Path, int] | None = None
    # Location granularity: who leads each location and why, the leader moves (absent otherwise).
    leaders: LeadershipStatus | None = None

    def to_json(self) -> JSON:
        out: JSON = {
            "cluster": self.cluster, "backend": self.backend, "revision": self.revision, "records": self.records,
            "granularity": self.granularity, "mesh": mesh_to_record(self.mesh), "leader": self.leader,
            "is_leader": self.is_leader, "wireguard_ip": self.wireguard_ip, "nodes": self.nodes,
            "routes": self.routes, "paths": dict(self.paths),
            "relays": {n: {"via": r.via, "reason": r.reason} for n, r in self.relays.items()},
            "discovered_endpoints": dict(self.discovered_endpoints), "unreached_peers": list(self.unreached_peers),
            "rejections": [r.to_json() for r in self.rejections], "rejections_total": self.rejections_total,
            "pod_interfaces": list(self.pod_interfaces), "warnings": list(self.warnings),
            "last_reconcile": self.last_reconcile.to_json(),
            "reconcile": {"ok_total": self.reconcile.ok_total, "failed_total": self.reconcile.failed_total,
                          "full_total": self.reconcile.full_total},
            "errors_total": dict(self.errors_total), "pid": self.pid,
        }
        opt_key(out, "remotes", self.remotes.to_json() if self.remotes is not None else None)
        opt_key(out, "interfaces", self.interfaces.to_json() if self.interfaces is not None else None)
        opt_key(out, "path_mtu", dict(self.path_mtu) if self.path_mtu is not None else None)
        opt_key(out, "leaders", self.leaders.to_json() if self.leaders is not None else None)
        return out

    @classmethod
    def from_json(cls, d: JSON) -> PassSummary:
        rec = d.get("reconcile") or {}
        remotes, ifs, mtu, lead = d.get("remotes"), d.get("interfaces"), d.get("path_mtu"), d.get("leaders")
        return cls(
            cluster=str(d.get("cluster", "")), backend=str(d.get("backend", "")), revision=d.get("revision", 0),
            records=d.get("records"), granularity=d.get("granularity"),
            mesh=parse_mesh(d.get("mesh"), "status.mesh"), leader=d.get("leader"),
            is_leader=bool(d.get("is_leader")), wireguard_ip=d.get("wireguard_ip"), nodes=d.get("nodes", 0),
            routes=d.get("routes", 0), paths={n: path_of(p, f"paths.{n}") for n, p in (d.get("paths") or {}).items()},
            relays={n: Relay(str(r.get("via", "")), str(r.get("reason", "")))
                    for n, r in (d.get("relays") or {}).items()},
            discovered_endpoints=dict(d.get("discovered_endpoints") or {}),
            unreached_peers=tuple(d.get("unreached_peers") or ()),
            rejections=tuple(Rejected.from_json(r) for r in d.get("rejections") or ()),
            rejections_total=d.get("rejections_total", 0), pod_interfaces=tuple(d.get("pod_interfaces") or ()),
            warnings=tuple(d.get("warnings") or ()),
            last_reconcile=LastReconcile.from_json(d.get("last_reconcile") or {}),
            reconcile=ReconcileTotals(rec.get("ok_total", 0), rec.get("failed_total", 0), rec.get("full_total", 0)),
            errors_total=dict(d.get("errors_total") or {}), pid=d.get("pid", 0),
            remotes=RemotesStatus.from_json(remotes) if isinstance(remotes, dict) else None,
            interfaces=Interfaces.from_json(ifs) if isinstance(ifs, dict) else None,
            path_mtu={path_of(r, "path_mtu"): m for r, m in mtu.items()} if isinstance(mtu, dict) else None,
            leaders=LeadershipStatus.from_json(lead) if isinstance(lead, dict) else None,
        )


def objects_line(objects: str, refused: int | None) -> str:
    """The `objects: ...` line of `meshctl status` and `datapath status`: the outcome, and how many
    compiled objects were refused for their map layout version (when any)."""
    return f"objects: {objects}" + (f" ({refused} refused for their map layout version)" if refused else "")


@dataclass(frozen=True)
class RungChanges:
    """How often pairs moved from one rung to another for one reason, since start (`old` none:
    the pair's first choice)."""

    old: Path
    new: Path
    reason: str
    count: int

    def to_json(self) -> JSON:
        return {"from": self.old, "to": self.new, "reason": self.reason, "count": self.count}

    @classmethod
    def from_json(cls, d: JSON) -> RungChanges:
        return cls(path_of(d.get("from"), "path_changes.from"), path_of(d.get("to"), "path_changes.to"),
                   str(d.get("reason", "")), d.get("count", 0))


@dataclass(frozen=True)
class PodsStatus:
    """Pod interfaces: how they are found (`flag` or `netlink`), which were found, which carry the
    fast path, and a warning when there are pods and none carries it."""

    source: str
    found: tuple[str, ...]
    fastpath: tuple[str, ...]
    warning: str | None = None

    def to_json(self) -> JSON:
        out: JSON = {"source": self.source, "found": list(self.found), "fastpath": list(self.fastpath)}
        opt_key(out, "warning", self.warning)
        return out

    @classmethod
    def from_json(cls, d: JSON) -> PodsStatus:
        return cls(str(d.get("source", "")), tuple(d.get("found") or ()), tuple(d.get("fastpath") or ()),
                   d.get("warning"))


@dataclass(frozen=True)
class CniStatus:
    """`--cni` mode, and a warning when another CNI's config is left over (mode keep)."""

    mode: str
    warning: str | None = None

    def to_json(self) -> JSON:
        out: JSON = {"mode": self.mode}
        opt_key(out, "warning", self.warning)
        return out

    @classmethod
    def from_json(cls, d: JSON) -> CniStatus:
        return cls(str(d.get("mode", "")), d.get("warning"))


@dataclass(frozen=True)
class PeerCounters:
    """What WireGuard says of a peer now: bytes each way, last handshake (0: none), live endpoint,
    and the handshake's age when the status was read (None: no handshake, the key is absent)."""

    rx_bytes: int
    tx_bytes: int
    last_handshake: float
    live_endpoint: str | None
    handshake_age_s: float | None = None


@dataclass(frozen=True)
class PeerRow:
    """A WireGuard peer of the plan, with its live counters when the device knows the peer
    (`live` None: the counter keys are absent)."""

    name: str
    kind: str
    public_key: str
    endpoint: str | None
    allowed_ips: tuple[str, ...]
    live: PeerCounters | None = None

    def to_json(self) -> JSON:
        out: JSON = {"name": self.name, "kind": self.kind, "public_key": self.public_key, "endpoint": self.endpoint,
                     "allowed_ips": list(self.allowed_ips)}
        if self.live is not None:
            out.update(rx_bytes=self.live.rx_bytes, tx_bytes=self.live.tx_bytes,
                       last_handshake=self.live.last_handshake, live_endpoint=self.live.live_endpoint)
            opt_key(out, "handshake_age_s", self.live.handshake_age_s)
        return out

    @classmethod
    def from_json(cls, d: JSON) -> PeerRow:
        live = PeerCounters(d.get("rx_bytes", 0), d.get("tx_bytes", 0), d.get("last_handshake") or 0,
                            d.get("live_endpoint"), d.get("handshake_age_s")) if "rx_bytes" in d else None
        return cls(str(d.get("name", "")), str(d.get("kind", "")), str(d.get("public_key", "")), d.get("endpoint"),
                   tuple(d.get("allowed_ips") or ()), live)


@dataclass(frozen=True)
class BackendBlocks:
    """What the backend adds (backends.base.Backend.status), each absent unless it serves it:
    `own_record` and `lapsed` (etcd), `kvstore` (Kubernetes with a mirror), `backend_error` when
    the backend could not say."""

    own_record: OwnRecord | None = None
    lapsed: dict[str, float] | None = None
    kvstore: KvstoreStatus | None = None
    backend_error: str | None = None

    def to_json(self) -> JSON:
        out: JSON = {}
        if self.own_record is not None:
            out["own_record"] = {"restored_total": self.own_record.restored_total,
                                 "last_restored": self.own_record.last_restored}
        opt_key(out, "lapsed", dict(self.lapsed) if self.lapsed is not None else None)
        opt_key(out, "kvstore", self.kvstore.to_json() if self.kvstore is not None else None)
        opt_key(out, "backend_error", self.backend_error)
        return out

    @classmethod
    def from_json(cls, d: JSON) -> BackendBlocks:
        own, lapsed, kv = d.get("own_record"), d.get("lapsed"), d.get("kvstore")
        return cls(OwnRecord(own.get("restored_total", 0), own.get("last_restored")) if isinstance(own, dict) else None,
                   dict(lapsed) if isinstance(lapsed, dict) else None,
                   KvstoreStatus.from_json(kv) if isinstance(kv, dict) else None, d.get("backend_error"))


@dataclass(frozen=True)
class LiveStatus:
    """The parts read on request. `path_probe` is None without a prober (the key is null);
    `node_list` is None until a plan was applied (the key is absent)."""

    datapath: DatapathStatus
    path_probe: ProbeStatus | None
    path_changes: tuple[RungChanges, ...]
    wireguard_mode: str | None
    pods: PodsStatus
    cni: CniStatus
    peers: tuple[PeerRow, ...]
    node_list: tuple[NodeRow, ...] | None
    backend: BackendBlocks

    def to_json(self) -> JSON:
        out: JSON = {
            "datapath": self.datapath.to_json(),
            "path_probe": self.path_probe.to_json() if self.path_probe is not None else None,
            "path_changes": [c.to_json() for c in self.path_changes], "wireguard_mode": self.wireguard_mode,
            "pods": self.pods.to_json(), "cni": self.cni.to_json(), "peers": [p.to_json() for p in self.peers],
        }
        opt_key(out, "node_list", [r.to_json() for r in self.node_list] if self.node_list is not None else None)
        out.update(self.backend.to_json())
        return out

    @classmethod
    def from_json(cls, d: JSON) -> LiveStatus:
        probe, rows = d.get("path_probe"), d.get("node_list")
        return cls(DatapathStatus.from_json(d.get("datapath") or {}),
                   ProbeStatus.from_json(probe) if isinstance(probe, dict) else None,
                   tuple(RungChanges.from_json(c) for c in d.get("path_changes") or ()), d.get("wireguard_mode"),
                   PodsStatus.from_json(d.get("pods") or {}), CniStatus.from_json(d.get("cni") or {}),
                   tuple(PeerRow.from_json(p) for p in d.get("peers") or ()),
                   tuple(NodeRow.from_json(r) for r in rows) if isinstance(rows, list) else None,
                   BackendBlocks.from_json(d))


@dataclass(frozen=True)
class AgentStatus:
    """An agent's status: its node, whether its backend is ready (and why not), the last pass
    (None before the first: its keys are then absent) and the live parts."""

    node: str
    ready: bool
    reason: str
    summary: PassSummary | None
    live: LiveStatus

    def to_json(self) -> JSON:
        out: JSON = {"node": self.node}
        if self.summary is None:
            out.update(ready=self.ready, reason=self.reason)
        else:
            s = self.summary.to_json()
            out.update(cluster=s.pop("cluster"), backend=s.pop("backend"), ready=self.ready, reason=self.reason)
            out.update(s)
        out.update(self.live.to_json())
        return out

    @classmethod
    def from_json(cls, d: JSON) -> AgentStatus:
        summary = PassSummary.from_json(d) if "last_reconcile" in d else None
        return cls(str(d.get("node", "")), bool(d.get("ready")), str(d.get("reason", "")), summary,
                   LiveStatus.from_json(d))


@dataclass(frozen=True)
class ProbeResult:
    """One probe sent on request (`/probe?peer=NAME`): towards which peer, on which rung and probe
    kind, whether it came back and its round trip; `error` says why none was sent (then `kind`
    may be None)."""

    peer: str
    rung: Path | None
    kind: str | None
    answered: bool
    rtt_ms: float | None
    timeout_s: float
    error: str | None = None

    def to_json(self) -> JSON:
        out: JSON = {"peer": self.peer, "rung": self.rung, "kind": self.kind, "answered": self.answered,
                     "rtt_ms": self.rtt_ms, "timeout_s": self.timeout_s}
        opt_key(out, "error", self.error)
        return out

    @classmethod
    def from_json(cls, d: JSON) -> ProbeResult:
        return cls(str(d.get("peer", "")), opt_path(d.get("rung"), "rung"), d.get("kind"), bool(d.get("answered")),
                   d.get("rtt_ms"),
                   d.get("timeout_s", 0.0), d.get("error"))


@dataclass(frozen=True)
class LeaderMove:
    """A location's leaders changed: when (unix seconds), from whom to whom, and why (the reason
    names the verdicts, who published them and their age; "" for a return to the documented order)."""

    location: str
    at: float
    before: tuple[str, ...]
    after: tuple[str, ...]
    reason: str

    def to_json(self) -> JSON:
        return {"location": self.location, "at": self.at, "from": list(self.before), "to": list(self.after),
                "reason": self.reason}

    @classmethod
    def from_json(cls, d: JSON) -> LeaderMove:
        return cls(str(d.get("location", "")), float(d.get("at", 0.0)), tuple(d.get("from") or ()),
                   tuple(d.get("to") or ()), str(d.get("reason", "")))


@dataclass(frozen=True)
class LeadershipStatus:
    """Who leads each location (mesh.leaders.LocationLeaders, as JSON: `leaders`, `static`, `out`,
    `reason`, `evidence`), the moves counted since the agent started, per location, the last moves,
    and this node's own forwarding verdicts on its location's members and the other locations'
    leaders it witnesses (`forwarding`: node -> {verdict, since}; absent when this node probes none)."""

    locations: tuple[JSON, ...] = ()
    moves: dict[str, int] = field(default_factory=dict)
    last_moves: tuple[LeaderMove, ...] = ()
    forwarding: dict[str, JSON] | None = None

    def to_json(self) -> JSON:
        out: JSON = {"locations": list(self.locations), "moves": dict(self.moves),
                     "last_moves": [m.to_json() for m in self.last_moves]}
        opt_key(out, "forwarding", self.forwarding)
        return out

    @classmethod
    def from_json(cls, d: JSON) -> LeadershipStatus:
        fwd = d.get("forwarding")
        return cls(tuple(d.get("locations") or ()), dict(d.get("moves") or {}),
                   tuple(LeaderMove.from_json(m) for m in d.get("last_moves") or ()),
                   dict(fwd) if isinstance(fwd, dict) else None)
