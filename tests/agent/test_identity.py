# SPDX-License-Identifier: Apache-2.0
"""Identities in a real etcd with auth on: a node writes only its own record, a remote cluster
only reads, the operator does everything; an agent puts its record back when someone else deletes
or changes it; a record whose lease ran out stays through the lapse grace, a withdrawn one does not."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshctl.backends import etcd_identity as identity
from meshctl.backends.etcd import EtcdBackend, mesh_key, node_key, withdraw_record, write_topology
from meshctl.errors import InputError
from meshctl.etcd import EtcdClient, PermissionDenied
from meshctl.lab.rigs import pki
from meshctl.mesh import records
from meshctl.mesh.model import Cluster, MeshSettings, Node

from .conftest import wait_for

pytestmark = pytest.mark.root


def node(name: str, i: int) -> Node:
    import ipaddress

    return Node(name=name, pod_cidrs=(ipaddress.ip_network(f"10.42.{i}.0/24"),),
                public_key=base64.b64encode(i.to_bytes(32, "big")).decode())


class AuthEtcd:
    """The test etcd with users provisioned for cluster c1 (nodes n1, n2; reader cluster c2) and auth on."""

    def __init__(self, srv: Any, cert: pki.CertFiles) -> None:
        self.srv = srv
        d = Path(cert.cert).parent
        self.ca = pki.make_ca(d)  # the fixture's CA (reused from its directory)
        self.ids: dict[str, tuple[str, Path, pki.CertFiles]] = {}
        for who, user in (("admin", identity.ADMIN_USER), ("n1", "n1"), ("n2", "n2"),
                          ("c2", identity.remote_user("c2")), ("cache", identity.CACHE_USER),
                          ("kvstore", identity.KVSTORE_USER)):
            c = pki.make_cert(self.ca, d, f"id-{who}", common_name=False)
            self.ids[who] = (user, identity.new_password(d / f"id-{who}.password"), c)
        plain = self.client("admin", auth=False)
        write_topology(plain, Cluster("c1", 1), MeshSettings())
        identity.provision(plain, "c1", admin_password=self.ids["admin"][1],
                           nodes={"n1": self.ids["n1"][1], "n2": self.ids["n2"][1]},
                           readers={"c2": self.ids["c2"][1]}, kvstore=self.ids["kvstore"][1],
                           cache=self.ids["cache"][1])

    def client(self, who: str, *, auth: bool = True) -> EtcdClient:
        user, pw, c = self.ids[who]
        return EtcdClient([self.srv.url], ca=str(c.ca), cert=str(c.cert), key=str(c.key), netns=self.srv.netns,
                          user=user if auth else None, password_file=str(pw) if auth else None)


@pytest.fixture
def auth_etcd(etcd_tls) -> Iterator[AuthEtcd]:
    yield AuthEtcd(*etcd_tls)


def test_each_identity_may_do_only_its_part(auth_etcd: AuthEtcd) -> None:
    n1, n2, c2, admin = (auth_etcd.client(w) for w in ("n1", "n2", "c2", "admin"))
    rec = json.dumps(records.node_to_record(node("n1", 1)))
    n1.put(node_key("c1", "n1"), rec, lease=n1.lease_grant(5))
    # n2's credentials: reads its cluster, writes its own record, and nothing else.
    assert n2.get(node_key("c1", "n1")) is not None
    n2.put(node_key("c1", "n2"), json.dumps(records.node_to_record(node("n2", 2))))
    for attempt in (lambda: n2.put(node_key("c1", "n1"), "{}"), lambda: n2.delete(node_key("c1", "n1")),
                    lambda: n2.put(mesh_key("c1"), "{}"), lambda: n2.put(node_key("c1", "n3"), "{}"),
                    lambda: n2.put_if_absent(node_key("c1", "n1"), "{}")):
        with pytest.raises(PermissionDenied, match="permission denied"):
            attempt()
    assert auth_etcd.client("admin").get(node_key("c1", "n1")).value.decode() == rec
    # The reader cluster's credentials read and never write.
    assert c2.get(node_key("c1", "n1")) is not None
    with pytest.raises(PermissionDenied):
        c2.put(node_key("c1", "n9"), "{}")
    # Without an identity etcd answers nothing; the operator may do everything.
    with pytest.raises(Exception, match="user name is empty"):
        auth_etcd.client("n1", auth=False).get(node_key("c1", "n1"))
    admin.put(mesh_key("c1"), json.dumps({"granularity": "full"}))
    # A node may not be called root: that is etcd's superuser.
    with pytest.raises(InputError, match="'root' is reserved"):
        identity.node_user("root")


def test_the_clustermesh_cache_alone_writes_its_prefix_and_agents_read_it(auth_etcd: AuthEtcd) -> None:
    from meshctl.backends.clustermesh_cache import cache_status_key, cached_key

    cache, n1, kv = auth_etcd.client("cache"), auth_etcd.client("n1"), auth_etcd.client("kvstore")
    mirrored = cached_key("c1", node_key("c9", "g1"))
    cache.put(mirrored, "{}")
    cache.put(cache_status_key("c1"), "{}", lease=cache.lease_grant(3))
    # node agents (etcd backend) and Kubernetes agents (their kvstore identity) read it, neither writes it
    for reader in (n1, kv):
        assert reader.get(mirrored) is not None and reader.get(cache_status_key("c1")) is not None
        for attempt in (lambda r=reader: r.put(mirrored, "{}"), lambda r=reader: r.delete(mirrored),
                        lambda r=reader: r.put(cache_status_key("c1"), "{}")):
            with pytest.raises(PermissionDenied):
                attempt()
    kvs, _ = cache.range("/meshctl/c1/", prefix=True)   # reads the local records it admits against
    assert any(kv.key == "/meshctl/c1/cluster" for kv in kvs)
    for attempt in (lambda: cache.put(node_key("c1", "n1"), "{}"), lambda: cache.put(cached_key("c2", "/x"), "{}")):
        with pytest.raises(PermissionDenied):
            attempt()


def test_a_deleted_or_overwritten_own_record_is_back_within_2s(auth_etcd: AuthEtcd) -> None:
    b = EtcdBackend(auth_etcd.client("n1"), Cluster("c1", 1), lease_ttl=5)
    stop = threading.Event()
    t = threading.Thread(target=b.run, args=(stop, lambda: None), daemon=True)
    t.start()
    admin = auth_etcd.client("admin")
    key = node_key("c1", "n1")
    try:
        b.publish(node("n1", 1))
        good = admin.get(key)
        assert good is not None and wait_for(lambda: b.snapshot().nodes)
        took = []
        for tamper in (lambda: admin.delete(key), lambda: admin.put(key, json.dumps(
                {"name": "n1", "pod_cidr": "10.42.9.0/24", "public_key": node("x", 9).public_key}))):
            t0 = time.monotonic()
            tamper()
            assert wait_for(lambda: (kv := admin.get(key)) is not None and kv.value == good.value
                            and kv.lease == good.lease), "not restored"
            took.append(time.monotonic() - t0)
        st = b.status().own_record
        assert st is not None and st.restored_total == 2 and "overwritten" in (st.last_restored or ""), st
        print(f"restored after {', '.join(f'{x * 1000:.0f} ms' for x in took)}")
    finally:
        stop.set()
        b.close()
        t.join(3)


def test_a_lapsed_record_stays_through_the_grace_and_a_withdrawn_one_goes_at_once(auth_etcd: AuthEtcd) -> None:
    grace = 10.0  # long enough that a withdrawn record going "at once" is told apart on a loaded machine
    watcher = EtcdBackend(auth_etcd.client("n1"), Cluster("c1", 1), lease_ttl=5, lapse_grace=grace)
    stop = threading.Event()
    wakes: list[float] = []
    t = threading.Thread(target=watcher.run, args=(stop, lambda: wakes.append(time.monotonic())), daemon=True)
    t.start()
    n2 = auth_etcd.client("n2")
    try:
        n2.put(node_key("c1", "n2"), json.dumps(records.node_to_record(node("n2", 2))), lease=n2.lease_grant(2))
        assert wait_for(lambda: [n.name for n in watcher.snapshot().nodes] == ["n2"])
        # n2's agent is gone: its lease runs out after 2 s, its record stays for the grace, then goes.
        assert wait_for(lambda: auth_etcd.client("admin").get(node_key("c1", "n2")) is None)
        # the watch delivers the lease's delete a moment after etcd has dropped the key
        assert wait_for(lambda: "n2" in (watcher.status().lapsed or {}))
        t0 = time.monotonic()
        assert [n.name for n in watcher.snapshot().nodes] == ["n2"]
        assert wait_for(lambda: not watcher.snapshot().nodes, timeout=grace + 30)
        gone = time.monotonic() - t0
        assert gone >= grace - 1, gone  # (the grace began when the watch saw the delete, a moment before t0)
        assert wakes[-1] >= t0 + grace - 1  # the agent was woken when the grace ended
        # Withdrawn (cleanup): off its lease first, so it goes at once.
        n2.put(node_key("c1", "n2"), json.dumps(records.node_to_record(node("n2", 2))), lease=n2.lease_grant(30))
        assert wait_for(lambda: watcher.snapshot().nodes)
        withdraw_record(n2, "c1", "n2")
        assert wait_for(lambda: not watcher.snapshot().nodes, timeout=grace - 1)  # at once, not after the grace
    finally:
        stop.set()
        watcher.close()
        t.join(3)


def test_a_record_that_lapsed_while_this_agent_restarted_stays_through_the_grace(auth_etcd: AuthEtcd,
                                                                                tmp_path: Path) -> None:
    """n1's agent stops while n2's is away too (a rolling update slower than the lease): n2's record
    runs out while n1 has no agent. n1's next agent does not find it in the store, and keeps it
    through the grace all the same, from what its predecessor handed over (its routes to n2 stay)."""
    grace = 60.0
    handed = tmp_path / "state" / "lapsing-c1.json"

    def agent() -> tuple[EtcdBackend, threading.Event, threading.Thread]:
        b = EtcdBackend(auth_etcd.client("n1"), Cluster("c1", 1), lease_ttl=5, lapse_grace=grace, lapsing_file=handed)
        stop = threading.Event()
        t = threading.Thread(target=b.run, args=(stop, lambda: None), daemon=True)
        t.start()
        return b, stop, t

    def stopped(b: EtcdBackend, stop: threading.Event, t: threading.Thread) -> None:
        stop.set()
        b.close()
        t.join(3)

    n2, admin = auth_etcd.client("n2"), auth_etcd.client("admin")
    n2.put(node_key("c1", "n2"), json.dumps(records.node_to_record(node("n2", 2))), lease=n2.lease_grant(2))
    first = agent()
    try:
        first[0].publish(node("n1", 1))
        assert wait_for(lambda: sorted(n.name for n in first[0].snapshot().nodes) == ["n1", "n2"])
    finally:
        stopped(*first)
    assert handed.stat().st_mode & 0o777 == 0o600
    assert "n1" not in handed.read_text()  # its own record is the next agent's to publish
    assert wait_for(lambda: admin.get(node_key("c1", "n2")) is None)  # n2's lease ran out
    second = agent()
    try:
        assert wait_for(lambda: second[0].snapshot().ready)
        second[0].publish(node("n1", 1))  # its own record comes back through the watch; n2 only from the hand-over
        assert wait_for(lambda: sorted(n.name for n in second[0].snapshot().nodes) == ["n1", "n2"])
        assert "n2" in (second[0].status().lapsed or {})
        assert not handed.exists()  # taken over once; the next close hands over afresh
        # n2's agent is back: its record is live again, no longer lapsed.
        n2.put(node_key("c1", "n2"), json.dumps(records.node_to_record(node("n2", 2))), lease=n2.lease_grant(30))
        assert wait_for(lambda: not (second[0].status().lapsed or {}))
        assert sorted(n.name for n in second[0].snapshot().nodes) == ["n1", "n2"]
    finally:
        stopped(*second)
    assert [r["key"] for r in json.loads(handed.read_text())["records"]] == [node_key("c1", "n2")]
