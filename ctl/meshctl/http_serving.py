# SPDX-License-Identifier: Apache-2.0
"""The threaded HTTP server meshctl's own servers stand on (the agent's status API, `meshctl ui`,
the lab's API server).

A client that goes away in the middle of a request (a browser closing a keep-alive connection, a
page reloaded, a scraper timing out) is not an error: nothing is printed. Any other failure of one
request is one line on stderr naming the client and the error, never socketserver's traceback;
the server goes on serving the others.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# What a peer that hung up looks like from the server's side of the socket.
CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)


class SleepsWhenIdle(socketserver.TCPServer):
    """A socketserver whose serve_forever sleeps until a client connects or shutdown() wakes it
    (a pipe beside the listening socket), where socketserver's wakes every poll_interval to look
    for a shutdown: an agent's two servers polling at 0.1 s woke it 20 times a second, which a
    node at rest (and an emulated guest's five) should not pay. poll_interval is ignored.
    shutdown() returns once the loop has ended, at once when it never started."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._wake_r, self._wake_w = os.pipe()
        self._stopping = False
        self._ended = threading.Event()
        self._ended.set()
        super().__init__(*args, **kwargs)

    def serve_forever(self, poll_interval: float | None = None) -> None:
        self._ended.clear()
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(self.socket, selectors.EVENT_READ)
                sel.register(self._wake_r, selectors.EVENT_READ)
                while not self._stopping:
                    for key, _ in sel.select():
                        if key.fileobj is self.socket and not self._stopping:
                            self._handle_request_noblock()  # type: ignore[attr-defined]
                    self.service_actions()
        finally:
            self._ended.set()

    def shutdown(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b".")
        self._ended.wait()

    def server_close(self) -> None:
        super().server_close()
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


class HttpServer(SleepsWhenIdle, ThreadingHTTPServer):
    """ThreadingHTTPServer with request threads as daemons, sleeping when idle (SleepsWhenIdle) and
    the error reporting above; `name` prefixes the one line."""

    daemon_threads = True
    name = "meshctl"

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, CLIENT_GONE):
            return
        host = client_address[0] if isinstance(client_address, tuple) and client_address else client_address
        sys.stderr.write(f"{self.name}: a request from {host} failed: {type(exc).__name__}: {exc}\n")


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing per request and answers with `send`, dropping the answer
    without a word when the client already went (a poll with a short timeout on a slow machine is
    not the server's error)."""

    def send(self, code: int, body: bytes, ctype: str = "text/plain") -> None:
        with contextlib.suppress(*CLIENT_GONE):
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        return
