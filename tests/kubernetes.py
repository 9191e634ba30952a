# SPDX-License-Identifier: Apache-2.0
"""The tests' Kubernetes: one real control plane per test session (kube-apiserver and
kube-controller-manager v1.32.6 with etcd, lab.rigs.kube_control_plane), the way controller-runtime's
envtest gives each suite one, reset between tests.

`kube` (session) is the ControlPlane with manifests/'s Namespace and Peer CRD applied; `api` (each
test) is an `Api` over it after `reset` removed what earlier tests left (Nodes, Peers, the mesh's
ConfigMaps and Secrets, Services and EndpointSlices, CRDs other than the baseline, namespaces
other than the baseline). Tests that must break the control plane itself (stop it, restart it,
compact its etcd) take `own_kube`, a control plane of their own.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client, KubeConfig

from meshctl.errors import MeshError
from meshctl.lab.namespaces.kube_cluster import wait_established
from meshctl.lab.rigs.kube_control_plane import ControlPlane
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ROOT / "manifests"
BASE_MANIFESTS = ("00-namespace.yaml", "01-crd-peers.yaml")
BASE_NAMESPACES = frozenset({"default", "kube-system", "kube-public", "kube-node-lease", "meshctl"})
BASE_CRDS = frozenset({"peers.meshctl.io"})
# Objects the control plane makes by itself in every namespace: kept by reset.
KEEP_CONFIGMAPS = frozenset({"kube-root-ca.crt", "openshift-service-ca.crt"})


def kubectl(kubeconfig: Path | str, *args: str, input: str | None = None, check: bool = True,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """This machine's kubectl against a test control plane."""
    p = subprocess.run(["kubectl", "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True,
                       input=input, timeout=timeout, check=False)
    if check and p.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {p.stderr.strip()}")
    return p


def start_control_plane(directory: Path, manifests: tuple[str, ...] = BASE_MANIFESTS, **kw: Any) -> ControlPlane:
    """A started control plane with `manifests` (names under manifests/) applied, or a test
    failure with the one line that says why it could not start (never a skip)."""
    try:
        cp = ControlPlane(directory, **kw).start()
    except MeshError as e:
        pytest.fail(f"the Kubernetes control plane did not start: {e}", pytrace=False)
    try:
        for m in manifests:
            kubectl(cp.admin_kubeconfig, "apply", "--server-side", "-f", str(MANIFESTS / m))
        if "01-crd-peers.yaml" in manifests:
            wait_established(lambda args: kubectl(cp.admin_kubeconfig, *args), "peers.meshctl.io")
        # The controller manager makes each namespace's `default` ServiceAccount moments after
        # start; until then Pods are refused. Every test starts after it.
        wait_until(lambda: _has_default_account(cp), 60, "the default ServiceAccount")
    except BaseException:
        cp.stop()
        raise
    return cp


def _has_default_account(cp: ControlPlane) -> bool:
    try:
        cp.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
    except MeshError:
        return False
    return True


@dataclass
class Api:
    """One test's view of a control plane: its URL, the admin kubeconfig, clients."""

    cp: ControlPlane

    @property
    def url(self) -> str:
        return self.cp.url

    @property
    def kubeconfig(self) -> str:
        return str(self.cp.admin_kubeconfig)

    def client(self) -> Client:
        return Client(KubeConfig.from_file(self.kubeconfig), trust_env=False, field_manager="test")

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return kubectl(self.kubeconfig, *args, input=input, check=check)

    def apply(self, *docs: dict[str, Any]) -> None:
        """Apply objects as an operator would (server-side apply through kubectl)."""
        import yaml

        self.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(list(docs)))

    def reset(self) -> None:
        """Remove what tests create, and wait until it is gone."""
        cp = self.cp
        for crd in cp.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]:
            name = crd["metadata"]["name"]
            if name not in BASE_CRDS:
                cp.request("DELETE", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        for ns in cp.request("GET", "/api/v1/namespaces")["items"]:
            name = ns["metadata"]["name"]
            if name not in BASE_NAMESPACES and not ns["metadata"].get("deletionTimestamp"):
                cp.request("DELETE", f"/api/v1/namespaces/{name}")
        cp.request("DELETE", "/api/v1/nodes")
        cp.request("DELETE", "/apis/meshctl.io/v1alpha1/peers")
        for ns in ("default", "meshctl"):
            for cm in cp.request("GET", f"/api/v1/namespaces/{ns}/configmaps")["items"]:
                if cm["metadata"]["name"] not in KEEP_CONFIGMAPS:
                    cp.request("DELETE", f"/api/v1/namespaces/{ns}/configmaps/{cm['metadata']['name']}")
            for kind in ("secrets", "services", "pods"):
                for o in cp.request("GET", f"/api/v1/namespaces/{ns}/{kind}")["items"]:
                    if kind == "services" and o["metadata"]["name"] == "kubernetes":
                        continue
                    q = "?gracePeriodSeconds=0" if kind == "pods" else ""
                    cp.request("DELETE", f"/api/v1/namespaces/{ns}/{kind}/{o['metadata']['name']}{q}")
            cp.request("DELETE", f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices")
            cp.request("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases")
        wait_until(self._clean, 60, "the test control plane to be reset", step=0.1)

    def _clean(self) -> bool:
        cp = self.cp
        if cp.request("GET", "/api/v1/nodes")["items"]:
            return False
        crds = {c["metadata"]["name"] for c in
                cp.request("GET", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions")["items"]}
        if crds - BASE_CRDS:
            return False
        nss = {n["metadata"]["name"] for n in cp.request("GET", "/api/v1/namespaces")["items"]}
        return not nss - BASE_NAMESPACES


def running_control_plane(directory: Path) -> Iterator[ControlPlane]:
    """A fixture's body: a started control plane (start_control_plane), stopped after."""
    cp = start_control_plane(directory)
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    yield from running_control_plane(tmp_path_factory.mktemp("kube"))


@pytest.fixture
def api(kube: ControlPlane) -> Iterator[Api]:
    a = Api(kube)
    a.reset()
    yield a


@pytest.fixture
def own_kube(tmp_path: Path) -> Iterator[Api]:
    """A control plane of this test's own (for faults that would break the shared one)."""
    cp = start_control_plane(tmp_path / "kube")
    try:
        yield Api(cp)
    finally:
        cp.stop()


@pytest.fixture
def kclient(api: Api) -> Iterator[Client]:
    c = api.client()
    yield c
    c._client._client.close()
