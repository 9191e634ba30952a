# SPDX-License-Identifier: Apache-2.0
"""The namespace lab with `lab: {backend: kubernetes}`: a real control plane per cluster
(kube-apiserver, kube-controller-manager and their etcd: lab.rigs.kube_control_plane) in its own
namespace on the lab's public segment, reached from the host through a relay on 127.0.0.1 (for
the host's kubectl and `meshctl lab kubeconfig`).

It holds what the cluster would hold: kubelet's Nodes (each with its pod CIDR and the user-set
annotations), meshctl's manifests applied with `kubectl apply -k manifests/` as docs/kubernetes.md
tells a user, the mesh ConfigMap and the Peers. A kubelet reproduction (lab.rigs.kubelets) keeps
the Nodes Ready and runs the DaemonSet's Pods; each agent runs `--backend kubernetes` with a token
of the `meshctl` ServiceAccount bound to its node's Pod, so RBAC and the admission policies are
the ones a user's cluster applies: an agent process through a kubeconfig naming the token, an agent
from the image (image_agents) through what the kubelet gives a Pod (service_account_dir,
in_cluster_env).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from meshctl.backends.kube.backend import DEFAULT_NAMESPACE
from meshctl.backends.kube.nodes import ALLOWED_LOCATION_IPS, LEADER, LOCATION, PERSISTENT_KEEPALIVE, PREFIX
from meshctl.errors import MeshError
from meshctl.lab.namespaces import kube_api
from meshctl.lab.namespaces.cni_labs import CNI_LABS
from meshctl.lab.namespaces.state import ClusterState, KubeAccess
from meshctl.lab.rigs.etcd_process import stop_pid
from meshctl.lab.rigs.kube_control_plane import ControlPlane
from meshctl.lab.rigs.kubelets import POD_IP_ANNOTATION, READY_ANNOTATION
from meshctl.mesh.model import Topology
from meshctl.mesh.records import mesh_to_record

# How long a lab Node without kubelet heartbeats stays Ready (the controller manager's
# --node-monitor-grace-period; 40 s in a cluster): short, so a lab shows NotReady within a test.
NODE_MONITOR_GRACE_S = 20
MANIFESTS = Path(__file__).resolve().parents[4] / "manifests"
# The agents' ServiceAccount and namespace (manifests/02-rbac.yaml).
SERVICE_ACCOUNT = "meshctl"
NAMESPACE = DEFAULT_NAMESPACE


def operator_objects(topo: Topology, agent_keys: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """What an operator sets after `kubectl apply -k manifests/`: the mesh ConfigMap with the
    cluster's settings and identity, and `agent_keys` (the keys the DaemonSet reads into the
    agent's environment: the lab's `fastpath` and `cni`)."""
    out: list[dict[str, Any]] = []
    data = {k: str(v) for k, v in mesh_to_record(topo.mesh).items()}
    data.update(cluster_name=topo.cluster.name, cluster_id=str(topo.cluster.id))
    data.update(agent_keys or {})
    out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "meshctl", "namespace": "meshctl"},
                "data": data})
    return out


def node_objects(topo: Topology, cni: str = "") -> list[dict[str, Any]]:
    """What the cluster holds before anyone applies meshctl: kubelet's Nodes (each lab node's pod
    CIDR and the annotations its user set) and, with `lab.cni`, what that CNI wrote (annotations on
    the Nodes, its own objects)."""
    cni_lab = CNI_LABS[cni] if cni else None
    written = cni_lab.node_annotations(topo) if cni_lab is not None else {}
    out: list[dict[str, Any]] = []
    for n in topo.nodes:
        ann: dict[str, str] = {}
        if n.location:
            ann[PREFIX + LOCATION] = n.location
        if n.leader:
            ann[PREFIX + LEADER] = "true"
        if n.persistent_keepalive:
            ann[PREFIX + PERSISTENT_KEEPALIVE] = str(n.persistent_keepalive)
        if n.allowed_location_ips:
            ann[PREFIX + ALLOWED_LOCATION_IPS] = ",".join(str(a) for a in n.allowed_location_ips)
        ann.update(written.get(n.name, {}))
        out.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n.name, "annotations": ann},
                    "spec": {"podCIDR": str(n.pod_cidrs[0]), "podCIDRs": [str(c) for c in n.pod_cidrs]}})
    if cni_lab is not None:
        out += cni_lab.seed(topo)
    return out


def peer_objects(topo: Topology) -> list[dict[str, Any]]:
    """The Peers an operator applies (once the CRD is served)."""
    out: list[dict[str, Any]] = []
    for p in topo.peers:
        spec: dict[str, Any] = {"allowedIPs": [str(a) for a in p.allowed_ips], "publicKey": p.public_key}
        if p.endpoint is not None:
            where = "ip" if p.endpoint.ip is not None else "dns"
            spec["endpoint"] = {"dnsOrIP": {where: p.endpoint.host}, "port": p.endpoint.port}
        if p.persistent_keepalive is not None:
            spec["persistentKeepalive"] = p.persistent_keepalive
        out.append({"apiVersion": "meshctl.io/v1alpha1", "kind": "Peer", "metadata": {"name": p.name},
                    "spec": spec})
    return out


def start(run_dir: Path, ns: str, ip: str, topo: Topology, *, cni: str = "",
          agent_keys: Mapping[str, str] | None = None) -> tuple[KubeAccess, dict[str, int]]:
    """Cluster `topo`'s control plane in namespace `ns` on `ip` (lab.rigs.kube_control_plane), the
    host's relay to it, and what the cluster holds before its agents run: kubelet's Nodes (each
    with its pod CIDR and the annotations its user set, and `lab.cni`'s objects), then meshctl's
    manifests applied with `kubectl apply -k manifests/` exactly as docs/kubernetes.md tells a
    user, the mesh ConfigMap (with `agent_keys`) and the Peers. Returns the access and every PID
    started, by role."""
    cp = ControlPlane(run_dir, host=ip, netns=ns, node_monitor_grace=NODE_MONITOR_GRACE_S)
    cp.start()
    pids = {f"kube-{k}": v for k, v in cp.pids.items()}
    try:
        port_file = run_dir / "host-port"
        port_file.unlink(missing_ok=True)
        fwd = _spawn_forwarder(run_dir, ns, f"{ip}:{cp.port}", port_file)
        pids["kube-forward"] = fwd.pid
        deadline = time.monotonic() + 15
        while not port_file.exists():
            if fwd.poll() is not None or time.monotonic() > deadline:
                raise MeshError(f"the host's relay to the API server in {ns} did not start (see {run_dir}/forward.log)")
            time.sleep(0.05)
        host_url = f"https://127.0.0.1:{port_file.read_text().strip()}"
        host_kc = cp.kubeconfig(run_dir / "kubeconfig.host", server=host_url, identity=cp.admin_identity(),
                                user="lab-admin")
        access = KubeAccess(url=cp.url, kubeconfig=str(cp.admin_kubeconfig), netns=ns, pid=cp.pids["apiserver"],
                            dir=str(run_dir), host_kubeconfig=str(host_kc), ca=str(cp.ca))
        seeded = node_objects(topo, cni)
        crds = [o for o in seeded if o.get("kind") == "CustomResourceDefinition"]
        _apply(host_kc, run_dir, "crds.yaml", crds)  # a CNI's own CRDs, served before its objects
        for crd in crds:
            wait_established(lambda args: kubectl(host_kc, run_dir, args), crd["metadata"]["name"])
        _apply(host_kc, run_dir, "nodes.yaml", [o for o in seeded if o.get("kind") != "CustomResourceDefinition"])
        kubectl(host_kc, run_dir, ["apply", "-k", str(MANIFESTS)])
        wait_established(lambda args: kubectl(host_kc, run_dir, args), "peers.meshctl.io")
        for name, objs in (("operator.yaml", operator_objects(topo, agent_keys)), ("peers.yaml", peer_objects(topo))):
            _apply(host_kc, run_dir, name, objs)
    except BaseException:
        cp.stop()
        for k in ("kube-forward",):
            if k in pids:
                stop_pid(pids[k], 2)
        raise
    return access, pids


def _apply(kubeconfig: Path, run_dir: Path, name: str, objs: list[dict[str, Any]]) -> None:
    if objs:
        path = run_dir / name
        path.write_text(yaml.safe_dump_all(objs, sort_keys=False))
        kubectl(kubeconfig, run_dir, ["apply", "-f", str(path)])


def _spawn_forwarder(run_dir: Path, ns: str, to: str, port_file: Path) -> subprocess.Popen[bytes]:
    with open(run_dir / "forward.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "meshctl.lab.rigs.tcp_forward", "--netns", ns, "--to", to,
                                 "--port-file", str(port_file)], stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                start_new_session=True)


def join_nodes(kube: KubeAccess, nodes: dict[str, str], agent_dirs: dict[str, str], *,
               timeout: float = 120.0) -> int:
    """Once the lab's nodes exist: the kubelet reproduction for them (`nodes`: name -> address;
    lab.rigs.kubelets), which reports them Ready and runs the DaemonSet's Pods the controller
    made; then each node's agent gets a kubeconfig with a token of the `meshctl` ServiceAccount
    bound to its node's DaemonSet Pod (`agent_dirs`: name -> where to keep it, mode 0600), as
    the kubelet projects one into the Pod: the token, the cluster's CA and the namespace in the
    node's `service_account_dir`. Returns the kubelets' PID."""
    cp = kube_api.control_plane(kube)
    pid = cp.start_kubelets(nodes)
    deadline = time.monotonic() + timeout
    pods: dict[str, str] = {}
    while True:
        listing = cp.request("GET", "/api/v1/namespaces/meshctl/pods?labelSelector=app.kubernetes.io/name%3Dmeshctl")
        pods = {str(p["spec"].get("nodeName")): str(p["metadata"]["name"]) for p in listing["items"]
                if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")}
        if set(nodes) <= set(pods):
            break
        if time.monotonic() > deadline:
            missing = sorted(set(nodes) - set(pods))
            raise MeshError(f"the DaemonSet's Pods did not run on {', '.join(missing)} within {timeout:.0f} s "
                            f"(see {kube.dir}/kubelets.log)")
        time.sleep(0.2)
    for node, d in agent_dirs.items():
        sa = service_account_dir(d)
        sa.mkdir(parents=True, exist_ok=True)
        tfile = sa / "token"
        for f, text in ((tfile, cp.create_token(SERVICE_ACCOUNT, NAMESPACE, pod=pods[node])),
                        (sa / "ca.crt", Path(kube.ca).read_text()), (sa / "namespace", NAMESPACE)):
            fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(text)
        kube.agent_kubeconfigs[node] = str(cp.kubeconfig(Path(d) / "kubeconfig", token_file=tfile,
                                                         user=f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}@{node}"))
    return pid


def service_account_dir(node_dir: str) -> Path:
    """Where a lab node keeps what the kubelet projects into its DaemonSet Pod at
    SERVICE_ACCOUNT_DIR: `token`, `ca.crt` and `namespace`, each 0600."""
    return Path(node_dir) / "serviceaccount"


def in_cluster_env(kube: KubeAccess) -> dict[str, str]:
    """What the kubelet sets in every container for the cluster's API server, here the lab API
    server's address on the public segment (no kube-proxy serves a Service address)."""
    host, _, port = kube.url.removeprefix("https://").rpartition(":")
    return {"KUBERNETES_SERVICE_HOST": host.strip("[]"), "KUBERNETES_SERVICE_PORT": port}


ESTABLISHED_WAIT_S = 60.0  # how long a new CRD may take to be served


def wait_established(kubectl_run: Callable[[list[str]], object], crd: str, timeout: float = ESTABLISHED_WAIT_S
                     ) -> None:
    """Until the API server serves CRD `crd` (`kubectl wait --for=condition=Established`, run by
    `kubectl_run`, which raises on a non-zero exit). kubectl 1.32 fails at once, instead of
    waiting, while a just-created CRD has no status.conditions yet ("accessor error: <nil>"):
    that one failure is retried until `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            kubectl_run(["wait", "--for=condition=Established", f"crd/{crd}", f"--timeout={timeout:.0f}s"])
            return
        except Exception as e:  # whatever kubectl_run raises: only kubectl's accessor error is retried
            if "accessor error" not in str(e) or time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def kubectl(kubeconfig: Path | str, run_dir: Path, args: list[str], *, timeout: float = 120.0) -> str:
    """Run this machine's kubectl against a lab API server (its discovery cache kept in the lab's
    folder); its output, or MeshError with kubectl's last line."""
    exe = shutil.which("kubectl")
    if exe is None:
        raise MeshError("kubectl is not installed: the Kubernetes lab applies its objects with it")
    p = subprocess.run([exe, "--kubeconfig", str(kubeconfig), "--cache-dir", str(run_dir / "kubectl-cache"), *args],
                       capture_output=True, text=True, timeout=timeout, check=False)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise MeshError(f"kubectl {' '.join(args)}: {last}")
    return p.stdout


# What a Kubernetes agent takes from its Node instead of flags: the pod CIDRs (spec.podCIDRs) and
# the user-set annotations node_objects writes. Dropping them makes the lab run the agents the way
# the DaemonSet does, so their own record follows the annotations, also when they change.
_FROM_NODE = ("--pod-cidr", "--location", "--persistent-keepalive", "--allowed-location-ips")
_FROM_NODE_FLAGS = ("--leader",)
_ETCD_ONLY = ("--etcd-endpoints", "--etcd-ca", "--etcd-cert", "--etcd-key", "--etcd-user", "--etcd-password-file",
              "--lease-ttl", "--backend")


# What the DaemonSet opens on the node (manifests/04-daemonset.yaml): probes and /metrics over TLS.
SECURE_METRICS_ADDR = "0.0.0.0:9737"


def pod_object(name: str, namespace: str, node: str, ip: str, labels: dict[str, str], *,
               ready: bool = True, hostname: str = "", subdomain: str = "") -> dict[str, Any]:
    """A Pod for one of the lab's pods (a namespace the lab wired, at `ip` on `node`): the kubelet
    reproduction reports it Running at that address, Ready unless `ready` is False, so the
    EndpointSlice controller lists it for the Services that select it (with `hostname` and
    `subdomain` naming a headless Service, as a StatefulSet's pods do, the slice carries the hostname)."""
    ann = {POD_IP_ANNOTATION: ip}
    if not ready:
        ann[READY_ANNOTATION] = "false"
    spec: dict[str, Any] = {"nodeName": node, "containers": [{"name": "app", "image": "meshctl-lab/pod"}],
                            "terminationGracePeriodSeconds": 0}
    if hostname:
        spec["hostname"] = hostname
    if subdomain:
        spec["subdomain"] = subdomain
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": ann}, "spec": spec}


def agent_argv(argv: list[str]) -> list[str]:
    """An etcd agent command line turned into a kubernetes one: the etcd flags dropped, what the
    Node says (pod CIDR, location, leader, keepalive, location IPs) left to the Node, and the
    DaemonSet's TLS port for probes and metrics opened."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
            continue
        if a in _ETCD_ONLY or a in _FROM_NODE:
            skip = True
            continue
        if a in _FROM_NODE_FLAGS:
            continue
        out.append(a)
    return [*out, "--backend", "kubernetes", "--secure-metrics-addr", SECURE_METRICS_ADDR]


def agent_env(cluster_state: ClusterState, node: str) -> dict[str, str]:
    """The environment that points an agent at its cluster's API server with its node's
    service-account token (none for an etcd cluster)."""
    kube = cluster_state.kube
    if kube is None:
        return {}
    if node not in kube.agent_kubeconfigs:
        raise MeshError(f"node {node} has no service-account token in lab cluster {cluster_state.name}")
    return {"KUBECONFIG": kube.agent_kubeconfigs[node]}
