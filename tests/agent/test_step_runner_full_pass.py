# SPDX-License-Identifier: Apache-2.0
"""A full pass does not hold up a change (agent/step_runner.py): before each step's full read the
runner asks whether a change waits; when one does, the rest of the pass runs as any pass, the
remaining steps stay owed, and the loop's next tick pays them. A debt older than one interval is
paid whatever waits. The steps record what the runner calls on them; the clock is the test's."""

from __future__ import annotations

import pytest

from meshctl.agent import step_runner
from meshctl.agent.reporting import ErrorCounts, PassLog
from meshctl.agent.step_runner import StepRunner

from .test_step_runner_order import Recording, _input

INTERVAL = 30.0
BEFORE = "before the pass"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(step_runner.time, "monotonic", c)
    return c


def setup(journal: list[str], pending_after: str | None) -> tuple[StepRunner, list[bool]]:
    """Three steps; `pending` is true once the journal holds `pending_after` (a change written
    while that call ran), from the start when it is BEFORE, never when None. The list returned
    switches pending off again (the loop ran the change)."""
    waiting = [True]
    steps = [Recording(n, journal) for n in ("wireguard", "routes", "datapath")]

    def pending() -> bool:
        return waiting[0] and (pending_after == BEFORE or pending_after is not None and pending_after in journal)

    return StepRunner(steps, resync_interval=INTERVAL, pending=pending), waiting


def one(runner: StepRunner, *, timer: bool) -> PassLog:
    run = PassLog(ErrorCounts())
    p = _input()
    runner.run(type(p)(**{**p.__dict__, "timer_pass": timer}), run)
    return run


@pytest.mark.parametrize("case, pending_after, first_tick, full", [
    ("nothing waits: the tick's pass reads every step in full", None,
     ["forget wireguard", "sync wireguard", "forget routes", "sync routes", "forget datapath", "sync datapath",
      "retire datapath", "retire routes", "retire wireguard"], True),
    ("a change arrives during wireguard's full read: routes and datapath wait", "sync wireguard",
     ["forget wireguard", "sync wireguard", "retire wireguard"], False),
    ("a change waits before the pass: it reads nothing in full", BEFORE, [], False),
], ids=["nothing waits", "change during the pass", "change before the pass"])
def test_a_change_cuts_the_full_pass_short_and_the_next_tick_finishes_it(
        clock: Clock, case: str, pending_after: str | None, first_tick: list[str], full: bool) -> None:
    journal: list[str] = []
    runner, waiting = setup(journal, pending_after)
    assert one(runner, timer=False).full  # the first pass: every step, whatever waits; nothing owed after
    assert journal[:3] == ["forget wireguard", "forget routes", "forget datapath"] and not runner.full_owed()
    journal.clear()
    clock.now += INTERVAL + 1
    run = one(runner, timer=True)
    assert journal == first_tick, case
    assert run.full == full and runner.full_owed() == (not full)
    if full:
        assert runner.full_total == 2
        return
    # The loop runs the change (a pass of its own, not the tick's): it pays no debt.
    waiting[0] = False
    journal.clear()
    clock.now += 0.1
    assert not one(runner, timer=False).full and journal == [] and runner.full_owed()
    # The loop's next tick (full_owed asked for it) reads the steps still owed, and only those.
    clock.now += 1
    run = one(runner, timer=True)
    owed = [n for n in ("wireguard", "routes", "datapath") if f"forget {n}" not in first_tick]
    assert journal == [x for n in owed for x in (f"forget {n}", f"sync {n}")] + \
        [f"retire {n}" for n in reversed(owed)]
    assert run.full and not runner.full_owed() and runner.full_total == 2


def test_a_debt_older_than_an_interval_is_paid_whatever_waits(clock: Clock) -> None:
    """Changes keep coming (pending always true): the full reads wait one interval, no longer."""
    journal: list[str] = []
    steps = [Recording(n, journal) for n in ("wireguard", "routes")]
    runner = StepRunner(steps, resync_interval=INTERVAL, pending=lambda: True)
    one(runner, timer=False)
    journal.clear()
    clock.now += INTERVAL + 1
    assert not one(runner, timer=True).full and journal == [] and runner.full_owed()
    clock.now += INTERVAL / 2
    assert not one(runner, timer=False).full and journal == []
    clock.now += INTERVAL / 2 + 1
    run = one(runner, timer=False)  # a change's pass, the debt overdue: paid now
    assert run.full and journal == ["forget wireguard", "sync wireguard", "forget routes", "sync routes",
                                    "retire routes", "retire wireguard"]
    assert not runner.full_owed()
