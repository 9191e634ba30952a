# SPDX-License-Identifier: Apache-2.0
"""The DaemonSet's command line against the real `meshctl agent` parser, so the manifest and the
CLI can never drift apart: every flag it passes exists and means what the pod gives it (the
mounted folders, the probed port, the sidecar's device), and the Kubernetes-only flags reach
`meshctl.agent.kube_backend.make_backend`.

The command runs for real up to `run_agent`, which is swapped for a function that keeps the
AgentConfig: running the agent itself with the DaemonSet's settings would touch this machine's
root namespace (0.0.0.0:9736, /var/lib/meshctl, kilo0), which tests must not do."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from meshctl.agent.config import AgentConfig
from meshctl.backends.kube.backend import AGENT_ENV_KEYS, settings_from_configmap
from meshctl.cli import main
from tests.names import unique

from .helpers import MANIFESTS, create_node, node_obj
from .test_manifests import by_kind


def pod_spec() -> dict[str, Any]:
    return by_kind("DaemonSet")["spec"]["template"]["spec"]


def container(name: str) -> dict[str, Any]:
    spec = pod_spec()
    return next(c for c in [*spec["containers"], *spec.get("initContainers", [])] if c["name"] == name)


def expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of container args."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], a) for a in args]


def parse(monkeypatch: pytest.MonkeyPatch, argv: list[str], env: dict[str, str] | None = None
          ) -> tuple[Any, AgentConfig | None]:
    """Run `meshctl <argv>` through the real click group; returns (result, the AgentConfig)."""
    import meshctl.agent.run as run

    got: list[AgentConfig] = []
    monkeypatch.setattr(run, "run_agent", got.append)
    res = CliRunner().invoke(main, argv, env=env or {}, catch_exceptions=False)
    return res, (got[0] if got else None)


def test_the_daemonset_args_parse_into_what_the_pod_provides(monkeypatch):
    agent = container("agent")
    env_names = {e["name"] for e in agent["env"]}
    for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", " ".join(agent["args"])):
        assert ref in env_names, f"$({ref}) is not in the agent container's env"
    res, cfg = parse(monkeypatch, expand(agent["args"], {"NODE_NAME": "node-1"}))
    assert res.exit_code == 0, res.output
    assert cfg is not None
    assert cfg.backend == "kubernetes" and cfg.node_name == "node-1"
    assert cfg.pod_cidrs == ()  # the agent takes them from the Node's spec.podCIDRs

    mounts = {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec()["volumes"]}
    # the agent keeps its key in a host folder, so a restarted pod keeps the node's identity
    state = next(n for n, p in mounts.items() if Path(p) == cfg.state_dir)
    assert volumes[state]["hostPath"]["path"] == str(cfg.state_dir)
    # wireguard-go's UAPI socket: the sidecar's folder is the agent's --wg-run-dir, and the device the
    # sidecar creates is the agent's --wg-interface
    wg = container("wireguard-go")
    wg_mounts = {m["name"]: m["mountPath"] for m in wg["volumeMounts"]}
    run_vol = next(n for n, p in mounts.items() if Path(p) == cfg.wg_run_dir)
    assert Path(wg_mounts[run_vol]) == cfg.wg_run_dir
    assert wg["command"][-1] == cfg.wg_interface
    assert str(cfg.wg_run_dir / f"{cfg.wg_interface}.sock") in wg["startupProbe"]["exec"]["command"][-1]
    # the full API (/status, /probe) on loopback only: on the host's network 0.0.0.0 is every pod's
    assert cfg.metrics_addr.rsplit(":", 1)[0] == "127.0.0.1"
    # /healthz and /metrics over TLS on every address, on the port the probes and Prometheus use
    host, port = cfg.secure_metrics_addr.rsplit(":", 1)
    assert host == "0.0.0.0"
    assert int(port) == agent["ports"][0]["containerPort"] == agent["livenessProbe"]["httpGet"]["port"]
    assert agent["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert agent["livenessProbe"]["httpGet"]["scheme"] == agent["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    annotations = by_kind("DaemonSet")["spec"]["template"]["metadata"]["annotations"]
    assert (annotations["prometheus.io/port"], annotations["prometheus.io/scheme"]) == (str(port), "https")


def test_the_daemonset_env_from_the_configmap_reaches_the_agent(monkeypatch):
    agent = container("agent")
    from_cm = {e["name"]: e["valueFrom"]["configMapKeyRef"] for e in agent["env"]
               if "configMapKeyRef" in e.get("valueFrom", {})}
    assert from_cm, "the DaemonSet reads the private network from the ConfigMap"
    cm = by_kind("ConfigMap")["metadata"]["name"]
    values = {"private_interface": "eth1", "internal_cidr": "10.10.0.0/16,fd10::/48", "cni": "install",
              "fastpath": "false", "masquerade6": "true"}
    env = {}
    for name, ref in from_cm.items():
        assert ref["name"] == cm and ref["optional"] is True and ref["key"] in AGENT_ENV_KEYS
        env[name] = values[ref["key"]]
    res, cfg = parse(monkeypatch, expand(agent["args"], {"NODE_NAME": "node-1"}), env)
    assert res.exit_code == 0, res.output
    assert cfg is not None
    assert cfg.private_interface == "eth1"
    assert cfg.internal_cidr == (ipaddress.ip_network("10.10.0.0/16"), ipaddress.ip_network("fd10::/48"))
    assert cfg.cni == "install" and str(cfg.cni_conf_dir) == "/etc/cni/net.d"
    assert cfg.fastpath is False  # the ConfigMap's `fastpath: "false"`: docs/datapath.md's off switch
    assert cfg.masquerade6 is True  # the ConfigMap's `masquerade6: "true"`
    # ... and those keys in the ConfigMap do not break the mesh settings every agent reads from it
    cluster, mesh = settings_from_configmap({**by_kind("ConfigMap")["data"], **values})
    assert cluster.name == "default" and mesh.granularity == "location"
    # without them (optional refs, no env), the agent discovers
    res, cfg = parse(monkeypatch, expand(agent["args"], {"NODE_NAME": "node-1"}))
    assert cfg is not None and cfg.private_interface is None and cfg.internal_cidr == () and cfg.cni == "keep"
    assert cfg.fastpath is True and cfg.masquerade6 is False


@pytest.mark.parametrize(("value", "flag", "on"), [("true", False, True), ("false", False, False), ("", False, False),
                                                   ("false", True, True)])
def test_the_configmaps_masquerade6_key_switches_ipv6_masquerade(monkeypatch, value, flag, on):
    settings_from_configmap({**by_kind("ConfigMap")["data"], "masquerade6": value})  # not a mesh setting
    args = expand(container("agent")["args"], {"NODE_NAME": "node-1"}) + (["--masquerade6"] if flag else [])
    res, cfg = parse(monkeypatch, args, {"MESHCTL_MASQUERADE6": value})
    assert res.exit_code == 0, res.output
    assert cfg is not None and cfg.masquerade6 is on


def test_the_configmaps_commented_dual_stack_keys_parse():
    """The ConfigMap's commented examples, uncommented, are what they say: an IPv6 WireGuard subnet
    next to the IPv4 one."""
    text = (MANIFESTS / "03-configmap.yaml").read_text()
    example = next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("  # subnet6:"))
    _, mesh = settings_from_configmap({**by_kind("ConfigMap")["data"], "subnet6": example})
    assert [str(s) for s in mesh.subnets] == ["10.4.0.0/16", example]


@pytest.mark.parametrize(("value", "flag", "on"), [("false", False, False), ("False", False, False),
                                                   ("true", False, True), ("", False, True), ("true", True, False)])
def test_the_configmaps_fastpath_key_switches_the_fast_path(monkeypatch, value, flag, on):
    cluster, mesh = settings_from_configmap({**by_kind("ConfigMap")["data"], "fastpath": value})
    assert mesh.granularity == "location"  # accepted: not a mesh setting, not an unknown field
    args = expand(container("agent")["args"], {"NODE_NAME": "node-1"}) + (["--no-fastpath"] if flag else [])
    res, cfg = parse(monkeypatch, args, {"MESHCTL_FASTPATH": value})
    assert res.exit_code == 0, res.output
    assert cfg is not None and cfg.fastpath is on


@pytest.mark.parametrize(("key", "env", "value"), [("fastpath", "MESHCTL_FASTPATH", "off"),
                                                 ("masquerade6", "MESHCTL_MASQUERADE6", "yes please")])
def test_a_bad_true_or_false_key_is_a_one_line_rejection(monkeypatch, key, env, value):
    from meshctl.errors import InputError

    with pytest.raises(InputError) as e:
        settings_from_configmap({key: value}, "configmap meshctl/meshctl")
    assert str(e.value) == f"configmap meshctl/meshctl.{key}: {value!r} is not true or false"
    res, cfg = parse(monkeypatch, expand(container("agent")["args"], {"NODE_NAME": "node-1"}), {env: value})
    assert res.exit_code == 2 and cfg is None
    assert res.stderr == f"error: {env}: {value!r} is not true or false\n"


def test_the_parser_does_catch_drift(monkeypatch):
    args = expand(container("agent")["args"], {"NODE_NAME": "node-1"})
    res, cfg = parse(monkeypatch, [*args, "--wg-run-directory=/x"])
    assert res.exit_code == 2 and cfg is None
    assert "error: --wg-run-directory: no such option of meshctl agent" in res.output
    res, cfg = parse(monkeypatch, [*args, "--metrics-addr=9736"])
    assert res.exit_code == 2 and "--metrics-addr: '9736' is not host:port" in res.output
    # --pod-cidr may only be left out with the kubernetes backend
    res, cfg = parse(monkeypatch, ["agent", "--node=n1", "--backend=etcd", "--etcd-endpoints=https://e:2379"])
    assert res.exit_code == 2 and "--pod-cidr: '' is required with --backend etcd" in res.output
    res, cfg = parse(monkeypatch, ["agent", "--node=n1", "--pod-cidr=10.42.0.0/24", "--backend=etcd",
                                   "--etcd-endpoints=https://e:2379", "--kvstore-endpoints=https://k:2379"])
    assert res.exit_code == 2 and "--kvstore-endpoints: 'https://k:2379' is for --backend kubernetes" in res.output
    res, cfg = parse(monkeypatch, [*args, "--resync-seconds=0"])
    assert res.exit_code == 2 and "--resync-seconds: 0.0 must be > 0" in res.output


@pytest.mark.parametrize(("extra", "line"), [
    pytest.param(["--backend=kubernetes", "--clustermesh-dir=/cm", "--clustermesh-cache"],
                 "--clustermesh-cache: true reads the cache in this cluster's etcd: it needs --backend etcd, "
                 "or --backend kubernetes with --kvstore-endpoints", id="kubernetes-without-kvstore"),
    pytest.param(["--backend=kubernetes", "--kvstore-endpoints=https://k:2379", "--clustermesh-cache"],
                 "--clustermesh-cache: true needs --clustermesh-dir (the fallback)", id="no-fallback"),
    pytest.param(["--backend=kubernetes", "--kvstore-endpoints=https://k:2379", "--clustermesh-dir=/cm",
                  "--clustermesh-cache"], "", id="kubernetes-with-kvstore"),
    pytest.param(["--backend=etcd", "--etcd-endpoints=https://e:2379", "--pod-cidr=10.42.0.0/24",
                  "--clustermesh-dir=/cm", "--clustermesh-cache"], "", id="etcd"),
])
def test_clustermesh_cache_needs_this_clusters_etcd_and_a_fallback(monkeypatch, extra, line):
    res, cfg = parse(monkeypatch, ["agent", "--node=n1", *extra])
    if line:
        assert res.exit_code == 2 and cfg is None and line in res.output
    else:
        assert res.exit_code == 0, res.output
        assert cfg is not None and cfg.clustermesh_cache


def test_kubernetes_flags_reach_make_backend(monkeypatch, api, kclient):
    from meshctl.agent.kube_backend import make_backend

    create_node(kclient, node_obj("node-1", "10.42.9.0/24", labels={"example.com/site": "lisbon"}))
    res, cfg = parse(monkeypatch, ["agent", "--backend=kubernetes", "--node=node-1", f"--kubeconfig={api.kubeconfig}",
                                   "--location-label=example.com/site", "--resync-seconds=7.5",
                                   "--kvstore-endpoints=https://192.0.2.1:2379, https://192.0.2.2:2379",
                                   "--lease-ttl=4"])
    assert res.exit_code == 0, res.output
    assert cfg is not None and cfg.kvstore_endpoints == ("https://192.0.2.1:2379", "https://192.0.2.2:2379")
    wiring = make_backend(cfg)
    be, own = wiring.backend, wiring.own.current()
    try:
        assert be.config.get().cluster.server == api.url
        assert be.location_label == "example.com/site" and be.resync_seconds == 7.5
        assert own.pod_cidrs == (ipaddress.ip_network("10.42.9.0/24"),) and own.location == "lisbon"
        assert be.mirror is not None and be.mirror.client.endpoints == list(cfg.kvstore_endpoints)
        assert be.mirror.lease_ttl == 4
    finally:
        be.close()
    # --kubeconfig: a file that is not there is a one-line error naming it
    res, cfg = parse(monkeypatch, ["agent", "--backend=kubernetes", "--node=node-1",
                                   "--kubeconfig=/nonexistent/kubeconfig"])
    assert cfg is not None
    from meshctl.errors import InputError

    with pytest.raises(InputError, match="--kubeconfig: '/nonexistent/kubeconfig' is not a file"):
        make_backend(cfg)


@pytest.mark.root
def test_internal_cidr_names_the_private_interface(request):
    """The DaemonSet passes one cluster-wide CIDR (ConfigMap `internal_cidr`), not per-node NIC
    names: the NIC holding an address inside it becomes the agent's private interface, which the
    private routes and the fast path need. Checked in a namespace of this test's own."""
    import sys

    from meshctl.lab.rigs import netns

    ns = unique("kc")
    netns.add(ns)
    try:
        netns.veth(ns, "nat0", ns, "nat0p")
        netns.veth(ns, "priv7", ns, "priv7p")
        netns.addr(ns, "nat0", "10.0.2.15/24")  # the same NAT address on every VM, default route
        netns.run(ns, ["ip", "link", "set", "nat0", "up"])
        netns.run(ns, ["ip", "route", "add", "default", "via", "10.0.2.2", "dev", "nat0"])
        netns.addr(ns, "priv7", "10.10.1.11/24")
        netns.addr(ns, "priv7p", "10.99.0.1/32")
        code = "\n".join([
            "import ipaddress, sys",
            "from meshctl.agent.config import AgentConfig",
            "from meshctl.agent.run import resolve_private_interface",
            "for kw in (dict(internal_cidr=(ipaddress.ip_network(sys.argv[1]),)),",
            "           dict(force_internal_ip=(ipaddress.ip_interface(sys.argv[2]),)),",
            "           dict(private_interface='eth9', internal_cidr=(ipaddress.ip_network(sys.argv[1]),))):",
            "    c = AgentConfig(node_name='n', backend='kubernetes', **kw)",
            "    print(resolve_private_interface(c).private_interface)",
        ])
        out = netns.run(ns, [sys.executable, "-c", code, "10.10.0.0/16", "10.99.0.1/16"]).stdout.split()
        # by CIDR; by a forced address whose NIC holds only the /32; a flag is never overridden
        assert out == ["priv7", "priv7p", "eth9"]
    finally:
        netns.delete(ns)
