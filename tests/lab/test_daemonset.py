# SPDX-License-Identifier: Apache-2.0
"""How the lab reads manifests/04-daemonset.yaml for `lab.agent: image` (namespaces/daemonset.py):
the pod of the real manifest, the kubelet's `$(VAR)` expansion and environment, the arguments the
lab adds, the securityContext as podman options, each hostPath as a node's own; and the lab keys
and flags that choose agents from the image, refused in one line where they cannot run."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
import yaml

from meshctl.errors import InputError
from meshctl.lab.namespaces import daemonset
from meshctl.lab.namespaces.spec import parse_lab, with_image

from .conftest import topo


def manifest() -> dict[str, Any]:
    docs = yaml.safe_load_all(daemonset.MANIFEST.read_text())
    return next(d for d in docs if d and d.get("kind") == "DaemonSet")


def test_the_pod_of_the_manifest() -> None:
    pod = daemonset.load()
    wg, agent = pod.containers
    assert (wg.name, wg.sidecar, agent.name, agent.sidecar) == ("wireguard-go", True, "agent", False)
    assert wg.startup is not None and wg.startup.command[-1].startswith("test -S /var/run/wireguard/kilo0.sock")
    assert wg.security == {"capabilities": {"add": ["NET_ADMIN"]}}
    assert {m.path: (m.host_path, m.host_type) for m in wg.mounts}["/dev/net/tun"] == ("/dev/net/tun", "CharDevice")
    assert agent.memory_limit == 512 * 2**20 and "--node=$(NODE_NAME)" in agent.args
    assert {m.path for m in agent.mounts} >= {"/sys/fs/bpf", "/var/lib/meshctl", "/etc/cni/net.d", "/var/run/wireguard"}


def test_what_the_lab_cannot_run_is_refused_naming_it() -> None:
    ds = copy.deepcopy(manifest())
    ds["spec"]["template"]["spec"]["volumes"].append({"name": "cfg", "configMap": {"name": "x"}})
    ds["spec"]["template"]["spec"]["containers"][0]["volumeMounts"].append({"name": "cfg", "mountPath": "/etc/x"})
    with pytest.raises(InputError) as e:
        daemonset.parse(ds)
    assert str(e.value) == "DaemonSet: volume cfg: ['configMap'] is not a hostPath volume, the only kind the lab runs"
    ds = copy.deepcopy(manifest())
    ds["spec"]["template"]["spec"]["hostNetwork"] = False
    with pytest.raises(InputError, match="hostNetwork: false is not true: the lab runs the pod in its node's"):
        daemonset.parse(ds)


def test_the_kubelets_expansion_and_environment() -> None:
    assert daemonset.expand("--node=$(NODE_NAME)", {"NODE_NAME": "a1"}) == "--node=a1"
    assert daemonset.expand("$(UNSET) $$(NODE_NAME)", {"NODE_NAME": "a1"}) == "$(UNSET) $(NODE_NAME)"
    agent = daemonset.load().container("agent")
    env = daemonset.environment(agent, {"spec.nodeName": "a1"}, {"meshctl": {"fastpath": "false"},
                                                                   "other": {"cni": "install"}})
    assert env == {"NODE_NAME": "a1", "MESHCTL_FASTPATH": "false"}  # optional keys the ConfigMap lacks: left out
    # what the kubelet sets in every container comes first, and a manifest's value may name it
    with_value = replace(agent, env=({"name": "API", "value": "$(KUBERNETES_SERVICE_HOST)"},))
    assert daemonset.environment(with_value, {}, {}, {"KUBERNETES_SERVICE_HOST": "198.51.100.240"}) == {
        "KUBERNETES_SERVICE_HOST": "198.51.100.240", "API": "198.51.100.240"}
    with pytest.raises(InputError) as e:
        daemonset.environment(agent, {}, {})
    assert str(e.value).startswith("agent.env.NODE_NAME.valueFrom.fieldRef.fieldPath: 'spec.nodeName' is not a field")
    required = replace(agent, env=(
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "meshctl", "key": "cni"}}},))
    with pytest.raises(InputError) as e:
        daemonset.environment(required, {}, {"meshctl": {}})
    assert str(e.value) == ("agent.env.X.valueFrom.configMapKeyRef.key: 'cni' is not a key of ConfigMap meshctl "
                            "and not optional")


def test_the_labs_flags_follow_the_manifests_and_the_lab_names_the_backend() -> None:
    manifest_args = ["agent", "--backend=kubernetes", "--node=a1", "--state-dir=/var/lib/meshctl"]
    lab = ["--node", "a1", "--state-dir", "/run/x", "--backend", "etcd", "--leader", "--lease-ttl", "5"]
    assert daemonset.merge_args(manifest_args, lab) == [
        "agent", "--node=a1", "--state-dir=/var/lib/meshctl", "--backend", "etcd", "--leader", "--lease-ttl", "5"]
    # a Kubernetes lab's backend is the manifest's: its argument stays as the manifest spells it
    kube_lab = ["--node", "a1", "--backend", "kubernetes", "--secure-metrics-addr", "0.0.0.0:9737"]
    assert daemonset.merge_args([*manifest_args, "--secure-metrics-addr=0.0.0.0:9737"], kube_lab) == [
        *manifest_args, "--secure-metrics-addr=0.0.0.0:9737"]


def test_a_security_context_as_podman_options() -> None:
    opts, warnings = daemonset.security_options({"capabilities": {"add": ["NET_ADMIN"], "drop": ["NET_RAW"]},
                                                 "readOnlyRootFilesystem": True, "runAsUser": 1000,
                                                 "allowPrivilegeEscalation": False, "procMount": "Unmasked"})
    caps = [opts[i + 1] for i, o in enumerate(opts) if o == "--cap-add"]
    assert opts[:2] == ["--cap-drop", "all"] and "NET_ADMIN" in caps and "NET_RAW" not in caps and "KILL" in caps
    assert {"--read-only", "no-new-privileges", "seccomp=unconfined"} <= set(opts) and "1000" in opts
    assert warnings == ["securityContext.procMount is not applied by the lab"]
    privileged, _ = daemonset.security_options({"privileged": True})
    assert privileged == ["--privileged", "--security-opt", "seccomp=unconfined"]


def test_each_host_path_is_the_nodes_own() -> None:
    def at(path: str) -> str:
        return daemonset.host_path(daemonset.Mount("v", "/c", path, ""), "/run/lab/nodes/a1/root",
                                   "/sys/fs/bpf/l/a1-host")
    assert at("/sys/fs/bpf") == "/sys/fs/bpf/l/a1-host"
    assert at("/dev/net/tun") == "/dev/net/tun" and at("/lib/modules") == "/lib/modules"
    assert at("/var/lib/meshctl") == "/run/lab/nodes/a1/root/var/lib/meshctl"
    pod = daemonset.load()
    sock = daemonset.container_to_host(pod, "/var/run/wireguard/kilo0.sock", "/r", "/b")
    assert sock == "/r/var/run/wireguard/kilo0.sock"
    assert daemonset.quantity("256Mi", "x") == 256 * 2**20 and daemonset.quantity("1G", "x") == 10**9
    with pytest.raises(InputError):
        daemonset.quantity("1.5Gi", "limits.memory")


def test_agents_from_the_image_take_namespace_nodes_with_either_backend() -> None:
    spec = parse_lab(topo(agent="image"))
    assert spec.options.agent == "image" and spec.options.image == ""
    assert with_image(parse_lab(topo()), "ex/meshctl:1").options.image == "ex/meshctl:1"
    with pytest.raises(InputError) as e:
        parse_lab(topo(agent="docker"))
    assert str(e.value) == "lab.agent: 'docker' is not one of process, image"
    kube = with_image(parse_lab(topo(backend="kubernetes")), "ex/meshctl:1").options
    assert (kube.backend, kube.agent, kube.image) == ("kubernetes", "image", "ex/meshctl:1")
    with pytest.raises(InputError) as e:
        parse_lab(topo(agent="image", vms=True))
    assert str(e.value) == "lab.agent: 'image' is not available with lab.vms (a VM node's agent runs in its VM)"
