# SPDX-License-Identifier: Apache-2.0
"""A background thread with a stop event, for the watchers that run beside the reconcile loop."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Worker:
    """Runs `target(stop)` on a daemon thread between `start` and `stop`. Each `start` after a
    `stop` runs it anew with a fresh event, so a consumer may stop and start it again (the elected
    agent's informers when the Lease is lost and won)."""

    def __init__(self, target: Callable[[threading.Event], object], name: str) -> None:
        self.target, self.name = target, name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread unless it runs."""
        if self.running:
            return
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.target, args=(self._stop,), name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0, interrupt: Callable[[], object] | None = None) -> None:
        """Set the event, call `interrupt` (to end a blocking read the thread is in), and wait up
        to `timeout` for the thread."""
        self._stop.set()
        if interrupt is not None:
            interrupt()
        if self._thread is not None:
            self._thread.join(timeout)
        self._thread = None
