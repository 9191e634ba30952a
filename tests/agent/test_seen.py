# SPDX-License-Identifier: Apache-2.0
"""The summary a node publishes of what it sees: built from its status, written at a bounded rate,
on its own key only (a real etcd with auth), and refused when it names another node."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import pytest

from meshctl.agent.seen import HEARTBEAT_S, MIN_INTERVAL_S, SeenPublisher, _first, publish_loop, summarise
from meshctl.agent.status import AgentStatus
from meshctl.backends.etcd import EtcdBackend, read_seen, seen_key
from meshctl.etcd import PermissionDenied
from meshctl.mesh.model import Cluster
from meshctl.mesh.observed import NodeSeen, PeerSeen

from .conftest import wait_for
from .test_identity import AuthEtcd, node


def status(paths: dict[str, str], *, pairs: dict[str, Any] | None = None, unreached: tuple[str, ...] = (),
           peers: tuple[dict[str, Any], ...] = (), name: str = "a1") -> AgentStatus:
    """An agent's /status document as the agent serves it, reduced to what a summary reads."""
    return AgentStatus.from_json({
        "node": name, "cluster": "c1", "backend": "etcd", "ready": True, "reason": "", "paths": paths,
        "unreached_peers": list(unreached), "last_reconcile": {"ok": True}, "mesh": {},
        "path_probe": None if pairs is None else {"port": 1, "pairs": pairs}, "peers": list(peers)})


def test_a_summary_names_each_peers_rung_its_ladder_start_probe_and_handshake() -> None:
    pairs = {
        "a2": {"rung": "direct+vxlan", "ladder": ["direct", "direct+ipip", "direct+vxlan", "tunnel"],
               "probes": {"direct": {"up": False, "lost": 9, "rtt_ms": None},
                          "udp": {"up": True, "lost": 2, "rtt_ms": 0.8, "last_rtt_ms": 0.61234}}},
        "a3": {"rung": "direct", "ladder": ["direct", "tunnel"], "probes": {"direct": {"up": True, "lost": 0,
                                                                                      "rtt_ms": 0.3}}},
    }
    st = status({"a1": "local", "a2": "direct+vxlan", "a3": "direct", "b1": "tunnel", "c2/g1": "tunnel",
                 "b2": "relay"}, pairs=pairs, unreached=("b2",),
                peers=({"name": "b1", "kind": "node", "public_key": "k", "allowed_ips": [], "rx_bytes": 1,
                        "tx_bytes": 1, "last_handshake": 1, "handshake_age_s": 12.5},
                       {"name": "g1", "kind": "remote", "public_key": "k", "allowed_ips": [], "rx_bytes": 1,
                        "tx_bytes": 1, "last_handshake": 0}))
    seen = summarise(st, "c1", 1000.0)
    assert (seen.node, seen.cluster, seen.at) == ("a1", "c1", 1000.0)
    assert set(seen.peers) == {"a2", "a3", "b1", "c2/g1", "b2"}, "the node itself is no peer"
    a2 = seen.peers["a2"]
    assert (a2.rung, a2.first, a2.rtt_ms, a2.loss, a2.fell_back) == ("direct+vxlan", "direct", 0.612, 0.25, True)
    assert seen.peers["a3"] == PeerSeen("direct", "direct", 0.3, 0.0)
    assert not seen.peers["a3"].fell_back
    assert seen.peers["b1"] == PeerSeen("tunnel", "tunnel", handshake_age_s=12.5)
    assert seen.peers["c2/g1"].handshake_age_s is None, "a peer without a handshake has no age"
    assert seen.peers["b2"].rung is None, "an unreached peer has no path"
    # What a node publishes parses back as it was.
    assert NodeSeen.from_json(json.loads(json.dumps(seen.to_json()))) == seen


def test_past_its_bound_a_summary_keeps_the_observed_peers_then_its_own_clusters() -> None:
    """A summary holds at most MAX_PEERS peers (a reader refuses more, etcd a value that large): in
    a cluster mesh past it, what was observed (a probe, a handshake, an unreached peer) stays, then
    this cluster's nodes; the rest are drawn on their plan's rung."""
    paths = {"a1": "local", "a2": "direct", "b1": "tunnel", "b2": "tunnel", "b3": "relay",
             "c2/g1": "tunnel", "c2/g2": "tunnel", "c2/g3": "tunnel"}
    pairs = {"a2": {"rung": "direct", "ladder": ["direct", "tunnel"], "probes": {}}}
    peers = ({"name": "g3", "kind": "remote", "public_key": "k", "allowed_ips": [], "rx_bytes": 1,
              "tx_bytes": 1, "last_handshake": 1, "handshake_age_s": 3.0},
             {"name": "g2", "kind": "remote", "public_key": "k", "allowed_ips": [], "rx_bytes": 1,
              "tx_bytes": 1, "last_handshake": 0})
    st = status(paths, pairs=pairs, unreached=("b3",), peers=peers)
    assert list(summarise(st, "c1", 1.0, limit=4).peers) == ["a2", "b3", "c2/g3", "b1"]
    assert list(summarise(st, "c1", 1.0, limit=6).peers) == ["a2", "b3", "c2/g3", "b1", "b2", "c2/g1"]
    assert len(summarise(st, "c1", 1.0).peers) == 7, "under the bound every peer is there, in the plan's order"


def test_writes_are_bounded_however_often_the_rungs_change() -> None:
    pub = SeenPublisher()
    flip = [NodeSeen("a1", "c1", 0, {"a2": PeerSeen(r, "direct")}) for r in ("direct", "direct+vxlan")]
    writes = []
    t = 0.0
    while t < 300:  # a pair that flaps every 100 ms for five minutes
        s = flip[int(t * 10) % 2]
        if pub.due(s, t):
            pub.wrote(s, t)
            writes.append(t)
        t = round(t + 0.1, 1)
    gaps = [b - a for a, b in zip(writes, writes[1:], strict=False)]
    assert min(gaps) >= MIN_INTERVAL_S, gaps
    assert len(writes) <= 300 / MIN_INTERVAL_S + 1
    # Nothing changes: only the heartbeat writes; a change is written as soon as the interval allows.
    quiet = SeenPublisher()
    s = flip[0]
    quiet.wrote(s, 0.0)
    assert not quiet.due(s, HEARTBEAT_S - 1) and quiet.due(s, HEARTBEAT_S)
    assert not quiet.due(flip[1], MIN_INTERVAL_S - 0.1) and quiet.due(flip[1], MIN_INTERVAL_S)
    # A loss within one bucket is no change; a pair that loses a quarter more is.
    lossy = NodeSeen("a1", "c1", 0, {"a2": PeerSeen("direct", "direct", loss=0.05)})
    assert not quiet.due(lossy, MIN_INTERVAL_S)
    assert quiet.due(NodeSeen("a1", "c1", 0, {"a2": PeerSeen("direct", "direct", loss=0.5)}), MIN_INTERVAL_S)


@pytest.mark.root
def test_a_node_writes_only_its_own_summary_on_its_lease_and_a_forged_one_is_refused(etcd_tls) -> None:
    auth = AuthEtcd(*etcd_tls)
    n1, n2, admin = auth.client("n1"), auth.client("n2"), auth.client("admin")
    b = EtcdBackend(n1, Cluster("c1", 1), lease_ttl=5)
    b.publish(node("n1", 1))
    stop = threading.Event()
    st = status({"n1": "local", "n2": "tunnel"}, name="n1")
    t = threading.Thread(target=publish_loop, args=(b, lambda: st, "c1", stop), kwargs={"interval": 0.1},
                         daemon=True)
    t.start()
    try:
        assert wait_for(lambda: admin.get(seen_key("c1", "n1")) is not None)
        kv = admin.get(seen_key("c1", "n1"))
        assert kv.lease == admin.get("/meshctl/c1/nodes/n1").lease != 0, "the summary goes with the record"
        # n2's credentials write n2's summary and no other.
        forged = NodeSeen("n1", "c1", 1.0, {"n2": PeerSeen(None)})
        with pytest.raises(PermissionDenied):
            n2.put(seen_key("c1", "n1"), json.dumps(forged.to_json()))
        n2.put(seen_key("c1", "n2"), json.dumps(NodeSeen("n2", "c1", 1.0).to_json()))
        # A summary under one node's key that names another (written by the operator's credentials
        # here, as a node could not) and one that is not JSON are refused; the rest stand.
        admin.put(seen_key("c1", "n3"), json.dumps(forged.to_json()))
        admin.put(seen_key("c1", "n4"), "{not json")
        seen, refused = read_seen(n2, "c1")
        assert set(seen) == {"n1", "n2"}
        assert seen["n1"].peers["n2"].rung == "tunnel"
        assert any("/meshctl-seen/c1/n3" in r and "another node" in r for r in refused), refused
        assert any("/meshctl-seen/c1/n4" in r and "not JSON" in r for r in refused), refused
        # One write, however many checks: nothing changed (the heartbeat is a minute away).
        stop.wait(1.0)
        assert admin.get(seen_key("c1", "n1")).mod_revision == kv.mod_revision
    finally:
        stop.set()
        t.join(2)
        b.close()


@pytest.mark.parametrize(("case", "limit", "observed_every"), [
    ("few observed, the limit reaches into the remote peers", 300, 97),
    ("few observed, the limit ends among this cluster's peers", 40, 97),
    ("more observed than the limit", 20, 3),
    ("none observed", 150, 0),
])
def test_the_peers_past_the_bound_are_the_first_by_rank(case: str, limit: int, observed_every: int) -> None:
    """`_first` picks what sorting every name by (not observed, remote, name) and cutting at the
    limit picks, without the sort."""
    rng = random.Random(limit)
    names = [f"n{rng.randrange(10**6)}" for _ in range(100)] + \
        [f"cluster{rng.randrange(2, 9)}/s{rng.randrange(10**6)}" for _ in range(400)]
    rng.shuffle(names)
    observed = {n for i, n in enumerate(names) if observed_every and i % observed_every == 0}
    want = sorted(names, key=lambda n: (n not in observed, "/" in n, n))[:limit]
    assert _first(names, limit, observed.__contains__) == want, case
