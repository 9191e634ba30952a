# SPDX-License-Identifier: Apache-2.0
"""Issue 22's mixed mesh in the namespace lab (lab/labs/mixed-families.yaml): IPv4-only nodes (a4,
b4), IPv6-only ones (a6, and f6 behind a stateful IPv6 firewall, `lab.nat: firewall6`) and a
dual-stack ones (d1 public, h behind a home router: a cone NAT for IPv4 and a stateful firewall
for IPv6), each in a location of its own. The pairs that share no IP family are relayed
through d1 and `meshctl status` says so; f6 is reached although its firewall drops every new
connection from outside, because it calls its peers. One bring-up for the module."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from importlib.resources import files

import pytest
from click.testing import CliRunner

from meshctl.backends.file import load_yaml
from meshctl.cli import main
from meshctl.lab.namespaces import build
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces import nat_router as labnat
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.namespaces.state import LabState
from meshctl.lab.rigs import netns
from tests.names import unique
from tests.pinging import LATE_REPLY_S

from .conftest import node_of, status, wait_for

pytestmark = [pytest.mark.root, pytest.mark.slow]

IPV4_ONLY = ("a4", "b4")
IPV6_ONLY = ("a6", "f6", "g6")
DUAL = "d1"
HOME = "h"  # dual stack behind a cone NAT (IPv4) and the same router's firewall (IPv6)
NO_SHARED_FAMILY = {(a, b) for a in IPV4_ONLY for b in IPV6_ONLY} | {(b, a) for a in IPV4_ONLY for b in IPV6_ONLY}


@pytest.fixture(scope="module")
def mixed() -> Iterator[LabState]:
    prefix = unique("mxf") + "-"
    doc = load_yaml(str(files("meshctl") / "lab" / "labs" / "mixed-families.yaml"))
    try:
        yield build.up(parse_lab(doc), prefix=prefix)
    finally:
        build.down(labstate.lab_name(prefix))
    assert not netns.list_prefixed(prefix)


def addresses(ns: str | None, dev: str) -> list[str]:
    return [a["local"] for link in json.loads(netns.run(ns, ["ip", "-j", "addr", "show", "dev", dev]).stdout)
            for a in link["addr_info"] if a.get("scope") == "global"]


def meshctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshctl.cli", *args], capture_output=True, text=True, timeout=60)


def test_each_node_speaks_its_own_families(mixed: LabState) -> None:
    assert addresses(node_of(mixed, "a4").netns, "pub") == ["198.51.100.11"]
    assert addresses(node_of(mixed, "a6").netns, "pub") == ["2001:db8:100::13"]
    assert addresses(node_of(mixed, DUAL).netns, "pub") == ["198.51.100.10", "2001:db8:100::10"]
    # etcd answers in both families; each node dials it in its own.
    e = mixed.clusters[0].etcd
    assert e.endpoints == ["https://198.51.100.250:2379", "https://[2001:db8:100::250]:2379"]
    assert build.etcd_endpoints_for(mixed, e, node_of(mixed, "a6")) == ["https://[2001:db8:100::250]:2379"]
    assert build.etcd_endpoints_for(mixed, e, node_of(mixed, "a4")) == ["https://198.51.100.250:2379"]
    r = CliRunner().invoke(main, ["lab", "status", "--lab", mixed.name, "-o", "json"])
    assert r.exit_code == 0, r.output
    rows = {n["node"]: n for n in json.loads(r.stdout)["nodes"]}
    assert {n: (row["ip_families"], row["nat"]) for n, row in rows.items()} == {
        "d1": ([4, 6], None), "a4": ([4], None), "b4": ([4], None), "a6": ([6], None), "f6": ([6], "firewall6"),
        "g6": ([6], "firewall6"), "h": ([4, 6], "cone")}


FIREWALLED = ("f6", "g6", HOME)
NODES = (*IPV4_ONLY, *IPV6_ONLY, DUAL, HOME)


def test_every_pair_reachable_in_both_pod_families_relayed_where_no_family_is_shared(mixed: LabState) -> None:
    # A firewalled node is reached only once it has called its peer: its first initiation may
    # reach a peer that does not know it yet (dropped there), and WireGuard tries again 5 s later.
    # So its pairs are given that long first; then every pair must answer.
    calls = [(a, b) for b in FIREWALLED for a in NODES if a != b]
    calls += [(b, a) for a, b in calls]
    assert wait_for(lambda: all(r.ok for r in labcheck.check(mixed, count=1, pairs=calls)), 30, 1), \
        labcheck.format_matrix(labcheck.check(mixed, count=1, pairs=calls))
    results = labcheck.check(mixed)
    table = labcheck.format_matrix(results)
    assert len(results) == 84 and all(r.ok for r in results), table
    for r in results:
        want = "relay" if (r.src, r.dst) in NO_SHARED_FAMILY else "tunnel"
        assert (r.expected, r.path) == (want, want), f"IPv{r.family} {r.src}->{r.dst}\n{table}"


def test_status_says_which_node_relays(mixed: LabState) -> None:
    text = meshctl("status", "--lab", mixed.name, "--lab-node", "a4")
    assert text.returncode == 0, text.stderr
    for dst in IPV6_ONLY:
        assert f"relay: {dst} through {DUAL} (a4 (IPv4) and {dst} (IPv6) share no IP family)" in text.stdout
    assert "relay: b4" not in text.stdout and "relay: d1" not in text.stdout
    # No private network here: the fast path is loaded but has nothing to steer, and says so rather
    # than warning that no pod interface carries it.
    assert "datapath ebpf (idle: no private interface, every peer goes through WireGuard)" in text.stdout
    assert "none carry the fast path" not in text.stdout
    doc = meshctl("status", "--lab", mixed.name, "--lab-node", "f6", "-o", "json")
    assert doc.returncode == 0, doc.stderr
    st = json.loads(doc.stdout)
    assert {n: r["via"] for n, r in st["relays"].items()} == {"a4": DUAL, "b4": DUAL}
    assert st["paths"]["a4"] == "relay" and st["paths"]["a6"] == st["paths"]["g6"] == "tunnel"


def test_a_node_behind_an_ipv6_firewall_is_reached_because_it_calls_out(mixed: LabState) -> None:
    """f6's firewall drops every new connection from outside (a ping to its public address, a
    WireGuard initiation), yet its peers reach it at its own endpoint: its handshakes and
    keepalives open the way back, g6's (behind a firewall of its own) too. When the firewall
    forgets that state, f6's next keepalive opens it again."""
    f6, a6 = node_of(mixed, "f6"), node_of(mixed, "a6")
    assert f6.nat is not None and f6.nat.kind == "firewall6"
    dropped = labnat.dropped(f6.nat)
    assert labcheck.ping(a6.netns or "", f6.public_ip, count=2)[1] == 0  # nothing new gets in
    assert labnat.dropped(f6.nat) >= dropped + 2
    # out (and its replies) it goes
    assert labcheck.ping(f6.netns or "", a6.public_ip, count=2, deadline=LATE_REPLY_S)[1] == 2
    for caller in ("a6", "g6"):  # called where it lives, not through a relay
        peer = next(p for p in status(mixed, caller)["peers"] if p["name"] == "f6")
        assert peer["endpoint"] == f"[{f6.public_ip}]:51820", caller
    labnat.rebind(f6, mixed.clusters[0].port)  # the firewall forgets every connection
    again = [("a6", "f6"), ("g6", "f6"), ("d1", "f6")]
    assert wait_for(lambda: all(r.ok for r in labcheck.check(mixed, count=3, pairs=again, families=(6,))), 15, 0.5)


def test_a_dual_stack_node_behind_a_home_router_is_reached_in_both_families(mixed: LabState) -> None:
    """h sits behind one router that NATs its IPv4 (a cone) and firewalls its IPv6: its IPv4 peers
    call the NAT's mapping they learnt from its handshakes, its IPv6-only peers call its own IPv6
    address, which the firewall opened for them because h called first; a new connection from
    outside (a ping to that address) is still dropped. `lab nat h` shows both sides."""
    h, a6 = node_of(mixed, HOME), node_of(mixed, "a6")
    nat = h.nat
    assert nat is not None and nat.kind == "cone" and nat.firewall6_ip is not None
    mapping = f"{nat.public_ip}:{nat.port}"
    own6 = f"[{nat.firewall6_ip}]:51820"
    called = {caller: next(p["endpoint"] for p in status(mixed, caller)["peers"] if p["name"] == HOME)
              for caller in NODES if caller != HOME}
    # d1 shares both families with h: it calls whichever h's handshakes last came from
    assert called == {**dict.fromkeys(IPV4_ONLY, mapping), **dict.fromkeys(IPV6_ONLY, own6),
                      DUAL: mapping if called[DUAL] == mapping else own6}
    dropped = labnat.dropped(nat)
    assert labcheck.ping(a6.netns or "", nat.firewall6_ip, count=2)[1] == 0  # nothing new gets in over IPv6
    assert labnat.dropped(nat) >= dropped + 2
    shown = meshctl("lab", "nat", HOME, "--lab", mixed.name)
    assert shown.returncode == 0, shown.stderr
    outside = f"outside {nat.public_ip} port {nat.port}"
    assert shown.stdout.startswith(f"h: cone NAT in {nat.router_ns}, inside {nat.inside_ip}, {outside}"), shown.stdout
    assert f"; IPv6 {nat.firewall6_ip} behind its firewall6, inbound new dropped" in shown.stdout
