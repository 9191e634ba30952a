# SPDX-License-Identifier: Apache-2.0
"""Where node records come from. Every backend (etcd, Kubernetes, a static file) gives the agent
the same thing: a `ClusterState` snapshot and a wake-up when it may have changed.

Backends parse records one by one: a record that cannot be parsed becomes a `Rejection` and the
rest go on. Checks between records (overlaps, duplicates) are the agent's, through
`mesh.admit.admit_nodes`, so every backend rejects the same things the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from meshctl.etcd import KeyValue
from meshctl.mesh.admit import Rejection
from meshctl.mesh.flannel import FlannelLease
from meshctl.mesh.leaders import ForwardingReport
from meshctl.mesh.model import Cluster, MeshSettings, Node, Peer, Topology


@dataclass(frozen=True)
class ClusterState:
    """One consistent view of a cluster. `nodes` are in admission order: older records first, so
    a newcomer can never take an address an existing node holds.

    What a backend counts besides the records (none of it compared): `records`, how many node
    records the store holds (etcd, lapsed ones not counted; None: the backend does not count);
    `lapsed`, records kept through their lapse grace (etcd); `pending`, nodes that have not joined
    yet (no pod CIDR, or their agent has not published), each with what it still lacks, and
    `stale`, nodes left out because their last-seen is too old (Kubernetes);
    `flannel`, flannel's lease of each node by name (`--cni flannel`: the plan's flannel input's
    applier writes flannel's routes back from them)."""

    cluster: Cluster
    mesh: MeshSettings
    nodes: tuple[Node, ...] = ()
    peers: tuple[Peer, ...] = ()
    rejections: tuple[Rejection, ...] = ()
    ready: bool = True
    reason: str = ""
    revision: int = 0
    records: int | None = field(default=None, compare=False)
    lapsed: int = field(default=0, compare=False)
    pending: Mapping[str, str] = field(default_factory=dict, compare=False)
    stale: tuple[str, ...] = field(default=(), compare=False)
    flannel: Mapping[str, FlannelLease] = field(default_factory=dict, compare=False)
    # The nodes' forwarding reports (mesh/leaders.py), by publishing node; empty where the store
    # keeps none (the leaders are then those of the documented order).
    forwarding: dict[str, ForwardingReport] = field(default_factory=dict, compare=False)

    def topology(self) -> Topology:
        return Topology(cluster=self.cluster, mesh=self.mesh, nodes=self.nodes, peers=self.peers)


@dataclass(frozen=True)
class OwnRecord:
    """How often this agent put its record back after someone else deleted or changed it."""

    restored_total: int
    last_restored: str | None


@dataclass(frozen=True)
class KvstoreStatus:
    """The Kubernetes backend's mirror into the cluster-mesh etcd (--kvstore-endpoints)."""

    writing: bool
    writer: str | None
    lease: int
    puts: int = 0
    deletes: int = 0
    errors: int = 0
    takeovers: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"writing": self.writing, "writer": self.writer, "lease": self.lease, "puts": self.puts,
                "deletes": self.deletes, "errors": self.errors, "takeovers": self.takeovers}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> KvstoreStatus:
        return cls(bool(d.get("writing")), d.get("writer"), d.get("lease", 0), d.get("puts", 0),
                   d.get("deletes", 0), d.get("errors", 0), d.get("takeovers", 0))


@dataclass(frozen=True)
class BackendStatus:
    """What a backend adds to the agent's /status, each None when it does not serve it:
    `own_record` (etcd: how often the agent put its record back), `lapsed` (etcd: records kept
    through their lapse grace, by name, with the seconds left), `kvstore` (Kubernetes with a
    cluster-mesh mirror)."""

    own_record: OwnRecord | None = None
    lapsed: dict[str, float] | None = None
    kvstore: KvstoreStatus | None = None


class Backend(Protocol):
    """What the agent needs from a store of node records."""

    def publish(self, node: Node) -> None:
        """Publish (or refresh) this agent's own record; it must disappear by itself if the agent dies."""

    def snapshot(self) -> ClusterState:
        """The current view; never raises for bad records (they are rejections), and when the store
        is unreachable returns the last good view with ready=False and a reason."""

    def run(self, stop: threading.Event, changed: Callable[[], None]) -> None:
        """Watch until `stop` is set, calling `changed()` after anything may have changed
        (including connection loss and recovery). Runs in its own thread."""

    def close(self) -> None:
        """Release connections. Must not withdraw the published record (a restarting agent keeps it)."""

    def status(self) -> BackendStatus:
        """Blocks the backend adds to the agent's /status (e.g. `kvstore`); BackendStatus() when none."""


class RecordMirror(Protocol):
    """A cluster's records as a watcher mirrors them (backends.etcd.EtcdBackend): the keys under a
    prefix, and the parsed view. Readers of other records than nodes (global services, the
    Multi-Cluster Services controller) take them from the mirror without a watch of their own."""

    def records_under(self, prefix: str) -> list[KeyValue]: ...

    def snapshot(self) -> ClusterState: ...
