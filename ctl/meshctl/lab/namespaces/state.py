"""A lab's state file, /run/meshctl-lab/<lab>/state.json: every name and PID the lab made, written
as it goes (so `lab down` after a crash half-way still knows what to remove)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from meshctl.errors import MeshError

LAB_ROOT = Path("/run/meshctl-lab")


def lab_name(prefix: str) -> str:
    """A lab is named after its prefix (`ml-` -> `ml`): one namespace prefix, one lab."""
    return prefix.rstrip("-")


def lab_dir(name: str) -> Path:
    return LAB_ROOT / name


def state_path(name: str) -> Path:
    return lab_dir(name) / "state.json"


_SAVING = threading.Lock()  # a multi-VM lab saves from one thread per VM


def save(state: dict[str, Any]) -> None:
    p = state_path(state["name"])
    with _SAVING:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1, sort_keys=True))
        os.replace(tmp, p)


def load(name: str) -> dict[str, Any] | None:
    try:
        st: dict[str, Any] = json.loads(state_path(name).read_text())
        return st
    except (OSError, ValueError):
        return None


def labs_up() -> list[str]:
    if not LAB_ROOT.exists():
        return []
    return sorted(p.name for p in LAB_ROOT.iterdir() if (p / "state.json").exists())


def resolve(name: str | None) -> dict[str, Any]:
    """The state of lab `name`, or of the only lab that is up."""
    if name is None:
        up = labs_up()
        if not up:
            raise MeshError("no lab is up (meshctl lab up -f FILE)")
        if len(up) > 1:
            raise MeshError(f"several labs are up ({', '.join(up)}): pass --lab NAME")
        name = up[0]
    st = load(name)
    if st is None:
        raise MeshError(f"lab {name} is not up (no {state_path(name)})")
    return st


def all_nodes(st: dict[str, Any]) -> list[dict[str, Any]]:
    return [n for c in st.get("clusters", []) for n in c.get("nodes", [])]


def dial_netns(node: dict[str, Any]) -> str | None:
    """The namespace a lab node's agent is dialled from: its own, or for a VM node the one on its
    public segment (its etcd's)."""
    ns: str | None = node.get("status_netns") or node["netns"]
    return ns


def find_node(lab: str | None, node: str) -> tuple[str | None, str]:
    """(netns to dial from, metrics address) of a lab node, by name or `cluster/name`: its own
    namespace, or for a VM node the namespace on its public segment (its etcd's)."""
    st = resolve(lab)
    for c in st.get("clusters", []):
        for n in c.get("nodes", []):
            if node in (n["name"], f"{c['name']}/{n['name']}"):
                return dial_netns(n), n["metrics_addr"]
    raise MeshError(f"lab {st['name']} has no node {node}")


def etcd_access(lab: str | None, cluster: str | None = None) -> dict[str, Any]:
    """How to reach a lab cluster's etcd: endpoints, ca, cert, key and the namespace to dial from."""
    st = resolve(lab)
    clusters = st.get("clusters", [])
    for c in clusters:
        if cluster in (None, "default", c["name"]) and "etcd" in c:
            if cluster == "default" and c["name"] != "default" and len(clusters) > 1:
                continue
            return dict(c["etcd"])
    raise MeshError(f"lab {st['name']} has no cluster {cluster}")
