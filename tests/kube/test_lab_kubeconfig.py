# SPDX-License-Identifier: Apache-2.0
"""`meshctl lab kubeconfig [--lab NAME] [--cluster-name C]`: the path of the host kubeconfig of a lab's
API server, chosen from the lab's state file; a one-line error and exit 2 when the lab, the
cluster or its API server is not there, or when two clusters leave the choice open. Two real
control planes stand for the clusters' (the lab e2e test runs the real lab)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from meshctl.lab.namespaces import state
from meshctl.lab.namespaces.state import ClusterState, EtcdAccess, KubeAccess, LabState
from tests.kubernetes import start_control_plane
from tests.names import unique

from .kubectl import Kubectl, lab_kubeconfig

pytestmark = [pytest.mark.root, pytest.mark.slow]


def meshctl(*args: str) -> subprocess.CompletedProcess[str]:
    return lab_kubeconfig(args[1], *args[2:])


@pytest.fixture(scope="module")
def two_cluster_lab(tmp_path_factory):
    """A lab state naming two clusters whose API servers run (the last test stops one's)."""
    tmp_path = tmp_path_factory.mktemp("two-clusters")
    if os.geteuid() != 0:
        pytest.fail("needs root for the lab's state folder")
    name = unique("ka")
    servers = [start_control_plane(tmp_path / f"kube-{i}", manifests=()) for i in range(2)]
    clusters = []
    for i, cp in enumerate(servers):
        cfg = str(cp.admin_kubeconfig)
        kube = KubeAccess(url=cp.url, kubeconfig=cfg, netns="", pid=cp.pids["apiserver"], host_kubeconfig=cfg,
                          ca=str(cp.ca), dir=str(cp.dir))
        clusters.append(ClusterState(name=f"c{i}", id=i + 1, etcd=EtcdAccess([], "", "", ""), port=51820, kube=kube))
    st = LabState(name=name, prefix=name + "-", dir=str(tmp_path), clusters=clusters)
    state.save(st)
    try:
        yield st, servers
    finally:
        for srv in servers:
            srv.stop()
        shutil.rmtree(state.lab_dir(name), ignore_errors=True)


def test_kubeconfig_picks_the_cluster_and_kubectl_reaches_it(two_cluster_lab, tmp_path):
    st, servers = two_cluster_lab
    r = meshctl("--lab", st.name, "--cluster-name", "c1")
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip())
    assert path == Path(st.clusters[1].kube.host_kubeconfig)
    # issue 21's spelling: the same path on stdout, the grammar's deprecation line on stderr
    old = meshctl("--lab", st.name, "--cluster", "c1")
    assert old.returncode == 0 and Path(old.stdout.strip()) == path
    assert old.stderr == "meshctl: --cluster is deprecated; use --cluster-name\n"
    servers[1].request("POST", "/api/v1/nodes",
                       {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "only-in-c1"}})
    k = Kubectl(path, tmp_path)
    assert "only-in-c1" in k("get", "nodes")


@pytest.mark.parametrize(("args", "words"), [
    pytest.param([], "has 2 clusters (c0, c1): pass --cluster-name", id="two-clusters-none-named"),
    pytest.param(["--cluster-name", "zz"], "--cluster-name: 'zz' is not a Kubernetes cluster of lab",
                 id="unknown-cluster"),
])
def test_kubeconfig_choice_errors(two_cluster_lab, args, words):
    st, _ = two_cluster_lab
    r = meshctl("--lab", st.name, *args)
    assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_kubeconfig_of_a_lab_that_is_not_up():
    r = meshctl("--lab", unique("ka"))
    assert r.returncode == 2 and "is not up" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_kubeconfig_of_a_stopped_api_server(two_cluster_lab):
    st, _ = two_cluster_lab
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    st.clusters[0].kube.pid = int(dead.stdout)
    state.save(st)
    r = meshctl("--lab", st.name, "--cluster-name", "c0")
    assert r.returncode == 2 and "has no API server running" in r.stderr, r.stderr


def test_kubeconfig_of_an_etcd_lab(tmp_path):
    if os.geteuid() != 0:
        pytest.fail("needs root for the lab's state folder")
    name = unique("ka")
    st = LabState(name=name, prefix=name + "-", dir=str(tmp_path),
                  clusters=[ClusterState(name="default", id=1, etcd=EtcdAccess([], "", "", ""), port=51820)])
    state.save(st)
    try:
        r = meshctl("--lab", name)
        assert r.returncode == 2 and f"--lab: '{name}' has no Kubernetes API server (its lab.backend is etcd)" \
            in r.stderr, r.stderr
    finally:
        shutil.rmtree(state.lab_dir(name), ignore_errors=True)
