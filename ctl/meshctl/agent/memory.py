# SPDX-License-Identifier: Apache-2.0
"""The agent's heap, as the C allocator keeps it (glibc; elsewhere both calls do nothing).

The agent runs a dozen threads (one watcher per remote cluster, the loop, HTTP servers), and
glibc gives each thread that allocates its own heap arena, which it seldom gives back: large
transient buffers (a routing table dumped as JSON, a WireGuard device read with 100,000 allowed
IPs, a remote cluster's initial list) leave freed but resident pages in many arenas. Two arenas
are plenty for threads that take turns under the GIL; `trim` hands freed pages back to the
kernel, and the agent calls it after its periodic full pass, when those buffers were freed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging

log = logging.getLogger("meshctl.agent")

M_ARENA_MAX = -8  # mallopt parameter (malloc.h)
ARENAS = 2


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, found once: find_library runs `ldconfig -p` (a process) on every call, and
    `trim` runs every resync interval."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if libc is not None and hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def cap_arenas(arenas: int = ARENAS) -> bool:
    """At most `arenas` malloc arenas from now on (call before starting threads); True if set."""
    libc = _libc()
    ok = libc is not None and libc.mallopt(M_ARENA_MAX, arenas) == 1
    log.debug("malloc arenas capped at %d: %s", arenas, ok)
    return ok


def trim() -> None:
    """Give freed heap pages back to the kernel."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)
