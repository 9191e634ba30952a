"""Where node records come from. Every backend (etcd, Kubernetes, a static file) gives the agent
the same thing: a `ClusterState` snapshot and a wake-up when it may have changed.

Backends parse records one by one: a record that cannot be parsed becomes a `Rejection` and the
rest go on. Checks between records (overlaps, duplicates) are the agent's, through
`validate.admit_nodes`, so every backend rejects the same things the same way.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from .errors import InputError
from .model import Cluster, MeshSettings, Node, Peer, Topology
from .validate import Rejection


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


class FileBackend:
    """A static topology file (`--backend file`): for setups without a store, and for tests."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._published: Node | None = None

    def publish(self, node: Node) -> None:
        self._published = node

    def snapshot(self) -> ClusterState:
        from .topofile import load_topology

        try:
            topo = load_topology(self.path)
        except InputError as e:
            return ClusterState(Cluster(), MeshSettings(), ready=False, reason=str(e))
        nodes = list(topo.nodes)
        if self._published is not None:
            nodes = [self._published if n.name == self._published.name else n for n in nodes]
            if all(n.name != self._published.name for n in nodes):
                nodes.append(self._published)
        return ClusterState(topo.cluster, topo.mesh, tuple(nodes), topo.peers)

    def run(self, stop: threading.Event, changed: Callable[[], None]) -> None:
        last = None
        while not stop.wait(1.0):
            try:
                mtime = self.path.stat().st_mtime_ns
            except OSError:
                mtime = None
            if mtime != last:
                last = mtime
                changed()

    def close(self) -> None:
        pass
