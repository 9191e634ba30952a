"""The file backend (`--backend file`) and topology files: the YAML that `meshctl plan`, `graph`,
`showconf`, the lab and static setups read."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from meshctl.backends.base import ClusterState
from meshctl.errors import InputError
from meshctl.mesh.model import Cluster, MeshSettings, Node, Topology
from meshctl.mesh.records import parse_topology


def load_yaml(path: str | Path) -> Any:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise InputError("", str(p), f"cannot be read: {e.strerror}") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise InputError("", str(p), f"is not valid YAML{where}") from None


def load_topology(path: str | Path) -> Topology:
    """Read and validate a topology file; errors carry the file name: `topo.yaml: nodes[3]...`."""
    doc = load_yaml(path)
    try:
        return parse_topology(doc)
    except InputError as e:
        raise e.prefixed(f"{Path(path).name}: ") from None


class FileBackend:
    """A static topology file (`--backend file`): for setups without a store, and for tests."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._published: Node | None = None

    def publish(self, node: Node) -> None:
        self._published = node

    def snapshot(self) -> ClusterState:
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

    def status(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass
