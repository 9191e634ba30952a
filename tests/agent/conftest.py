"""An etcd with mTLS inside a namespace of this test run, and clients for it."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from meshctl import netns
from meshctl.etcd import pki
from meshctl.etcd.process import EtcdServer


@pytest.fixture
def etcd_tls(request: pytest.FixtureRequest) -> Iterator[tuple[EtcdServer, pki.CertFiles]]:
    """(server, client cert): etcd on 10.99.0.1 inside `ma<pid>e-<n>`, client-cert auth on."""
    ns = f"ma{os.getpid() % 10000}e{abs(hash(request.node.name)) % 1000}"
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


def wait_for(pred: Callable[[], Any], timeout: float = 5.0, step: float = 0.02) -> Any:
    """pred()'s first truthy value within `timeout` s (else its last value)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(step)
    return pred()
