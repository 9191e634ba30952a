# SPDX-License-Identifier: Apache-2.0
"""The namespace lab with `lab: {backend: kubernetes}`: an in-process API server per cluster in its
own namespace on the lab's public segment (and on 127.0.0.1 of the host, for the host's kubectl),
holding what kubelet and an admin would have made: kubelet's Nodes (each with its pod CIDR and the
user-set annotations) are there from the start; the CRD, the Namespace, the mesh ConfigMap and the
Peers go in through this machine's `kubectl apply`, as an operator puts them in. The agents then
run `--backend kubernetes` against it through a kubeconfig, publish their annotations by patch and
watch each other.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from meshctl.backends.kube.nodes import ALLOWED_LOCATION_IPS, LEADER, LOCATION, PERSISTENT_KEEPALIVE, PREFIX
from meshctl.errors import MeshError
from meshctl.lab.namespaces.cni_labs import CNI_LABS
from meshctl.lab.namespaces.state import ClusterState, KubeAccess
from meshctl.mesh.model import Topology
from meshctl.mesh.records import mesh_to_record

API_PORT = 6443
MANIFESTS = Path(__file__).resolve().parents[4] / "manifests"


def operator_objects(topo: Topology) -> list[dict[str, Any]]:
    """What an operator applies before the agents start: the Namespace, the CRD, the mesh ConfigMap."""
    out: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "meshctl"}}]
    crd = MANIFESTS / "01-crd-peers.yaml"
    out += [d for d in yaml.safe_load_all(crd.read_text()) if d]
    data = {k: str(v) for k, v in mesh_to_record(topo.mesh).items()}
    data.update(cluster_name=topo.cluster.name, cluster_id=str(topo.cluster.id))
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


def start(run_dir: Path, ns: str, ip: str, topo: Topology, *, timeout: float = 15.0, cni: str = "") -> KubeAccess:
    """Start the API server in namespace `ns` on `ip`, seeded for `topo` (and `lab.cni`'s objects);
    returns its access (url, kubeconfig, netns, pid). The process is in its own session; stop it by pid."""
    run_dir.mkdir(parents=True, exist_ok=True)
    seed = run_dir / "nodes.yaml"
    seed.write_text(yaml.safe_dump_all(node_objects(topo, cni), sort_keys=False))
    kubeconfig = run_dir / "kubeconfig"
    host_kubeconfig = run_dir / "kubeconfig.host"
    kubeconfig.unlink(missing_ok=True)
    host_kubeconfig.unlink(missing_ok=True)
    log_path = run_dir / "apiserver.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "ab") as log:
        p = subprocess.Popen([sys.executable, "-m", "meshctl.lab.rigs.kube_apiserver",
                              "--netns", ns, "--listen", f"{ip}:{API_PORT}", "--load", str(seed),
                              "--kubeconfig", str(kubeconfig),
                              "--host-listen", "127.0.0.1:0", "--host-kubeconfig", str(host_kubeconfig)],
                             stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    deadline = time.monotonic() + timeout
    while not kubeconfig.exists():
        if p.poll() is not None or time.monotonic() > deadline:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
            if p.poll() is None:
                p.kill()
            raise MeshError(f"the lab's API server in {ns} did not start: {tail[0]}")
        time.sleep(0.05)
    url = json.loads(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    try:
        # two applies: the Peers' kind is served only once the CRD is in
        for name, objs in (("operator.yaml", operator_objects(topo)), ("peers.yaml", peer_objects(topo))):
            if objs:
                path = run_dir / name
                path.write_text(yaml.safe_dump_all(objs, sort_keys=False))
                kubectl(host_kubeconfig, run_dir, ["apply", "-f", str(path)])
    except (MeshError, subprocess.TimeoutExpired) as e:
        p.kill()
        raise MeshError(f"the lab's API server in {ns}: {e}") from None
    return KubeAccess(url=url, kubeconfig=str(kubeconfig), netns=ns, pid=p.pid, host_kubeconfig=str(host_kubeconfig))


def kubectl(kubeconfig: Path, run_dir: Path, args: list[str], *, timeout: float = 60.0) -> str:
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


def agent_argv(argv: list[str]) -> list[str]:
    """An etcd agent command line turned into a kubernetes one: the etcd flags dropped, and what
    the Node says (pod CIDR, location, leader, keepalive, location IPs) left to the Node."""
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
    return [*out, "--backend", "kubernetes"]


def agent_env(cluster_state: ClusterState) -> dict[str, str]:
    """The environment that points an agent at its cluster's API server (none for an etcd cluster)."""
    kube = cluster_state.kube
    return {"KUBECONFIG": kube.kubeconfig} if kube else {}
