# SPDX-License-Identifier: Apache-2.0
"""The leader decision (mesh/leaders.py), by table: which published verdicts rule which leader
out, ties, stale reports, reports from nodes that are down or cut off, two locations broken at
once; then the publisher's judge on made-up clocks, and the plans a decision gives (every pair
symmetric, leaders_per_location spreading locations over leaders)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from meshctl.errors import MeshError
from meshctl.mesh.leaders import (
    QUORUM,
    STALE_S,
    THROUGH_TARGETS,
    ForwardingJudge,
    ForwardingReport,
    Judged,
    JudgeTuning,
    LeaderTarget,
    LeaderWitness,
    choose_leaders,
    leader_targets,
    with_leaders,
)
from meshctl.mesh.model import Topology
from meshctl.mesh.plan import STANDBY_KEEPALIVE_S, plan_node
from meshctl.mesh.records import parse_topology
from meshctl.mesh.segments import gateway, segments

from .fixtures import key

T0 = 1_000_000.0


def three_by_three(**mesh: Any) -> Topology:
    """Three locations of three nodes (x1 x2 x3 in each of a, b, c), every node public; x1 leads."""
    nodes = []
    for li, loc in enumerate("abc"):
        for i in (1, 2, 3):
            k = li * 3 + i
            nodes.append({"name": f"{loc}{i}", "location": loc, "internal_ip": f"10.1{li}.0.{i}/24",
                          "endpoint": f"198.51.100.{k}:51820", "pod_cidr": f"10.42.{k}.0/24",
                          "public_key": key(k), "leader": i == 1})
    return parse_topology({"cluster": {"name": "c1", "id": 1}, "mesh": {"granularity": "location", **mesh},
                           "nodes": nodes})


def report(node: str, at: float = T0, **verdicts: str | tuple[str, float]) -> ForwardingReport:
    """`node`'s report at `at`: member=verdict (held since `at`) or member=(verdict, since)."""
    out = {}
    for m, v in verdicts.items():
        verdict, since = (v, at) if isinstance(v, str) else v
        out[m] = Judged(verdict, since)  # type: ignore[arg-type]
    return ForwardingReport(node, "c1", at, out)


def reports(*rs: ForwardingReport) -> dict[str, ForwardingReport]:
    return {r.node: r for r in rs}


def leaders_of(topo: Topology, rs: dict[str, ForwardingReport]) -> dict[str, tuple[str, ...]]:
    d = choose_leaders(topo, rs)
    return {k.removeprefix("location:"): v.leaders for k, v in d.locations.items()}


ALL_OK = (report("a2", a1="ok", a3="ok"), report("a3", a1="ok", a2="ok"))


@pytest.mark.parametrize(("rs", "expected_a"), [
    pytest.param((), ("a1",), id="no reports: the documented order"),
    pytest.param(ALL_OK, ("a1",), id="every verdict ok: the documented order"),
    pytest.param((report("a2", a1="bad", a3="ok"), report("a3", a1="bad", a2="ok")), ("a2",),
                 id="both other members see a1 bad: the next in order leads"),
    pytest.param((report("a2", a1="bad", a3="ok"), report("a3", a1="ok", a2="ok")), ("a1",),
                 id="one node alone cannot depose a leader"),
    pytest.param((report("a2", a1="recovering", a3="ok"), report("a3", a1="recovering", a2="ok")), ("a2",),
                 id="recovering is not yet back: the hold runs"),
    pytest.param((report("a2", a1="recovering", a3="ok"), report("a3", a1="ok", a2="ok")), ("a1",),
                 id="one publisher's hold ended: back"),
    pytest.param((report("a2", a1="bad", a3="bad"), report("a3", a1="bad", a2="ok")), ("a1",),
                 id="a publisher that sees no member ok is cut off itself: it does not count"),
    pytest.param((report("a2", at=T0 - STALE_S - 1, a1="bad", a3="ok"), report("a3", a1="bad", a2="ok"),
                  report("b2", b1="ok", b3="ok"), report("b3", b1="ok", b2="ok")), ("a1",),
                 id="a stale report does not count"),
    pytest.param((report("a2", a1="bad", a3="ok"), report("a3", a1="bad", a2="ok"),
                  report("b2", a1="bad", b1="ok"), report("b3", a1="bad", b1="ok")), ("a2",),
                 id="reports about another location's members do not count (nor make a tie)"),
    pytest.param((report("a2", a1="bad", a3="ok"), report("a3", a1="bad", a2="ok"), report("zz", a1="ok")),
                 ("a2",), id="a report of a node that is not admitted (down, gone) does not count"),
    pytest.param((report("a2", a1="bad", a2="bad", a3="ok"), report("a3", a1="ok", a2="ok")), ("a1",),
                 id="a verdict on oneself does not count"),
    pytest.param((report("a2", a1="bad", a3="bad"), report("a3", a1="bad", a2="ok")), ("a1",),
                 id="a2 cut off: only a3 speaks of a1, one is not a quorum"),
    pytest.param((report("a2", a1="bad", a3="bad"), report("a3", a1="bad", a2="bad")), ("a1",),
                 id="every member bad for every other: the private network is down, nobody moves"),
    pytest.param((report("a2", a1="bad", a3="ok"), report("a3", a1="bad", a2="bad")), ("a1",),
                 id="a3 sees a1 and a2 bad: a2 alone names a1, no quorum"),
    pytest.param((report("a1", a2="ok", a3="ok"), report("a2", a1="bad", a3="bad"),
                  report("a3", a1="bad", a2="ok")), ("a1",),
                 id="a2 sees nobody: does not count, a1 stays"),
])
def test_which_reports_depose_which_leader(rs: tuple[ForwardingReport, ...], expected_a: tuple[str, ...]) -> None:
    assert leaders_of(three_by_three(), reports(*rs))["a"] == expected_a


def test_two_locations_broken_at_once_each_moves_alone() -> None:
    rs = reports(report("a2", a1="bad", a3="ok"), report("a3", a1="bad", a2="ok"),
                 report("b2", b1="bad", b3="ok"), report("b3", b1="bad", b2="ok"),
                 report("c2", c1="ok", c3="ok"), report("c3", c1="ok", c2="ok"))
    assert leaders_of(three_by_three(), rs) == {"a": ("a2",), "b": ("b2",), "c": ("c1",)}


def one_location(members: int) -> Topology:
    return parse_topology({"mesh": {"granularity": "location"}, "nodes": [
        {"name": f"a{i}", "location": "a", "internal_ip": f"10.10.0.{i}/24", "endpoint": f"198.51.100.{i}:51820",
         "pod_cidr": f"10.42.{i}.0/24", "public_key": key(i)} for i in range(1, members + 1)]})


def test_second_in_order_out_too_skips_to_third() -> None:
    """Four members, a1 and a2 both not forwarding (each still receives: its own probes through
    a3 and a4 come back): a3 leads."""
    rs = reports(report("a1", a2="bad", a3="ok", a4="ok"), report("a2", a1="bad", a3="ok", a4="ok"),
                 report("a3", a1="bad", a2="bad", a4="ok"), report("a4", a1="bad", a2="bad", a3="ok"))
    assert leaders_of(one_location(4), rs)["a"] == ("a3",)


def test_two_of_three_broken_and_out_of_reach_is_beyond_the_quorum() -> None:
    """Three members, a1 and a2 not forwarding nor answering a3 at their own addresses: a3, the one
    healthy member, sees no member ok and cannot tell that from being cut off itself, so only a2
    speaks against a1: no move (the documented limit)."""
    rs = reports(report("a1", a2="bad", a3="ok"), report("a2", a1="bad", a3="ok"), report("a3", a1="bad", a2="bad"))
    assert leaders_of(three_by_three(), rs)["a"] == ("a1",)


def test_two_of_three_that_answer_but_do_not_forward_both_go() -> None:
    """a1 and a2 not forwarding, but answering at their own addresses: a3 reaches both, so it is
    not cut off and its verdicts count; with a2's on a1 and a1's on a2, a3 leads."""
    rs = reports(replace(report("a1", a2="bad", a3="ok"), reached=("a2", "a3")),
                 replace(report("a2", a1="bad", a3="ok"), reached=("a1", "a3")),
                 replace(report("a3", a1="bad", a2="bad"), reached=("a1", "a2")))
    assert leaders_of(three_by_three(), rs)["a"] == ("a3",)


def test_a_tie_keeps_the_member_in() -> None:
    """Five members: two against a1, two for it: a tie, a1 stays; a third against moves it."""
    topo = one_location(5)
    base = [report("a2", a1="bad", a3="ok"), report("a3", a1="bad", a2="ok"),
            report("a4", a1="ok", a2="ok"), report("a5", a1="ok", a2="ok")]
    assert leaders_of(topo, reports(*base))["a"] == ("a1",)
    base[3] = report("a5", a1="recovering", a2="ok")
    assert leaders_of(topo, reports(*base))["a"] == ("a2",)
    assert QUORUM == 2


def test_the_decision_says_why_with_the_evidence() -> None:
    rs = reports(report("a2", at=T0, a1=("bad", T0 - 2.0), a3="ok"), report("a3", at=T0 - 1.0, a1="bad", a2="ok"))
    loc = choose_leaders(three_by_three(), rs).locations["location:a"]
    assert (loc.leaders, loc.static, loc.out) == (("a2",), ("a1",), ("a1",))
    assert {(e.publisher, e.verdict, e.held_s, e.age_s) for e in loc.evidence} == {("a2", "bad", 2.0, 0.0),
                                                                                  ("a3", "bad", 0.0, 1.0)}
    assert loc.reason.startswith("a1 does not forward: a2: a1 bad for 2.0 s")


def test_the_clock_is_the_reports_own() -> None:
    """Every report equally late (a frozen view): the same answer as when they were fresh."""
    rs = [report("a2", a1="bad", a3="ok"), report("a3", a1="bad", a2="ok")]
    late = [ForwardingReport(r.node, r.cluster, r.at + 10_000, r.verdicts) for r in rs]
    topo = three_by_three()
    assert leaders_of(topo, reports(*rs)) == leaders_of(topo, reports(*late))


def test_one_publisher_clock_in_the_future_cannot_age_the_others() -> None:
    rs = reports(report("a2", a1="bad", a3="ok"), report("a3", a1="bad", a2="ok"),
                 report("b2", at=T0 + 10_000, b1="ok", b3="ok"))
    assert leaders_of(three_by_three(), rs)["a"] == ("a2",)


def test_full_granularity_has_no_leaders_to_choose() -> None:
    rs = reports(report("a2", a1="bad", a3="ok"), report("a3", a1="bad", a2="ok"))
    assert choose_leaders(three_by_three(granularity="full"), rs).locations == {}


def test_report_json_round_trip_and_strict_parse() -> None:
    r = report("a2", a1=("bad", T0 - 1), a3="ok")
    assert ForwardingReport.from_json(r.to_json(), "k") == r
    with pytest.raises(MeshError, match="verdicts.a1: verdict must be one of ok, bad, recovering"):
        ForwardingReport.from_json({"node": "a2", "cluster": "c1", "at": 1, "verdicts": {"a1": {"verdict": "meh",
                                                                                             "since": 1}}}, "k")
    with pytest.raises(MeshError, match="at must be a time"):
        ForwardingReport.from_json({"node": "a2", "cluster": "c1", "at": -1}, "k")


# --- the publisher's judge, on a made-up clock ------------------------------------------------------


def run(judge: ForwardingJudge, member: str, start: float, end: float, answers: bool, step: float = 0.1) -> float:
    """Probe every `step` from `start` to `end`; each answered or lost (as the prober reports: a
    loss is known `timeout` after the probe); ticks after each. Returns the end time."""
    t = start
    while t < end:
        if answers:
            judge.answered(member, t)
        else:
            judge.lost(member, t)
        judge.tick(t)
        t = round(t + step, 6)
    return t


def test_judge_bad_within_a_second_and_a_half_of_the_break() -> None:
    j = ForwardingJudge(hold=30)
    j.set_members(["a1"], 0.0)
    t = run(j, "a1", 0.0, 5.0, True)
    assert j.verdicts()["a1"].verdict == "ok"
    broke = t
    while j.verdicts()["a1"].verdict == "ok":
        j.lost("a1", t)
        j.tick(t)
        t = round(t + 0.1, 6)
    assert t - broke <= 1.5


def test_judge_back_only_after_the_hold_and_a_flap_starts_it_again() -> None:
    j = ForwardingJudge(hold=30)
    j.set_members(["a1"], 0.0)
    t = run(j, "a1", 0.0, 2.0, True)
    t = run(j, "a1", t, t + 2.0, False)
    assert j.verdicts()["a1"].verdict == "bad"
    t = run(j, "a1", t, t + 20.0, True)
    assert j.verdicts()["a1"].verdict == "recovering"
    t = run(j, "a1", t, t + 2.0, False)  # a flap: bad again, the hold starts over
    assert j.verdicts()["a1"].verdict == "bad"
    back = t
    t = run(j, "a1", t, t + 29.5, True)
    assert j.verdicts()["a1"].verdict == "recovering"
    t = run(j, "a1", t, back + 31.0, True)
    assert j.verdicts()["a1"].verdict == "ok"


def test_judge_says_a_report_is_due_at_every_change_of_verdict_and_only_then() -> None:
    """A member's first answer (no verdict -> ok) is a change: the publisher's report must carry it
    at once, or its witness would not count until the next heartbeat."""
    j = ForwardingJudge(hold=5)
    j.set_members(["a1", "a2"], 0.0)
    assert not j.tick(0.0)
    j.answered("a1", 0.1)
    assert j.tick(0.1) and j.verdicts()["a1"].verdict == "ok"  # first answer
    j.answered("a1", 0.2)
    assert not j.tick(0.2)  # answering again changes nothing
    changes = []
    t = 0.3
    for lost in [True] * 20 + [False] * 60:  # 2 s without answers, then answers for 6 s
        (j.lost if lost else j.answered)("a1", t)
        j.answered("a2", t)
        if j.tick(t):
            changes.append((round(t, 1), j.verdicts()["a1"].verdict))
        t = round(t + 0.1, 6)
    assert [v for _, v in changes] == ["ok", "bad", "recovering", "ok"], changes  # a2's first answer, then a1's


def test_judge_twenty_percent_loss_each_way_is_never_bad() -> None:
    import random

    rng = random.Random(7)
    j = ForwardingJudge(hold=30, tuning=JudgeTuning())
    j.set_members(["a1"], 0.0)
    t = 0.0
    for _ in range(36_000):  # an hour at 10 probes a second
        if rng.random() < 0.8 and rng.random() < 0.8:
            j.answered("a1", t)
        else:
            j.lost("a1", t)
        j.tick(t)
        t = round(t + 0.1, 6)
    assert j.verdicts()["a1"].verdict == "ok"


# --- the plans a decision gives --------------------------------------------------------------------


def test_every_plan_follows_the_decision_and_pairs_stay_symmetric() -> None:
    topo = three_by_three()
    rs = reports(report("a2", a1="bad", a3="ok"), report("a3", a1="bad", a2="ok"))
    moved = with_leaders(topo, choose_leaders(topo, rs))
    plans = {n.name: plan_node(moved, n.name) for n in moved.nodes}
    assert {p.leader for n, p in plans.items() if n.startswith("a")} == {"a2"}
    assert plans["a1"].wireguard_ip is None
    assert plans["a2"].wireguard_ip is not None
    # b1 and c1 peer a2 now, and a2 peers them: every pair symmetric. a1 stands by: it and they keep
    # a peer for each other that carries nothing (no allowed IPs, so no route follows it), kept
    # alive from a1's end.
    for far in ("b1", "c1"):
        by_name = {p.name: p for p in plans[far].peers}
        assert by_name["a2"].kind == "segment" and far in {p.name for p in plans["a2"].peers}
        assert (by_name["a1"].kind, by_name["a1"].allowed_ips) == ("standby", ())
    assert {(p.name, p.kind, p.allowed_ips, p.persistent_keepalive) for p in plans["a1"].peers} == \
        {("b1", "standby", (), STANDBY_KEEPALIVE_S), ("c1", "standby", (), STANDBY_KEEPALIVE_S)}
    assert all(p.kind == "segment" for p in plans["a2"].peers)
    # a1 (no longer leading) sends other locations to a2 over the private network.
    route = next(r for r in plans["a1"].routes if str(r.dst) == "10.42.4.0/24")
    assert (str(route.via), route.dev) == ("10.10.0.2", "private")


@pytest.mark.parametrize("per_location", [1, 2])
def test_a_standby_leader_returns_over_the_sessions_it_kept(per_location: int) -> None:
    """Every standby peer has its mirror at the other end, and the return of the documented order
    changes no node's set of WireGuard keys: allowed IPs move between peers that exist (no
    handshake waits), and only the standby peers' own entries change."""
    topo = three_by_three(leaders_per_location=per_location)
    rs = reports(report("a2", a1="bad", a3="ok"), report("a3", a1="bad", a2="ok"))
    out = with_leaders(topo, choose_leaders(topo, rs))
    assert out.standby == (("location:a", ("a1",)),)
    during = {n.name: plan_node(out, n.name) for n in topo.nodes}
    after = {n.name: plan_node(topo, n.name) for n in topo.nodes}
    standby = {(n, p.name) for n, plan in during.items() for p in plan.peers if p.kind == "standby"}
    assert standby and all((b, a) in {(n, p.name) for n, plan in during.items() for p in plan.peers}
                           for a, b in standby)
    for n in topo.nodes:
        keys_after = {p.public_key for p in after[n.name].peers}
        assert keys_after <= {p.public_key for p in during[n.name].peers}, n.name
        # A standby peer carries nothing, and every route and fast-path entry is the move's own.
        assert all(p.allowed_ips == () for p in during[n.name].peers if p.kind == "standby")
        assert during[n.name].routes == plan_node(replace(out, standby=()), n.name).routes


def test_no_report_changes_nothing_in_the_plans() -> None:
    topo = three_by_three()
    assert with_leaders(topo, choose_leaders(topo, {})) is topo


def test_leaders_per_location_deals_locations_round_the_leaders_and_both_ends_agree() -> None:
    topo = three_by_three(leaders_per_location=2)
    segs = {s.key: s for s in segments(topo)}
    keys = sorted(segs)
    assert [n.name for n in segs["location:a"].all_leaders] == ["a1", "a2"]
    a, b, c = segs["location:a"], segs["location:b"], segs["location:c"]
    # a's other keys are b, c: b to a1, c to a2; b's are a, c: a to b1, c to b2; c's: a to c1, b to c2.
    assert (gateway(a, b, keys).name, gateway(a, c, keys).name) == ("a1", "a2")
    assert (gateway(b, a, keys).name, gateway(b, c, keys).name) == ("b1", "b2")
    assert (gateway(c, a, keys).name, gateway(c, b, keys).name) == ("c1", "c2")
    plans = {n.name: plan_node(topo, n.name) for n in topo.nodes}
    peer_names = {n: {p.name for p in plans[n].peers} for n in plans}
    assert peer_names["a1"] == {"b1"} and peer_names["a2"] == {"c1"}
    assert peer_names["b1"] == {"a1"} and peer_names["b2"] == {"c2"}
    assert peer_names["c1"] == {"a2"} and peer_names["c2"] == {"b2"}
    assert peer_names["a3"] == set()
    # Every peer is answered by the other end: symmetric.
    for n, names in peer_names.items():
        for p in names:
            assert n in peer_names[p], (n, p)
    # A member routes b's pods to a1 and c's to a2; a1 sends c's to a2 over the private network.
    def via(node: str, dst: str) -> str:
        r = next(r for r in plans[node].routes if str(r.dst) == dst)
        return f"{r.via} {r.dev}"
    assert via("a3", "10.42.4.0/24") == "10.10.0.1 private" and via("a3", "10.42.7.0/24") == "10.10.0.2 private"
    assert via("a1", "10.42.7.0/24") == "10.10.0.2 private" and via("a2", "10.42.4.0/24") == "10.10.0.1 private"
    assert plans["a1"].wireguard_ip == plans["a2"].wireguard_ip is not None and plans["a3"].wireguard_ip is None
    assert plans["a3"].leaders == ("a1", "a2")


def test_leaders_per_location_with_one_out_keeps_the_count_from_the_rest() -> None:
    topo = three_by_three(leaders_per_location=2)
    rs = reports(report("a2", a1="bad", a3="ok"), report("a3", a1="bad", a2="ok"))
    d = choose_leaders(topo, rs)
    assert d.locations["location:a"].leaders == ("a2", "a3")
    plans = {n.name: plan_node(with_leaders(topo, d), n.name) for n in topo.nodes}
    assert {p.name for p in plans["a2"].peers} | {p.name for p in plans["a3"].peers} == {"b1", "c1"}


def test_across_clusters_both_ends_follow_the_remote_clusters_own_choice() -> None:
    """Cluster c2 reads its reports and moves loc-a to a2; c1 reads c2's reports with its records
    (the cluster mesh) and makes the same choice: x1 peers c2/a2, and a2 peers c1/x1."""
    from meshctl.mesh.admit import admit_remotes

    c2 = three_by_three()
    c2 = parse_topology({"cluster": {"name": "c2", "id": 2},
                         "mesh": {"granularity": "location", "subnet": "10.5.0.0/16"},
                         "nodes": [{"name": n.name, "location": n.location, "internal_ip": str(n.internal_ip),
                                    "endpoint": str(n.endpoint), "pod_cidr": str(n.pod_cidrs[0]),
                                    "public_key": n.public_key, "leader": n.leader} for n in c2.nodes]})
    c1 = parse_topology({"cluster": {"name": "c1", "id": 1}, "mesh": {"granularity": "location"},
                         "nodes": [{"name": "x1", "location": "x", "internal_ip": "10.20.0.1/24",
                                    "endpoint": "203.0.113.1:51820", "pod_cidr": "10.43.1.0/24",
                                    "public_key": key(99)}]})
    rs = {r.node: ForwardingReport(r.node, "c2", r.at, r.verdicts)
          for r in (report("a2", a1="bad", a3="ok"), report("a3", a1="bad", a2="ok"))}
    led = with_leaders(c2, choose_leaders(c2, rs))
    remotes, rejected = admit_remotes(c1, [led])
    assert not rejected
    x1 = plan_node(c1, "x1", remotes)
    assert {p.name for p in x1.peers} == {"c2/a2", "c2/b1", "c2/c1"}
    back, rejected = admit_remotes(led, [c1])
    assert not rejected
    a2 = plan_node(led, "a2", back)
    assert "c1/x1" in {p.name for p in a2.peers}
    assert all("c1/x1" not in {p.name for p in plan_node(led, n, back).peers} for n in ("a1", "a3"))


def test_node_list_and_graph_say_who_leads_in_place_of_whom() -> None:
    from meshctl.mesh.graph import graph_model, model_text, with_leader_notes
    from meshctl.mesh.render import node_rows

    topo = three_by_three()
    rs = reports(report("a2", a1="bad", a3="ok"), report("a3", a1="bad", a2="ok"))
    d = choose_leaders(topo, rs)
    moved = with_leaders(topo, d)
    rows = {r["name"]: r.get("lead") for r in node_rows(moved, [], plan_node(moved, "b2"))}
    assert rows == {"a1": "out (does not forward)", "a2": "leads (for a1)", "a3": None,
                    "b1": "leads", "b2": None, "b3": None, "c1": "leads", "c2": None, "c3": None}
    text = model_text(with_leader_notes(graph_model(moved), d))
    assert "location a: 3 nodes, leader a2" in text
    assert "leaders: a: a2 leads in place of a1: a1 does not forward: a2: a1 bad for 0.0 s (report 0.0 s old); " \
           "a3: a1 bad for 0.0 s (report 0.0 s old)" in text
    assert "leaders:" not in model_text(with_leader_notes(graph_model(topo), choose_leaders(topo, {})))


# --- other locations' leaders as witnesses ---------------------------------------------------------


def locations(*sizes: int) -> Topology:
    """Locations a, b, c, ... of `sizes` members each (x1 leads each by the documented order)."""
    nodes = []
    for li, size in enumerate(sizes):
        loc = "abcdefgh"[li]
        for i in range(1, size + 1):
            k = li * 8 + i
            nodes.append({"name": f"{loc}{i}", "location": loc, "internal_ip": f"10.1{li}.0.{i}/24",
                          "endpoint": f"198.51.100.{k}:51820", "pod_cidr": f"10.42.{k}.0/24",
                          "public_key": key(k), "leader": i == 1})
    return parse_topology({"cluster": {"name": "c1", "id": 1}, "mesh": {"granularity": "location"},
                           "nodes": nodes})


def seen(node: str, reached: tuple[str, ...], at: float = T0, **verdicts: str | tuple[str, float]) -> ForwardingReport:
    """`node`'s report with the nodes whose own address answers it."""
    return replace(report(node, at, **verdicts), reached=reached)


# a2 reaches a1 (its own address answers) but a1 forwards none of its hairpins; b1 and c1 reach a1
# through the tunnel, and their echoes through it to a2 are lost.
A2_SEES = seen("a2", ("a1",), a1="bad")
B1_SEES = seen("b1", ("a1", "c1"), a1="bad", c1="ok", b2="ok")
C1_SEES = seen("c1", ("a1", "b1"), a1="bad", b1="ok", c2="ok")


@pytest.mark.parametrize(("rs", "expected_a"), [
    pytest.param((A2_SEES, B1_SEES), ("a2",), id="its member and another location's leader: a2 leads"),
    pytest.param((A2_SEES, B1_SEES, C1_SEES), ("a2",), id="its member and both other leaders"),
    pytest.param((A2_SEES,), ("a1",), id="its member alone never"),
    pytest.param((B1_SEES,), ("a1",), id="another location's leader alone never"),
    pytest.param((B1_SEES, C1_SEES), ("a1",),
                 id="outside witnesses alone never: a2 down fails their echoes through a1 as well"),
    pytest.param((seen("a2", (), a1="bad"), B1_SEES, C1_SEES), ("a1",),
                 id="a2 reaches nobody: cut off itself, it does not count, and the outside alone cannot"),
    pytest.param((A2_SEES, seen("b1", (), a1="bad")), ("a1",),
                 id="an outside leader that reaches nothing (cut off) does not count"),
    pytest.param((A2_SEES, seen("b1", ("c1",), a1="bad", c1="ok")), ("a2",),
                 id="an outside leader that sees another leader ok counts"),
    pytest.param((A2_SEES, replace(B1_SEES, at=T0 - STALE_S - 1), C1_SEES, seen("b2", (), b1="ok")), ("a2",),
                 id="a stale outside report does not count, a fresh one does"),
    pytest.param((A2_SEES, replace(B1_SEES, at=T0 - STALE_S - 1), seen("c2", (), c1="ok")), ("a1",),
                 id="the only outside report stale: no quorum"),
    pytest.param((A2_SEES, B1_SEES, seen("c1", ("a1", "b1"), a1="ok", b1="ok")), ("a2",),
                 id="two against outnumber one for"),
    pytest.param((A2_SEES, seen("b2", ("a1",), a1="bad", b1="ok")), ("a1",),
                 id="a member of another location that does not lead it is no witness"),
])
def test_other_locations_leaders_witness_a_location_of_two(rs: tuple[ForwardingReport, ...],
                                                           expected_a: tuple[str, ...]) -> None:
    assert leaders_of(locations(2, 2, 2), reports(*rs))["a"] == expected_a


def test_a_tie_of_outside_witnesses_keeps_the_leader() -> None:
    """Four locations of two: a2 and b1 against a1, c1 and d1 for it: a tie keeps a1; d1 against
    too moves it."""
    topo = locations(2, 2, 2, 2)
    d1_for = seen("d1", ("a1", "b1"), a1="ok", b1="ok")
    tie = reports(A2_SEES, B1_SEES, seen("c1", ("a1", "b1"), a1="ok", b1="ok"), d1_for)
    assert leaders_of(topo, tie)["a"] == ("a1",)
    more = reports(A2_SEES, B1_SEES, C1_SEES, d1_for)
    assert leaders_of(topo, more)["a"] == ("a2",)


def test_a_leader_its_own_members_replaced_witnesses_for_the_others() -> None:
    """loc-b (three members) moved from b1 to b2 by its own members: b2 peers the other locations
    now, and its verdict on a1 counts (b1's no longer does)."""
    topo = locations(2, 3, 1)
    b_moves = (seen("b2", (), b1="bad", b3="ok"), seen("b3", (), b1="bad", b2="ok"))
    b2_sees = seen("b2", ("a1",), a1="bad", b1="bad", b3="ok")
    assert leaders_of(topo, reports(A2_SEES, b2_sees, b_moves[1])) == {"a": ("a2",), "b": ("b2",), "c": ("c1",)}
    b1_sees = seen("b1", ("a1",), a1="bad", b2="ok", b3="ok")
    assert leaders_of(topo, reports(A2_SEES, b1_sees, *b_moves))["a"] == ("a1",)


def test_after_the_move_the_outside_word_holds_until_the_members_see_it_forward() -> None:
    """a2 leads; b1 peers a2 now and no longer reaches a1, but keeps its `bad` (frozen): with a2's
    `recovering` a1 stays out; once a2's hold ends (`ok`), a1 leads again, whatever b1 still says."""
    topo = locations(2, 2, 2)
    b1_after = seen("b1", ("a2", "c1"), a1=("bad", T0 - 5), a2="ok", c1="ok")
    held = reports(seen("a2", ("a1",), a1="recovering"), b1_after)
    assert leaders_of(topo, held)["a"] == ("a2",)
    back = reports(seen("a2", ("a1",), a1="ok"), b1_after)
    assert leaders_of(topo, back)["a"] == ("a1",)
    loc = choose_leaders(topo, held).locations["location:a"]
    assert {e.publisher for e in loc.evidence} == {"a2", "b1"} and loc.reason.startswith("a1 does not forward")


def test_two_locations_of_two_broken_at_once_each_moves() -> None:
    """a1 and b1 both stop forwarding: each still answers at its own address and still sends, so
    each witnesses the other, and c1 witnesses both."""
    topo = locations(2, 2, 2)
    rs = reports(seen("a2", ("a1",), a1="bad"), seen("b2", ("b1",), b1="bad"),
                 seen("a1", ("b1", "c1"), b1="bad", c1="ok", a2="ok"),
                 seen("b1", ("a1", "c1"), a1="bad", c1="ok", b2="ok"),
                 seen("c1", ("a1", "b1"), a1="bad", b1="bad", c2="ok"))
    assert leaders_of(topo, rs) == {"a": ("a2",), "b": ("b2",), "c": ("c1",)}


def test_a_report_of_unknown_reach_parses_as_before_and_reach_round_trips() -> None:
    r = seen("a2", ("a1",), a1="bad")
    assert ForwardingReport.from_json(r.to_json(), "k") == r
    old = {"node": "a2", "cluster": "c1", "at": 1, "verdicts": {}}
    assert ForwardingReport.from_json(old, "k").reached == ()
    with pytest.raises(MeshError, match="reached: 7 is not a node name"):
        ForwardingReport.from_json({**old, "reached": [7]}, "k")


# --- a leader's witness of other locations' leaders, on a made-up clock ------------------------------


def rounds(w: LeaderWitness, node: str, start: float, end: float, own: bool, through: bool | None) -> float:
    t = start
    while t < end:
        w.echo(node, own, through, t)
        w.tick(t)
        t = round(t + 0.1, 6)
    return t


def test_witness_a_leader_that_answers_but_does_not_forward_is_bad() -> None:
    w = LeaderWitness(hold=30)
    w.set_targets([], ["a1"], [], 0.0)
    t = rounds(w, "a1", 0.0, 2.0, True, True)
    assert w.verdicts()["a1"].verdict == "ok" and w.reached() == ("a1",)
    broke = t
    while w.verdicts()["a1"].verdict == "ok":
        t = rounds(w, "a1", t, t + 0.1, True, False)
    assert t - broke <= 1.5 and w.reached() == ("a1",)
    r = w.report("b1", "c1", t)
    assert r.verdicts["a1"].verdict == "bad" and r.reached == ("a1",)


def test_witness_a_leader_out_of_reach_is_not_judged() -> None:
    """Down, or the tunnel down: its own address does not answer either. Never `bad`; its `ok`
    leaves the report (it no longer vouches for it), and it leaves `reached`."""
    w = LeaderWitness(hold=30)
    w.set_targets([], ["a1"], [], 0.0)
    t = rounds(w, "a1", 0.0, 2.0, True, True)
    t = rounds(w, "a1", t, t + 10.0, False, False)
    assert "a1" not in w.verdicts() and w.reached() == ()
    assert w.forwards.verdicts()["a1"].verdict == "ok"  # held, not judged
    rounds(w, "a1", t, t + 1.0, True, True)
    assert w.verdicts()["a1"].verdict == "ok"


def test_witness_keeps_its_bad_on_a_leader_it_no_longer_peers_and_holds_it_when_it_sees_it_again() -> None:
    w = LeaderWitness(hold=5)
    w.set_targets(["b2"], ["a1", "c1"], [], 0.0)
    t = rounds(w, "a1", 0.0, 1.0, True, True)
    t = rounds(w, "a1", t, t + 2.0, True, False)
    assert w.verdicts()["a1"].verdict == "bad"
    rounds(w, "c1", 0.0, 1.0, True, True)
    # a2 leads loc-a now: b1 peers a2, not a1; a1 (bad) is kept, c1 (ok, no longer peered) is not.
    w.set_targets(["b2"], ["a2"], ["a1", "a2", "c1", "c2"], t)
    assert w.verdicts()["a1"].verdict == "bad" and w.reached() == ("a1",)  # as when last probed
    t = rounds(w, "a2", t, t + 60.0, True, True)
    assert w.verdicts()["a1"].verdict == "bad" and "c1" not in w.verdicts() and w.reached() == ("a1", "a2")
    # a1 leads again: seen again, it is `recovering` for the hold, then `ok`.
    w.set_targets(["b2"], ["a1"], ["a1", "a2", "c1", "c2"], t)
    t = rounds(w, "a1", t, t + 1.0, True, True)
    assert w.verdicts()["a1"].verdict == "recovering"
    rounds(w, "a1", t, t + 5.0, True, True)
    assert w.verdicts()["a1"].verdict == "ok"


def test_what_a_leader_probes_through_the_tunnel() -> None:
    """The leader it peers in each other location, with up to THROUGH_TARGETS other members to
    echo through it; a member that does not lead probes no other location; a location of one has
    nothing to echo through."""
    topo = locations(3, 5, 1)
    t = leader_targets(topo, "a1")
    assert t == {"b1": LeaderTarget("10.11.0.1", ("10.11.0.2", "10.11.0.3", "10.11.0.4"))}
    assert THROUGH_TARGETS == 3 and leader_targets(topo, "a2") == {}
    moved = with_leaders(topo, choose_leaders(topo, reports(seen("a2", (), a1="bad", a3="ok"),
                                                            seen("a3", (), a1="bad", a2="ok"))))
    assert leader_targets(moved, "a1") == {}
    assert set(leader_targets(moved, "a2")) == {"b1"}
    assert leader_targets(moved, "b1") == {"a2": LeaderTarget("10.10.0.2", ("10.10.0.1", "10.10.0.3"))}


def test_a_leader_of_a_location_of_one_keeps_a_moved_leader_out_from_the_moment_it_peers_the_next() -> None:
    """Locations a (a1, a2) and b (b1 alone). b1 sees a1 answer but not forward; with a2's word,
    a2 leads. b1 then peers a2 and no longer a1: its report, published at once, still counts
    (a1 stays `reached` as last seen) before any echo to a2 came back, so a1 is not brought
    straight back (which would move loc-a to and fro)."""
    topo = locations(2, 1)
    w = LeaderWitness(hold=10)
    w.set_targets([], ["a1"], ["a1", "a2"], 0.0)
    t = rounds(w, "a1", 0.0, 1.0, True, True)
    t = rounds(w, "a1", t, t + 2.0, True, False)
    a2 = seen("a2", ("a1",), at=t, a1="bad")
    moved = with_leaders(topo, choose_leaders(topo, reports(a2, w.report("b1", "c1", t))))
    assert leader_targets(moved, "b1") == {"a2": LeaderTarget("10.10.0.2", ("10.10.0.1",))}
    w.set_targets([], ["a2"], ["a1", "a2"], t)  # the peer changed; nothing heard from a2 yet
    assert leaders_of(topo, reports(a2, w.report("b1", "c1", t)))["a"] == ("a2",)


def test_showconf_gives_a_standby_peer_no_allowed_ips_line() -> None:
    """`wg setconf` takes a peer without AllowedIPs; an empty `AllowedIPs =` line says nothing."""
    from meshctl.mesh.render import conf_text, node_conf

    topo = three_by_three()
    out = with_leaders(topo, choose_leaders(topo, reports(report("a2", a1="bad", a3="ok"),
                                                          report("a3", a1="bad", a2="ok"))))
    text = conf_text(node_conf(out, plan_node(out, "a1")), "wireguard")
    peers = text.split("[Peer]")[1:]
    assert len(peers) == 2 and all("AllowedIPs" not in p and "PersistentKeepalive = 10" in p for p in peers)
