# SPDX-License-Identifier: Apache-2.0
"""A 100 pps ping between two lab pods, shared by the lab tests that count lost packets.

It runs for a time, not a count (`ping -w`): on a loaded machine ping paces itself below 100 pps,
and a count would stretch a 120 s ping to four minutes. Replies are read by sequence number, so a
loss is a sequence number that never came back; the packets sent in the last second before the
deadline may still be in flight when ping exits, and are not counted as lost.

Each result also carries its longest gap between replies, and `covered` holds when no reply is
further than MAX_GAP_S from the next (or from the start or end): a loaded machine slows ping
down, but a ping that stalled would send nothing through an outage and lose nothing."""

from __future__ import annotations

import itertools
import math
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass

from meshctl.lab.namespaces.state import LabState
from meshctl.lab.rigs import netns

_SENT = re.compile(r"(\d+) packets transmitted")
_REPLY = re.compile(r"^\[(\d+\.\d+)\] \d+ bytes from .*icmp_seq=(\d+)", re.M)
_SUMMARY = ("PING ", "--- ", "rtt ", "round-trip")
IN_FLIGHT_S = 1.0  # -W: how long ping waits for the last reply; what was sent in it may be in flight
MAX_GAP_S = 1.5  # below the shortest outage the tests ping across (2 s)


@dataclass(frozen=True)
class PingResult:
    sent: int
    received: int
    lost: tuple[int, ...]  # sequence numbers that never came back (those in flight at the end left out)
    elapsed: float
    longest_gap: float  # seconds between two replies (or the start and the first, the last and the end)

    @property
    def covered(self) -> bool:
        """Whether ping kept sending through its whole window."""
        return self.longest_gap <= MAX_GAP_S

    @property
    def pair(self) -> tuple[int, int]:
        """(sent, received) in the window ping measured: the in-flight tail is neither."""
        return self.sent, self.sent - len(self.lost)


class PodPing:
    """`ping -i 0.01 -w SECONDS` from the first pod of `src` to the first pod of `dst`, in the background."""

    def __init__(self, st: LabState, src: str, dst: str, seconds: float, interval: float = 0.01) -> None:
        by_name = {n.name: n for _, n in st.nodes()}
        self.dst_ip = by_name[dst].pods[0].ip
        self.seconds = seconds
        self.t0 = time.monotonic()
        self.wall0 = time.time()
        # a file, not a pipe: a line a reply fills a pipe nobody drains in ~12 s, and ping then blocks
        self.out = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed by result()
        self.proc = subprocess.Popen(
            [*netns.exec_prefix(by_name[src].pods[0].netns), "ping", "-n", "-D", "-i", str(interval), "-W",
             str(int(IN_FLIGHT_S)), "-w", str(math.ceil(seconds)), self.dst_ip],
            stdout=self.out, stderr=subprocess.STDOUT, text=True)

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
        gap = max(b - a for a, b in itertools.pairwise(times))
        # ICMP errors ("Destination Host Unreachable") and refused sends ("ping: sendmsg: ...")
        other = [line for line in out.splitlines() if line.strip() and not _REPLY.match(line)
                 and not line.startswith(_SUMMARY) and not _SENT.search(line)]
        print(f"ping {self.dst_ip}: {sent} sent, {len(replies)} replies, {len(lost)} lost in {elapsed:.1f} s, "
              f"longest gap {gap:.2f} s" + (f"; {len(other)} other lines, the first: {other[:3]}" if other else ""))
        return PingResult(sent, len(replies), lost, elapsed, gap)
