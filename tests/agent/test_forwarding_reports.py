# SPDX-License-Identifier: Apache-2.0
"""Forwarding reports in etcd (mesh/leaders.py, agent/leadership.py): a node writes only its own,
on its record's lease; every agent's view holds them, refuses one that names another node; a
changed verdict wakes the watchers and a heartbeat that only moves the report's time does not."""

from __future__ import annotations

import json
import threading

import pytest

from meshctl.backends.etcd import EtcdBackend, forwarding_key
from meshctl.etcd import PermissionDenied
from meshctl.mesh.leaders import ForwardingReport, Judged
from meshctl.mesh.model import Cluster

from .conftest import wait_for
from .test_identity import AuthEtcd, node


def report(name: str, at: float, verdict: str = "ok") -> ForwardingReport:
    return ForwardingReport(name, "c1", at, {"n9": Judged(verdict, 1.0)})  # type: ignore[arg-type]


@pytest.mark.root
def test_reports_on_the_lease_own_key_only_and_heartbeats_wake_nobody(etcd_tls) -> None:
    auth = AuthEtcd(*etcd_tls)
    n1, n2, admin = auth.client("n1"), auth.client("n2"), auth.client("admin")
    writer = EtcdBackend(n1, Cluster("c1", 1), lease_ttl=5)
    writer.publish(node("n1", 1))
    watcher = EtcdBackend(n2, Cluster("c1", 1), lease_ttl=5)
    wakes: list[int] = []
    stop = threading.Event()
    t = threading.Thread(target=watcher.run, args=(stop, lambda: wakes.append(1)), daemon=True)
    t.start()
    try:
        assert wait_for(lambda: watcher.snapshot().ready and wakes)
        writer.publish_forwarding(report("n1", 10.0))
        assert wait_for(lambda: "n1" in watcher.snapshot().forwarding)
        kv = admin.get(forwarding_key("c1", "n1"))
        assert kv is not None and kv.lease == admin.get("/meshctl/c1/nodes/n1").lease != 0
        assert watcher.snapshot().forwarding["n1"] == report("n1", 10.0)
        # A heartbeat (the same verdicts, a later time) is mirrored without waking the agent ...
        woke = len(wakes)
        writer.publish_forwarding(report("n1", 15.0))
        assert wait_for(lambda: watcher.snapshot().forwarding["n1"].at == 15.0)
        assert len(wakes) == woke
        # ... a changed verdict wakes it.
        writer.publish_forwarding(report("n1", 16.0, "bad"))
        assert wait_for(lambda: len(wakes) > woke)
        assert watcher.snapshot().forwarding["n1"].verdicts["n9"].verdict == "bad"
        # n2's credentials cannot write n1's report; a report naming another node than its key
        # (the operator's credentials here, as no node's could) is a rejection, the rest stand.
        with pytest.raises(PermissionDenied):
            n2.put(forwarding_key("c1", "n1"), json.dumps(report("n1", 20.0, "bad").to_json()))
        admin.put(forwarding_key("c1", "n3"), json.dumps(report("n1", 20.0).to_json()))
        assert wait_for(lambda: any(r.name == "forwarding/n3" for r in watcher.snapshot().rejections))
        snap = watcher.snapshot()
        assert set(snap.forwarding) == {"n1"}
        assert "does not match the key" in next(r.reason for r in snap.rejections if r.name == "forwarding/n3")
    finally:
        stop.set()
        watcher.close()
        writer.close()
