# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the Kubernetes tests: a real in-process API server on 127.0.0.1 with the Namespace
and Peer CRD of manifests/ created through it, and a lightkube client of it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lightkube import Client, KubeConfig
from lightkube.config.models import Cluster, User

from meshctl.lab.rigs.kube_apiserver import ApiServer, load_manifests

from .helpers import MANIFESTS


@pytest.fixture
def api() -> Iterator[ApiServer]:
    srv = ApiServer("127.0.0.1", 0).start()
    load_manifests(srv.store, [str(MANIFESTS / "00-namespace.yaml"), str(MANIFESTS / "01-crd-peers.yaml")])
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def kclient(api: ApiServer) -> Iterator[Client]:
    c = Client(KubeConfig.from_one(cluster=Cluster(server=api.url), user=User()), trust_env=False)
    yield c
    c._client._client.close()
