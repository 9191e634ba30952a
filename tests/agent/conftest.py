# SPDX-License-Identifier: Apache-2.0
"""An etcd with mTLS inside a namespace of this test run, and clients for it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshctl.lab.rigs import netns, pki
from meshctl.lab.rigs.etcd_process import EtcdServer
from tests.names import unique
from tests.waiting import wait_for  # noqa: F401 - re-exported for the tests here


@pytest.fixture
def etcd_tls(request: pytest.FixtureRequest) -> Iterator[tuple[EtcdServer, pki.CertFiles]]:
    """(server, client cert): etcd on 10.99.0.1 inside `ma<pid>e-<n>`, client-cert auth on."""
    ns = unique("ma")
    d = Path(f"/run/meshctl-test/{ns}")
    netns.add(ns)
    try:
        netns.run(ns, ["ip", "addr", "add", "10.99.0.1/32", "dev", "lo"])
        ca = pki.make_ca(d / "pki")
        server = pki.make_cert(ca, d / "pki", "etcd", server=True, hosts=("10.99.0.1",))
        client = pki.make_cert(ca, d / "pki", "client")
        srv = EtcdServer("t", d / "data", host="10.99.0.1", netns=ns, tls=server, log_file=d / "etcd.log")
        srv.start(client_tls=client)
        try:
            yield srv, client
        finally:
            srv.stop()
    finally:
        netns.delete(ns)
        shutil.rmtree(d, ignore_errors=True)


