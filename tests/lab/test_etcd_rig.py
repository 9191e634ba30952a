# SPDX-License-Identifier: Apache-2.0
"""The labs' etcd process (lab/rigs/etcd_process.py): one that exits at start says why in its
error, with its log's last error line and where the log is (a Kubernetes fixture's etcd exited at
start in the 14:35 run, and "see its log" named no log and no cause)."""

from __future__ import annotations

import pytest

from meshctl.errors import MeshError
from meshctl.lab.rigs.etcd_process import EtcdServer
from tests.plain_etcd import HOST, plain_etcd

pytestmark = pytest.mark.root


def test_an_etcd_that_exits_at_start_names_its_error_and_its_log(tmp_path) -> None:
    with plain_etcd("etr") as first:
        # its own client port, the first one's peer port: it cannot listen
        second = EtcdServer("t2", tmp_path / "data", host=HOST, port=first.port + 100, peer_port=first.peer_port,
                            netns=first.netns, log_file=tmp_path / "etcd.log")
        with pytest.raises(MeshError) as e:
            second.start(wait=30)
    msg = str(e.value)
    assert msg.startswith("etcd t2 exited with 1: ") and "address already in use" in msg, msg
    assert msg.endswith(f"({tmp_path / 'etcd.log'})")
