# SPDX-License-Identifier: Apache-2.0
"""The default lab with `lab: {backend: kubernetes, agent: image}`: each node's agent and
wireguard-go run from the agent image with podman as manifests/04-daemonset.yaml runs them, against
the lab's real control plane, with what the kubelet gives a pod of the `meshctl` ServiceAccount
(the node's bound token, the cluster's CA and the namespace at the service-account path,
KUBERNETES_SERVICE_HOST/PORT) and no kubeconfig; the manifest's own arguments (`--backend=kubernetes`,
`--secure-metrics-addr=0.0.0.0:9737`) and its environment from the real `meshctl` ConfigMap. Every
pair answers on its planned path with no request refused, `maps dump` runs inside the agent's
container, and the DaemonSet's TLS port answers the kubelet's probes."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from meshctl.backends.kube import nodes as A
from meshctl.backends.kube.backend import SERVICE_ACCOUNT_DIR
from meshctl.etcd.nsconn import session
from meshctl.lab.namespaces import build, daemonset, image_agents, kube_api, kube_cluster, podman
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.namespaces.state import LabState, NodeState
from meshctl.lab.rigs import netns
from tests.names import unique

from .helpers import wait_for

LAB = Path(__file__).resolve().parents[2] / "ctl" / "meshctl" / "lab" / "labs" / "default.yaml"
REFUSED = (" 401 ", " 403 ", "Unauthorized", "Forbidden", "forbidden")

pytestmark = [pytest.mark.root, pytest.mark.slow,
              pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")]


@pytest.fixture(scope="module")
def lab(agent_image: str) -> Iterator[LabState]:
    doc = yaml.safe_load(LAB.read_text())
    doc["lab"].update(backend="kubernetes", agent="image")
    prefix = unique("ik") + "-"
    try:
        yield build.up(parse_lab(doc), prefix=prefix, wait=120)
    finally:
        assert not build.down(labstate.lab_name(prefix))
        assert not image_agents.leftovers(prefix), "lab down left containers"
        assert not netns.list_prefixed(prefix)


def node(st: LabState, name: str) -> NodeState:
    return st.lookup(name)[1]


def inspect(name: str) -> dict:
    return json.loads(podman.podman("inspect", name).stdout)[0]


def binds(got: dict) -> dict[str, str]:
    """A container's binds: where it sees each (container path -> host path and options)."""
    return {b.split(":")[1]: f"{b.split(':')[0]}:{b.split(':')[2]}" for b in got["HostConfig"]["Binds"]}


def test_the_agent_runs_as_the_daemonset_with_the_pods_service_account(lab: LabState) -> None:
    (cluster,) = lab.clusters
    kube = cluster.kube
    assert kube is not None
    a1 = node(lab, "a1")
    pod = daemonset.load()
    got = inspect(image_agents.container_name(a1, image_agents.AGENT))
    argv, env = got["Config"]["Cmd"], dict(e.split("=", 1) for e in got["Config"]["Env"])
    # the manifest's arguments as it spells them, its backend and TLS port included; no kubeconfig
    manifest = [daemonset.expand(a, {"NODE_NAME": "a1"}) for a in pod.container(image_agents.AGENT).args]
    assert argv[:len(manifest)] == manifest
    assert {"--backend=kubernetes", "--secure-metrics-addr=0.0.0.0:9737"} <= set(manifest)
    assert [a for a in argv if a.startswith("--backend")] == ["--backend=kubernetes"]
    assert not [a for a in argv if "kubeconfig" in a] and "KUBECONFIG" not in env
    # the API server as the kubelet names it, and the environment from the real ConfigMap
    cm = kube_api.request(kube, "GET", "/api/v1/namespaces/meshctl/configmaps/meshctl")["data"]
    assert cm["fastpath"] == "true" and cm["cluster_name"] == cluster.name
    assert env["KUBERNETES_SERVICE_HOST"] == "198.51.100.240" and env["KUBERNETES_SERVICE_PORT"] == "6443"
    assert kube.url == "https://198.51.100.240:6443"
    assert env["NODE_NAME"] == "a1" and env["MESHCTL_FASTPATH"] == cm["fastpath"]
    # the service account in every container of the pod, read-only; no etcd identity in a Kubernetes lab
    sa = str(kube_cluster.service_account_dir(a1.dir))
    for c in pod.containers:
        assert binds(inspect(image_agents.container_name(a1, c.name)))[SERVICE_ACCOUNT_DIR].startswith(f"{sa}:ro")
    assert not [b for b in got["HostConfig"]["Binds"] if "/pki/" in b]
    agent = image_agents.container_name(a1, image_agents.AGENT)
    listed = podman.podman("exec", agent, "ls", SERVICE_ACCOUNT_DIR).stdout.split()
    assert listed == ["ca.crt", "namespace", "token"]
    token = podman.podman("exec", agent, "cat", f"{SERVICE_ACCOUNT_DIR}/token").stdout
    payload = token.split(".")[1]
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    assert claims["sub"] == "system:serviceaccount:meshctl:meshctl"
    assert claims["kubernetes.io"]["node"]["name"] == "a1"  # bound to the DaemonSet's Pod on a1
    # what the agent published with it: its own Node's annotations
    ann = kube_api.request(kube, "GET", "/api/v1/nodes/a1")["metadata"]["annotations"]
    assert len(ann[A.PUBLIC_KEY]) == 44 and ann[A.ENDPOINT] == f"{a1.public_ip}:51820"


def test_every_pair_answers_on_its_path_and_nothing_is_refused(lab: LabState) -> None:
    results = labcheck.check(lab, count=3)
    assert len(results) == 20
    bad = [r for r in results if not r.ok or r.path != r.expected]
    assert not bad, labcheck.format_matrix(results)
    assert {r.path for r in results} == {"direct", "tunnel", "via-leader"}
    for _, n in lab.nodes():
        s = labcheck.agent_status(n) or {}
        assert s.get("ready") and s["datapath"]["mode"] == "ebpf" and "shipped" in str(s["datapath"]), n.name
        log = Path(n.dir, "agent.log").read_text()
        assert log and not [w for w in REFUSED if w in log], n.name


def test_maps_dump_inside_the_agents_container(lab: LabState) -> None:
    a1 = node(lab, "a1")
    p = podman.podman("exec", image_agents.container_name(a1, image_agents.AGENT), "meshctl", "maps", "dump",
                      "-o", "json")
    (dump,) = json.loads(p.stdout)
    entries = {e["prefix"]: e["action"] for e in dump["entries"]}
    assert dump["node"] == "a1" and entries["10.42.2.0/24"] == "direct" and entries["10.42.3.0/24"] == "tunnel"


def test_the_tls_probe_port_answers_the_kubelets_probes(lab: LabState) -> None:
    """The manifest's liveness and readiness probes as the kubelet sends them (httpGet at the pod's
    address, the node's own on the host network; the certificate not verified); /metrics wants a
    token the cluster authorises."""
    ds = next(d for d in yaml.safe_load_all(daemonset.MANIFEST.read_text()) if d and d.get("kind") == "DaemonSet")
    agent = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == image_agents.AGENT)
    probes = [agent[k]["httpGet"] for k in ("livenessProbe", "readinessProbe")]
    assert {p["path"] for p in probes} == {"/healthz", "/readyz"}
    for _, n in lab.nodes():
        with session(n.netns) as s:
            for p in probes:
                r = s.get(f"{p['scheme'].lower()}://{n.public_ip}:{p['port']}{p['path']}", verify=False, timeout=5)
                assert r.status_code == 200, (n.name, p, r.status_code)
            metrics = s.get(f"https://{n.public_ip}:{probes[0]['port']}/metrics", verify=False, timeout=5)
            assert metrics.status_code == 401, n.name


def test_a_changed_configmap_reaches_the_restarted_agents_environment(lab: LabState) -> None:
    """The DaemonSet's configMapKeyRef reads the cluster's `meshctl` ConfigMap when the container
    starts: a key an operator sets there is in the restarted agent's environment."""
    (cluster,) = lab.clusters
    assert cluster.kube is not None
    path = "/api/v1/namespaces/meshctl/configmaps/meshctl"
    kube_api.request(cluster.kube, "PATCH", path, {"data": {"masquerade6": "true"}},
                     content_type="application/merge-patch+json")
    try:
        build.stop_agent(lab, "c1")
        build.start_agent(lab, "c1")
        c1 = node(lab, "c1")
        env = inspect(image_agents.container_name(c1, image_agents.AGENT))["Config"]["Env"]
        assert "MESHCTL_MASQUERADE6=true" in env
        wait_for(lambda: ((labcheck.agent_status(c1) or {}).get("last_reconcile") or {}).get("applied"),
                 timeout=60, what="c1's restarted agent applying its plan")
    finally:
        kube_api.request(cluster.kube, "PATCH", path, {"data": {"masquerade6": None}},
                         content_type="application/merge-patch+json")
