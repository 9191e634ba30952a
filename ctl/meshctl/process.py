# SPDX-License-Identifier: Apache-2.0
"""Process-wide state that the callers of the pure core own.

`mesh/` computes plans and admissions as pure functions and never touches the interpreter's
state; the agent loop and the CLI commands that run those computations decide how the process
runs them. That is one thing: the cyclic garbage collector is paused while they run. A pass
over 5,000 records keeps about 200,000 small objects alive (addresses, records, plan entries) and
allocates many more; the collector's passes over them take a large share of the pass, and find
nothing, because the data is acyclic and freed by reference counting.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC for the block. Nested pauses are safe: only the outermost one, which
    found the collector running, starts it again."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
