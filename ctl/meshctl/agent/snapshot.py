# SPDX-License-Identifier: Apache-2.0
"""The agent's status as one value: a `Snapshot` the reconcile loop builds after every pass (and,
between passes, when a reader asks for fresh counters) from the typed blocks of the pass and of
its steps, and publishes with one reference swap (`StatusBoard.publish`).

Readers (the /status and /metrics handlers, the observed-summary publisher) read snapshots only:
they never touch a step, WireGuard's device or the kernel, which only the loop's thread does. A
reader that wants counters as of now (`StatusBoard.fresh`) rings the loop (`Wake.nudge`, which is
no reason for a pass) and waits, at most FRESH_WAIT_S, for the snapshot the loop then publishes;
requests that arrive together share one read. During a pass the snapshot published at its end
answers them.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from meshctl.agent.status import AgentStatus
from meshctl.mesh.render import NodeRow

FRESH_WAIT_S = 2.0  # how long a reader waits for the loop's next snapshot before taking the last one


class NodeRows:
    """The node list of one applied view (`meshctl node list`), built on its first read (a
    50,000-node mesh is 50,000 rows: the loop does not build them for every view, a reader builds
    them once) and kept while the view is the same."""

    def __init__(self, build: Callable[[], tuple[NodeRow, ...]]) -> None:
        self._build: Callable[[], tuple[NodeRow, ...]] | None = build
        self._rows: tuple[NodeRow, ...] = ()
        self._lock = threading.Lock()

    def get(self) -> tuple[NodeRow, ...]:
        with self._lock:
            if self._build is not None:
                self._rows, self._build = self._build(), None
            return self._rows


@dataclass(frozen=True)
class Snapshot:
    """The status as the loop last published it: the /status document without its node list
    (`status`), the node list of the view it applied (None before one was applied), whether a plan
    has been applied since start, and when (monotonic) its live blocks were read."""

    status: AgentStatus
    rows: NodeRows | None
    plan_applied: bool
    at: float

    def document(self, node_list: bool = True) -> AgentStatus:
        """The /status document; without `node_list` its node list is left out (None)."""
        if not node_list or self.rows is None:
            return self.status
        return dataclasses.replace(self.status, live=dataclasses.replace(self.status.live, node_list=self.rows.get()))


class StatusBoard:
    """Where the loop publishes its snapshots and readers take them. `nudge` rings the loop for a
    snapshot between passes (agent.loop.Wake.nudge)."""

    def __init__(self, nudge: Callable[[], None]) -> None:
        self._nudge = nudge
        self._cond = threading.Condition()
        self._snapshot: Snapshot | None = None

    def publish(self, snapshot: Snapshot) -> None:
        with self._cond:
            self._snapshot = snapshot
            self._cond.notify_all()

    def latest(self) -> Snapshot | None:
        """The last snapshot published (None before the loop published one)."""
        return self._snapshot

    def fresh(self, timeout: float = FRESH_WAIT_S) -> Snapshot | None:
        """A snapshot whose live blocks were read after this call began: the loop is rung for one
        and waited for, at most `timeout`; then the last one, whatever its age."""
        asked = time.monotonic()
        self._nudge()
        with self._cond:
            self._cond.wait_for(lambda: self._snapshot is not None and self._snapshot.at >= asked, timeout)
            return self._snapshot
