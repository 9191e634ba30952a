# SPDX-License-Identifier: Apache-2.0
"""The web server of `meshctl ui`: the page and its assets (shipped in this package, so it works
offline) and a small JSON API the page polls, on the standard library's threaded HTTP server (meshctl.http_serving).

The server knows nothing of where the mesh comes from: a `Provider` answers each API call (the
CLI's is cli/ui.py, over the same Source as `plan` and `graph`). Its promises:
- it listens where `--listen HOST:PORT` says, loopback by default; a bad value or a port in use is
  an InputError naming `--listen` (one line, exit 2), never a traceback;
- on a loopback address it answers only requests whose Host is a loopback name, so a web page
  elsewhere cannot read the mesh through a DNS name that points at 127.0.0.1 (DNS rebinding);
- every answer carries a Content-Security-Policy that allows this origin only;
- an API error is a JSON `{"error": LINE}` with a 4xx (bad input) or 503 (the backend failed).
"""

from __future__ import annotations

import errno
import gzip
import ipaddress
import json
import secrets
import socket
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from importlib.resources import files
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

from meshctl.defaults import UI_LISTEN
from meshctl.errors import InputError, MeshError
from meshctl.http_serving import CLIENT_GONE, HttpServer

JSON = dict[str, Any]
# The page's files, by the path the browser asks for: (file under assets/, content type).
ASSETS: Mapping[str, tuple[str, str]] = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/app.js": ("app.js", "text/javascript; charset=utf-8"),
    "/app.css": ("app.css", "text/css; charset=utf-8"),
    "/favicon.svg": ("favicon.svg", "image/svg+xml"),
}
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
GZIP_OVER = 8192  # bytes: a larger answer is compressed when the browser accepts gzip
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")
_RUN = secrets.token_hex(4)  # this server process, in its answers' tags


@dataclass(frozen=True)
class Prepared:
    """An answer serialised once and served until it changes: its JSON bytes and their tag (the
    browser's If-None-Match gets a 304 while the tag stands, so 500 nodes are not parsed anew)."""

    body: bytes
    etag: str

    @classmethod
    def of(cls, doc: JSON, version: int) -> Prepared:
        """`doc` as the `version`th answer of this server: its tag names this process too, so a
        page that outlived a restarted server never keeps an old map for a new one's number."""
        return cls(json.dumps(doc, separators=(",", ":")).encode(), f'"{_RUN}-{version}"')


class Provider(Protocol):
    """Answers the page's API calls. Each raises InputError for a bad argument (a 400 naming it)
    and MeshError when the backend fails (a 503 saying why)."""

    def meta(self) -> JSON:
        """What the page needs once: the source's name, the poll interval, the rungs' colours."""
        ...

    def graph(self) -> Prepared:
        """The live map: the graph model (mesh.graph) with what the agents see now, and when."""
        ...

    def node(self, name: str) -> JSON:
        """One node: its record, its peers and the path to each (ui.view.node_detail)."""
        ...

    def explain(self, src: str, dst: str) -> JSON:
        """`meshctl explain SRC DST` of the pair, as JSON, with its text."""
        ...

    def search(self, query: str) -> JSON:
        """The nodes a name or an address finds (ui.view.search)."""
        ...


def parse_listen(value: str) -> tuple[str, int]:
    """(host, port) of `HOST:PORT` (`[::1]:PORT` for IPv6); InputError naming --listen."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError("--listen", value, f"is not HOST:PORT (e.g. {UI_LISTEN}; a port from 1 to 65535)")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """`host` is a loopback address or name: the page is then reachable from this machine only."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_of(header: str) -> str:
    """The host part of a Host header (`127.0.0.1:8470`, `[::1]:8470`, `localhost`)."""
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class UiServer(HttpServer):
    """The page's server, bound to one address. `loopback_only`: requests must name a loopback Host."""

    name = "meshctl ui"
    allow_reuse_address = False  # a port another `meshctl ui` holds is in use, not shared

    def __init__(self, addr: tuple[str, int], provider: Provider, family: socket.AddressFamily) -> None:
        self.address_family = family
        self.provider = provider
        self.loopback_only = is_loopback(addr[0])
        super().__init__(addr, _Handler)

    @property
    def url(self) -> str:
        host, port = str(self.server_address[0]), self.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"


def bind(listen: str, provider: Provider) -> UiServer:
    """A server listening at `listen` (HOST:PORT); InputError naming --listen when the value is
    bad, the host has no such address, or the port is in use."""
    host, port = parse_listen(listen)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise InputError("--listen", listen, f"names no address of this host ({e.strerror})") from None
    family, *_, sockaddr = infos[0]
    try:
        return UiServer((str(sockaddr[0]), port), provider, family)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise InputError("--listen", listen, "is in use: another program listens on that port "
                             "(pick another: --listen 127.0.0.1:PORT)") from None
        if e.errno in (errno.EACCES, errno.EPERM):
            raise InputError("--listen", listen, "may not be bound by this user (a port below 1024 needs root)") \
                from None
        raise InputError("--listen", listen, f"cannot be bound: {e.strerror}") from None


def asset(name: str) -> bytes:
    """A file of the page, as the package ships it."""
    return (files("meshctl.ui") / "assets" / name).read_bytes()


def _one(qs: Mapping[str, list[str]], key: str) -> str:
    vals = qs.get(key) or []
    if len(vals) != 1:
        raise InputError(key, vals[0] if vals else None, "is required, once")
    return vals[0]


# The API: path -> what answers it from the query string.
Route = Callable[[Provider, Mapping[str, list[str]]], JSON | Prepared]
API: Mapping[str, Route] = {
    "/api/meta": lambda p, q: p.meta(),
    "/api/graph": lambda p, q: p.graph(),
    "/api/node": lambda p, q: p.node(_one(q, "name")),
    "/api/explain": lambda p, q: p.explain(_one(q, "src"), _one(q, "dst")),
    "/api/search": lambda p, q: p.search(_one(q, "q")),
}


class _Handler(BaseHTTPRequestHandler):
    server: UiServer
    server_version = "meshctl-ui"
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.server.loopback_only and not is_loopback(_host_of(self.headers.get("Host", ""))):
            self._json(HTTPStatus.MISDIRECTED_REQUEST, {"error": "this page answers on its loopback address only"})
            return
        url = urlsplit(self.path)
        if url.path in ASSETS:
            name, ctype = ASSETS[url.path]
            self._send(HTTPStatus.OK, asset(name), ctype)
            return
        route = API.get(url.path)
        if route is None:
            self._json(HTTPStatus.NOT_FOUND, {"error": f"no such page: {url.path}"})
            return
        try:
            body = route(self.server.provider, parse_qs(url.query))
        except InputError as e:
            self._json(HTTPStatus.BAD_REQUEST, {"error": str(e)})
        except MeshError as e:
            self._json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(e)})
        except Exception as e:  # a bug: one line here and on the page, and the server goes on
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {type(e).__name__}: {e}"})
        else:
            if isinstance(body, Prepared):
                self._prepared(body)
            else:
                self._json(HTTPStatus.OK, body)

    def _prepared(self, p: Prepared) -> None:
        if self.headers.get("If-None-Match") == p.etag:
            self._send(HTTPStatus.NOT_MODIFIED, b"", "application/json", p.etag)
        else:
            self._send(HTTPStatus.OK, p.body, "application/json", p.etag)

    def _json(self, status: HTTPStatus, body: JSON) -> None:
        self._send(status, json.dumps(body, separators=(",", ":")).encode(), "application/json")

    def _send(self, status: HTTPStatus, data: bytes, ctype: str, etag: str | None = None) -> None:
        gz = len(data) > GZIP_OVER and "gzip" in self.headers.get("Accept-Encoding", "")
        if gz:
            data = gzip.compress(data, compresslevel=5)
        try:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-cache" if etag else "no-store")
            if etag:
                self.send_header("ETag", etag)
            self.send_header("Content-Security-Policy", CSP)
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Referrer-Policy", "no-referrer")
            if gz:
                self.send_header("Content-Encoding", "gzip")
            self.end_headers()
            self.wfile.write(data)
        except CLIENT_GONE:
            pass  # the browser went away (a reload): nothing to answer

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Quiet: a page polling every few seconds would fill the terminal. Server errors only."""
        if isinstance(code, int) and code >= 500:
            sys.stderr.write(f"meshctl ui: {self.requestline}: {int(code)}\n")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # malformed requests are answered with their status; nothing for the terminal
