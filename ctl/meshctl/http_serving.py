# SPDX-License-Identifier: Apache-2.0
"""The threaded HTTP server meshctl's own servers stand on (the agent's status API, `meshctl ui`,
the lab's API server).

A client that goes away in the middle of a request (a browser closing a keep-alive connection, a
page reloaded, a scraper timing out) is not an error: nothing is printed. Any other failure of one
request is one line on stderr naming the client and the error, never socketserver's traceback;
the server goes on serving the others.
"""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer
from typing import Any

# What a peer that hung up looks like from the server's side of the socket.
CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)


class HttpServer(ThreadingHTTPServer):
    """ThreadingHTTPServer with request threads as daemons and the error reporting above; `name`
    prefixes the one line."""

    daemon_threads = True
    name = "meshctl"

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, CLIENT_GONE):
            return
        host = client_address[0] if isinstance(client_address, tuple) and client_address else client_address
        sys.stderr.write(f"{self.name}: a request from {host} failed: {type(exc).__name__}: {exc}\n")
