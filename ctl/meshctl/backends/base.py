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

from meshctl.mesh.admit import Rejection
from meshctl.mesh.flannel import FlannelLease
from meshctl.mesh.model import Cluster, MeshSettings, Node, Peer, Topology


@dataclass(frozen=True)
class ClusterState:
    """One consistent view of a cluster. `nodes` are in admission order: older records first, so
    a newcomer can never take an address an existing node holds.

    What a backend counts besides the records (none of it compared): `records`, how many node
    records the store holds (etcd, lapsed ones not counted; None: the backend does not count);
    `lapsed`, records kept through their lapse grace (etcd); `pending`, nodes that have no pod
    CIDR yet, and `stale`, nodes left out because their last-seen is too old (Kubernetes);
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
    pending: tuple[str, ...] = field(default=(), compare=False)
    stale: tuple[str, ...] = field(default=(), compare=False)
    flannel: Mapping[str, FlannelLease] = field(default_factory=dict, compare=False)

    def topology(self) -> Topology:
        return Topology(cluster=self.cluster, mesh=self.mesh, nodes=self.nodes, peers=self.peers)


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

    def status(self) -> dict[str, Any]:
        """Blocks the backend adds to the agent's /status (e.g. `kvstore`); {} when none."""


