# SPDX-License-Identifier: Apache-2.0
"""The agent's reconcile loop at scale, in-process, in a node namespace of this test run, over a real
etcd (mTLS), real wireguard-go, real routes and ipsets: a join costs work in proportion to what
changed, a pass with nothing new reuses admission and plan, and drift made behind the agent's back
is repaired by the periodic full pass (and only by it: the passes in between trust their memory).
"""

from __future__ import annotations

import base64
import ipaddress
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from meshctl.agent.config import AgentConfig
from meshctl.agent.lifecycle import Agent
from meshctl.agent.status import PassSummary
from meshctl.backends.etcd import EtcdBackend, node_key, write_topology
from meshctl.lab.rigs import netns
from meshctl.mesh.model import Cluster, MeshSettings
from meshctl.node.masquerade import set_members
from meshctl.node.wireguard.state import PeerOp
from meshctl.node.wireguard.uapi import UapiClient
from tests.names import unique

from ..node.conftest import in_ns
from .conftest import wait_for

pytestmark = pytest.mark.root

CLUSTER = "rc"
POD = ipaddress.ip_network("10.42.1.0/24")


def synth_record(i: int, locations: int = 50) -> dict[str, Any]:
    """Node i: pod CIDR i of 10.128.0.0/9 in /24s, `locations` locations of one private /16 each
    (as bench/convergence.py writes them)."""
    loc, j = i % locations, i // locations
    return {"name": f"s{i}", "location": f"synth-{loc}", "internal_ip": f"100.{64 + loc}.{j // 250}.{1 + j % 250}/16",
            "pod_cidr": f"{ipaddress.ip_address(int(ipaddress.ip_address('10.128.0.0')) + 256 * i)}/24",
            "public_key": base64.b64encode((i + 1000).to_bytes(32, "big")).decode(),
            "endpoint": f"203.0.113.{1 + i % 250}:51820"}


class AgentNode:
    """One agent running in-process, its threads inside namespace `ns` (they inherit it from the
    thread that starts them), with a private NIC `pv` (10.30.0.1/16)."""

    def __init__(self, ns: str, tmp: Path, srv: Any, cert: Any, *, resync: float) -> None:
        self.ns, self.tmp = ns, tmp
        self.prefix = ns
        netns.run(ns, ["ip", "link", "set", "lo", "up"])
        netns.run(ns, ["ip", "link", "add", "pv", "type", "veth", "peer", "name", "pvx"])
        for dev in ("pv", "pvx"):
            netns.run(ns, ["ip", "link", "set", dev, "up"])
        netns.addr(ns, "pv", "10.30.0.1/16")
        self.client = srv.client(cert, timeout=10)
        write_topology(self.client, Cluster(CLUSTER, 7), MeshSettings(granularity="location"))
        self.cfg = AgentConfig(
            node_name="a1", pod_cidrs=(POD,), location="loc-a", leader=True, private_interface="pv",
            endpoint="10.30.0.1", state_dir=tmp / "state", wg_run_dir=tmp / "run", metrics_addr="127.0.0.1:9736",
            fastpath=False, bpf_pin_root=f"/sys/fs/bpf/{self.prefix}", nat_prefix=self.prefix,
            cluster_name=CLUSTER, cluster_id=7, resync_interval=resync, etcd_endpoints=(srv.url,))
        # Every pass's summary, as the loop finishes it (status() only shows the last one).
        self.passes: list[dict[str, Any]] = []

        def record(summary: PassSummary) -> None:
            self.passes.append(summary.last_reconcile.to_json() | {"nodes": summary.nodes})

        self.agent = Agent(self.cfg, EtcdBackend(srv.client(cert, timeout=10), Cluster(CLUSTER, 7), lease_ttl=10),
                           on_pass=record)
        in_ns(ns, self.agent.start)

    def put(self, i: int, locations: int = 50, **changes: Any) -> None:
        rec = synth_record(i, locations) | changes
        self.client.put(node_key(CLUSTER, rec["name"]), json.dumps(rec))

    def wait_pass(self, after: int, pred: Callable[[dict[str, Any]], bool], timeout: float = 30) -> dict[str, Any]:
        """The first pass after the `after`-th one that satisfies `pred`."""
        got = wait_for(lambda: next((p for p in self.passes[after:] if pred(p)), None), timeout)
        assert got, f"no such pass within {timeout} s; last: {self.passes[-1:]}"
        return got

    def routes(self) -> dict[str, dict[str, Any]]:
        out = json.loads(netns.run(self.ns, ["ip", "-j", "route", "show", "proto", "109"]).stdout)
        return {r["dst"]: r for r in out}

    def wg_allowed(self) -> set[str]:
        st = in_ns(self.ns, UapiClient(self.tmp / "run" / "kilo0.sock").get)
        return {str(n) for p in st.peers.values() for n in p.allowed_ips}

    def mesh_set(self) -> set[str]:
        return {str(n) for n in in_ns(self.ns, set_members, f"{self.prefix}-mesh4")}

    def close(self) -> None:
        self.agent.stop()
        from meshctl.node.masquerade import NatApplier
        from meshctl.node.wireguard import WireGuard

        in_ns(self.ns, NatApplier(self.prefix).cleanup)
        in_ns(self.ns, WireGuard("kilo0", run_dir=str(self.tmp / "run")).delete)


@pytest.fixture
def make_node(etcd_tls: Any) -> Iterator[Callable[[float], AgentNode]]:
    srv, cert = etcd_tls
    made: list[AgentNode] = []
    ns = unique("mar")
    tmp = Path(tempfile.mkdtemp(prefix=f"{ns}-"))

    def make(resync: float) -> AgentNode:
        netns.add(ns)
        made.append(AgentNode(ns, tmp, srv, cert, resync=resync))
        return made[-1]

    try:
        yield make
    finally:
        for n in made:
            n.close()
        netns.delete(ns)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.mark.slow
def test_at_5000_records_a_join_costs_what_changed_and_nothing_new_reuses_the_plan(make_node, caplog):
    """What a pass does at 5,000 records, by what it changed in the kernel (its times are printed:
    bench/ measures them)."""
    caplog.set_level(logging.INFO, logger="meshctl")
    node = make_node(600.0)  # no timer-driven full pass during the test
    count = 5000
    t0 = time.monotonic()
    node.client.put_many([(node_key(CLUSTER, f"s{i}"), json.dumps(synth_record(i))) for i in range(count)])
    first = node.wait_pass(0, lambda p: p["nodes"] == count + 1 and p["applied"], timeout=120)
    first_s = time.monotonic() - t0
    assert not first["errors"], first["errors"]
    assert len(node.routes()) > count and str(synth_record(7)["pod_cidr"]) in node.wg_allowed()

    # A join: one route, one allowed IP on the location leader's peer, one ipset member.
    joins = []
    for k in range(3):
        n = len(node.passes)
        caplog.clear()
        node.put(count + k)
        joins.append(node.wait_pass(n, lambda p, k=k: p["nodes"] == count + 2 + k))
        new = synth_record(count + k)["pod_cidr"]
        assert new in node.routes() and new in node.wg_allowed() and new in node.mesh_set()
        # the appliers wrote its two routes (its pods, and its private address: another location's
        # is routed through WireGuard, as in Kilo) and its one set member, nothing else
        said = [r.getMessage() for r in caplog.records]
        assert [m for m in said if m.startswith("routes:")] == ["routes: added 2, changed 0"], said
        assert [m for m in said if m.startswith("ipset ")] == [f"ipset {node.prefix}-mesh4: +1 -0 members"], said
    for j in joins:
        assert not j["errors"] and not j["full"]
    appliers = [sum(j["steps_ms"][s] for s in ("wireguard", "routes", "nat")) for j in joins]

    # A record change that leaves the plan as it is: admission and plan run, no applier does.
    n = len(node.passes)
    node.put(3, persistent_keepalive=25)
    touch = node.wait_pass(n, lambda p: p["applied"])
    assert all(touch["steps_ms"][s] == 0.0 for s in ("wireguard", "routes", "nat")), touch["steps_ms"]

    # A pass with no record changed (the loop is woken by something else): admission and plan reused.
    n = len(node.passes)
    node.agent.wake()
    idle = node.wait_pass(n, lambda p: p["applied"])
    assert idle["reused"] == ["admission", "plan"] and idle["steps_ms"]["wireguard"] == 0.0

    def ms(p: dict[str, Any]) -> str:
        return f"{1000 * p['duration_s']:.0f} ms (cpu {1000 * p['cpu_s']:.0f})"

    print(f"\n{count} records: first pass {first_s:.1f} s; joins {', '.join(ms(j) for j in joins)}, of which "
          f"appliers {', '.join(f'{a:.0f}' for a in appliers)} ms; touch {ms(touch)}; no change {ms(idle)}")
    print("join steps (ms):", joins[-1]["steps_ms"], "first pass steps (ms):", first["steps_ms"])


def test_drift_is_repaired_by_the_full_pass_not_by_the_passes_between(make_node):
    node = make_node(4.0)
    node.client.put_many([(node_key(CLUSTER, f"s{i}"), json.dumps(synth_record(i, locations=3))) for i in range(30)])
    node.wait_pass(0, lambda p: p["nodes"] == 31 and p["applied"], timeout=30)
    victim = synth_record(4, locations=3)["pod_cidr"]
    assert victim in node.routes() and victim in node.mesh_set() and victim in node.wg_allowed()

    # Right after a full pass, change things behind the agent's back...
    n = len(node.passes)
    node.wait_pass(n, lambda p: p["full"], timeout=15)
    netns.run(node.ns, ["ip", "route", "del", victim, "proto", "109"])
    netns.run(node.ns, ["ipset", "del", f"{node.prefix}-mesh4", victim])
    uapi = UapiClient(node.tmp / "run" / "kilo0.sock")
    # The peer carrying it: the leader of s4's location.
    owner = next(k for k, p in in_ns(node.ns, uapi.get).peers.items() if ipaddress.ip_network(victim) in p.allowed_ips)
    in_ns(node.ns, uapi.set, peers=[PeerOp(owner, remove=True)])
    # ... then a join: its pass applies the join and trusts its memory for the rest.
    n = len(node.passes)
    node.put(100, locations=3)
    join = node.wait_pass(n, lambda p: p["nodes"] == 32)
    assert not join["full"]
    joined = synth_record(100, locations=3)["pod_cidr"]
    assert joined in node.routes() and joined in node.mesh_set()
    assert victim not in node.routes() and victim not in node.mesh_set() and victim not in node.wg_allowed()
    # The next full pass reads the kernel and the device again and puts everything back.
    node.wait_pass(n, lambda p: p["full"], timeout=15)
    assert victim in node.routes() and victim in node.mesh_set() and victim in node.wg_allowed()
    assert joined in node.wg_allowed()

