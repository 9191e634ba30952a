# SPDX-License-Identifier: Apache-2.0
"""Where node records come from. Every backend (etcd, Kubernetes, a static file) gives the agent
the same thing: a `ClusterState` snapshot and a wake-up when it may have changed.

Backends parse records one by one: a record that cannot be parsed becomes a `Rejection` and the
rest go on. Checks between records (overlaps, duplicates) are the agent's, through
`mesh.admit.admit_nodes`, so every backend rejects the same things the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from meshctl.mesh.admit import Rejection
from meshctl.mesh.leaders import ForwardingReport
from meshctl.mesh.model import Cluster, MeshSettings, Node, Peer, Topology


@dataclass(frozen=True)
class ClusterState:
    """One consistent view of a cluster. `nodes` are in admission order: older records first, so
    a newcomer can never take an address an existing node holds."""

    cluster: Cluster
    mesh: MeshSettings
    nodes: tuple[Node, ...] = ()
    peers: tuple[Peer, ...] = ()
    rejections: tuple[Rejection, ...] = ()
    ready: bool = True
    reason: str = ""
    revision: int = 0
    extra: dict[str, object] = field(default_factory=dict, compare=False)
    # The nodes' forwarding reports (mesh/leaders.py), by publishing node; empty where the store
    # keeps none (the leaders are then those of the documented order).
    forwarding: dict[str, ForwardingReport] = field(default_factory=dict, compare=False)

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


