# SPDX-License-Identifier: Apache-2.0
"""The etcd client and backend against a real etcd with client-cert auth (in a test namespace)."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
import threading
import time

import pytest

from meshctl.backends.etcd import EtcdBackend, mesh_key, node_key, write_topology
from meshctl.etcd import EtcdClient, EtcdError
from meshctl.mesh import records
from meshctl.mesh.model import Cluster, MeshSettings, Node
from tests.waiting import wait_until

from .conftest import wait_for

pytestmark = pytest.mark.root


def key(i: int) -> str:
    return base64.b64encode(i.to_bytes(32, "big")).decode()


def node(name: str, i: int, **kw) -> Node:
    import ipaddress

    return Node(name=name, pod_cidrs=(ipaddress.ip_network(f"10.42.{i}.0/24"),), public_key=key(i), **kw)


def test_kv_txn_lease_watch_over_mtls(etcd_tls):
    srv, cert = etcd_tls
    c = srv.client(cert)
    rev = c.put("/t/a", "1")
    kvs, now = c.range("/t/", prefix=True)
    assert [(k.key, k.value) for k in kvs] == [("/t/a", b"1")] and now == rev
    assert c.put_if_absent("/t/a", "2") is False
    assert c.put_if_absent("/t/b", "2") is True
    assert c.get("/t/a").value == b"1"
    lease = c.lease_grant(2)
    c.put("/t/leased", "x", lease=lease)
    assert c.lease_keepalive(lease) == 2
    events = []

    def watch():
        try:
            for _, evs in c.watch("/t/", prefix=True, start_revision=rev + 1, idle_timeout=5):
                events.extend(evs)
        except EtcdError:
            pass

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    assert c.delete("/t/a") == 1
    # The lease runs out without keepalives: its key goes, and the watch sees both deletes.
    got = wait_for(lambda: [e.kv.key for e in events if e.type == "DELETE"])
    assert wait_for(lambda: len([e for e in events if e.type == "DELETE"]) == 2), got
    assert {e.kv.key for e in events if e.type == "PUT"} == {"/t/b", "/t/leased"}
    c.abort_watch()


IDLE_S = 30.0


def blocked_reading(t: threading.Thread) -> bool:
    """Whether thread `t` is inside a socket read (its innermost Python frame is ssl's or socket's
    read): blocked on a stream that has nothing to give."""
    frame = sys._current_frames().get(t.ident or 0)
    return frame is not None and frame.f_code.co_name in ("read", "recv_into", "readinto", "recv") \
        and frame.f_code.co_filename.endswith(("/ssl.py", "/socket.py"))


def test_abort_watch_ends_a_blocked_watch_at_once(etcd_tls):
    """A stopping agent closes its watch from another thread: the reader must not wait for its
    idle timeout."""
    srv, cert = etcd_tls
    c = srv.client(cert)
    rev = c.put("/t/idle/x", "1")
    seen, ended = threading.Event(), threading.Event()

    def watch():
        try:
            for _ in c.watch("/t/idle/", prefix=True, start_revision=rev, idle_timeout=IDLE_S):
                seen.set()
        except EtcdError:
            pass
        ended.set()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    assert seen.wait(30), "the watch delivered the first put"
    wait_until(lambda: blocked_reading(t), 30, "the reader blocked on the idle stream")
    c.abort_watch()
    # well inside the idle timeout (30 s), which is what a reader not woken would wait out
    assert ended.wait(IDLE_S / 2), "the watch ended only at its idle timeout, not at abort_watch"
    t.join(1)


def test_client_cert_is_required(etcd_tls):
    srv, cert = etcd_tls
    no_cert = EtcdClient([srv.url], ca=str(cert.ca), netns=srv.netns, timeout=1)
    with pytest.raises(EtcdError):
        no_cert.put("/t/x", "1")
    assert not no_cert.health()
    assert stat.S_IMODE(os.stat(cert.key).st_mode) == 0o600


def test_backend_publishes_watches_and_rejects_bad_records(etcd_tls):
    srv, cert = etcd_tls
    c = srv.client(cert)
    write_topology(c, Cluster("c1", 3), MeshSettings(granularity="full"))
    b = EtcdBackend(srv.client(cert), Cluster("c1", 3), lease_ttl=2)
    stop = threading.Event()
    wakes = []
    t = threading.Thread(target=b.run, args=(stop, lambda: wakes.append(1)), daemon=True)
    t.start()
    try:
        b.publish(node("n1", 1))
        st = wait_for(lambda: (s := b.snapshot()).ready and s.nodes and s)
        assert [n.name for n in st.nodes] == ["n1"] and st.mesh.granularity == "full"
        # Bad records: each one is a rejection naming the key; the good ones still come through.
        c.put(node_key("c1", "junk"), "{not json")
        c.put(node_key("c1", "badcidr"), json.dumps({"name": "badcidr", "pod_cidr": "10.42.9.0/33",
                                                     "public_key": key(9)}))
        c.put(node_key("c1", "other"), json.dumps({"name": "renamed", "pod_cidr": "10.42.8.0/24",
                                                   "public_key": key(8)}))
        c.put(node_key("c1", "n2"), json.dumps(records.node_to_record(node("n2", 2))))
        st = wait_for(lambda: len((s := b.snapshot()).rejections) == 3 and len(s.nodes) == 2 and s)
        reasons = {r.name: r.reason for r in st.rejections}
        assert "is not JSON" in reasons["junk"]
        assert "10.42.9.0/33" in reasons["badcidr"] and "is not a CIDR" in reasons["badcidr"]
        assert "does not match the key" in reasons["other"]
        assert [n.name for n in st.nodes] == ["n1", "n2"]  # creation order: older first
        # Mesh settings change at run time.
        c.put(mesh_key("c1"), json.dumps({"granularity": "cross"}))
        assert wait_for(lambda: b.snapshot().mesh.granularity == "cross")
        # Keepalives hold the record past its TTL (the experiment: 1.5 TTLs).
        time.sleep(3)
        assert c.get(node_key("c1", "n1")) is not None
    finally:
        stop.set()
        b.close()
        t.join(3)
    # With the agent gone the lease expires and the record disappears by itself.
    assert wait_for(lambda: c.get(node_key("c1", "n1")) is None)
    assert c.get("/meshctl/c1/cluster") is not None


def test_backend_reports_outage_and_resyncs(etcd_tls):
    srv, cert = etcd_tls
    b = EtcdBackend(srv.client(cert), Cluster("c2", 1), lease_ttl=3)
    stop = threading.Event()
    t = threading.Thread(target=b.run, args=(stop, lambda: None), daemon=True)
    t.start()
    try:
        b.publish(node("n1", 1))
        assert wait_for(lambda: b.snapshot().ready and b.snapshot().nodes)
        srv.stop()
        st = wait_for(lambda: not (s := b.snapshot()).ready and s)
        assert st.reason and [n.name for n in st.nodes] == ["n1"]  # last good view kept
        srv.start(client_tls=cert)
        c = srv.client(cert)
        c.put(node_key("c2", "n2"), json.dumps(records.node_to_record(node("n2", 2))))
        st = wait_for(lambda: (s := b.snapshot()).ready and len(s.nodes) == 2 and s)
        assert st and [n.name for n in st.nodes] == ["n1", "n2"]
    finally:
        stop.set()
        b.close()
        t.join(3)


def test_lines_of_a_stream_whatever_the_chunks() -> None:
    from meshctl.etcd.client import stream_lines

    text = b'{"a": 1}\n\n{"b": "' + b"x" * 5000 + b'"}\n{"c": 3}'
    for size in (1, 7, 512, 4096, len(text)):
        chunks = [text[i:i + size] for i in range(0, len(text), size)]
        assert list(stream_lines(chunks)) == [b'{"a": 1}', b'{"b": "' + b"x" * 5000 + b'"}', b'{"c": 3}'], size


def test_a_huge_record_is_refused_unread_and_delays_no_one(etcd_tls):
    """A 1.4 MB value under a node key is one rejection naming its size; a node put right after it
    shows up in the same way as without it (the watch reads the 1.9 MB event line at once)."""
    from meshctl.backends.etcd import MAX_RECORD_BYTES

    srv, cert = etcd_tls
    c = srv.client(cert)
    write_topology(c, Cluster("c1", 3), MeshSettings())
    b = EtcdBackend(srv.client(cert), Cluster("c1", 3), lease_ttl=5)
    stop = threading.Event()
    t = threading.Thread(target=b.run, args=(stop, lambda: None), daemon=True)
    t.start()
    try:
        assert wait_for(lambda: b.snapshot().ready)
        c.put(node_key("c1", "huge"), b"{" + b" " * 1_400_000 + b"}")
        c.put(node_key("c1", "n2"), json.dumps(records.node_to_record(node("n2", 2))))
        st = wait_for(lambda: (s := b.snapshot()).nodes and s)
        assert [n.name for n in st.nodes] == ["n2"]
        [r] = st.rejections
        assert r.name == "huge" and "'1400002 bytes' is larger than a record may be" in r.reason, r
        assert str(MAX_RECORD_BYTES) in r.reason
    finally:
        stop.set()
        b.close()
        t.join(3)


def test_connections_follow_a_namespace_recreated_under_the_same_name():
    """A namespace deleted and made again under its name: connections go to the new one, and the
    thread kept inside the old one ends (it would otherwise keep the dead namespace alive)."""
    import socket

    from meshctl.etcd import nsconn
    from meshctl.lab.rigs import netns
    from tests.names import unique

    ns = unique("mac")

    def listen_and_connect(addr: str) -> str:
        netns.add(ns)
        netns.run(ns, ["ip", "link", "set", "lo", "up"])
        netns.run(ns, ["ip", "addr", "add", f"{addr}/32", "dev", "lo"])
        srv = nsconn.ns_socket(ns)
        try:
            srv.bind((addr, 7000))
            srv.listen(1)
            conn = nsconn.ns_create_connection(ns, (addr, 7000), timeout=2)
            name = conn.getsockname()[0]
            conn.close()
            return name
        finally:
            srv.close()

    try:
        assert listen_and_connect("10.98.0.1") == "10.98.0.1"
        netns.delete(ns)
        assert listen_and_connect("10.98.0.2") == "10.98.0.2"
        netns.delete(ns)
        with pytest.raises(Exception, match="does not exist"):
            nsconn.ns_socket(ns)
        assert wait_for(lambda: not [t for t in threading.enumerate() if t.name.startswith(f"netns-{ns}_")],
                        timeout=30)
    finally:
        nsconn.release(ns)
        netns.delete(ns)
        socket.setdefaulttimeout(None)
