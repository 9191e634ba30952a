# SPDX-License-Identifier: Apache-2.0
"""A 100 pps ping between two lab pods (or slower: `interval`), shared by the lab tests that count
lost packets.

It runs for a time, not a count (`ping -w`): on a loaded machine ping paces itself below 100 pps,
and a count would stretch a 120 s ping to four minutes. Replies are read by sequence number, so a
loss is a sequence number that never came back; the packets sent in the last second before the
deadline may still be in flight when ping exits, and are not counted as lost.

Each result also carries its longest gap between replies, and `covered` holds when no reply is
further than MAX_GAP_S from the next (or from the start or end): a loaded machine slows ping
down, but a ping that stalled would send nothing through an outage and lose nothing.

`errors` are the ICMP errors ping printed ("Destination Host Unreachable", "Destination Net
Unreachable", ...) and the sends the kernel refused ("ping: sendmsg: ..."): what a connection
being opened at that moment would fail on. `lost_at` and `errors_at` say when each happened
(wall-clock seconds; a lost packet's send time is interpolated between the replies around it), so
a caller can tell which of several changes in the ping's window it belongs to."""

from __future__ import annotations

import bisect
import itertools
import math
import os
import re
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces.state import LabState
from meshctl.lab.rigs import netns
from tests.waiting import WAIT_S, wait_for, wait_until

_SENT = re.compile(r"(\d+) packets transmitted")
_REPLY = re.compile(r"^\[(\d+\.\d+)\] \d+ bytes from .*icmp_seq=(\d+)", re.M)
_STAMP = re.compile(r"^\[(\d+\.\d+)\]")
_ERROR = re.compile(r"(?:From \S+ icmp_seq=\d+ |ping: sendmsg: |ping: )(.*)")
_SUMMARY = ("PING ", "--- ", "rtt ", "round-trip")
IN_FLIGHT_S = 1.0  # -W: how long ping waits for the last reply; what was sent in it may be in flight
MAX_GAP_S = 1.5  # below the shortest outage the tests ping across (2 s)
# ping's -w for a check that wants every reply: once one reply is in, ping waits only two round
# trips after its last ping and counts a later reply as lost (a userspace WireGuard starved of CPU
# for a moment on a loaded machine); with -w it waits up to this many seconds for each.
LATE_REPLY_S = 5


@dataclass(frozen=True)
class PingResult:
    sent: int
    received: int
    lost: tuple[int, ...]  # sequence numbers that never came back (those in flight at the end left out)
    elapsed: float
    longest_gap: float  # seconds between two replies (or the start and the first, the last and the end)
    errors: tuple[str, ...] = ()  # ICMP errors and refused sends, as ping printed them
    lost_at: tuple[float, ...] = ()  # when each of `lost` was sent (wall clock, interpolated)
    errors_at: tuple[float, ...] = ()  # when each of `errors` was printed (wall clock)
    gap_at: float = 0.0  # when the longest gap began (wall clock)
    replied_at: tuple[float, ...] = ()  # when each reply came (wall clock, ping's own -D stamps), in order

    @property
    def covered(self) -> bool:
        """Whether ping kept sending through its whole window."""
        return self.longest_gap <= MAX_GAP_S

    @property
    def pair(self) -> tuple[int, int]:
        """(sent, received) in the window ping measured: the in-flight tail is neither."""
        return self.sent, self.sent - len(self.lost)


class PodPing:
    """`ping -i INTERVAL -w SECONDS` from the first pod of `src` to the first pod of `dst`, in the
    background. `through_errors`: `-c` for the same window instead (`-w` makes ping exit at the
    first ICMP error, `-c` keeps it sending through a moment without a route)."""

    def __init__(self, st: LabState, src: str, dst: str, seconds: float, interval: float = 0.01, *,
                 through_errors: bool = False) -> None:
        by_name = {n.name: n for _, n in st.nodes()}
        self.dst_ip = by_name[dst].pods[0].ip
        self.seconds = seconds
        self.interval = interval
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        # a file, not a pipe: a line a reply fills a pipe nobody drains in ~12 s, and ping then blocks
        self.out = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by result()
        self.proc = subprocess.Popen(
            [*netns.exec_prefix(by_name[src].pods[0].netns), "ping", "-n", "-D", "-i", str(interval), "-W",
             str(int(IN_FLIGHT_S)),
             *(("-c", str(math.ceil(seconds / interval))) if through_errors else ("-w", str(math.ceil(seconds)))),
             self.dst_ip],
            stdout=self.out, stderr=subprocess.STDOUT, text=True)

    def replies(self) -> int:
        """Replies so far, read at an explicit offset (ping writes at the offset it shares with
        `out`: seeking that one while ping runs would make it write over its own lines)."""
        fd = self.out.fileno()
        return len(_REPLY.findall(os.pread(fd, os.fstat(fd).st_size, 0).decode(errors="replace")))

    def answered(self, count: int = 3, timeout: float = WAIT_S) -> PodPing:
        """Once `count` replies came back: the ping runs and the pair works, so a change made now
        falls inside its window (what a fixed sleep after the start only hoped for)."""
        wait_until(lambda: self.replies() >= count, timeout, f"{count} replies from {self.dst_ip}")
        return self

    def stop(self) -> None:
        """End ping now, before its window: on SIGINT it prints its summary as at its deadline."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)

    def result(self, timeout: float | None = None) -> PingResult:
        """Wait for ping to end; kill it after `timeout` (default: its deadline plus 30 s)."""
        try:
            self.proc.wait(timeout=timeout or self.seconds + 30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.out.seek(0)
            out = self.out.read()
            self.out.close()
        elapsed = time.monotonic() - self.t0
        m = _SENT.search(out)
        assert m, out[-2000:]
        sent = int(m.group(1))
        replies = {int(seq): float(ts) for ts, seq in _REPLY.findall(out)}
        tail = math.ceil(sent / max(elapsed, 1e-3) * IN_FLIGHT_S) + 1
        lost = tuple(s for s in range(1, max(sent - tail, 0) + 1) if s not in replies)
        times = sorted([self.wall0, *replies.values(), self.wall0 + min(elapsed, self.seconds)])
        gap, gap_at = max((b - a, a) for a, b in itertools.pairwise(times))
        errors, errors_at = self._errors(out)
        print(f"ping {self.dst_ip}: {sent} sent, {len(replies)} replies, {len(lost)} lost in {elapsed:.1f} s, "
              f"longest gap {gap:.2f} s" + (f"; {len(errors)} errors, the first: {errors[:3]}" if errors else ""))
        return PingResult(sent, len(replies), lost, elapsed, gap, errors, self._lost_at(lost, replies), errors_at,
                          gap_at, tuple(sorted(replies.values())))

    def _errors(self, out: str) -> tuple[tuple[str, ...], tuple[float, ...]]:
        """ICMP errors ("Destination Host Unreachable") and refused sends ("ping: sendmsg: ..."),
        each with the time of its line (a line without a timestamp: that of the line before)."""
        errors: list[str] = []
        at: list[float] = []
        last = self.wall0
        for line in out.splitlines():
            stamp = _STAMP.match(line)
            if stamp:
                last = float(stamp.group(1))
            if not line.strip() or _REPLY.match(line) or line.startswith(_SUMMARY) or _SENT.search(line):
                continue
            m = _ERROR.search(line)
            errors.append(m.group(1) if m else line.strip())
            at.append(last)
        return tuple(errors), tuple(at)

    def _lost_at(self, lost: tuple[int, ...], replies: dict[int, float]) -> tuple[float, ...]:
        """When each lost sequence number was sent: between the replies before and after it, in
        proportion (from the start at `interval` when no reply came before it)."""
        seqs = sorted(replies)
        out = []
        for s in lost:
            i = bisect.bisect_left(seqs, s)
            before = (seqs[i - 1], replies[seqs[i - 1]]) if i > 0 else (0, self.wall0 - self.interval)
            if i < len(seqs):
                after = (seqs[i], replies[seqs[i]])
                out.append(before[1] + (s - before[0]) * (after[1] - before[1]) / (after[0] - before[0]))
            else:
                out.append(before[1] + (s - before[0]) * self.interval)
        return tuple(out)


def checked(st: LabState, pairs: list[tuple[str, str]] | None = None, count: int = 3,
            timeout: float = WAIT_S) -> list[labcheck.PairResult]:
    """`lab check` of `pairs` (None: all): the pairs that failed are checked again until each answers
    (a pair's first packets may meet WireGuard's first handshake, and crossed initiations are retried
    after 5 s); the assertion names those that never did within `timeout`; every pair's last result."""
    results = {(r.src, r.dst, r.family): r for r in labcheck.check(st, count=count, pairs=pairs)}

    def answered() -> bool:
        failed = sorted({(src, dst) for (src, dst, _), r in results.items() if not r.ok})
        if failed:
            results.update({(r.src, r.dst, r.family): r for r in labcheck.check(st, count=count, pairs=failed)})
        return all(r.ok for r in results.values())

    if not wait_for(answered, timeout, step=0.5):
        raise AssertionError(f"not answering after {timeout:.0f} s: {[r for r in results.values() if not r.ok]}")
    return list(results.values())


# A lab node's logs, with where each line's time stamp starts and its format: the agent's lines start
# "2026-12-05 01:01:02,036 INFO", wireguard-go's "DEBUG: (kilo0) 2026/12/05 01:05:19".
NODE_LOGS = (("agent.log", 0, "%Y-%m-%d %H:%M:%S"), ("wg/kilo0.log", 15, "%Y/%m/%d %H:%M:%S"))


def node_log_lines(st: LabState, nodes: Iterable[str], since: float, until: float | None = None,
                   pick: dict[str, tuple[str, ...]] | None = None, tail: int | None = None) -> list[str]:
    """The lines each of `nodes` logged from `since` to `until` (wall clock, to the second; None: to
    now), named "<node> <log>: <line>"; `pick` reads only the logs it names, and of each only the
    lines with one of its words; `tail` keeps only each log's last so many.
    What a failed window is read with: a loss on one CI run is explained by what its ends logged."""
    by_name = {n.name: n for _, n in st.nodes()}
    out: list[str] = []
    for name in nodes:
        for log, at, fmt in NODE_LOGS:
            if pick is not None and log not in pick:
                continue
            first = time.strftime(fmt, time.localtime(since))
            last = time.strftime(fmt, time.localtime(until)) if until is not None else None
            try:
                lines = (Path(by_name[name].dir) / log).read_text(errors="replace").splitlines()
            except OSError as e:
                out.append(f"{name} {log}: {e}")
                continue
            words = pick[log] if pick is not None else None
            kept = [f"{name} {log}: {ln}" for ln in lines
                    if first <= ln[at:at + len(first)] and (last is None or ln[at:at + len(last)] <= last)
                    and (words is None or any(w in ln for w in words))]
            out += kept[-tail:] if tail else kept
    return out
