# SPDX-License-Identifier: Apache-2.0
"""Run a function inside a named network namespace, from this process.

setns(2) changes the namespace of the calling thread only, so the function runs in a fresh
thread that enters the namespace first; the rest of the process (and its mount namespace, where
bpffs is) is untouched. Processes started from that thread inherit its namespace. Tests, the
benchmark and `meshctl datapath ... --netns` use it to drive a node's datapath as its agent would.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from meshctl.errors import MeshError

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")  # where `ip netns` keeps its named namespaces


def join_netns(fd: int, ns: str) -> None:
    """Move the calling thread into the network namespace open at `fd` (named `ns` in the error):
    setns(2), or MeshError."""
    if ctypes.CDLL(None, use_errno=True).setns(fd, CLONE_NEWNET) != 0:
        raise MeshError(f"setns {ns}: {os.strerror(ctypes.get_errno())}")


def in_netns(ns: str | None, fn: Callable[[], T]) -> T:
    """fn() run in NETNS_DIR/<ns>, or in the namespace file `ns` when it is a path (ns None: here),
    its result or its exception returned/raised here."""
    if ns is None:
        return fn()
    path = ns if ns.startswith("/") else str(NETNS_DIR / ns)
    box: dict[str, object] = {}

    def body() -> None:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            box["err"] = MeshError(f"network namespace {ns!r}: {e.strerror}")
            return
        try:
            join_netns(fd, ns)
        except MeshError as e:
            box["err"] = e
            return
        finally:
            os.close(fd)
        try:
            box["ok"] = fn()
        except BaseException as e:  # handed to the caller's thread
            box["err"] = e

    t = threading.Thread(target=body, name=f"netns-{ns}")
    t.start()
    t.join()
    if "err" in box:
        raise box["err"]  # type: ignore[misc]
    return box["ok"]  # type: ignore[return-value]
