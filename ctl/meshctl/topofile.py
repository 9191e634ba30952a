"""Topology files: the YAML that `meshctl plan`, `graph`, `showconf` and the lab read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from . import validate as v
from .errors import InputError
from .model import Topology


def parse_topology(doc: Any) -> Topology:
    """A parsed YAML document to a Topology; raises InputError on the first problem."""
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise InputError("", doc, "is not a topology (a mapping with cluster, mesh, nodes, peers)")
    for k in doc:
        if k not in ("cluster", "mesh", "nodes", "peers", "lab"):
            raise InputError(str(k), doc[k], "is not a known field")
    cluster = v.parse_cluster(doc.get("cluster"), "cluster")
    mesh = v.parse_mesh(doc.get("mesh"), "mesh")
    raw_nodes = doc.get("nodes") or []
    if not isinstance(raw_nodes, list):
        raise InputError("nodes", raw_nodes, "is not a list")
    nodes = [v.parse_node(d, f"nodes[{i}]", default_port=mesh.port) for i, d in enumerate(raw_nodes)]
    raw_peers = doc.get("peers") or []
    if not isinstance(raw_peers, list):
        raise InputError("peers", raw_peers, "is not a list")
    peers = [v.parse_peer(d, f"peers[{i}]") for i, d in enumerate(raw_peers)]
    claims = v.Claims()
    _, rejected = v.admit_nodes(nodes, mesh.subnet, claims=claims)
    if rejected:
        raise InputError.from_line(rejected[0].reason)
    _, rejected_peers = v.admit_peers(peers, claims)
    if rejected_peers:
        raise InputError.from_line(rejected_peers[0].reason)
    return Topology(cluster=cluster, mesh=mesh, nodes=tuple(nodes), peers=tuple(peers))


def load_yaml(path: str | Path) -> Any:
    """A YAML (or JSON) file's document; a file that is not UTF-8 text or not YAML is one InputError."""
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
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise InputError("", str(p), f"is not valid YAML{where}") from None
    except RecursionError:
        raise InputError("", str(p), "is nested too deeply to be a topology") from None


def load_topology(path: str | Path) -> Topology:
    """Read and validate a topology file; errors carry the file name: `topo.yaml: nodes[3]...`."""
    return load_topology_checked(path)[0]


def load_topology_checked(path: str | Path) -> tuple[Topology, list[str]]:
    """`load_topology` and the file's warnings (checks.topology_warnings), each line led by the
    file name like its errors."""
    from .checks import topology_warnings

    doc = load_yaml(path)
    prefix = f"{Path(path).name}: "
    try:
        topo = parse_topology(doc)
        warnings = topology_warnings(topo, doc)
    except InputError as e:
        raise e.prefixed(prefix) from None
    return topo, [prefix + w for w in warnings]
