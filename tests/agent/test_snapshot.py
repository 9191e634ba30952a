# SPDX-License-Identifier: Apache-2.0
"""The agent's status is one snapshot the loop publishes (agent/snapshot.py): one type, built in
one place of the loop, swapped in as one reference; the readers (HTTP, metrics, the observed
summary) read snapshots and nothing of a step, WireGuard or the kernel; a reader asking for
counters as of now gets the loop's next snapshot."""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

from meshctl.agent import loop, snapshot
from meshctl.agent.snapshot import NodeRows, Snapshot, StatusBoard
from meshctl.agent.status import AgentStatus, LiveStatus
from meshctl.mesh.render import NodeRow

AGENT = Path(loop.__file__).parent
PKG = AGENT.parent


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _calls(tree: ast.AST, attr: str) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == attr]


def _board_publishes(tree: ast.AST) -> list[ast.Call]:
    """Calls of `<...>.board.publish(...)` (a StatusBoard's)."""
    return [c for c in _calls(tree, "publish") if isinstance(c.func, ast.Attribute)
            and isinstance(c.func.value, ast.Attribute) and c.func.value.attr == "board"]


def test_the_loop_publishes_one_snapshot_type_in_one_place() -> None:
    where = {p.name: calls for p in sorted(AGENT.glob("*.py")) if (calls := _board_publishes(_tree(p)))}
    boards = {p.name for p in sorted(AGENT.glob("*.py")) if "StatusBoard(" in p.read_text()}
    assert boards == {"lifecycle.py"}, boards  # one board, made at start
    assert list(where) == ["loop.py"], where
    [call] = where["loop.py"]
    [arg] = call.args
    assert isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name) and arg.func.id == "Snapshot"
    # the one publisher is the pass driver's, called at the end of every pass and on a reader's nudge
    driver = next(n for n in _tree(AGENT / "loop.py").body if isinstance(n, ast.ClassDef) and n.name == "PassDriver")
    finish = next(f for f in driver.body if isinstance(f, ast.FunctionDef) and f.name == "_finish")
    assert _calls(finish, "publish_status")


def test_readers_read_snapshots_only() -> None:
    """The HTTP server and the observed-summary publisher import nothing that reaches a step, the
    device or the kernel; the agent's status() takes a snapshot from the board."""
    for name in ("server.py", "seen.py", "snapshot.py"):
        imported = {n.module for n in ast.walk(_tree(AGENT / name)) if isinstance(n, ast.ImportFrom)}
        reach = {m for m in imported if m and m.startswith(("meshctl.agent.steps", "meshctl.agent.step_runner",
                                                               "meshctl.agent.reporting", "meshctl.node",
                                                               "meshctl.datapath"))}
        assert not reach, (name, reach)
    lifecycle = _tree(AGENT / "lifecycle.py")
    status = next(n for n in ast.walk(lifecycle) if isinstance(n, ast.FunctionDef) and n.name == "status")
    assert {c.func.attr for c in _calls(status, "fresh")} == {"fresh"}  # type: ignore[attr-defined]
    assert not _calls(status, "read")


def test_no_module_outside_the_agent_reads_a_step() -> None:
    """Steps and their runner are the agent's: nothing outside agent/ imports them or reaches into
    a running agent (`_running`)."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        if path.is_relative_to(AGENT):
            continue
        tree = _tree(path)
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module in ("meshctl.agent.steps", "meshctl.agent.step_runner",
                                                              "meshctl.agent.loop", "meshctl.agent.reporting"):
                bad.append(f"{path.relative_to(PKG)}: imports {n.module}")
            if isinstance(n, ast.Attribute) and n.attr in ("_running", "runner", "steps"):
                bad.append(f"{path.relative_to(PKG)}:{n.lineno}: .{n.attr}")
    assert not bad, bad


def _snap(at: float, rows: NodeRows | None = None) -> Snapshot:
    return Snapshot(AgentStatus("a1", True, "", None, LiveStatus.from_json({})), rows, True, at)


def test_a_reader_gets_the_snapshot_the_loop_publishes_after_it_asked() -> None:
    asked = threading.Event()
    board = StatusBoard(asked.set)
    board.publish(_snap(time.monotonic() - 5))

    def the_loop() -> None:  # answers the nudge as ReconcileLoop does: a snapshot read now
        asked.wait(10)
        board.publish(_snap(time.monotonic()))

    t = threading.Thread(target=the_loop)
    t.start()
    t0 = time.monotonic()
    got = board.fresh(timeout=10)
    t.join()
    assert got is not None and got.at >= t0 and got is board.latest()
    # a loop that does not answer: the last snapshot, once the wait is over
    stale = StatusBoard(lambda: None)
    old = _snap(time.monotonic() - 5)
    stale.publish(old)
    assert stale.fresh(timeout=0.01) is old


def test_the_node_list_is_built_once_on_its_first_read() -> None:
    built: list[int] = []
    row = NodeRow("a2", "c1", "local", "loc", None, None, (), None, "direct", None, None)

    def build() -> tuple[NodeRow, ...]:
        built.append(1)
        return (row,)

    snap = _snap(0.0, NodeRows(build))
    assert built == [] and snap.document(node_list=False).live.node_list is None
    assert snap.document().live.node_list == (row,) and snap.document().live.node_list == (row,)
    assert built == [1]


def test_a_nudge_is_no_reason_for_a_pass() -> None:
    wake = loop.Wake()
    wake.nudge()
    assert wake.wait(0.0) is False and wake.take_nudge() and not wake.take_nudge()
    wake.set()
    assert wake.wait(0.0) is True and wake.is_set()
    assert snapshot.FRESH_WAIT_S > 0
