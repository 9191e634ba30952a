# SPDX-License-Identifier: Apache-2.0
"""--secure-metrics-addr against a real API server: /metrics answers only tokens whose user the
cluster's RBAC lets get /metrics (TokenReview, SubjectAccessReview: kube-rbac-proxy's way),
/healthz and /readyz answer anyone, nothing else is served there."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import requests
import yaml

from meshctl.agent.secure_metrics import SecureMetricsServer, self_signed
from meshctl.backends.kube.authn import DelegatedAuth
from tests.agent.test_local_agent import free_port
from tests.kubernetes import MANIFESTS, Api

pytestmark = pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")


def reader_role() -> dict:
    docs = yaml.safe_load_all((MANIFESTS / "02-rbac.yaml").read_text())
    return next(d for d in docs
                if d and d["kind"] == "ClusterRole" and d["metadata"]["name"] == "meshctl-metrics-reader")


@pytest.fixture
def served(api: Api, tmp_path) -> Iterator[tuple[str, Api]]:
    cert, key = self_signed(tmp_path / "tls", "meshctl-agent.n1")
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    auth = DelegatedAuth(api.client(), api.url)
    srv = SecureMetricsServer(f"127.0.0.1:{free_port()}", cert, key, lambda: b"meshctl_up 1\n", auth,
                              lambda: True, lambda: False)
    srv.start()
    try:
        yield f"https://127.0.0.1:{srv.address[1]}", api
    finally:
        srv.stop()


def get(url: str, token: str | None = None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.get(url, headers=headers, verify=False, timeout=10)  # noqa: S501 - self-signed, as kube-rbac-proxy's


def test_metrics_follow_the_clusters_rbac(served) -> None:
    url, api = served
    api.apply(reader_role(),
              {"apiVersion": "v1", "kind": "ServiceAccount",
               "metadata": {"name": "prometheus", "namespace": "default"}},
              {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "nobody", "namespace": "default"}},
              {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": "prometheus-reads-meshctl"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                           "name": "meshctl-metrics-reader"},
               "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "default"}]})
    prom = api.cp.create_token("prometheus", "default", seconds=600)
    nobody = api.cp.create_token("nobody", "default", seconds=600)
    r = get(url + "/metrics", prom)
    assert r.status_code == 200 and r.text == "meshctl_up 1\n"
    r = get(url + "/metrics", nobody)
    assert r.status_code == 403 and r.text == "system:serviceaccount:default:nobody may not get /metrics\n"
    assert get(url + "/metrics").status_code == 401
    assert get(url + "/metrics", "not-a-token").status_code == 401
    assert get(url + "/healthz").status_code == 200
    assert get(url + "/readyz").status_code == 503  # not ready: says so to anyone, nothing more
    assert get(url + "/status", prom).status_code == 404


def test_plain_http_to_the_tls_port_gets_nothing(served) -> None:
    url, _ = served
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        assert b"meshctl_up" not in s.recv(4096)
    assert get(url + "/healthz").status_code == 200  # and the server goes on
