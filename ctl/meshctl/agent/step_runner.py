# SPDX-License-Identifier: Apache-2.0
"""Running the steps of a pass (agent/steps.py) in order: which to skip, which to make forget,
and when a pass is a full one. It holds the steps only as `Step`s: it reads nothing of a step
but what the protocol answers.

The order is derived from what each step declares (`step_order`): a step runs after every step
that provides what it needs, and otherwise in the order it was given; a need nobody provides, or
needs that go round in a circle, stop the agent at start (MeshError naming them).

Make before break: a pass first runs `sync` on every step (each adds or replaces what the plan
wants), then `retire` on the steps that synced, in reverse order (each removes what the plan no
longer wants). So the old state goes only once every new piece is in place: a route that moved
to the WireGuard device is there before the old peer loses the address, a fast-path entry that
moved to a kernel route is deleted only after the route exists.

A full pass (every step forgets and reads the kernel again, every resync interval) may take
seconds with tens of thousands of routes and peers; a change that arrives meanwhile must not wait
for it. So after the first pass a full pass is a debt of steps, paid one step at a time: before
each step's full read the runner asks `pending` (a change is waiting for the loop); when one is,
the remaining steps run as in any pass and stay owed, the pass ends, the loop runs the change, and
the next pass of the loop's tick (`full_owed` asks for one) pays the rest. A debt older than one
interval is paid whatever is pending, so a steady stream of changes cannot postpone repairs
forever."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import cast

from meshctl.agent.reporting import PassLog
from meshctl.agent.steps import NOTHING_SHOWN, EncapCarrier, LivePeers, PassInput, Step, StepReport
from meshctl.errors import MeshError


def step_order(steps: Sequence[Step]) -> list[Step]:
    """`steps` in the order their declarations ask for: each after the steps that provide what it
    needs (Step.needs, Step.provides), else in the order given. MeshError when a step needs what
    no step provides, or when the needs go round in a circle."""
    providers: dict[str, list[str]] = {}
    for s in steps:
        for what in s.provides:
            providers.setdefault(what, []).append(s.name)
    missing = sorted(f"{s.name} needs {what!r}" for s in steps for what in s.needs if what not in providers)
    if missing:
        raise MeshError(f"agent steps: no step provides what they need: {'; '.join(missing)}")
    after = {s.name: {p for what in s.needs for p in providers[what] if p != s.name} for s in steps}
    out: list[Step] = []
    left = list(steps)
    while left:
        ready = next((s for s in left if not after[s.name] - {o.name for o in out}), None)
        if ready is None:
            raise MeshError("agent steps: their needs go round in a circle: " + ", ".join(
                f"{s.name} after {'/'.join(sorted(after[s.name]))}" for s in left))
        out.append(ready)
        left.remove(ready)
    return out

log = logging.getLogger("meshctl.agent")


class StepRunner:
    """The steps of every pass, the inputs of each one's last success, and the full-pass clock."""

    def __init__(self, steps: Sequence[Step], resync_interval: float,
                 pending: Callable[[], bool] = lambda: False) -> None:
        self.steps = step_order(steps)
        self.resync_interval = resync_interval
        self.full_total = 0
        self.pending = pending  # a change waits for the loop (its wake event is set)
        self._applied: dict[str, Hashable] = {}
        self._full_due: float | None = None  # None: the first pass, always a full one
        self._owed: list[str] = []  # steps whose full read the current full pass still owes
        self._owed_since = 0.0

    def wants_pass(self, now: float, last_pass: float) -> bool:
        """A step asks for a pass although nothing changed (Step.wants_pass)."""
        return any(s.wants_pass(now, last_pass) for s in self.steps)

    def full_owed(self) -> bool:
        """A full pass was cut short by a change: the loop's next tick should run a pass to finish it."""
        return bool(self._owed)

    def _serving(self, interface: type) -> list[Step]:
        """The steps that declare they serve `interface` (Step.serves): the one way other parts of
        the agent reach a step."""
        return [s for s in self.steps if interface in s.serves]

    def carriers(self) -> list[EncapCarrier]:
        """The steps that serve EncapCarrier, as carriers (the prober's)."""
        return [cast(EncapCarrier, s) for s in self._serving(EncapCarrier)]

    def live_peers(self) -> LivePeers:
        """The one step that serves LivePeers (the loop's and the status's peer source); MeshError
        at start when not exactly one does."""
        found = self._serving(LivePeers)
        if len(found) != 1:
            raise MeshError(f"agent steps: {len(found)} serve LivePeers, one must")
        return cast(LivePeers, found[0])

    def report(self) -> StepReport:
        """Every step's status report, read now, joined (each block comes from one step)."""
        out = NOTHING_SHOWN
        for s in self.steps:
            out = out.join(s.status())
        return out

    def _full_pass_due(self, timer_pass: bool) -> tuple[bool, bool]:
        """Whether this pass pays full reads, and whether it is the first pass. Full passes (every
        step reads the kernel again) come from the loop's own tick, so they do not slow down the
        pass that applies a change, unless changes keep coming for two intervals. The first pass
        is always full and owes nothing afterwards, however young the machine's monotonic clock is."""
        now = time.monotonic()
        due = self._full_due
        if due is None:
            self._full_due = now + self.resync_interval
            return True, True
        if not self._owed and now >= due and (timer_pass or now >= due + self.resync_interval):
            self._full_due = now + self.resync_interval
            self._owed, self._owed_since = [s.name for s in self.steps], now
        overdue = now >= self._owed_since + self.resync_interval
        return bool(self._owed) and (timer_pass or overdue), False

    def _pay(self, s: Step) -> bool:
        """Step `s` reads the kernel in full now, unless a change waits (and the debt is not
        overdue): False then, and the caller pays nothing more this pass."""
        if self.pending() and time.monotonic() < self._owed_since + self.resync_interval:
            return False
        self._owed.remove(s.name)
        s.forget()
        self._applied.pop(s.name, None)
        return True

    def run(self, p: PassInput, run: PassLog) -> None:
        """Run every step's `sync` in order, then `retire` on those that synced, in reverse order.
        A step whose inputs did not change since it last succeeded is skipped, except when it reads
        the kernel in full; a failing step is counted, logged and made to forget, and never stops the
        others (a step whose sync failed does not retire: it removes nothing while its new state is
        not in place). `run.full`: this pass finished a full pass."""
        paying, first = self._full_pass_due(p.timer_pass)
        if first:
            for s in self.steps:
                s.forget()
            self._applied.clear()
        owed_before = bool(self._owed)
        by_name = {s.name: s for s in self.steps}
        synced: list[tuple[Step, Hashable | None]] = []
        for s in self.steps:
            inputs = s.inputs(p)
            full = first
            if paying and s.name in self._owed:
                full = paying = self._pay(s)
                if not paying:
                    log.info("full pass: a change waits; %s read in full at the next tick", ", ".join(self._owed))
            if inputs is not None and not full and self._applied.get(s.name) == inputs:
                run.steps_ms[s.name] = 0.0
                continue
            if self._sync(s, p, run, by_name):
                synced.append((s, inputs))
        run.full = first or (owed_before and not self._owed)
        if run.full:
            self.full_total += 1
        disturbed = self._retire(reversed(synced), p, run)
        # A retire disturbed a step (kilo0 lost its last address and, with it, its routes): that
        # step reads the kernel and runs again now, not at the next full pass. Once: what this
        # second round disturbs is left to the next pass (its step was made to forget).
        again = [(s, s.inputs(p)) for s in self.steps if s.name in disturbed]
        for s, _ in again:
            s.forget()
        self._retire(reversed([(s, i) for s, i in again if self._sync(s, p, run, by_name)]), p, run)

    def _sync(self, s: Step, p: PassInput, run: PassLog, by_name: Mapping[str, Step]) -> bool:
        """Run one step's sync; True if it succeeded (the steps it disturbed forget)."""
        self._applied.pop(s.name, None)
        t = time.monotonic()
        try:
            for other in s.sync(p):
                by_name[other].forget()
                self._applied.pop(other, None)
            return True
        except Exception as e:  # noqa: BLE001 - one step's failure must not stop the others
            self._failed(s, run, e)
            return False
        finally:
            run.timed(s.name, t)

    def _retire(self, steps: Iterable[tuple[Step, Hashable | None]], p: PassInput, run: PassLog) -> set[str]:
        """Run each step's retire, recording its inputs as applied when it succeeds; the names of
        the steps the retires disturbed (each made to forget)."""
        disturbed: set[str] = set()
        for s, inputs in steps:
            t = time.monotonic()
            try:
                others = s.retire(p)
                if inputs is not None:
                    self._applied[s.name] = inputs
                for other in others:
                    self._applied.pop(other, None)
                disturbed |= others
            except Exception as e:  # noqa: BLE001 - one step's failure must not stop the others
                self._failed(s, run, e)
            finally:
                run.timed(s.name, t)
        return disturbed

    @staticmethod
    def _failed(s: Step, run: PassLog, e: Exception) -> None:
        """Count and log a step's failure; make it forget (its memory of the kernel may be wrong
        now: it reads the kernel next time)."""
        run.fail(s.name, str(e) or type(e).__name__)
        log.warning("%s: %s", s.name, run.errors[s.name])
        s.forget()
