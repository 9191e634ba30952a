# SPDX-License-Identifier: Apache-2.0
"""`lab check` names the path a pair's pings took from the counters that moved: one case per path."""

from __future__ import annotations

import pytest

from meshctl.lab.namespaces.check import _measured_path

# delta: packets sent meanwhile on (kilo0, private NIC, the leader's kilo0, the VXLAN device)
CASES = [
    ("tunnel", [5, 0, 0, 0], {}, None, False, False, "tunnel"),
    ("relay", [5, 0, 0, 0], {}, "relay", True, False, "relay"),
    ("wireguard over the private address", [5, 5, 0, 0], {}, "wireguard-private", False, True, "wireguard-private"),
    ("via the leader", [0, 5, 5, 0], {}, "via-leader", False, False, "via-leader"),
    ("encapsulated by the fast path, rung as planned", [0, 5, 0, 0], {"encap": 5}, "direct+ipip", False, False,
     "direct+ipip"),
    ("encapsulated by the kernel's VXLAN device", [0, 5, 0, 5], {}, None, False, False, "direct+vxlan"),
    ("encapsulated, rung not planned as such", [0, 5, 0, 0], {"encap": 5}, "direct", False, False, "direct+encap"),
    ("direct", [0, 5, 0, 0], {"direct": 5}, "direct", False, False, "direct"),
    # the source's keepalives to its other peers leave by kilo0 meanwhile (the 6.1 VM lab's b1)
    ("direct beside kilo0's own traffic", [4, 5, 0, 0], {"direct": 5}, "direct", False, False, "direct"),
    ("too few packets anywhere", [1, 1, 0, 0], {}, "direct", False, False, "unknown"),
]


@pytest.mark.parametrize(("case", "delta", "fp", "expected", "relayed", "private", "want"), CASES,
                         ids=[c[0] for c in CASES])
def test_measured_path(case: str, delta: list[int], fp: dict[str, int], expected: str | None, relayed: bool,
                       private: bool, want: str) -> None:
    assert _measured_path(delta, fp, 4, expected, relayed=relayed, private_endpoint=private) == want
