# SPDX-License-Identifier: Apache-2.0
"""The path chooser's rules on made-up clocks: leave a dead rung fast, come back after the hold,
do not flap under random loss, agree with the peer."""

from __future__ import annotations

import random

from meshctl.mesh.chooser import Chooser, ProbeTuning

LADDER = ("direct", "direct+ipip", "direct+vxlan", "wireguard-private", "tunnel")
ALL = frozenset(LADDER[:-1])
T = ProbeTuning()


class Sim:
    """Drives a chooser as the prober would: probes at the chooser's pace, each answered unless the
    fabric of its kind is cut (or lost at random)."""

    def __init__(self, local=ALL, peer_rungs=ALL, loss: float = 0.0, seed: int = 1) -> None:
        self.c = Chooser(local, T)
        self.now = 0.0
        self.cut: set[str] = set()
        self.loss = loss
        self.rng = random.Random(seed)
        self.peer_rungs = peer_rungs
        self.peer_choice: str | None = None
        self.c.set_peers({"b": LADDER}, self.now)
        self.next = {k: 0.0 for k in self.c.pairs["b"].kinds}

    def run(self, seconds: float, step: float = 0.01) -> list[str]:
        rungs = []
        end = self.now + seconds
        while self.now < end:
            for k, at in self.next.items():
                if self.now >= at:
                    ok = k not in self.cut and self.rng.random() >= self.loss
                    if ok:
                        self.c.reply("b", k, 0.001, self.now, self.peer_rungs, self.peer_choice)
                    else:
                        self.c.lost("b", k, self.now + T.timeout)
                    self.next[k] = self.now + self.c.due("b", k)
            if self.c.tick(self.now):
                rungs.append(self.c.pairs["b"].rung)
            self.now += step
        return rungs


def test_first_verdict_is_immediate_and_takes_the_cheapest() -> None:
    s = Sim()
    assert s.c.path_state() == {}  # no verdict yet: the plan assumes every rung works
    s.run(0.1)
    assert s.c.pairs["b"].rung == "direct"
    assert s.c.path_state()["b"] == ALL


def test_dead_rung_is_left_within_3_s_and_taken_back_after_the_hold() -> None:
    s = Sim()
    s.run(2)
    s.cut = {"direct"}
    t0 = s.now
    s.run(3)
    assert s.c.pairs["b"].rung == "direct+ipip"
    left = next(c for c in s.c.changes if c.new == "direct+ipip")
    assert left.at - t0 <= 2.0 and left.reason == "direct stopped delivering"
    s.cut = set()
    back = s.now
    s.run(T.hold - 1)
    assert s.c.pairs["b"].rung == "direct+ipip"  # still holding
    s.run(2)
    assert s.c.pairs["b"].rung == "direct"
    last = s.c.changes[-1]
    assert last.reason == "direct delivered for the hold time" and last.at - back >= T.hold


def test_everything_cut_falls_to_the_tunnel() -> None:
    s = Sim()
    s.cut = {"direct", "udp", "ipip"}
    s.run(3)
    assert s.c.pairs["b"].rung == "tunnel" and s.c.path_state()["b"] == frozenset()


def test_random_loss_does_not_flap() -> None:
    # 20 % loss each way is 36 % of probe round trips.
    for seed in range(5):
        s = Sim(loss=0.36, seed=seed)
        changes = s.run(60)
        assert changes == ["direct"], (seed, changes)


def test_unavailable_rungs_are_skipped_on_either_end() -> None:
    s = Sim(local=ALL - {"direct+ipip"})
    assert "ipip" not in s.c.pairs["b"].kinds
    s.cut = {"direct"}
    s.run(3)
    assert s.c.pairs["b"].rung == "direct+vxlan"
    s = Sim(peer_rungs=ALL - {"direct+ipip"})
    s.cut = {"direct"}
    s.run(3)
    assert s.c.pairs["b"].rung == "direct+vxlan"


def test_both_ends_use_the_costlier_choice() -> None:
    s = Sim()
    s.peer_choice = "direct+vxlan"  # the peer's direct probes fail (one-way breakage)
    s.run(1)
    assert s.c.pairs["b"].rung == "direct+vxlan"
    assert s.c.path_state()["b"] == frozenset({"direct+vxlan", "wireguard-private"})
    assert s.c.changes[-1].reason in ("first probes", "peer chose direct+vxlan")


def test_a_kind_that_never_delivered_needs_no_hold() -> None:
    s = Sim()
    s.cut = {"direct", "udp", "ipip"}  # the peer's agent is not up yet
    s.run(3)
    assert s.c.pairs["b"].rung == "tunnel"
    s.cut = set()
    s.run(1.5)
    assert s.c.pairs["b"].rung == "direct"
    assert s.c.changes[-1].reason == "direct became available"


def test_without_probes_no_encapsulated_rung_is_assumed() -> None:
    from meshctl.agent.path_probing import unprobed_state

    state = unprobed_state({"b": LADDER, "c": LADDER[1:]})
    assert state == {"b": frozenset({"direct", "wireguard-private"}), "c": frozenset({"wireguard-private"})}


def test_a_hold_the_peer_ends_later_is_still_the_reason_of_the_move_back() -> None:
    """Every kind cut, then restored: the holds end together here, the peer's a little later and
    one rung at a time. The pair steps back through the peer's choices; its last move, onto direct,
    is still owed to direct's hold, not "became available" (one change used to clear every kind's hold)."""
    s = Sim()
    s.run(2)
    s.cut = {"direct", "udp", "ipip"}
    s.run(8)  # stand-by kinds are probed slowly: the last one is seen dead within a few seconds
    assert s.c.pairs["b"].rung == "tunnel"
    s.cut = set()
    s.peer_choice = "tunnel"
    s.run(T.hold + 1)
    assert s.c.pairs["b"].rung == "tunnel"  # our holds are over; the peer's are not
    s.peer_choice = "direct+vxlan"
    s.run(6)  # the stand-by kind's probe must be fresh again
    assert s.c.pairs["b"].rung == "direct+vxlan"
    assert s.c.changes[-1].reason == "peer chose direct+vxlan"
    s.peer_choice = "direct"
    s.run(2)
    assert s.c.pairs["b"].rung == "direct"
    assert s.c.changes[-1].reason == "direct delivered for the hold time", s.c.changes[-3:]


def test_a_newly_probed_pair_keeps_its_path_until_a_verdict() -> None:
    """Make before break: a private_networks change makes b, c and d (reached by tunnel, a private
    rung and a leader) eligible; until their probes give a verdict each keeps the path of the last
    plan, and the plan chooses that path (choose_rung). A peer with a verdict keeps it; one the
    last plan did not reach (a node joining) is left to the plan's assumption."""
    from meshctl.agent.path_probing import keep_paths
    from meshctl.mesh.ladder import choose_rung

    ladders = {"b": LADDER, "c": LADDER, "d": LADDER, "e": LADDER, "f": LADDER}
    verdicts = {"e": frozenset({"direct+vxlan"})}
    previous = {"b": "tunnel", "c": "wireguard-private", "d": "via-leader", "e": "tunnel"}
    held = keep_paths(verdicts, ladders, previous)
    assert held == {"b": frozenset(), "c": frozenset({"wireguard-private"}), "d": frozenset(),
                    "e": frozenset({"direct+vxlan"})}
    assert [choose_rung(LADDER, held.get(n)) for n in "bcdef"] == \
        ["tunnel", "wireguard-private", "tunnel", "direct+vxlan", "direct"]
