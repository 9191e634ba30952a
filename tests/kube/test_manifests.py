# SPDX-License-Identifier: Apache-2.0
"""What a user installs: manifests/ against the Kubernetes JSON schemas (offline, with the schemas
kubernetes-validate bundles), the Peer CRD's schema as a real kube-apiserver applies it against the
backend's own checks, the Dockerfile against the DaemonSet, and the Vagrantfile through `vagrant
validate`. (tests/kube/test_kubectl.py applies manifests/ to a real control plane.)"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from meshctl.backends.kube.peers import parse_peer_object
from meshctl.errors import InputError

from .helpers import MANIFESTS, ROOT, wg_key

# The newest schemas bundled, and an older release still common on k3s/kubeadm clusters.
VERSIONS = [kubernetes_validate.latest_version(), "1.28"]


def docs() -> list[dict]:
    out = []
    for f in sorted(MANIFESTS.glob("[0-9]*.yaml")):
        out += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return out


def by_kind(kind: str) -> dict:
    return next(d for d in docs() if d["kind"] == kind)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_manifest_passes_the_schemas(version):
    kinds = []
    for d in docs():
        kubernetes_validate.validate(d, version, strict=True)  # raises on any error or unknown field
        kinds.append(d["kind"])
    assert {"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
            "ConfigMap", "DaemonSet"} <= set(kinds)


def test_the_validation_can_fail():
    ds = copy.deepcopy(by_kind("DaemonSet"))
    ds["spec"]["template"]["spec"]["hostNetworking"] = True  # a typo
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, VERSIONS[0], strict=True)
    ds = copy.deepcopy(by_kind("DaemonSet"))
    ds["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "metrics"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, VERSIONS[0], strict=True)


def test_daemonset_runs_privileged_everywhere_with_a_separate_wireguard_go():
    ds = by_kind("DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True
    assert pod["tolerations"] == [{"operator": "Exists"}]
    assert pod["serviceAccountName"] == by_kind("ServiceAccount")["metadata"]["name"]
    containers = {c["name"]: c for c in pod["containers"]}
    agent = containers["agent"]
    # wireguard-go is a native sidecar: started (and its socket answering) before the agent, so the
    # agent never starts a wireguard-go of its own that a restart would take down.
    (wg,) = pod["initContainers"]
    assert wg["name"] == "wireguard-go" and wg["restartPolicy"] == "Always"
    assert "/var/run/wireguard/kilo0.sock" in wg["startupProbe"]["exec"]["command"][-1]
    assert agent["securityContext"]["privileged"] is True
    assert {"NET_ADMIN", "BPF", "SYS_ADMIN"} <= set(agent["securityContext"]["capabilities"]["add"])
    # wireguard-go needs its TUN device and NET_ADMIN in the host's network namespace, nothing more
    assert wg["securityContext"] == {"capabilities": {"add": ["NET_ADMIN"]}}
    assert {m["mountPath"] for m in wg["volumeMounts"]} == {"/var/run/wireguard", "/dev/net/tun"}
    mounts = {m["mountPath"]: m["name"] for m in agent["volumeMounts"]}
    assert {"/sys/fs/bpf", "/lib/modules", "/var/lib/meshctl", "/var/run/wireguard"} <= set(mounts)
    # no kernel headers from the host: the image ships the compiled programs (docs/datapath.md)
    assert "/usr/src" not in mounts
    assert not [v for v in pod["volumes"] if v.get("hostPath", {}).get("path", "").startswith("/usr/src")]
    assert next(m for m in agent["volumeMounts"] if m["mountPath"] == "/lib/modules")["readOnly"] is True
    # the UAPI socket folder is the same volume in both containers
    assert {m["mountPath"]: m["name"] for m in wg["volumeMounts"]}["/var/run/wireguard"] == mounts["/var/run/wireguard"]
    assert "--backend=kubernetes" in agent["args"] and "--wg-run-dir=/var/run/wireguard" in agent["args"]
    port = next(p["containerPort"] for p in agent["ports"] if p["name"] == "metrics")
    assert agent["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port, "scheme": "HTTPS"}
    assert agent["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port, "scheme": "HTTPS"}
    # An API server older than 1.29 drops restartPolicy and then refuses the startupProbe of a plain
    # init container: the DaemonSet is refused there instead of hanging in Init (docs/kubernetes.md).
    assert wg["restartPolicy"] == "Always" and "startupProbe" in wg
    # only the TLS port is open off the host; the full API keeps --metrics-addr's loopback default
    assert f"--secure-metrics-addr=0.0.0.0:{port}" in agent["args"]
    assert not [a for a in agent["args"] if a.startswith("--metrics-addr")]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/sys/fs/bpf"]]["hostPath"]["path"] == "/sys/fs/bpf"
    assert volumes[mounts["/etc/cni/net.d"]]["hostPath"]["path"] == "/etc/cni/net.d"  # --cni install writes there


def test_rbac_allows_what_the_backend_does():
    rules = by_kind("ClusterRole")["rules"]

    def allowed(group: str, resource: str, verb: str) -> bool:
        return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)

    for verb in ("get", "list", "watch", "patch"):
        assert allowed("", "nodes", verb)
    for group in ("meshctl.io", "kilo.squat.ai"):
        for verb in ("list", "watch"):
            assert allowed(group, "peers", verb)
    from meshctl.backends.kube.cni_ipam import CNI_KINDS

    for kind in (k for kinds in CNI_KINDS.values() for k in kinds):  # --cni calico|cilium reads, never writes
        assert all(allowed(kind.group, kind.plural, v) for v in ("list", "watch"))
        assert not allowed(kind.group, kind.plural, "patch")
    assert not allowed("", "nodes", "update")  # patches only, never a full update
    role = by_kind("Role")
    assert any("configmaps" in r["resources"] and "watch" in r["verbs"] for r in role["rules"])


def test_configmap_settings_parse():
    from meshctl.backends.kube.backend import settings_from_configmap

    cm = by_kind("ConfigMap")
    cluster, mesh = settings_from_configmap(cm["data"])
    assert mesh.granularity == "location" and str(mesh.subnet) == "10.4.0.0/16" and mesh.port == 51820
    assert cluster.name == "default" and cluster.id == 1
    assert mesh.intra_subnet == "auto"


def _comment_above(key: str) -> list[str]:
    """The comment lines directly above the ConfigMap's data key `key`, without their `#`."""
    lines = (MANIFESTS / "03-configmap.yaml").read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"  {key}:"))
    above: list[str] = []
    for line in reversed(lines[:at]):
        if not line.strip().startswith("#"):
            break
        above.insert(0, line.strip().removeprefix("#").strip())
    return above


def test_configmap_intra_subnet_comment_names_every_accepted_mode():
    from meshctl.mesh.model import INTRA_SUBNET_MODES

    documented = [line.split(":", 1)[0] for line in _comment_above("intra_subnet") if ":" in line]
    # one `mode: phrase` line per mode the parser accepts, and no mode it rejects
    assert sorted(m for m in documented if " " not in m) == sorted(INTRA_SUBNET_MODES)
    assert by_kind("ConfigMap")["data"]["intra_subnet"] == "auto"


PEERS = [
    ({"allowedIPs": ["10.5.0.1/32"], "publicKey": wg_key(1)}, True),
    ({"allowedIPs": ["10.5.0.0/24", "fd00::/64"], "publicKey": wg_key(2), "persistentKeepalive": 0,
      "endpoint": {"dnsOrIP": {"dns": "vpn.example.com"}, "port": 51820}}, True),
    ({"allowedIPs": ["10.5.0.1/32"], "publicKey": wg_key(3), "endpoint": {"dnsOrIP": {"ip": "203.0.113.1"},
                                                                          "port": 1}}, True),
    ({"allowedIPs": ["10.5.0.1/32"], "publicKey": "short="}, False),
    ({"allowedIPs": ["10.5.0.1/32"], "publicKey": wg_key(4), "persistentKeepalive": -1}, False),
    ({"allowedIPs": ["10.5.0.1"], "publicKey": wg_key(5)}, False),
    ({"allowedIPs": [], "publicKey": wg_key(6)}, False),
    ({"allowedIPs": ["10.5.0.1/32"], "publicKey": wg_key(7), "endpoint": {"dnsOrIP": {"dns": "x"}, "port": 0}},
     False),
    ({"allowedIPs": ["10.5.0.1/32"], "publicKey": wg_key(8), "endpoint": {"dnsOrIP": {"dns": "Bad_Name"},
                                                                          "port": 5}}, False),
    ({"publicKey": wg_key(9)}, False),
]


@pytest.mark.parametrize("spec,good", PEERS)
def test_peer_crd_schema_and_backend_agree(api, spec, good):
    """The CRD's schema as kube-apiserver applies it (a server-side dry run: nothing stored), the same
    schema read offline as JSON Schema, and the backend's own parser say the same of each Peer."""
    from meshctl.errors import MeshError

    schema = by_kind("CustomResourceDefinition")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    obj = {"apiVersion": "meshctl.io/v1alpha1", "kind": "Peer", "metadata": {"name": "p"}, "spec": spec}
    try:
        api.cp.request("POST", "/apis/meshctl.io/v1alpha1/peers?dryRun=All&fieldValidation=Strict", obj)
        server_ok = True
    except MeshError as e:
        assert ": 422 " in str(e), e  # refused as Invalid, not for another reason
        server_ok = False
    schema_ok = jsonschema.Draft7Validator(schema).is_valid(obj)
    try:
        parse_peer_object(obj)
        parser_ok = True
    except InputError:
        parser_ok = False
    assert (server_ok, schema_ok, parser_ok) == (good, good, good)


def test_dockerfile_matches_the_daemonset():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE=debian:bookworm", text, re.M) and re.search(r"^FROM \$\{BASE\} AS base", text, re.M)
    for pkg in ("libbpf1", "wireguard-tools", "wireguard-go"):
        assert re.search(rf"\b{pkg}\b", text), pkg
    assert 'ENTRYPOINT ["meshctl"]' in text
    (wg,) = by_kind("DaemonSet")["spec"]["template"]["spec"]["initContainers"]
    # the wrapper the wireguard-go container runs is copied into the image ...
    wrapper = ROOT / "scripts" / "container" / Path(wg["command"][0]).name
    assert f"COPY scripts/container/{wrapper.name} {Path(wg['command'][0]).parent}/" in text
    # ... and it leaves the marker the startup probe accepts when the kernel has WireGuard
    assert "/var/run/wireguard/$ifname.kernel" in wrapper.read_text()
    assert "kilo0.kernel" in wg["startupProbe"]["exec"]["command"][-1]
    ports = re.findall(r"^EXPOSE (\d+)", text, re.M)
    agent = next(c for c in by_kind("DaemonSet")["spec"]["template"]["spec"]["containers"] if c["name"] == "agent")
    assert [str(agent["ports"][0]["containerPort"])] == ports
    made = ("build/image/",)  # scripts/image.sh writes these into the context before the build
    for src in re.findall(r"^COPY (?!--from=)(\S+)", text, re.M):  # --from: another stage's files
        if not src.endswith("*") and not src.startswith(made):
            assert (ROOT / src).exists(), src


def test_vagrantfile_validates(tmp_path):
    vagrant = shutil.which("vagrant")
    assert vagrant, "vagrant is not installed (scripts/setup.sh installs it)"
    env = {**os.environ, "VAGRANT_DOTFILE_PATH": str(tmp_path / "dot"), "VAGRANT_HOME": str(tmp_path / "home"),
           "VAGRANT_CHECKPOINT_DISABLE": "1"}
    cwd = ROOT / "vagrant"
    p = subprocess.run([vagrant, "validate", "--ignore-provider"], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "validated successfully" in p.stdout, p.stdout + p.stderr
    # four VMs by default, two per location, and the validation does see a broken setting
    assert {f"==> {n}: " for n in ("a1", "a2", "b1", "b2")} <= {ln[: len("==> a1: ")] for ln in p.stdout.splitlines()}
    p = subprocess.run([vagrant, "validate", "--ignore-provider"], cwd=cwd, env={**env, "MESHCTL_PER_LOC": "0"},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "MESHCTL_PER_LOC" in p.stdout + p.stderr
    for script in ("provision-common.sh", "provision-server.sh", "provision-agent.sh", "cni.sh", "deploy.sh",
                   "check.sh"):
        assert subprocess.run(["bash", "-n", str(cwd / script)]).returncode == 0, script


def test_clustermesh_cache_deployment_args_parse_and_only_it_holds_the_remote_credentials():
    from meshctl.cli.clustermesh import cache_cmd

    dep = by_kind("Deployment")
    assert dep["metadata"]["name"] == "meshctl-clustermesh-cache"
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][:2] == ["clustermesh", "cache"]
    env = {e["name"]: "1" if e["name"].endswith("_ID") else "x" for e in c["env"]}
    args = [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], a) for a in c["args"][2:]]
    ctx = cache_cmd.make_context("cache", args)   # the real parser: an unknown or bad flag raises
    assert ctx.params["etcd_user"] == "meshctl:clustermesh-cache"
    # Multi-Cluster Services: the controller with the cache's own token, the DNS server behind its Service.
    assert ctx.params["mcs"] and ctx.params["dns_addr"] == "0.0.0.0:1053"
    assert dep["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    dns = next(d for d in docs() if d["kind"] == "Service" and d["metadata"]["name"] == "meshctl-clusterset-dns")
    assert {(p["port"], p["protocol"]) for p in dns["spec"]["ports"]} == {(53, "UDP"), (53, "TCP")}
    assert dns["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    crds = {d["metadata"]["name"] for d in docs() if d["kind"] == "CustomResourceDefinition"}
    assert {"serviceexports.multicluster.x-k8s.io", "serviceimports.multicluster.x-k8s.io"} <= crds
    assert "06-mcs-crds.yaml" in (MANIFESTS / "kustomization.yaml").read_text()
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mounts[str(ctx.params["clustermesh_dir"])]]["secret"]["secretName"] == "meshctl-clustermesh"
    # the agents' DaemonSet does not mount the remote clusters' credentials
    ds = by_kind("DaemonSet")["spec"]["template"]["spec"]
    assert all(v.get("secret", {}).get("secretName") != "meshctl-clustermesh" for v in ds["volumes"])
    assert "05-clustermesh-cache.yaml" in (MANIFESTS / "kustomization.yaml").read_text()
