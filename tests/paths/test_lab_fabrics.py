# SPDX-License-Identifier: Apache-2.0
"""The path ladder in a running lab with every fabric kind (lab/labs/fabrics.yaml): each pair on the
rung its fabric allows, all pairs reachable; what `intra_subnet: direct` loses; a direct pair
whose fabric turns into a blackhole under a 100 pps ping, and back; no flapping under 20 % loss;
`meshctl explain` naming every pair's measured rung, and a blackhole's move and lost probes."""

from __future__ import annotations

import copy
import json
import signal
import subprocess
import sys
import time
from importlib.resources import files
from typing import Any

import pytest
import yaml

from meshctl.cli.plan import Source
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces import fabric
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.state import LabState
from meshctl.lab.rigs import netns
from tests.pinging import PodPing
from tests.waiting import WAIT_S, wait_for, wait_until

from .conftest import node_of

pytestmark = pytest.mark.slow

HOLD_S = 5.0
LAB_DOC: dict[str, Any] = yaml.safe_load((files("meshctl.lab") / "labs" / "fabrics.yaml").read_text())
# The rung each pair of the file must take (both directions).
EXPECTED = {("l1", "l2"): "direct", ("v1", "v2"): "direct+ipip", ("v1", "v3"): "direct+ipip",
            ("v2", "v3"): "direct+ipip", ("u1", "u2"): "direct+vxlan", ("h1", "h2"): "direct+ipip",
            ("k1", "k2"): "tunnel"}


def doc(intra: str) -> dict[str, Any]:
    d = copy.deepcopy(LAB_DOC)
    d["mesh"]["intra_subnet"] = intra
    d["lab"]["agent_args"] = ["--path-hold-seconds", str(HOLD_S)]
    d["lab"].pop("prefix", None)
    return d


def status(st: LabState, name: str) -> dict[str, Any]:
    s = labcheck.agent_status(node_of(st, name))
    assert s is not None, f"no status from {name}"
    return s


def rung(st: LabState, src: str, dst: str) -> str | None:
    s = labcheck.agent_status(node_of(st, src), timeout=1.0) or {}
    return (s.get("paths") or {}).get(dst)


def settled(st: LabState) -> bool:
    return all(rung(st, a, b) == r and rung(st, b, a) == r for (a, b), r in EXPECTED.items())


def unsettled(st: LabState) -> dict[str, Any]:
    """Each pair off its rung, with what its ends say of it: the rung, the fast path's mode and
    rungs, and the pair's probe verdicts and last moves."""
    out: dict[str, Any] = {}
    for (a, b), want in EXPECTED.items():
        got = (rung(st, a, b), rung(st, b, a))
        if got == (want, want):
            continue
        ends = {}
        for x, y in ((a, b), (b, a)):
            s = labcheck.agent_status(node_of(st, x), timeout=2.0) or {}
            probe = (s.get("path_probe") or {})
            pair = (probe.get("pairs") or {}).get(y, {})
            ends[x] = {"datapath": (s.get("datapath") or {}).get("mode"), "local_rungs": probe.get("local_rungs"),
                       "probes": {k: (v.get("up"), v.get("lost")) for k, v in (pair.get("probes") or {}).items()},
                       "history": pair.get("history", [])[-3:]}
        out[f"{a}-{b}"] = {"want": want, "got": got, **ends}
    return out


@pytest.fixture(scope="module")
def auto_lab(request) -> Any:
    from meshctl.lab.namespaces import build
    from meshctl.lab.namespaces.spec import parse_lab
    from tests.names import unique

    prefix = unique("pb") + "-"  # one prefix scheme for every lab of the tests
    st = build.up(parse_lab(doc("auto")), prefix=prefix, wait=120)
    try:
        # A pair whose probes starved while the lab came up on a loaded machine holds on a lower
        # rung for HOLD_S after they answer again: give it a few holds.
        assert wait_for(lambda: settled(st), 60), unsettled(st)
        yield st
    finally:
        build.down(labstate.lab_name(prefix))


def test_every_pair_reachable_on_the_rung_its_fabric_allows(auto_lab) -> None:
    results = labcheck.check(auto_lab, count=2)
    # A pair whose two pings met a WireGuard handshake (a rekey among 110 pairs) is checked once more.
    again = {(r.src, r.dst): r for r in labcheck.check(auto_lab, count=3, pairs=[(r.src, r.dst) for r in results
                                                                              if not r.ok])}
    results = [again.get((r.src, r.dst), r) for r in results]
    bad = [(r.src, r.dst, r.path) for r in results if not r.ok]
    assert not bad, bad
    seen = {(r.src, r.dst): r.path for r in results}
    # The check takes a minute on a shared machine: a pair whose probes starved meanwhile may have
    # stepped aside (and be holding before coming back); once settled again it must be on its rung.
    odd = [k for (a, b) in EXPECTED for k in ((a, b), (b, a)) if seen[k] != EXPECTED.get(k, EXPECTED.get(k[::-1]))]
    if odd:
        assert wait_for(lambda: settled(auto_lab), HOLD_S + 20), odd
        seen.update({(r.src, r.dst): r.path for r in labcheck.check(auto_lab, count=2, pairs=odd)})
    for (a, b), want in EXPECTED.items():
        assert seen[(a, b)] == want and seen[(b, a)] == want, ((a, b), seen[(a, b)], seen[(b, a)])
    # Pairs no private network joins take the tunnel.
    assert seen[("l1", "v1")] == "tunnel" and seen[("u2", "h1")] == "tunnel"
    # `meshctl explain` (its builder, on every agent's status read once) names each pair's measured rung.
    assert explained_rungs(auto_lab, list(seen)) == {k: [v] for k, v in seen.items()}


def explained_rungs(st: LabState, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], list[str]]:
    """The rungs of each pair's hops as explain.explain answers from the lab's agents."""
    from meshctl.agent.explain import explain
    from meshctl.agent.status import AgentStatus

    views = {f"{c.name}/{n.name}": AgentStatus.from_json(status(st, n.name)) for c, n in st.nodes()}
    by_name = {v.node: v for v in views.values()}
    return {(a, b): [h.rung for h in explain(by_name[a], a, b, views).hops] for a, b in pairs}


def test_status_node_list_and_metrics_name_the_rungs(auto_lab) -> None:
    # Only one end of a pair times a kind's round trip: the other hears its probes and answers,
    # postponing its own (prober.LISTEN_FACTOR), so which end depends on who probed first. The
    # first answer to either end's ipip probe is waited for, in fresh reads (the probes' block is
    # read live; a quiet mesh makes no pass).
    def timed() -> float | None:
        for a, b in (("v1", "v2"), ("v2", "v1")):
            d = labcheck.agent_status(node_of(auto_lab, a), fresh=True)
            rtt = d["path_probe"]["pairs"][b]["probes"]["ipip"]["rtt_ms"] if d else None
            if rtt is not None:
                return float(rtt)
        return None

    # (a round trip of 0 would be falsy and time out: that is a failure too)
    rtt = wait_until(timed, 10, "a timed answer to an ipip probe between v1 and v2", step=0.2)
    assert rtt > 0  # measured (bench/probe.py)
    s = labcheck.agent_status(node_of(auto_lab, "v1"), fresh=True)
    assert s is not None
    rows = {r["name"]: r["path"] for r in s["node_list"]}
    assert rows["v2"] == "direct+ipip" and rows["v3"] == "direct+ipip" and rows["l1"] == "tunnel"
    probes = s["path_probe"]["pairs"]["v2"]["probes"]
    assert probes["direct"]["up"] is False and probes["ipip"]["up"] is True  # the vpc drops pod addresses
    n = node_of(auto_lab, "v1")
    text = netns.run(n.netns, ["curl", "-s", f"http://{n.metrics_addr}/metrics"]).stdout
    assert 'meshctl_path_pairs{rung="direct+ipip"} 2.0' in text
    assert 'meshctl_path_pairs{rung="tunnel"} 8.0' in text
    assert 'meshctl_path_probe_up{kind="direct",peer="v2"} 0.0' in text
    assert "meshctl_path_changes_total{" in text and "meshctl_path_probe_rtt_seconds{" in text
    from meshctl.agent.status import AgentStatus
    from meshctl.cli.agent import format_status

    out = format_status(AgentStatus.from_json(s))
    assert "  v2  direct+ipip  probes: direct down" in out


def test_big_df_ping_on_every_rung(auto_lab) -> None:
    for (a, b), _ in EXPECTED.items():
        src = node_of(auto_lab, a).pods[0].netns
        dst = node_of(auto_lab, b).pods[0].ip
        p = netns.run(src, ["ping", "-n", "-q", "-c", "3", "-i", "0.05", "-W", "1", "-M", "do", "-s", "1372", dst],
                      check=False)
        assert " 0% packet loss" in p.stdout, (a, b, p.stdout, p.stderr)


def test_blackhole_under_a_ping_and_back(auto_lab) -> None:
    st = auto_lab
    assert rung(st, "l1", "l2") == "direct"
    ping = PodPing(st, "l1", "l2", 10).answered()
    t0 = time.monotonic()
    fabric.change(st, "10.30.1.0/24", "blackhole")
    assert wait_for(lambda: rung(st, "l1", "l2") == "tunnel" and rung(st, "l2", "l1") == "tunnel", WAIT_S, 0.05)
    moved, wall_moved = time.monotonic() - t0, time.time()
    got = ping.result()
    print(f"blackhole: both ends on the tunnel after {moved:.2f} s, {len(got.lost)} pings lost")
    assert any(t > wall_moved for t in got.replied_at), "no echo came back over the tunnel"
    changes = status(st, "l1")["path_changes"]
    assert {"from": "direct", "to": "tunnel", "reason": "direct stopped delivering", "count": 1} in changes

    ping = PodPing(st, "l1", "l2", HOLD_S + 6).answered()
    t1 = time.monotonic()
    fabric.change(st, "10.30.1.0/24", "l2")
    assert wait_for(lambda: rung(st, "l1", "l2") == "direct" and rung(st, "l2", "l1") == "direct",
                    HOLD_S + WAIT_S, 0.05)
    assert time.monotonic() - t1 >= HOLD_S
    assert not ping.result().lost, "packets lost while the pair returned to direct"


def explained(st: LabState, src: str, dst: str, *flags: str) -> dict[str, Any]:
    """`meshctl explain --lab LAB SRC DST -o json`, run in this process."""
    from click.testing import CliRunner

    from meshctl.cli import main

    r = CliRunner().invoke(main, ["explain", "--lab", st.name, src, dst, "-o", "json", *flags])
    assert r.exit_code == 0, (src, dst, r.output)
    out: dict[str, Any] = json.loads(r.output)
    return out


def monitored(st: LabState, node: str, *flags: str) -> list[dict[str, Any]]:
    """The events `meshctl monitor --lab LAB --node NODE FLAGS -o json` printed (its summary left out)."""
    r = subprocess.run([sys.executable, "-m", "meshctl.cli", "monitor", "--lab", st.name, "--node", node, *flags,
                        "-o", "json"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return [e for e in map(json.loads, r.stdout.splitlines()) if not e.get("summary")]


def test_explain_shows_a_blackholed_subnet_move_and_its_lost_probes(auto_lab) -> None:
    st = auto_lab
    assert wait_for(lambda: rung(st, "l1", "l2") == "direct", HOLD_S + WAIT_S)
    fabric.change(st, "10.30.1.0/24", "blackhole")
    try:
        def moved() -> bool:
            [hop] = explained(st, node_of(st, "l1").pods[0].netns, "l2")["hops"]
            probes = {p["kind"]: p for p in hop["probes"]}
            last = hop["moves"][-1] if hop["moves"] else {}
            return hop["rung"] == "tunnel" and probes["direct"]["up"] is False and probes["direct"]["lost"] > 0 \
                and (last.get("from"), last.get("to"), last.get("reason")) == \
                ("direct", "tunnel", "direct stopped delivering")

        assert wait_for(moved, WAIT_S, 0.1)
        # monitor (docs/explain.md's worked example): the pair's packets now leave on the tunnel entry
        # pings for as long as the monitor may take to attach on a loaded machine; SIGINT (ping's
        # summary) once it has its three events
        ping = PodPing(st, "l1", "l2", 28, interval=0.2)
        try:
            events = monitored(st, "l1", "--to", node_of(st, "l2").pods[0].ip, "--count", "3")
        finally:
            ping.proc.send_signal(signal.SIGINT)
            ping.result()
        assert [(e["type"], e["src_owner"], e["dst_owner"]) for e in events] == \
            [("tunnel", "default/l1", "default/l2")] * 3, events
        # --probe on the tunnel probes the rung the pair left: lost, and the pair still has its path
        probe = explained(st, "l1", "l2", "--probe")["probe"]
        assert (probe["rung"], probe["kind"], probe["answered"]) == ("direct", "direct", False), probe
    finally:
        fabric.change(st, "10.30.1.0/24", "l2")
    assert wait_for(lambda: rung(st, "l1", "l2") == "direct", HOLD_S + WAIT_S)


def live_pairs(st: LabState) -> dict[frozenset[str], tuple[str | None, bool]]:
    """`meshctl graph --live --lab LAB -o json`: each pair's (rung, fell back) as the agents publish it."""
    from click.testing import CliRunner

    from meshctl.cli import main

    r = CliRunner().invoke(main, ["graph", "--live", "--lab", st.name, "-o", "json"])
    assert r.exit_code == 0, r.output
    model = json.loads(r.stdout)
    assert model["live"] is True
    return {frozenset((p["a"], p["b"])): (p["rung"], p["fell_back"]) for p in model["pairs"]}


def test_graph_live_names_the_measured_rungs_and_a_blackholed_subnet_moves(auto_lab) -> None:
    from meshctl.agent.seen import CHECK_INTERVAL_S

    st = auto_lab
    pairs = [k for (a, b) in EXPECTED for k in ((a, b), (b, a))]
    want = {frozenset(k): r for k, r in EXPECTED.items()}

    def drawn() -> dict[frozenset[str], str | None]:
        live = live_pairs(st)
        return {k: live.get(k, (None, False))[0] for k in want}

    assert wait_for(lambda: drawn() == want, 15), drawn()
    measured = {(r.src, r.dst): r.path for r in labcheck.check(st, count=2, pairs=pairs)}
    drawn_now = drawn()
    assert {(a, b): drawn_now[frozenset((a, b))] for a, b in pairs} == measured
    t0 = time.monotonic()
    fabric.change(st, "10.30.1.0/24", "blackhole")
    try:
        # The failover (6 s, as test_blackhole_under_a_ping_and_back allows) and two checks of the
        # publisher (its last write was long ago: the pair had settled).
        pair = frozenset(("l1", "l2"))
        assert wait_for(lambda: live_pairs(st).get(pair) == ("tunnel", True), WAIT_S + 2 * CHECK_INTERVAL_S, 0.2), \
            live_pairs(st).get(pair)
        print(f"graph --live shows the blackholed pair on the tunnel {time.monotonic() - t0:.1f} s after the change")
        # The graph draws the costlier end: soon both ends say so, each in its own summary.
        def ends() -> tuple[str | None, str | None]:
            seen = Source(None, None, None, st.name, "", None, None, None, "default").seen()
            return seen["l1"].peers["l2"].rung, seen["l2"].peers["l1"].rung

        assert wait_for(lambda: ends() == ("tunnel", "tunnel"), WAIT_S + 2 * CHECK_INTERVAL_S, 0.2), ends()
        assert live_pairs(st)[frozenset(("u1", "u2"))][0] == "direct+vxlan", "another subnet's pair is untouched"
    finally:
        fabric.change(st, "10.30.1.0/24", "l2")
    assert wait_for(lambda: live_pairs(st).get(frozenset(("l1", "l2"))) == ("direct", False), HOLD_S + 15, 0.2)


def test_random_loss_does_not_flap(auto_lab) -> None:
    st = auto_lab
    assert wait_for(lambda: rung(st, "l1", "l2") == "direct", HOLD_S + WAIT_S)

    def changes() -> int:
        return sum(c["count"] for c in status(st, "l1")["path_changes"])

    before = changes()
    fabric.change(st, "10.30.1.0/24", "l2", 20)
    try:
        time.sleep(60)  # the experiment: a minute of 20 % loss
        assert changes() - before <= 1
    finally:
        fabric.change(st, "10.30.1.0/24", "l2", 0)


def test_the_same_lab_with_intra_subnet_direct_loses_the_pairs_the_fabrics_drop(make_lab) -> None:
    st = make_lab(doc("direct"), wait=120)
    # vpc and vpc-udp drop pod addresses, the hetzner nodes have no on-link route to each other,
    # the blackhole drops everything; v1-v3 are not neighbours: WireGuard, as before.
    dropped = [("h1", "h2"), ("k1", "k2"), ("u1", "u2"), ("v1", "v2")]
    pairs = [(a, b) for a, b in EXPECTED if (a, b) not in dropped]
    pairs += [(b, a) for a, b in pairs]
    results = {(r.src, r.dst): r for r in labcheck.check(st, count=2, pairs=pairs)}
    # A dropped pair is direct (no handshake to wait for): one round of pings says it, and a pair
    # a fabric did not drop would answer it.
    both_ways = dropped + [(b, a) for a, b in dropped]
    results |= {(r.src, r.dst): r for r in labcheck.check(st, count=2, pairs=both_ways, retry=False)}
    failed = sorted({tuple(sorted(k)) for k, r in results.items() if not r.ok})
    assert failed == dropped, failed
    assert results[("l1", "l2")].path == "direct" and results[("v1", "v3")].path == "tunnel"


def test_without_the_fast_path_the_kernel_fallback_carries_vxlan_and_ipip_is_unavailable(make_lab) -> None:
    d = doc("auto")
    d["lab"]["fastpath"] = False
    st = make_lab(d, wait=120)
    want = {("l1", "l2"): "direct", ("v1", "v2"): "direct+vxlan", ("v1", "v3"): "direct+vxlan",
            ("u1", "u2"): "direct+vxlan", ("h1", "h2"): "direct+vxlan", ("k1", "k2"): "tunnel"}
    assert wait_for(lambda: all(rung(st, a, b) == r and rung(st, b, a) == r for (a, b), r in want.items()), 30), \
        {k: (rung(st, *k), rung(st, k[1], k[0])) for k in want}
    assert "direct+ipip" not in status(st, "v1")["path_probe"]["local_rungs"]  # no ipip device, no eBPF
    pairs = [(a, b) for a, b in want] + [(b, a) for a, b in want]
    # Without the fast path `lab up` has no maps to wait for: the agents may still be applying
    # routes and handshaking when it returns, so the pairs get a bounded while to come up.
    last: list[labcheck.PairResult] = []

    def all_up() -> bool:
        last[:] = labcheck.check(st, count=2, pairs=pairs)
        return all(r.ok for r in last)

    assert wait_for(all_up, 30), [(r.src, r.dst) for r in last if not r.ok]
    seen = {(r.src, r.dst): r.path for r in last}
    assert seen[("v1", "v2")] == "direct+vxlan" and seen[("h2", "h1")] == "direct+vxlan"


# --- the fabrics over an IPv6 underlay (lab.ip_families [6], issue 22) --------------------------


def ipv6_doc() -> dict[str, Any]:
    """fabrics.yaml over an IPv6-only underlay: every internal address and fabric subnet its IPv6
    twin (namespaces/families.py: 10.30.2.11/24 -> fd10:a1e:200:b::1/48, each node in a /64 of its
    own, as hetzner wants), `intra_subnet: direct` so each pair's raw packets meet its fabric."""
    import ipaddress

    from meshctl.lab.namespaces.families import private6, subnet6

    d = copy.deepcopy(LAB_DOC)
    for n in d["nodes"]:
        n["internal_ip"] = str(private6(ipaddress.ip_interface(n["internal_ip"]), "x"))
    d["lab"]["fabrics"] = {str(subnet6(ipaddress.ip_network(k))): v for k, v in d["lab"]["fabrics"].items()}
    d["lab"].update(ip_families=[6], fastpath=False)
    d["lab"].pop("prefix", None)
    d["mesh"]["intra_subnet"] = "direct"
    return d


def node_ping(st: LabState, src: str, dst: str) -> bool:
    """A node's private IPv6 address pings another's (the fabric between them decides)."""
    a, b = node_of(st, src), node_of(st, dst)
    assert a.netns is not None and b.internal_ip is not None
    sent, got, _ = labcheck.ping(a.netns, b.internal_ip.split("/")[0], count=2, interval=0.1, wait=1.0)
    return got > 0


def pod_ping(st: LabState, src: str, dst: str, family: int) -> bool:
    a, b = node_of(st, src), node_of(st, dst)
    _, got, _ = labcheck.ping(a.pods[0].netns, b.pods[0].address(family) or "", count=2, interval=0.1, wait=1.0)
    return got > 0


def test_every_fabric_kind_filters_ipv6_as_it_filters_ipv4(make_lab) -> None:
    from click.testing import CliRunner

    from meshctl.cli import main

    st = make_lab(ipv6_doc(), wait=120)
    # Node addresses pass every kind but blackhole: over the bridge (l2, vpc), through the vpc
    # router between subnets (v1 -> v3), with ICMPv6 through vpc-udp, through hetzner's gateway.
    reach = {(a, b): node_ping(st, a, b) for a, b in (("l1", "l2"), ("v1", "v2"), ("v1", "v3"), ("u1", "u2"),
                                                       ("h1", "h2"), ("k1", "k2"))}
    assert reach == {("l1", "l2"): True, ("v1", "v2"): True, ("v1", "v3"): True, ("u1", "u2"): True,
                     ("h1", "h2"): True, ("k1", "k2"): False}, reach
    # Raw IPv6 pod packets (intra_subnet: direct) pass l2 only: vpc's source and destination check,
    # vpc-udp's, hetzner's (nodes meet only at the gateway) and the blackhole drop them. IPv4 pods
    # share no IPv4 private network here, so the plan sends them over WireGuard (docs/mesh.md, "Dual
    # stack"), through the public endpoints: they pass every kind, the blackholed subnet's too.
    pods = {(a, b, f): pod_ping(st, a, b, f) for a, b in (("l1", "l2"), ("v1", "v2"), ("h1", "h2"), ("k1", "k2"))
            for f in (4, 6)}
    assert pods == {(a, b, f): a == "l1" or f == 4 for a, b, f in pods}, pods
    # `meshctl lab fabric` takes the IPv6 subnet: l2 turned blackhole and back.
    subnet = next(s for s, e in st.fabrics.items() if e.kind == "l2")
    assert ":" in subnet
    r = CliRunner().invoke(main, ["lab", "fabric", "--lab", st.name, subnet, "blackhole"])
    assert r.exit_code == 0 and r.output.strip() == f"fabric {subnet}: blackhole", r.output
    assert not node_ping(st, "l1", "l2") and not pod_ping(st, "l1", "l2", 6)
    assert CliRunner().invoke(main, ["lab", "fabric", "--lab", st.name, subnet, "l2"]).exit_code == 0
    assert wait_for(lambda: node_ping(st, "l1", "l2") and pod_ping(st, "l1", "l2", 6), 10)


def test_every_pair_on_the_rung_its_fabric_allows_over_an_ipv6_underlay(make_lab) -> None:
    d = ipv6_doc()
    d["mesh"]["intra_subnet"] = "auto"
    d["lab"]["fastpath"] = True
    st = make_lab(d, wait=120)
    assert wait_for(lambda: settled(st), 20), unsettled(st)
