# SPDX-License-Identifier: Apache-2.0
"""`lab.cni: install`: the agents write their CNI config (`--cni install`, node/cni.py) and the
lab's pods are made by the real plugins from it: the `bridge`, `host-local` and `portmap` of
Debian's containernetworking-plugins (/usr/lib/cni, or /opt/cni/bin), run as a container runtime
runs them (the CNI spec: the config on stdin, CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS,
CNI_IFNAME, CNI_PATH in the environment; each plugin of the list in order on ADD with the previous
one's result, in reverse on DEL), in the node's network namespace, where the kubelet runs them.

What the lab adds as a runtime would: host-local's `dataDir` (the node's own
`<node dir>/root/var/lib/cni/networks`, so nothing lands in the host's /var/lib/cni), and for pod 0
of every node the `portMappings` capability (hostPort HOST_PORT to its port POD_PORT, TCP) that
a pod spec's hostPort asks for. A plugin's error fails the pod with the plugin's own message
(and `lab up` with it). Each ADD's result is kept beside the IPAM state (`results/<id>.json`) for
the DEL, as runtimes cache it.

The node's CNI config folder is `<node dir>/root/etc/cni/net.d`: the agent container's
/etc/cni/net.d hostPath (lab.agent image), and the agent process's `--cni-conf-dir`.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from meshctl.errors import MeshError
from meshctl.lab.namespaces.state import LabState, NodeState, PodState
from meshctl.lab.namespaces.wiring import add_ns
from meshctl.lab.rigs import netns
from meshctl.node.cni import CONF_NAME

NAME = "install"
PLUGIN_DIRS = ("/opt/cni/bin", "/usr/lib/cni")  # where kubeadm/k3s put the plugins, and where Debian does
IFNAME = "eth0"
HOST_PORT = 8080  # pod 0 of each node publishes this hostPort ...
POD_PORT = 80  # ... to this port of its own
CONF_WAIT = 30.0  # s a node's agent has to write its CNI config after it started
PLUGIN_TIMEOUT = 30.0


def node_root(node: NodeState) -> Path:
    return Path(node.dir) / "root"


def conf_dir(node: NodeState) -> Path:
    return node_root(node) / "etc" / "cni" / "net.d"


def data_dir(node: NodeState) -> Path:
    """host-local's dataDir of the node (its IPAM state)."""
    return node_root(node) / "var" / "lib" / "cni" / "networks"


def _results(node: NodeState) -> Path:
    return node_root(node) / "var" / "lib" / "cni" / "results"


def plugin_path() -> str:
    """CNI_PATH: the plugin folders that exist here."""
    dirs = [d for d in PLUGIN_DIRS if Path(d).is_dir()]
    if not dirs:
        raise MeshError(f"no CNI plugins in {' or '.join(PLUGIN_DIRS)} "
                        "(make setup installs containernetworking-plugins)")
    return ":".join(dirs)


def container_id(st: LabState, pod_ns: str) -> str:
    return f"{st.name}-{pod_ns.removeprefix(st.prefix)}"


def load_conflist(node: NodeState, wait: float = 0.0) -> dict[str, Any]:
    """The node's CNI config list, waiting up to `wait` seconds for its agent to write it."""
    path = conf_dir(node) / CONF_NAME
    deadline = time.monotonic() + wait
    while not path.exists():
        if time.monotonic() >= deadline:
            raise MeshError(f"node {node.name}: its agent wrote no CNI config ({path}) within {wait:.0f} s")
        time.sleep(0.1)
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def _net_conf(conflist: dict[str, Any], plugin: dict[str, Any], node: NodeState,
              ports: list[dict[str, Any]], prev: dict[str, Any] | None) -> dict[str, Any]:
    """One plugin's network configuration as a runtime derives it from the list."""
    conf = dict(plugin, cniVersion=conflist["cniVersion"], name=conflist["name"])
    if isinstance(conf.get("ipam"), dict) and conf["ipam"].get("type") == "host-local":
        conf["ipam"] = dict(conf["ipam"], dataDir=str(data_dir(node)))
    caps = plugin.get("capabilities") or {}
    if caps.get("portMappings") and ports:
        conf["runtimeConfig"] = {"portMappings": ports}
    if prev is not None:
        conf["prevResult"] = prev
    return conf


def _call(command: str, plugin: str, conf: dict[str, Any], node: NodeState, pod_ns: str, cid: str) -> dict[str, Any]:
    """One plugin run in the node's namespace; its result (ADD), or MeshError with its error."""
    assert node.netns is not None
    path = plugin_path()
    exe = next((Path(d) / plugin for d in path.split(":") if (Path(d) / plugin).exists()), None)
    if exe is None:
        raise MeshError(f"CNI plugin {plugin} is not in {path}")
    env = {"CNI_COMMAND": command, "CNI_CONTAINERID": cid, "CNI_NETNS": f"{netns.NETNS_DIR}/{pod_ns}",
           "CNI_IFNAME": IFNAME, "CNI_PATH": path, "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")}
    p = subprocess.run([*netns.exec_prefix(node.netns), str(exe)], input=json.dumps(conf), capture_output=True,
                       text=True, env=env, timeout=PLUGIN_TIMEOUT)
    if p.returncode != 0:
        try:
            err = json.loads(p.stdout)
            why = err.get("msg", "") + (f" ({err['details']})" if err.get("details") else "")
        except ValueError:
            why = ((p.stderr or p.stdout).strip().splitlines() or [f"exit {p.returncode}"])[-1]
        raise MeshError(f"CNI {command} of pod {pod_ns} on node {node.name}: plugin {plugin}: {why}")
    return json.loads(p.stdout) if p.stdout.strip() else {}


def add_pod(st: LabState, node: NodeState, k: int) -> PodState:
    """Pod `k` of the node (namespace `<node ns>-p<k>`), made by CNI ADD of every plugin of the
    node's config list; its addresses and host veth are what the plugins' result says."""
    assert node.netns is not None
    conflist = load_conflist(node)
    pod_ns = add_ns(st, f"{node.netns}-p{k}")
    cid = container_id(st, pod_ns)
    ports = [{"hostPort": HOST_PORT, "containerPort": POD_PORT, "protocol": "tcp"}] if k == 0 else []
    prev: dict[str, Any] | None = None
    for plugin in conflist["plugins"]:
        prev = _call("ADD", plugin["type"], _net_conf(conflist, plugin, node, ports, prev), node, pod_ns, cid)
    assert prev is not None
    _results(node).mkdir(parents=True, exist_ok=True)
    (_results(node) / f"{cid}.json").write_text(json.dumps({"result": prev, "ports": ports}))
    ips = [ip["address"].split("/")[0] for ip in prev.get("ips") or []]
    bridge = _bridge(conflist)
    host = next((i["name"] for i in prev.get("interfaces") or [] if not i.get("sandbox") and i["name"] != bridge), "")
    v4 = next((a for a in ips if ":" not in a), None)
    v6 = next((a for a in ips if ":" in a), None)
    if v4 is None and v6 is None:
        raise MeshError(f"CNI ADD of pod {pod_ns} on node {node.name}: the plugins gave it no address ({prev})")
    return PodState(pod_ns, v4 or v6 or "", host, v6 if v4 else None)


def _bridge(conflist: dict[str, Any]) -> str:
    return next((p.get("bridge", "") for p in conflist["plugins"] if p.get("type") == "bridge"), "")


def del_pod(st: LabState, node: NodeState, pod: PodState) -> None:
    """CNI DEL of every plugin of the node's config list, in reverse, with the ADD's result."""
    conflist = load_conflist(node)
    cid = container_id(st, pod.netns)
    cached = _results(node) / f"{cid}.json"
    doc = json.loads(cached.read_text()) if cached.exists() else {"result": None, "ports": []}
    for plugin in reversed(conflist["plugins"]):
        conf = _net_conf(conflist, plugin, node, doc["ports"], doc["result"])
        _call("DEL", plugin["type"], conf, node, pod.netns, cid)
    cached.unlink(missing_ok=True)


def add_pods(st: LabState, node: NodeState, count: int) -> None:
    """The node's `count` pods, once its agent has written the config (waiting CONF_WAIT)."""
    load_conflist(node, CONF_WAIT)
    for k in range(count):
        node.pods.append(add_pod(st, node, k))
