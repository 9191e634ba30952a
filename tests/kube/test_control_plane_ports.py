# SPDX-License-Identifier: Apache-2.0
"""The tests' control plane on this host's loopback picks free ports for its etcd; a port another
socket takes before etcd binds it (an outgoing connection's source port on a busy host: a
Kubernetes fixture's etcd exited so under make test, 2026-12-07) is not a failed start: etcd is
started again on new ports (kube_control_plane.PORT_TRIES)."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from meshctl.lab.rigs import kube_control_plane

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_an_etcd_port_taken_before_etcd_binds_it_is_picked_again(tmp_path, monkeypatch) -> None:
    taken = socket.create_server(("127.0.0.1", 0))
    busy = taken.getsockname()[1]
    real = kube_control_plane.free_port

    def picks() -> Iterator[int]:
        yield busy  # the first pick of etcd's client port is already someone's
        while True:
            yield real("127.0.0.1")

    it = picks()
    monkeypatch.setattr(kube_control_plane, "free_port", lambda host="127.0.0.1": next(it))
    cp = kube_control_plane.ControlPlane(tmp_path / "cp", port=real("127.0.0.1"))  # the API server's own
    try:
        cp.start()
        assert cp.etcd is not None and cp.etcd.port != busy
        assert "address already in use" in (tmp_path / "cp" / "etcd.log").read_text()  # the first start's
    finally:
        cp.stop()
        taken.close()
