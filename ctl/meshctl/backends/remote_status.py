# SPDX-License-Identifier: Apache-2.0
"""The ClusterMesh block of the agent's /status (`remotes`), typed: what the cluster-mesh watcher
(backends.clustermesh.RemoteClusters.report) and the global-services step (agent.global_services)
say of the remote clusters and the global Services. Its JSON form is a published interface
(agent/status.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]


@dataclass(frozen=True)
class Rejected:
    """A record left out of the plan, and why (`rejections`, and a remote cluster's)."""

    name: str
    reason: str

    def to_json(self) -> JSON:
        return {"name": self.name, "reason": self.reason}

    @classmethod
    def from_json(cls, d: JSON) -> Rejected:
        return cls(str(d.get("name", "")), str(d.get("reason", "")))


@dataclass(frozen=True)
class RemoteCluster:
    """One remote cluster of the cluster mesh as this agent sees it (backends.clustermesh)."""

    name: str
    ready: bool
    reason: str | None
    nodes: int
    endpoints: tuple[str, ...]
    connected: bool
    last_change: float | None
    reconnects: int
    last_sync_age: float | None
    rejected: int
    rejections: tuple[Rejected, ...]

    def to_json(self) -> JSON:
        return {"name": self.name, "ready": self.ready, "reason": self.reason, "nodes": self.nodes,
                "endpoints": list(self.endpoints), "connected": self.connected, "last_change": self.last_change,
                "reconnects": self.reconnects, "last_sync_age": self.last_sync_age, "rejected": self.rejected,
                "rejections": [r.to_json() for r in self.rejections]}

    @classmethod
    def from_json(cls, d: JSON) -> RemoteCluster:
        return cls(str(d.get("name", "")), bool(d.get("ready")), d.get("reason"), d.get("nodes") or 0,
                   tuple(d.get("endpoints") or ()), bool(d.get("connected")), d.get("last_change"),
                   d.get("reconnects") or 0, d.get("last_sync_age"), d.get("rejected") or 0,
                   tuple(Rejected.from_json(r) for r in d.get("rejections") or ()))


@dataclass(frozen=True)
class GlobalServiceStatus:
    """One global Service of this cluster (agent.global_services): its settings, the ready
    endpoints it publishes, and the endpoints each remote cluster gives it here."""

    namespace: str
    name: str
    shared: bool
    affinity: str
    local_endpoints: int
    remote_endpoints: dict[str, int]

    def to_json(self) -> JSON:
        return {"namespace": self.namespace, "name": self.name, "shared": self.shared, "affinity": self.affinity,
                "local_endpoints": self.local_endpoints,
                "remote_endpoints": dict(self.remote_endpoints)}

    @classmethod
    def from_json(cls, d: JSON) -> GlobalServiceStatus:
        return cls(str(d.get("namespace", "")), str(d.get("name", "")), bool(d.get("shared", True)),
                   str(d.get("affinity", "none")), d.get("local_endpoints") or 0,
                   {str(k): int(v) for k, v in (d.get("remote_endpoints") or {}).items()})


@dataclass(frozen=True)
class ImportStatus:
    """One ServiceImport of this cluster (Multi-Cluster Services, mesh.mcs): its type, its
    ClusterSetIP, and the endpoints each exporting cluster gives it here."""

    namespace: str
    name: str
    type: str
    ips: tuple[str, ...]
    endpoints: dict[str, tuple[str, ...]]  # cluster -> addresses

    def to_json(self) -> JSON:
        return {"namespace": self.namespace, "name": self.name, "type": self.type, "ips": list(self.ips),
                "endpoints": {c: list(a) for c, a in sorted(self.endpoints.items())}}

    @classmethod
    def from_json(cls, d: JSON) -> ImportStatus:
        return cls(str(d.get("namespace", "")), str(d.get("name", "")), str(d.get("type", "")),
                   tuple(str(a) for a in d.get("ips") or ()),
                   {str(c): tuple(str(a) for a in v) for c, v in (d.get("endpoints") or {}).items()})


@dataclass(frozen=True)
class ClusterSetStatus:
    """Multi-Cluster Services as this cluster holds them: its ServiceExports, its ServiceImports,
    and how many Services each remote cluster exports."""

    exports: int = 0
    imports: tuple[ImportStatus, ...] = ()
    remote_exports: dict[str, int] | None = None

    def to_json(self) -> JSON:
        return {"exports": self.exports, "imports": [i.to_json() for i in self.imports],
                "remote_exports": dict(self.remote_exports or {})}

    @classmethod
    def from_json(cls, d: JSON) -> ClusterSetStatus:
        return cls(int(d.get("exports") or 0), tuple(ImportStatus.from_json(i) for i in d.get("imports") or ()),
                   {str(k): int(v) for k, v in (d.get("remote_exports") or {}).items()})


@dataclass(frozen=True)
class RemotesStatus:
    """The ClusterMesh block: how many remote clusters are ready, and each; the global Services
    (`services`, the rejected service records and who publishes). `error`: the watcher could not
    say (then the block holds only that)."""

    ready: int = 0
    total: int = 0
    clusters: tuple[RemoteCluster, ...] = ()
    error: str | None = None
    via: str | None = None  # with a cluster-mesh cache: `via cache` or `direct (cache unhealthy: ...)`
    services: tuple[GlobalServiceStatus, ...] = ()
    service_rejections: tuple[Rejected, ...] = ()
    services_leader: str | None = None
    clusterset: ClusterSetStatus | None = None

    def to_json(self) -> JSON:
        if self.error is not None:
            return {"error": self.error}
        out: JSON = {"ready": self.ready, "total": self.total, "clusters": [c.to_json() for c in self.clusters],
                     "services": [s.to_json() for s in self.services],
                     "service_rejections": [r.to_json() for r in self.service_rejections],
                     "services_leader": self.services_leader}
        if self.via is not None:
            out["via"] = self.via
        if self.clusterset is not None:
            out["clusterset"] = self.clusterset.to_json()
        return out

    @classmethod
    def from_json(cls, d: JSON) -> RemotesStatus:
        if "clusters" not in d:
            return cls(error=str(d.get("error", "unknown")))
        return cls(d.get("ready", 0), d.get("total", 0), tuple(RemoteCluster.from_json(c) for c in d["clusters"]),
                   via=d.get("via"),
                   services=tuple(GlobalServiceStatus.from_json(s) for s in d.get("services") or ()),
                   service_rejections=tuple(Rejected.from_json(r) for r in d.get("service_rejections") or ()),
                   services_leader=d.get("services_leader"),
                   clusterset=ClusterSetStatus.from_json(d["clusterset"]) if d.get("clusterset") else None)
