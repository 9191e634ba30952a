# SPDX-License-Identifier: Apache-2.0
"""`lab check` waits for a pair that is silent at first (labcheck.PATIENT_S): a WireGuard session
still being made can hold a pair's pings for 15 s (an end sending into a session the other end
dropped makes a new handshake only then), longer than a pair of pings and a retry. Here b1's pod
drops a1's pings for SILENT_S, past the 8 s patient round `lab check` had before; the check
reports the pair answering on its plan, after the silence. Without `retry` it reports it down."""

from __future__ import annotations

import threading
import time

import pytest

from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.rigs import netns

from .conftest import node_of, topo

pytestmark = [pytest.mark.root, pytest.mark.slow]

SILENT_S = 12.0
TABLE = "silent"


def silence(pod_ns: str) -> None:
    """The pod answers no ping until `speak`."""
    netns.run(pod_ns, ["nft", "-f", "-"], input=(
        f"table inet {TABLE} {{\n"
        f"  chain input {{ type filter hook input priority 0; policy accept; icmp type echo-request drop; }}\n"
        f"}}\n"))


def speak(pod_ns: str) -> None:
    netns.run(pod_ns, ["nft", "delete", "table", "inet", TABLE], check=False)


def test_a_pair_silent_for_a_while_is_waited_for_and_measured_on_its_plan(make_lab) -> None:
    st = make_lab(topo("location"))
    b1_pod = node_of(st, "b1").pods[0].netns
    assert labcheck.check(st, pairs=[("a1", "b1")], families=(4,))[0].ok
    silence(b1_pod)
    try:
        assert not labcheck.check(st, pairs=[("a1", "b1")], families=(4,), retry=False)[0].ok
        t0 = time.monotonic()
        timer = threading.Timer(SILENT_S, speak, (b1_pod,))
        timer.start()
        (r,) = labcheck.check(st, pairs=[("a1", "b1")], families=(4,))
        took = time.monotonic() - t0
        timer.join()
    finally:
        speak(b1_pod)
    assert r.ok and r.path == r.expected == "tunnel", r
    assert took >= SILENT_S, "measured after the silence, not before it"
