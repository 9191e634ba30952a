# SPDX-License-Identifier: Apache-2.0
"""The namespace lab with `lab: {backend: kubernetes}`: an in-process API server per cluster in its
own namespace on the lab's public segment, seeded with what kubelet and an admin would have made
(the CRD, the Namespace, the mesh ConfigMap, one Node per lab node with its pod CIDR and user-set
annotations, the Peers); the agents then run `--backend kubernetes` against it through a
kubeconfig, publish their annotations by patch and watch each other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from meshctl.backends.kube.nodes import ALLOWED_LOCATION_IPS, LEADER, LOCATION, PERSISTENT_KEEPALIVE, PREFIX
from meshctl.errors import MeshError
from meshctl.lab.namespaces.state import ClusterState, KubeAccess
from meshctl.lab.rigs import netns
from meshctl.mesh.model import Topology
from meshctl.mesh.records import mesh_to_record

API_PORT = 6443
MANIFESTS = Path(__file__).resolve().parents[4] / "manifests"


def seed_objects(topo: Topology) -> list[dict[str, Any]]:
    """The objects a cluster has before its agents start."""
    out: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "meshctl"}}]
    crd = MANIFESTS / "01-crd-peers.yaml"
    out += [d for d in yaml.safe_load_all(crd.read_text()) if d]
    data = {k: str(v) for k, v in mesh_to_record(topo.mesh).items()}
    data.update(cluster_name=topo.cluster.name, cluster_id=str(topo.cluster.id))
    out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "meshctl", "namespace": "meshctl"},
                "data": data})
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
        out.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n.name, "annotations": ann},
                    "spec": {"podCIDR": str(n.pod_cidrs[0]), "podCIDRs": [str(c) for c in n.pod_cidrs]}})
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


def start(run_dir: Path, ns: str, ip: str, topo: Topology, *, timeout: float = 15.0) -> KubeAccess:
    """Start the API server in namespace `ns` on `ip`, seeded for `topo`; returns its access
    (url, kubeconfig, netns, pid). The process is in its own session; stop it by pid."""
    run_dir.mkdir(parents=True, exist_ok=True)
    seed = run_dir / "seed.yaml"
    seed.write_text(yaml.safe_dump_all(seed_objects(topo), sort_keys=False))
    kubeconfig = run_dir / "kubeconfig"
    kubeconfig.unlink(missing_ok=True)
    log_path = run_dir / "apiserver.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(log_path, "ab") as log:
        p = subprocess.Popen([*netns.exec_prefix(ns), sys.executable, "-m", "meshctl.lab.rigs.kube_apiserver",
                              "--listen", f"{ip}:{API_PORT}", "--load", str(seed), "--kubeconfig", str(kubeconfig)],
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
    return KubeAccess(url=url, kubeconfig=str(kubeconfig), netns=ns, pid=p.pid)


# What a Kubernetes agent takes from its Node instead of flags: the pod CIDRs (spec.podCIDRs) and
# the user-set annotations seed_objects writes. Dropping them makes the lab run the agents the way
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
