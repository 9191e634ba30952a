# SPDX-License-Identifier: Apache-2.0
"""Must show (issue 37): the leader replaced and back after the hold (tests/lab/test_leaders.py)
when the leader sits behind a cone NAT: a1 of loc-a publishes only its inside address and is
called at the endpoint b1 and c1 discovered from its handshakes (docs/nat.md)."""

from __future__ import annotations

import pytest

from tests.waiting import wait_until

from .conftest import status
from .leader_faults import (
    HOLD,
    RETURN_LOSS_BOUND_S,
    CrossPings,
    assert_recovered,
    follow_break,
    forwarding_fault,
    lab_doc,
    leaders_lab,
    report,
    standby_sessions,
    window_end,
)

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.fixture(scope="module")
def nat_lab():
    doc = lab_doc(nat={"a1": "cone"})
    a1 = next(n for n in doc["nodes"] if n["name"] == "a1")
    a1["persistent_keepalive"] = 1
    with leaders_lab(doc) as st:
        outside = st.lookup("a1")[1].nat
        assert outside is not None
        # b1 and c1 call a1 at its NAT's outside address (confirmed by both: docs/nat.md).
        wait_until(lambda: all(any(p["name"] == "a1" and p.get("endpoint") == f"{outside.public_ip}:{outside.port}"
                                   for p in status(st, far)["peers"]) for far in ("b1", "c1")), 60,
                   "a1 called at its discovered endpoint")
        yield st


def test_leader_behind_a_cone_nat_is_replaced_and_comes_back_after_the_hold(nat_lab):
    st = nat_lab
    brk, undo = forwarding_fault(st, "a1")
    pings = CrossPings(st, HOLD + 50)
    crossing = [p for p in pings.pairs if any(n in ("a2", "a3") for n in p)]
    try:
        wait_until(pings.all_answering, 30, "every pair answering")
        followed = follow_break(st, "loc-a", "a1", "a2", brk, undo, pings, crossing,
                                before_undo=standby_sessions(st, "a1", ("b1", "c1")))
    finally:
        undo()
    recovered, returned = report(pings.results(until=window_end(followed)), followed, crossing)
    assert followed.back - followed.undone >= HOLD - 1, "a1 came back before the hold"
    assert_recovered(st, recovered, crossing, followed)
    assert all(v <= RETURN_LOSS_BOUND_S for v in returned.values()), returned
