# SPDX-License-Identifier: Apache-2.0
"""meshctl's HTTP servers (meshctl.http_serving: `meshctl ui`, the agent's status API, the lab's
API server): a client that resets its connection mid-request prints nothing; a request that fails
otherwise is one line on stderr, never a traceback; the server goes on answering."""

from __future__ import annotations

import socket
import struct
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from meshctl.http_serving import HttpServer
from tests.waiting import wait_until


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        if self.path == "/boom":
            raise ValueError("a handler bug")
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class _Counted(HttpServer):
    """Counts the requests it is done with (answered, failed or reset: socketserver shuts each down
    last, after any handle_error), so a test waits for that instead of sleeping."""

    done = 0

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        with _lock:
            self.done += 1


_lock = threading.Lock()


@pytest.fixture
def server() -> Iterator[_Counted]:
    srv = _Counted(("127.0.0.1", 0), _Handler)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def _get(srv: HttpServer, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.server_address[1]}{path}", timeout=5) as r:
        return r.read()


def _reset_mid_request(srv: HttpServer) -> None:
    """Half a request line, then an RST (SO_LINGER 0): what a browser closing a tab can send."""
    s = socket.create_connection(("127.0.0.1", srv.server_address[1]))
    s.sendall(b"GET / HT")
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_a_client_that_resets_prints_nothing_and_the_server_goes_on(server, capfd) -> None:
    for _ in range(5):
        _reset_mid_request(server)
    wait_until(lambda: server.done >= 5, 30, "the five reset requests done with")
    assert _get(server, "/") == b"ok"
    assert capfd.readouterr().err == ""


def test_a_failing_request_is_one_line_not_a_traceback(server, capfd) -> None:
    with pytest.raises(Exception):  # noqa: B017 - the server closes the connection without an answer
        _get(server, "/boom")
    wait_until(lambda: server.done >= 1, 30, "the failed request done with")
    err = capfd.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines() == ["meshctl: a request from 127.0.0.1 failed: ValueError: a handler bug"]
    assert _get(server, "/") == b"ok"
