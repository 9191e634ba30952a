# SPDX-License-Identifier: Apache-2.0
"""Must show: the path pod traffic takes under each granularity, read from counters, each in its
own lab; and a granularity change in etcd converging every agent without a restart."""

from __future__ import annotations

import json

import pytest

from meshctl.backends.etcd import mesh_key
from meshctl.lab.namespaces import build
from meshctl.lab.namespaces.state import LabState
from meshctl.lab.rigs import netns

from .conftest import node_of, pair, status, topo, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]


def wg_endpoints(st: LabState, name: str) -> dict[str, str]:
    """`wg show kilo0 endpoints` of a lab node, keyed by peer public key. wireguard-go's socket is
    in the node's run dir: bind it where `wg` looks, in a private mount namespace."""
    n = node_of(st, name)
    script = f"mount --bind {n.wg_run_dir} /var/run/wireguard && wg show kilo0 endpoints"
    out = netns.run(n.netns, ["unshare", "-m", "--propagation", "private", "sh", "-c", script]).stdout
    return dict(line.split("\t") for line in out.strip().splitlines())


def fastpath_ok(st: LabState, name: str) -> bool:
    return status(st, name)["datapath"]["mode"] == "ebpf"


def test_cross_same_subnet_direct_other_location_tunnel(make_lab):
    st = make_lab(topo("cross"))
    d = pair(st, "a1", "a2")
    assert d.ok and d.path == "direct", d
    if fastpath_ok(st, "a1"):
        assert d.fastpath.get("direct", 0) >= 4, d.fastpath  # the fast path carried it, not kilo0
        assert d.fastpath.get("tunnel", 0) == 0
    t = pair(st, "a1", "b1")
    assert t.ok and t.path == "tunnel", t
    t2 = pair(st, "a2", "b1")
    assert t2.ok and t2.path == "tunnel", t2  # cross: every node is its own WireGuard peer


def test_location_non_leader_goes_through_its_leader(make_lab):
    st = make_lab(topo("location"))
    r = pair(st, "a2", "b1")
    assert r.ok and r.path == "via-leader" and r.expected == "via-leader", r
    assert pair(st, "a1", "b1").path == "tunnel"
    assert pair(st, "a2", "a1").path == "direct"
    assert status(st, "a2")["leader"] == "a1" and status(st, "a2")["peers"] == []


def test_full_wireguard_private_uses_private_endpoints(make_lab):
    st = make_lab(topo("full", "wireguard-private"))
    r = pair(st, "a1", "a2")
    assert r.ok and r.path == "wireguard-private", r  # WireGuard to the private endpoint: the rung named
    a2_key = next(p["public_key"] for p in status(st, "a1")["peers"] if p["name"] == "a2")
    b1_key = next(p["public_key"] for p in status(st, "a1")["peers"] if p["name"] == "b1")
    eps = wg_endpoints(st, "a1")
    assert eps[a2_key] == "10.10.1.12:51820"        # same subnet: the private address
    assert eps[b1_key] == f"{node_of(st, 'b1').public_ip}:51820"  # elsewhere: the public one


def test_full_direct_bypasses_kilo0(make_lab):
    st = make_lab(topo("full", "direct"))
    r = pair(st, "a1", "a2")
    assert r.ok and r.path == "direct", r
    assert pair(st, "a1", "b1").path == "tunnel"


def test_granularity_change_in_etcd_converges_without_restart(make_lab):
    st = make_lab(topo("location"))
    pids = {n: node_of(st, n).pid for n in ("a1", "a2", "b1")}
    assert pair(st, "a2", "b1").path == "via-leader"
    c = build.etcd_client(st.clusters[0])
    c.put(mesh_key("default"), json.dumps({"granularity": "cross"}))
    assert wait_for(lambda: all(status(st, n)["granularity"] == "cross" for n in pids))
    assert wait_for(lambda: pair(st, "a2", "b1", count=3).path == "tunnel")
    assert pair(st, "a2", "a1").path == "direct"
    assert {n: node_of(st, n).pid for n in pids} == pids
    assert all(netns.pid_alive(p) for p in pids.values())
