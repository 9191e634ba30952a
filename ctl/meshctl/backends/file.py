# SPDX-License-Identifier: Apache-2.0
"""The file backend (`--backend file`) and topology files: the YAML that `meshctl plan`, `graph`,
`showconf`, the lab and static setups read."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from meshctl.backends.base import BackendStatus, ClusterState
from meshctl.errors import MISSING, InputError, show
from meshctl.mesh.model import Cluster, MeshSettings, Node, Topology
from meshctl.mesh.records import parse_topology


class _DuplicateKey(Exception):
    """A mapping that gives one key twice (PyYAML would keep the last value without a word)."""

    def __init__(self, key: Any, first: yaml.Mark, again: yaml.Mark) -> None:
        super().__init__(key)
        self.key, self.first, self.again = key, first, again


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (merge keys `<<` may still be
    overridden: that is what they are for)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: SafeLoader's own error says so
                continue
            if first is not key_node.start_mark:
                raise _DuplicateKey(key, first, key_node.start_mark)
        return super().construct_mapping(node, deep)


# An IPv6 endpoint written bare: YAML reads `[fd00::1]` as a list and stumbles on the `:port`.
_BARE_V6_ENDPOINT = re.compile(r"(?<![\"'])\[[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\]:\d+")


def _yaml_hint(problem: str, line: str) -> str:
    """The usual cause of a YAML error on `line`, as ` (hint: ...)`, or ''."""
    bare = _BARE_V6_ENDPOINT.search(line)
    if bare:
        return f' (hint: quote an IPv6 endpoint: "{bare.group(0)}")'
    if "\\t" in problem or "\t" in line[: len(line) - len(line.lstrip())]:
        return " (hint: indent with spaces; YAML does not allow tabs)"
    return ""


def _yaml_error(name: str, text: str, e: yaml.YAMLError) -> InputError:
    """`topo.yaml:4:15: not valid YAML: <the parser's reason> (hint: ...)`."""
    mark = getattr(e, "problem_mark", None)
    problem = str(getattr(e, "problem", None) or "cannot be parsed")
    if mark is None:
        return InputError(name, MISSING, f"not valid YAML: {problem}")
    lines = text.splitlines()
    line = lines[mark.line] if mark.line < len(lines) else ""
    hint = _yaml_hint(problem, line)
    context = getattr(e, "context_mark", None)
    if not hint and context is not None and context.line < len(lines):
        hint = _yaml_hint(problem, lines[context.line])
    return InputError(f"{name}:{mark.line + 1}:{mark.column + 1}", MISSING, f"not valid YAML: {problem}{hint}")


def load_yaml(path: str | Path) -> Any:
    """A YAML (or JSON) file's document. A file that cannot be read, is not UTF-8 text, is not
    YAML, holds nothing (only comments or spaces) or gives a key twice in one mapping is one
    InputError that names the file (and the line and column)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as e:
        raise InputError("", str(p), f"cannot be read: {e.strerror}") from None
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        raise InputError("", str(p), f"is not a text file (not UTF-8 at byte {e.start})") from None
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as e:
        raise _yaml_error(p.name, text, e) from None
    except _DuplicateKey as e:
        raise InputError(f"{p.name}:{e.again.line + 1}:{e.again.column + 1}", MISSING,
                         f"key {show(e.key)} is given twice in one mapping (lines {e.first.line + 1} "
                         f"and {e.again.line + 1}); keep one") from None
    except RecursionError:
        raise InputError("", str(p), "is nested too deeply to be a topology") from None
    if doc is None:
        raise InputError(p.name, MISSING, "is empty")
    return doc


def load_topology(path: str | Path) -> Topology:
    """Read and validate a topology file; errors carry the file name: `topo.yaml: nodes[3]...`."""
    return load_topology_checked(path)[0]


def load_topology_checked(path: str | Path) -> tuple[Topology, list[str]]:
    """`load_topology` and the file's warnings (checks.topology_warnings), each line led by the
    file name like its errors."""
    from meshctl.mesh.checks import topology_warnings

    doc = load_yaml(path)
    refuse_lab_file(doc, path)
    prefix = f"{Path(path).name}: "
    try:
        topo = parse_topology(doc)
        warnings = topology_warnings(topo, doc)
    except InputError as e:
        raise e.prefixed(prefix) from None
    return topo, [prefix + w for w in warnings]


def _get(d: Any, *keys: str) -> Any:
    """`d[k1][k2]...` of a document, or None where a level is missing or not a mapping."""
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d


def refuse_lab_file(doc: Any, path: str | Path) -> None:
    """A lab file that cannot be a topology is one line saying why and what to run instead: its
    nodes have no keys (the lab's agents make them), or it holds several clusters (a plan is of one).
    A lab file whose nodes have keys is a topology file: its lab-only fields are ignored."""
    if not isinstance(doc, dict):
        return
    lab = doc.get("lab")
    prefix = lab.get("prefix") if isinstance(lab, dict) else None
    name = prefix.rstrip("-") if isinstance(prefix, str) and prefix.rstrip("-") else "NAME"
    kube = isinstance(lab, dict) and lab.get("backend") == "kubernetes"

    def up(cluster: str | None = None) -> str:
        # A Kubernetes lab's records are its API server's Nodes (one per cluster); the others' are
        # in the lab's etcd.
        one = f" --cluster-name {cluster}" if cluster else ""
        read = f'--backend kubernetes --kubeconfig "$(meshctl lab kubeconfig --lab {name}{one})"' if kube else \
            f"--backend etcd --lab {name}{one}"
        return f"run meshctl lab up -f {path}, then meshctl plan {read}"

    clusters = doc.get("clusters")
    if isinstance(clusters, list):
        first = clusters[0] if clusters and isinstance(clusters[0], dict) else {}
        cname = _get(first, "cluster", "name") or "CLUSTER"
        nodes = first.get("nodes")
        node = _get(nodes[0], "name") if isinstance(nodes, list) and nodes else None
        raise InputError(Path(path).name, MISSING, f"is a lab file of {len(clusters)} clusters (clusters: [...]) and a "
                         f"topology file is one cluster; {up(cname)} --node {node or 'NODE'}")
    nodes = doc.get("nodes")
    if "lab" not in doc or not isinstance(nodes, list):
        return
    keyless = [n for n in nodes if isinstance(n, dict) and "public_key" not in n]
    if keyless:
        raise InputError(Path(path).name, MISSING, "is a lab file: nodes have no public_key (the lab's agents make "
                         f"them); {up()} --node {_get(keyless[0], 'name') or 'NODE'}")


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

    def status(self) -> BackendStatus:
        return BackendStatus()

    def close(self) -> None:
        pass
