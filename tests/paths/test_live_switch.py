# SPDX-License-Identifier: Apache-2.0
"""Make before break, end to end: the default lab's pair types (same subnet, via the leaders,
tunnels between locations, a lone node) pinged at 20 pps while the mesh record switches
granularity location -> full -> cross -> location and intra_subnet direct -> vxlan -> direct,
one pass. No ICMP error anywhere; a pair a switch leaves on its path loses nothing; a pair it
moves loses under 0.5 s (tests/live_switching.py says which pairs a switch moves)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from meshctl.lab.namespaces import build
from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.namespaces.state import LabState
from tests.live_switching import MOVING_LOSS_MAX, PAIRS, Window, evidence, gap_window, run, table
from tests.names import unique

pytestmark = [pytest.mark.root, pytest.mark.slow]

DEFAULT_LAB = Path(__file__).resolve().parents[2] / "ctl" / "meshctl" / "lab" / "labs" / "default.yaml"
SWITCHES = ["granularity=full", "granularity=cross", "granularity=location", "intra_subnet=vxlan",
            "intra_subnet=direct"]
SETTLE_S = 4.0  # after each switch: every agent's pass and the WireGuard handshakes of new peers


@pytest.fixture
def lab() -> Iterator[LabState]:
    """The default lab under a prefix of this run (`mb<pid><n>-`), removed on success and failure."""
    prefix = unique("mb") + "-"
    doc = yaml.safe_load(DEFAULT_LAB.read_text())
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("LOG_LEVEL", "verbose")  # wireguard-go logs its handshakes: evidence of a failed window
            st = build.up(parse_lab(doc, str(DEFAULT_LAB)), prefix=prefix)
        yield st
    finally:
        build.down(labstate.lab_name(prefix))


def test_live_switches_break_nothing_that_stays_and_little_that_moves(lab: LabState) -> None:
    since = time.time()
    switches, results, windows = run(lab, SWITCHES, settle=SETTLE_S)

    def why(ws: list[Window]) -> str:
        return "\n".join([table(ws), *(evidence(lab, *PAIRS[p], since) for p in sorted({w.pair for w in ws}))])

    print(table(windows))
    # a pair that answered nothing for a while lost nothing only if ping kept sending, and its
    # replies came back in time: a tunnel that queued them through a handshake's retry did not
    gaps = {k: (round(r.longest_gap, 2), gap_window(switches, r)) for k, r in results.items() if not r.covered}
    assert gaps == {}, gaps
    # some switch moved pairs and some pairs kept their path: the assertions below test both kinds
    assert any(w.moving for w in windows) and any(not w.moving and w.switch != "quiet" for w in windows)
    assert [w for w in windows if w.errors] == []
    kept = [w for w in windows if not w.moving and w.lost]
    assert kept == [], why(kept)
    moved = [w for w in windows if w.moving and w.lost > MOVING_LOSS_MAX]
    assert moved == [], why(moved)
