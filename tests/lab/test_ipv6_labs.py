# SPDX-License-Identifier: Apache-2.0
"""Issue 22 end to end in the namespace lab: the default lab dual stack (labs/dual-stack.yaml, an
IPv4 underlay) and over an IPv6-only underlay (labs/ipv6-underlay.yaml), every pair in each pod
family on the rung the plan says. One bring-up per lab, its checks inside."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib.resources import files
from typing import Any

import pytest
import yaml

from meshctl.lab.namespaces import build
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.namespaces.state import LabState
from meshctl.lab.rigs import netns
from tests.names import unique
from tests.pinging import LATE_REPLY_S

from .conftest import node_of

pytestmark = pytest.mark.slow

# In the dual-stack lab (IPv4 underlay) these nodes reach each other without a private next hop
# (a1, b1 leaders and c1: WireGuard between them); every pair with a member (a2, b2) crosses the
# private network, whose next hops the records give in IPv4 only.
TUNNEL_ONLY = ("a1", "b1", "c1")
NEEDS_IPV6_INTERNAL = ("IPv6 pods over the IPv4 private network need the peers' IPv6 internal addresses: the "
                       "plan routes them via the peer's IPv4 address, which no IPv6 route can use (the kernel has "
                       "no RTA_VIA for IPv6; bpf_redirect_neigh takes no IPv4 next hop for an IPv6 packet). Lands "
                       "with records' per-family internal_ips (issue 22, dualmodel)")


def lab_file(name: str, **lab: Any) -> dict[str, Any]:
    d: dict[str, Any] = yaml.safe_load((files("meshctl.lab") / "labs" / f"{name}.yaml").read_text())
    d["lab"].update(lab)
    return d


def bring_up(name: str, **lab: Any) -> Iterator[LabState]:
    prefix = unique("m6") + "-"
    try:
        yield build.up(parse_lab(lab_file(name, **lab)), prefix=prefix)
    finally:
        build.down(labstate.lab_name(prefix))
    assert not netns.list_prefixed(prefix)


def off_plan(results: list[labcheck.PairResult]) -> list[str]:
    return [f"IPv{r.family} {r.src}->{r.dst}: {'ok' if r.ok else 'FAIL'} {r.path}, plan {r.expected}"
            for r in results if not r.ok or r.path != r.expected]


def addresses(ns: str, dev: str) -> list[str]:
    return [a["local"] for link in json.loads(netns.run(ns, ["ip", "-j", "addr", "show", "dev", dev]).stdout)
            for a in link["addr_info"] if a.get("scope") == "global"]


@pytest.fixture(scope="module")
def dual() -> Iterator[LabState]:
    yield from bring_up("dual-stack")


def test_dual_stack_lab_ipv4_everywhere_and_ipv6_between_tunnel_nodes(dual: LabState) -> None:
    st = dual
    a1 = node_of(st, "a1")
    assert st.ip_families == [4, 6] and st.pod_families == [4, 6]
    assert a1.pods[0].ip == "10.42.1.2" and a1.pods[0].ip6 == "fd42:1:a2a:100::2"
    assert a1.netns is not None
    assert addresses(a1.netns, "priv") == ["10.10.1.11", "fd10:a0a:100:b::1"]
    assert addresses(a1.netns, "pub") == ["198.51.100.10", "2001:db8:100::10"]
    v6_pairs = [(s, d) for s in TUNNEL_ONLY for d in TUNNEL_ONLY if s != d]
    results = labcheck.check(st, families=(4,)) + labcheck.check(st, pairs=v6_pairs, families=(6,))
    assert len(results) == 20 + 6
    assert not off_plan(results), "\n".join(off_plan(results)) + "\n" + labcheck.format_matrix(results)
    assert {r.path for r in results if r.family == 4} == {"direct", "tunnel", "via-leader"}
    assert {r.path for r in results if r.family == 6} == {"tunnel"}
    rows = json.loads(labcheck.results_json(results))
    assert [r["family"] for r in rows] == [4] * 20 + [6] * 6
    text = labcheck.format_matrix(results)
    assert text.index("IPv4 pods") < text.index("IPv6 pods") and text.endswith("26/26 pairs reachable")
    # The IPv6 underlay answers too: a1 reaches a2's private and c1's public IPv6 address.
    for dst in (node_of(st, "a2").internal_ip6, node_of(st, "c1").public_ip6):
        assert dst is not None
        assert labcheck.ping(a1.netns, dst.split("/")[0], count=2, deadline=LATE_REPLY_S)[1] == 2, dst
    # The agents forward IPv6 (they set it once the mesh has an IPv6 pod CIDR).
    assert netns.run(a1.netns, ["sysctl", "-n", "net.ipv6.conf.all.forwarding"]).stdout.strip() == "1"


def test_dual_stack_lab_ipv6_pairs_through_the_private_network(dual: LabState) -> None:
    results = labcheck.check(dual, pairs=[("a1", "a2")], families=(6,))
    assert not off_plan(results), "\n".join(off_plan(results))


@pytest.mark.parametrize("fastpath", [False, True], ids=["kernel-routes", "fastpath"])
def test_ipv6_underlay_lab_every_pair_in_both_families(fastpath: bool) -> None:
    """IPv6-only private and public networks (etcd and WireGuard over IPv6 too), dual-stack pods:
    every pair in both families on the rung its plan names (IPv6 pods over the private network,
    IPv4 pods, which share no IPv4 private network, over WireGuard), with and without the fast path."""
    for st in bring_up("ipv6-underlay", fastpath=fastpath):
        a1 = node_of(st, "a1")
        assert a1.netns is not None
        assert addresses(a1.netns, "priv") == ["fd10:0:1:11::1"] and addresses(a1.netns, "pub") == ["2001:db8:100::10"]
        assert st.clusters[0].etcd.endpoints == ["https://[2001:db8:100::250]:2379"]
        results = labcheck.check(st)
        assert len(results) == 40
        assert not off_plan(results), "\n".join(off_plan(results)) + "\n" + labcheck.format_matrix(results)
        view = labcheck.agent_view(a1)
        assert view is not None
        peers = {p.name: p for p in view.live.peers}
        assert str(peers["b1"].endpoint).startswith("[2001:db8:100::"), peers["b1"]  # WireGuard over IPv6
        assert view.live.datapath.mode == ("ebpf" if fastpath else "kernel-routes")


def test_two_clusters_dual_stack_every_pair_across_clusters_in_both_families() -> None:
    """labs/two-clusters.yaml with `ip_families: [4, 6]`: each cluster publishes both pod families
    in its etcd, the other cluster's agents admit and route them, and every pod pair, across the
    clusters too, answers in each family on the rung its agent planned."""
    for st in bring_up("two-clusters", ip_families=[4, 6]):
        results = labcheck.check(st)
        assert len(results) == 60
        assert not off_plan(results), "\n".join(off_plan(results)) + "\n" + labcheck.format_matrix(results)
        across = [r for r in results if r.family == 6 and r.src.split("/")[0] != r.dst.split("/")[0]]
        assert len(across) == 18 and {r.path for r in across} >= {"direct", "tunnel"}, across
