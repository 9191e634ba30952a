# SPDX-License-Identifier: Apache-2.0
"""Names for the namespaces, links and lab prefixes a test creates: unique within this test run
(a counter) and between runs (the pid), so no fixture ever meets a namespace another one left."""

from __future__ import annotations

import itertools
import os

_counter = itertools.count(1)
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def unique(prefix: str) -> str:
    """`prefix`, this run's pid (mod 10000) and a base-36 counter: `ma4711e3`."""
    n, out = next(_counter), ""
    while n:
        n, r = divmod(n, 36)
        out = _DIGITS[r] + out
    return f"{prefix}{os.getpid() % 10000}{out}"
