# SPDX-License-Identifier: Apache-2.0
"""Errors that teach (issue 25): each bad input is one line on stderr that names the field (never a
long value), says why and what to write instead, exits 2 and never shows a traceback."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from meshctl.backends.kube.backend import find_kubeconfig
from meshctl.cli import main
from meshctl.errors import MeshError

from .fixtures import KILO_CLASSIC

LABS = Path(__file__).resolve().parents[2] / "ctl/meshctl/lab/labs"


def run(*args: str, env: dict[str, str | None] | None = None):
    return CliRunner().invoke(main, list(args), env=env)


def one_error(r) -> str:
    """The single `error:` line of a run that exited 2, without its `error: ` lead."""
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    return lines[0].removeprefix("error: ")


def write(tmp_path: Path, doc, name: str = "topo.yaml") -> str:
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return str(p)


def plan_error(tmp_path: Path, doc, node: str = "a") -> str:
    return one_error(run("plan", "-f", write(tmp_path, doc), "--node", node))


def kilo_with(where: str, key: str, value) -> dict:
    """KILO_CLASSIC with `key: value` added at `where` ('' for the top level, `nodes.0`, `mesh`, ...)."""
    import copy

    d = copy.deepcopy(KILO_CLASSIC)
    target = d
    for part in where.split(".") if where else []:
        target = target.setdefault(part, {}) if not part.isdigit() else target[int(part)]
    target[key] = value
    return d


# --- 1. unknown keys: the key, never its value, and the nearest known one -------------------------

@pytest.mark.parametrize("where, key, message", [
    ("", "nodez", "nodez: is not a known field (did you mean nodes?)"),
    ("cluster", "nmae", "cluster.nmae: is not a known field (did you mean name?)"),
    ("mesh", "granularty", "mesh.granularty: is not a known field (did you mean granularity?)"),
    ("nodes.0", "podcidr", "nodes[0].podcidr: is not a known field (did you mean pod_cidr?)"),
    ("peers.0", "allowed_ip", "peers[0].allowed_ip: is not a known field (did you mean allowed_ips?)"),
    ("", "zzz", "zzz: is not a known field"),
])
def test_unknown_key_names_the_key_and_the_nearest_field(tmp_path: Path, where: str, key: str, message: str) -> None:
    assert plan_error(tmp_path, kilo_with(where, key, "some value")) == f"topo.yaml: {message}"


def test_unknown_key_never_prints_its_value(tmp_path: Path) -> None:
    nodes = [{"name": f"n{i}", "pod_cidr": f"10.{i // 250}.{i % 250}.0/24"} for i in range(5000)]
    err = plan_error(tmp_path, {"cluster": {"name": "default", "id": 1}, "node": nodes})
    assert err == "topo.yaml: node: is not a known field (did you mean nodes?)"


def test_unknown_lab_key_names_the_nearest_field(tmp_path: Path) -> None:
    doc = {"nodes": [{"name": "a1", "pod_cidr": "10.42.1.0/24"}], "lab": {"lease_tl": 5}}
    r = run("lab", "up", "-f", write(tmp_path, doc, "lab.yaml"))
    assert one_error(r) == "lab.yaml: lab.lease_tl: is not a known field (did you mean lease_ttl?)"


# --- 2. YAML errors: line, column, the parser's reason and a hint ---------------------------------

def test_bare_ipv6_endpoint_gets_the_quoting_hint(tmp_path: Path) -> None:
    doc = "cluster: {name: default, id: 1}\nnodes:\n  - name: a\n    endpoint: [fd00::1]:51820\n"
    assert plan_error(tmp_path, doc) == ("topo.yaml:4:24: not valid YAML: expected <block end>, but found "
                                         "'<scalar>' (hint: quote an IPv6 endpoint: \"[fd00::1]:51820\")")


def test_tab_indent_gets_the_spaces_hint(tmp_path: Path) -> None:
    assert plan_error(tmp_path, "nodes:\n\t- name: a\n") == (
        "topo.yaml:2:1: not valid YAML: found character '\\t' that cannot start any token "
        "(hint: indent with spaces; YAML does not allow tabs)")


@pytest.mark.parametrize("text", ["", "# only a comment\n", "\n  \n"])
def test_empty_file_is_an_error(tmp_path: Path, text: str) -> None:
    assert one_error(run("graph", "-f", write(tmp_path, text))) == "topo.yaml: is empty"


def test_duplicate_key_names_the_key_and_both_lines(tmp_path: Path) -> None:
    doc = "mesh: {granularity: full}\nnodes: []\nmesh: {granularity: location}\n"
    assert one_error(run("graph", "-f", write(tmp_path, doc))) == (
        "topo.yaml:3:1: key 'mesh' is given twice in one mapping (lines 1 and 3); keep one")


def test_merge_keys_may_still_be_overridden(tmp_path: Path) -> None:
    doc = "nodes: []\nmesh: {<<: {granularity: full, port: 4}, granularity: location}\n"
    r = run("graph", "-f", write(tmp_path, doc))
    assert r.exit_code == 0, r.output
    assert "(location)" in r.stdout


# --- 3. numbers in strings, one rule -------------------------------------------------------------

def test_quoted_cluster_id_is_accepted_as_a_quoted_port_is(tmp_path: Path) -> None:
    d = kilo_with("cluster", "id", "1")
    d["mesh"]["port"] = "51820"
    r = run("plan", "-f", write(tmp_path, d), "--node", "a")
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("value, message", [
    ("256", "cluster.id: '256' is not a cluster id in 1..255"),
    ("1.5", "cluster.id: '1.5' is not a cluster id in 1..255"),
    (True, "cluster.id: true is not a cluster id in 1..255"),
])
def test_bad_cluster_id_shows_the_value_as_written(tmp_path: Path, value, message: str) -> None:
    assert plan_error(tmp_path, kilo_with("cluster", "id", value)) == f"topo.yaml: {message}"


# --- 4. finding the live cluster -----------------------------------------------------------------

def test_no_kubeconfig_names_every_place_and_k3s(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    r = run("plan", "--backend", "kubernetes", "--node", "a", env={"KUBECONFIG": None})
    assert one_error(r) == ("--kubeconfig: is not given, $KUBECONFIG is not set, there is no ~/.kube/config "
                            "and this is not a pod; on k3s: --kubeconfig /etc/rancher/k3s/k3s.yaml")


def test_kubeconfig_list_without_a_file_says_so(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    listed = f"{tmp_path}/a:{tmp_path}/b"
    r = run("plan", "--backend", "kubernetes", "--node", "a", env={"KUBECONFIG": listed})
    assert one_error(r) == (f"--kubeconfig: is not given and $KUBECONFIG ({listed}) names no file that exists; "
                            "on k3s: --kubeconfig /etc/rancher/k3s/k3s.yaml")


def test_kubeconfig_is_found_as_kubectl_finds_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    second, flag, home = tmp_path / "second", tmp_path / "flag", tmp_path / ".kube" / "config"
    for p in (second, flag, home):
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("{}")
    env = {"KUBECONFIG": f"{tmp_path}/missing:{second}"}
    assert find_kubeconfig(str(flag), env) == flag
    assert find_kubeconfig(None, env) == second  # the first that exists; ~/.kube/config is not read then
    assert find_kubeconfig(None, {}) == home
    home.unlink()
    assert find_kubeconfig(None, {}) is None


def test_in_a_pod_the_service_account_is_the_kubeconfig(tmp_path: Path, monkeypatch) -> None:
    """No kubeconfig anywhere: what the kubelet gives a pod's container (token, CA and namespace
    at the service-account path, the API server in $KUBERNETES_SERVICE_HOST/PORT) is used; without
    the two variables, one line."""
    from meshctl.backends.kube import backend

    monkeypatch.setenv("HOME", str(tmp_path))
    sa = tmp_path / "serviceaccount"
    sa.mkdir()
    for name, text in (("token", "t0k"), ("ca.crt", "-----BEGIN CERTIFICATE-----"), ("namespace", "meshctl")):
        (sa / name).write_text(text)
    monkeypatch.setattr(backend, "SERVICE_ACCOUNT_DIR", str(sa))
    env = {"KUBERNETES_SERVICE_HOST": "198.51.100.240", "KUBERNETES_SERVICE_PORT": "6443"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    cfg = backend.kubeconfig_for(None).get()
    assert cfg.cluster.server == "https://198.51.100.240:6443" and cfg.namespace == "meshctl"
    assert cfg.cluster.certificate_auth == str(sa / "ca.crt") and cfg.user.token_file == str(sa / "token")
    with pytest.raises(MeshError) as e:
        backend.kubeconfig_for(None, {"KUBERNETES_SERVICE_PORT": "6443"})
    assert str(e.value) == (f"service account {sa}: $KUBERNETES_SERVICE_HOST not set (the kubelet sets them in "
                            "every container of a pod); outside a pod pass --kubeconfig")


def test_etcd_outside_a_lab_names_the_flags_of_a_real_etcd(tmp_path: Path, monkeypatch) -> None:
    from meshctl.lab.namespaces import state

    monkeypatch.setattr(state, "LAB_ROOT", tmp_path / "no-labs")
    assert one_error(run("plan", "--backend", "etcd", "--node", "a")) == (
        "--etcd-endpoints: is not given and no lab is up (meshctl lab up -f FILE); a real etcd: --etcd-endpoints "
        "https://HOST:2379 --etcd-ca FILE --etcd-cert FILE --etcd-key FILE (or --etcd-user NAME "
        "--etcd-password-file FILE); a lab's: --lab NAME")


# --- 5. lab files: plan, or one line saying why not ----------------------------------------------

@pytest.mark.parametrize("name, node, message", [
    ("default.yaml", "a1", "is a lab file: nodes have no public_key (the lab's agents make them); run meshctl lab "
     "up -f {path}, then meshctl plan --backend etcd --lab ml --node a1"),
    ("dual-stack.yaml", "a1", "is a lab file: nodes have no public_key (the lab's agents make them); run meshctl "
     "lab up -f {path}, then meshctl plan --backend etcd --lab ds --node a1"),
    ("fabrics.yaml", "l1", "is a lab file: nodes have no public_key (the lab's agents make them); run meshctl lab "
     "up -f {path}, then meshctl plan --backend etcd --lab mf --node l1"),
    ("ipv6-underlay.yaml", "a1", "is a lab file: nodes have no public_key (the lab's agents make them); run meshctl "
     "lab up -f {path}, then meshctl plan --backend etcd --lab v6u --node a1"),
    ("mixed-families.yaml", "a4", "is a lab file: nodes have no public_key (the lab's agents make them); run "
     "meshctl lab up -f {path}, then meshctl plan --backend etcd --lab mx --node d1"),
    ("leaders.yaml", "a1", "is a lab file: nodes have no public_key (the lab's agents make them); run meshctl lab "
     "up -f {path}, then meshctl plan --backend etcd --lab ld --node a1"),
    ("nat.yaml", "pa", "is a lab file: nodes have no public_key (the lab's agents make them); run meshctl lab "
     "up -f {path}, then meshctl plan --backend etcd --lab nt --node pa"),
    ("vms.yaml", "a1", "is a lab file: nodes have no public_key (the lab's agents make them); run meshctl lab "
     "up -f {path}, then meshctl plan --backend etcd --lab mv --node a1"),
    ("calico.yaml", "a1", "is a lab file: nodes have no public_key (the lab's agents make them); run meshctl lab "
     'up -f {path}, then meshctl plan --backend kubernetes --kubeconfig "$(meshctl lab kubeconfig --lab cal)" '
     "--node a1"),
    ("cilium.yaml", "a1", "is a lab file: nodes have no public_key (the lab's agents make them); run meshctl lab "
     'up -f {path}, then meshctl plan --backend kubernetes --kubeconfig "$(meshctl lab kubeconfig --lab cil)" '
     "--node a1"),
    ("flannel.yaml", "a1", "is a lab file: nodes have no public_key (the lab's agents make them); run meshctl lab "
     'up -f {path}, then meshctl plan --backend kubernetes --kubeconfig "$(meshctl lab kubeconfig --lab fl)" '
     "--node a1"),
    ("two-clusters.yaml", "a1", "is a lab file of 2 clusters (clusters: [...]) and a topology file is one "
     "cluster; run meshctl lab up -f {path}, then meshctl plan --backend etcd --lab mc --cluster-name cluster1 "
     "--node a1"),
    ("global-ranges.yaml", "a1", "is a lab file of 2 clusters (clusters: [...]) and a topology file is one "
     "cluster; run meshctl lab up -f {path}, then meshctl plan --backend etcd --lab gn --cluster-name cluster1 "
     "--node a1"),
    ("global-services.yaml", "a1", "is a lab file of 2 clusters (clusters: [...]) and a topology file is one "
     "cluster; run meshctl lab up -f {path}, then meshctl plan --backend kubernetes --kubeconfig "
     '"$(meshctl lab kubeconfig --lab gs --cluster-name cluster1)" --node a1'),
])
def test_each_shipped_lab_file_says_why_it_does_not_plan(name: str, node: str, message: str) -> None:
    path = str(LABS / name)
    assert one_error(run("plan", "-f", path, "--node", node)) == f"{name}: {message.format(path=path)}"


def test_shipped_lab_files_are_all_covered() -> None:
    assert sorted(p.name for p in LABS.glob("*.yaml")) == [
        "calico.yaml", "cilium.yaml", "default.yaml", "dual-stack.yaml", "fabrics.yaml", "flannel.yaml",
        "global-ranges.yaml", "global-services.yaml", "ipv6-underlay.yaml", "leaders.yaml", "mixed-families.yaml",
        "nat.yaml", "two-clusters.yaml", "vms.yaml"]


@pytest.mark.parametrize("name, node, others", [
    ("vms.yaml", "a1", ("a2", "b1")),  # nodes[].kernel ignored
    ("mixed-families.yaml", "a4", ("a6", "d1")),  # nodes[].ip_families ignored
])
def test_lab_file_with_keys_plans_its_lab_fields_ignored(tmp_path: Path, name: str, node: str,
                                                         others: tuple[str, ...]) -> None:
    d = yaml.safe_load((LABS / name).read_text())
    for i, n in enumerate(d["nodes"]):
        n["public_key"] = base64.b64encode(bytes([i + 1]) * 32).decode()
    r = run("plan", "-f", write(tmp_path, d, name), "--node", node)
    assert r.exit_code == 0, r.output
    assert all(o in r.stdout for o in others)
