# SPDX-License-Identifier: Apache-2.0
"""`lab.agent: image` (`meshctl lab up --image IMAGE`): each node's agent and its wireguard-go run
from the agent image, with podman, in the node's network namespace, as the DaemonSet runs them
(namespaces/daemonset.py reads manifests/04-daemonset.yaml each time a container starts).

Per node (namespace `<prefix><node>`): containers `meshctl-<namespace>-<container>`, the node's
hostPaths under `<node dir>/root/`, its bpffs folder `<pin root>/<cluster>/<node>-host` bound on
/sys/fs/bpf (the agent pins under /sys/fs/bpf/meshctl/<node>, the DaemonSet's default), and each
container's output in `<node dir>/<container>.log` (the agent's in agent.log, which `lab up`
quotes when an agent exits). The native sidecar (wireguard-go) starts first and the agent only once
its startup probe passes; restarting the agent (`stop_agent`, `start_agent`) leaves the sidecar
and its WireGuard device up, as a DaemonSet's agent restart does.

What `configMapKeyRef` reads: in an etcd lab the lab's ConfigMap (`fastpath` from lab.fastpath,
`cni` from lab.cni); in a Kubernetes lab the ConfigMaps of the pod's namespace on the lab's API
server (the lab writes the same keys into the real `meshctl` one). In a Kubernetes lab every
container also gets what the kubelet gives a pod of the `meshctl` ServiceAccount: the node's
token, the cluster's CA and the namespace read-only at SERVICE_ACCOUNT_DIR, and
KUBERNETES_SERVICE_HOST/PORT naming the lab's API server, from which the agent builds its
in-cluster configuration as in a Pod (no kubeconfig)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from meshctl.backends.kube.backend import DEFAULT_CONFIGMAP, SERVICE_ACCOUNT_DIR
from meshctl.datapath import loader
from meshctl.errors import MeshError
from meshctl.lab.namespaces import daemonset, kube_api, kube_cluster, podman
from meshctl.lab.namespaces.state import ClusterState, LabState, NodeState
from meshctl.lab.rigs.netns import NETNS_DIR

AGENT = "agent"  # the DaemonSet's agent container; the others are its sidecars


def container_name(node: NodeState, container: str) -> str:
    return f"meshctl-{node.netns}-{container}"


def node_root(node: NodeState) -> str:
    """The folder that stands for the node's root filesystem (its hostPaths)."""
    return str(Path(node.dir) / "root")


def node_bpffs(st: LabState, cst: ClusterState, node: NodeState) -> str:
    """The node's own /sys/fs/bpf: a folder of the host's bpffs (whose names take no dots)."""
    return f"{st.pin_root}/{cst.name}/{node.name.replace('.', '-')}-host"


def config_map(st: LabState) -> dict[str, str]:
    """The lab's ConfigMap keys the DaemonSet's environment reads (in a Kubernetes lab, written
    into the real `meshctl` ConfigMap)."""
    out = {"fastpath": "true" if st.fastpath else "false"}
    if st.cni:
        out["cni"] = st.cni
    return out


def config_maps(st: LabState, cst: ClusterState, pod: daemonset.Pod) -> dict[str, dict[str, str]]:
    """The ConfigMaps `configMapKeyRef` reads, by name: the pod's namespace's on the lab's API
    server in a Kubernetes lab, else the lab's own as `meshctl`."""
    if cst.kube is None:
        return {DEFAULT_CONFIGMAP: config_map(st)}
    listing = kube_api.request(cst.kube, "GET", f"/api/v1/namespaces/{pod.namespace}/configmaps")
    return {str(cm["metadata"]["name"]): dict(cm.get("data") or {}) for cm in listing["items"]}


def adopt(st: LabState, cst: ClusterState, node: NodeState, pod: daemonset.Pod | None = None) -> None:
    """Point the node's lab paths at where its containers keep them: its state folder and
    WireGuard socket folder (the manifest's --state-dir and --wg-run-dir through their mounts), its
    agent's address (the manifest's --metrics-addr, dialled on loopback) and its pin root."""
    pod = pod or daemonset.load()
    agent = pod.container(AGENT)
    flags = dict(a.split("=", 1) for a in agent.args if a.startswith("--") and "=" in a)
    root, bpffs = node_root(node), node_bpffs(st, cst, node)
    for flag, attr in (("--state-dir", "state_dir"), ("--wg-run-dir", "wg_run_dir")):
        if flag in flags:
            host = daemonset.container_to_host(pod, flags[flag], root, bpffs)
            if host is None:
                raise MeshError(f"the DaemonSet's agent keeps {flag}={flags[flag]} on no volume")
            setattr(node, attr, host)
    if "--metrics-addr" in flags:
        host, _, port = flags["--metrics-addr"].rpartition(":")
        node.metrics_addr = f"{'127.0.0.1' if host in ('0.0.0.0', '', '[::]') else host}:{port}"
    node.pin_root = f"{bpffs}/meshctl"


def _prepare(m: daemonset.Mount, host: str) -> list[str]:
    """Make a hostPath as its type says and return its podman option."""
    if m.host_type == "CharDevice":
        if not Path(host).is_char_device():
            raise MeshError(f"hostPath {m.host_path} (volume {m.volume}) is not a character device here")
    elif m.host_type == "FileOrCreate":
        Path(host).parent.mkdir(parents=True, exist_ok=True)
        Path(host).touch(exist_ok=True)
    elif m.host_type in ("DirectoryOrCreate", "") and not Path(host).exists():
        Path(host).mkdir(parents=True, exist_ok=True)
    opts = ["ro" if m.read_only else "rw"]
    if m.propagation == "Bidirectional" and _shared(host):
        opts.append("rshared")
    elif m.propagation == "HostToContainer" and _shared(host):
        opts.append("rslave")
    return ["-v", f"{host}:{m.path}:{','.join(opts)}"]


def _shared(path: str) -> bool:
    """Whether the mount holding `path` propagates (a bind with rshared needs a shared source)."""
    best, shared = "", False
    with open("/proc/self/mountinfo") as f:
        for line in f:
            parts = line.split()
            mnt = parts[4]
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, shared = mnt, any(p.startswith("shared:") for p in parts[6:parts.index("-")])
    return shared


def podman_argv(st: LabState, cst: ClusterState, node: NodeState, pod: daemonset.Pod, c: daemonset.Container,
                image: str, lab_flags: list[str], files: list[str],
                config: Mapping[str, Mapping[str, str]]) -> tuple[list[str], list[str]]:
    """The `podman run` of one container of the node's pod, and warnings about what is not applied.
    `files` (the lab's credentials, named by `lab_flags`) are bound read-only into the agent's;
    `config` holds the ConfigMaps by name (config_maps)."""
    assert node.netns is not None
    root, bpffs = node_root(node), node_bpffs(st, cst, node)
    # a Kubernetes lab: the kubelet's service-account volume and API server address, in every container
    in_cluster = kube_cluster.in_cluster_env(cst.kube) if cst.kube is not None and pod.automount_token else None
    env = daemonset.environment(c, {"spec.nodeName": node.name, "status.hostIP": node.public_ip,
                                    "status.podIP": node.public_ip, "metadata.namespace": pod.namespace},
                                config, in_cluster)
    security, warnings = daemonset.security_options(c.security)
    argv = [*podman.run_prefix(), "--detach", "--name", container_name(node, c.name),
            "--network", f"ns:{NETNS_DIR}/{node.netns}", "--hostname", node.name,
            "--image-volume", "ignore",  # the image's VOLUME: a kubelet makes nothing of it
            "--log-driver", "k8s-file", "--log-opt", f"path={Path(node.dir) / f'{c.name}.log'}", *security]
    if c.memory_limit:
        argv += ["--memory", str(c.memory_limit)]
    for m in c.mounts:
        argv += _prepare(m, daemonset.host_path(m, root, bpffs))
    for f in files if c.name == AGENT else ():
        argv += ["-v", f"{f}:{f}:ro"]
    if in_cluster is not None:
        argv += ["-v", f"{kube_cluster.service_account_dir(node.dir)}:{SERVICE_ACCOUNT_DIR}:ro"]
    for k, v in env.items():
        argv += ["--env", f"{k}={v}"]
    args = [daemonset.expand(a, env) for a in c.args]
    if c.name == AGENT:
        args = daemonset.merge_args(args, lab_flags)
    if c.command:
        argv += ["--entrypoint", daemonset.expand(c.command[0], env)]
        args = [daemonset.expand(a, env) for a in c.command[1:]] + args
    return [*argv, image, *args], warnings


def _running(name: str) -> bool:
    p = podman.podman("inspect", "--format", "{{.State.Running}}", name, check=False)
    return p.stdout.strip() == "true"


def _wait_startup(name: str, probe: daemonset.Probe, log: Path) -> None:
    """The kubelet's startup probe: the command in the container every `period` until it passes,
    at most `failures` times."""
    for _ in range(probe.failures):
        if podman.podman("exec", name, *probe.command, check=False, timeout=30).returncode == 0:
            return
        if not _running(name):
            break
        time.sleep(probe.period)
    tail = ""
    with contextlib.suppress(OSError):
        tail = " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:])
    raise MeshError(f"container {name}: its startup probe did not pass ({' '.join(probe.command)}); its log ends: "
                    f"{tail or 'empty'}")


def start(st: LabState, cst: ClusterState, node: NodeState, image: str, lab_flags: list[str], files: list[str],
          warn: list[str]) -> int:
    """Start the node's pod (its sidecars when not running, then the agent); returns the agent's
    host PID. Containers are recorded in the node's state as they start."""
    pod = daemonset.load()
    loader.ensure_bpffs(st.pin_root)
    Path(node_bpffs(st, cst, node)).mkdir(parents=True, exist_ok=True)
    adopt(st, cst, node, pod)
    config = config_maps(st, cst, pod)
    pid = None
    for c in pod.containers:
        name = container_name(node, c.name)
        if c.sidecar and _running(name):
            continue
        podman.remove([name])
        argv, warnings = podman_argv(st, cst, node, pod, c, image, lab_flags, files, config)
        warn.extend(f"{c.name}: {w}" for w in warnings if f"{c.name}: {w}" not in warn)
        p = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if name not in node.containers:
            node.containers.append(name)
        if p.returncode != 0:
            lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
            raise MeshError(f"podman could not start {name}: {lines[-1] if lines else p.returncode}")
        if c.sidecar and c.startup is not None:
            _wait_startup(name, c.startup, Path(node.dir) / f"{c.name}.log")
        if c.name == AGENT:
            pid = podman.container_pid(name)
    if pid is None:
        raise MeshError(f"the agent container of {node.name} is not running (its log: {node.dir}/agent.log)")
    return pid


def stop(node: NodeState, *, kill: bool = False, all_containers: bool = False) -> None:
    """Stop the node's agent container (SIGTERM with 10 s grace, or SIGKILL) and remove it; with
    `all_containers` its sidecars too."""
    names = [n for n in node.containers if all_containers or n.endswith(f"-{AGENT}")]
    if kill:
        for n in names:
            podman.podman("kill", n, check=False)
    left = podman.remove(names, timeout=0 if kill else 10)
    node.containers = [n for n in node.containers if n not in names or n in left]


def leftovers(prefix: str) -> list[str]:
    """Containers of a lab's nodes found by name (`meshctl-<prefix>...`), for `lab down` after a
    crash left some unrecorded; none where podman is not installed."""
    if shutil.which("podman") is None:
        return []
    p = podman.podman("ps", "--all", "--format", "{{.Names}}", "--filter", f"name=^meshctl-{prefix}", check=False)
    return [n for n in p.stdout.split() if n.startswith(f"meshctl-{prefix}")]


def remove_all(names: list[str]) -> list[str]:
    """Remove every named container (lab down); returns those left."""
    return podman.remove(names)


def agent_log_line(line: str) -> str:
    """A line of a k8s-file log without its timestamp and stream (`<time> stderr F <text>`)."""
    parts = line.split(" ", 3)
    return parts[3] if len(parts) == 4 and parts[2] in ("F", "P") else line


