# SPDX-License-Identifier: Apache-2.0
"""The HTTP side: paths, content negotiation (JSON, Table, aggregated discovery), watches as
chunked JSON lines, and the `ApiServer` around a `Store`."""

from __future__ import annotations

import base64
import copy
import json
import socket
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import parse_qs, urlsplit

from meshctl.http_serving import CLIENT_GONE, HttpServer

from . import discovery, openapi, tables
from .store import APPLY_PATCH, PATCH_TYPES, VALIDATION, Event, Store, Write, matches, selector
from .types import JSON, ApiFailure, ResourceType

VERSION = {"major": "1", "minor": "31", "gitVersion": "v1.31.0-meshctl-test", "platform": "linux/amd64"}


def _parse_path(parts: list[str]) -> tuple[str, str, str | None, str, str | None]:
    """(group, version, namespace, plural, name) from a path split on '/'."""
    if parts[:1] == ["api"] and len(parts) >= 3:
        group, version, rest = "", parts[1], parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 4:
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
    ns: str | None = None
    if rest[0] == "namespaces" and len(rest) >= 3:
        ns, rest = rest[1], rest[2:]
    if len(rest) > 2:
        raise ApiFailure(404, "NotFound", "subresources are not served")
    return group, version, ns, rest[0], rest[1] if len(rest) == 2 else None


def _dry_run(q: dict[str, str]) -> bool:
    """Whether a write is a dry run (`dryRun=All`, the one value kube-apiserver knows)."""
    if q.get("dryRun") not in (None, "", "All"):
        raise ApiFailure(400, "BadRequest", f"dryRun: Unsupported value: {q['dryRun']!r}: supported values: \"All\"")
    return q.get("dryRun") == "All"


def _watch_from(since: str | None) -> int:
    """Where a watch starts: after resourceVersion `since`, or -1 (none given: list first)."""
    if since in (None, "", "0"):
        return -1
    try:
        return int(since)
    except ValueError:
        raise ApiFailure(400, "BadRequest", f"bad resourceVersion {since!r}") from None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ApiServer

    def setup(self) -> None:
        super().setup()
        self._warnings: list[str] = []  # this request's warnings, sent as Warning headers

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        if self.server.verbose:
            super().log_message(format, *args)

    # plumbing

    def _send(self, code: int, body: JSON, ctype: str = "application/json") -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        for w in self._warnings:
            self.send_header("Warning", '299 - ' + json.dumps(w))
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> Any:
        raw = self._raw
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiFailure(400, "BadRequest", "the body is not JSON") from None

    def _dispatch(self, method: str) -> None:
        self._warnings = []
        n = int(self.headers.get("Content-Length") or 0)
        self._raw = self.rfile.read(n) if n else b""  # read it all: the connection is kept alive
        try:
            url = urlsplit(self.path)
            q = {k: v[-1] for k, v in parse_qs(url.query).items()}
            parts = [p for p in url.path.split("/") if p]
            self.server.requests.append((method, url.path, (self.headers.get("Content-Type") or "").split(";")[0]))
            if method == "GET" and parts in (["healthz"], ["readyz"], ["livez"]):
                data = b"ok"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(data)
                return
            if method == "GET" and parts == ["version"]:
                self._send(200, VERSION)
                return
            if method == "GET" and self._meta(parts):
                return
            self._resource(method, parts, q)
        except ApiFailure as e:
            self._send(e.code, e.status())
        except CLIENT_GONE:
            pass

    def _meta(self, parts: list[str]) -> bool:
        """Discovery and OpenAPI documents; False when `parts` names neither."""
        store = self.server.store
        types = store.served()
        accept = self.headers.get("Accept") or ""
        if parts in (["api"], ["apis"]):
            if discovery.wants_aggregated(accept):
                self._send(200, discovery.aggregated(types, parts == ["api"]), discovery.AGGREGATED)
            else:
                self._send(200, discovery.api_versions() if parts == ["api"] else discovery.group_list(types))
            return True
        if (parts[:1] == ["api"] and len(parts) == 2) or (parts[:1] == ["apis"] and len(parts) == 3):
            group, version = ("", parts[1]) if parts[0] == "api" else (parts[1], parts[2])
            doc = discovery.resource_list(types, group, version)
            if doc is None:
                raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
            self._send(200, doc)
            return True
        if parts[:2] == ["openapi", "v3"]:
            if len(parts) == 2:
                self._send(200, openapi.index(types, store.schemas))
                return True
            rest = parts[2:]
            gv = ("", rest[1]) if rest[:1] == ["api"] and len(rest) == 2 else \
                (rest[1], rest[2]) if rest[:1] == ["apis"] and len(rest) == 3 else None
            doc = openapi.document(types, store.schemas, *gv) if gv else None
            if doc is None:
                raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
            self._send(200, doc)
            return True
        if parts[:1] == ["openapi"]:
            raise ApiFailure(404, "NotFound", "the server could not find the requested resource")
        return False

    def _write(self, q: dict[str, str]) -> Write:
        """The write options of a request: its field manager (fieldManager, else the User-Agent's
        first word, as kube-apiserver defaults it), field validation and force."""
        manager = q.get("fieldManager") or (self.headers.get("User-Agent") or "").split("/")[0] or None
        validation = q.get("fieldValidation") or "Warn"
        if validation not in VALIDATION:
            raise ApiFailure(400, "BadRequest", f"fieldValidation: Unsupported value: {validation!r}")
        return Write(manager, validation, q.get("force") in ("true", "1"), self._warnings, _dry_run(q))

    def _answer(self, code: int, rt: ResourceType, obj: JSON, q: dict[str, str]) -> None:
        if tables.wants_table(self.headers.get("Accept") or ""):
            meta = {"resourceVersion": obj.get("metadata", {}).get("resourceVersion", "")}
            self._send(code, tables.table(rt, self._printer_columns(rt), [obj], meta, q.get("includeObject") or
                                          "Metadata"), tables.TABLE_MEDIA)
        else:
            self._send(code, obj)

    def _printer_columns(self, rt: ResourceType) -> tuple[JSON, ...] | None:
        custom = self.server.store.custom.get(rt)
        return custom.columns if custom else None

    def _resource(self, method: str, parts: list[str], q: dict[str, str]) -> None:
        store = self.server.store
        group, version, ns, plural, name = _parse_path(parts)
        rt = store.resource(group, version, plural)
        if rt.namespaced and ns is None and method != "GET":
            raise ApiFailure(405, "MethodNotAllowed", f"{plural} are namespaced: give a namespace")
        if not rt.namespaced and ns is not None:
            raise ApiFailure(404, "NotFound", f"{plural} are not namespaced")
        nsv = ns or ""
        if method == "GET" and name is None:
            if q.get("watch") in ("true", "1"):
                self._watch(rt, ns, q)
            else:
                self._list(rt, ns, q)
        elif method == "GET" and name is not None:
            self._answer(200, rt, store.get(rt, nsv, name), q)
        elif method == "POST" and name is None:
            self._answer(201, rt, store.create(rt, nsv, self._body(), self._write(q)), q)
        elif method == "PUT" and name is not None:
            self._answer(200, rt, store.update(rt, nsv, name, self._body(), self._write(q)), q)
        elif method == "PATCH" and name is not None:
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            body = self._raw if ctype == APPLY_PATCH else self._body() if ctype in PATCH_TYPES else None
            self._answer(200, rt, store.patch(rt, nsv, name, ctype, body, self._write(q)), q)
        elif method == "DELETE" and name is not None:
            opts = self._body()  # DeleteOptions: its dryRun is a list (kubectl puts it here, not in the query)
            body_dry = isinstance(opts, dict) and opts.get("dryRun") == ["All"]
            self._answer(200, rt, store.delete(rt, nsv, name, dry_run=_dry_run(q) or body_dry), q)
        else:
            raise ApiFailure(405, "MethodNotAllowed", f"{method} is not allowed here")

    def _list(self, rt: ResourceType, ns: str | None, q: dict[str, str]) -> None:
        rv, items = self.server.store.list(rt, ns, q.get("labelSelector"), q.get("fieldSelector"))
        meta: JSON = {"resourceVersion": str(rv)}
        limit = int(q.get("limit") or 0)
        start = 0
        if q.get("continue"):
            try:
                tok = json.loads(base64.urlsafe_b64decode(q["continue"]))
                rv, start = int(tok["rv"]), int(tok["start"])
            except (ValueError, KeyError, TypeError):
                raise ApiFailure(400, "BadRequest", "bad continue token") from None
            if rv <= self.server.store.compacted:
                raise ApiFailure(410, "Expired", "the provided continue parameter is too old")
            meta["resourceVersion"] = str(rv)
        if limit > 0:
            if start + limit < len(items):
                tok = json.dumps({"rv": rv, "start": start + limit}).encode()
                meta["continue"] = base64.urlsafe_b64encode(tok).decode()
            items = items[start:start + limit]
        if tables.wants_table(self.headers.get("Accept") or ""):
            self._send(200, tables.table(rt, self._printer_columns(rt), items, meta,
                                         q.get("includeObject") or "Metadata"), tables.TABLE_MEDIA)
            return
        self._send(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": items})

    def _chunk(self, ev: JSON) -> None:
        data = json.dumps(ev).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, rt: ResourceType, ns: str | None, q: dict[str, str]) -> None:
        """Serve one watch stream: replay from resourceVersion (410 Gone when it is compacted), then
        follow the store until the timeout, a store reset or the server's stop."""
        store = self.server.store
        lsel, fsel = selector(q.get("labelSelector")), selector(q.get("fieldSelector"))
        deadline = time.monotonic() + float(q.get("timeoutSeconds") or 1800)
        pos = _watch_from(q.get("resourceVersion"))
        self._open_stream()

        def wanted(obj: JSON, namespace: str | None) -> bool:
            return (ns is None or namespace == ns) and matches(obj, lsel, fsel)

        with store.cond:
            gen, compacted = store.generation, store.compacted
            initial: list[JSON] = []
            if pos < 0:
                pos = store.rv
                initial = [copy.deepcopy(o) for (t, n, _), o in sorted(store.objects.items(), key=lambda kv: kv[0][1:])
                           if t == rt and wanted(o, n)]
        if pos < compacted:
            self._gone(pos, compacted)
            self.wfile.write(b"0\r\n\r\n")
            return
        try:
            for o in initial:
                self._chunk({"type": "ADDED", "object": o})
            while True:
                pending, expired = self._next_events(pos, gen, deadline)
                if expired:
                    self._gone(pos, store.compacted)
                    break
                for e in pending:
                    pos = e.rv
                    if e.rt == rt and wanted(e.obj, e.obj["metadata"].get("namespace")):
                        self._chunk({"type": e.type, "object": e.obj})
                if not pending:
                    break
            self.wfile.write(b"0\r\n\r\n")
        except CLIENT_GONE:
            pass

    def _open_stream(self) -> None:
        """The headers of a chunked watch stream that ends with its connection: said so, or a
        client reuses the connection for its next watch and meets a socket the server is closing."""
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _next_events(self, pos: int, gen: int, deadline: float) -> tuple[list[Event], bool]:
        """The store's events after `pos`, waited for until some come, the deadline passes, the
        store is reset (a new generation) or the server stops; True when events this stream should
        have sent were dropped from the history meanwhile (the client must relist)."""
        store = self.server.store
        with store.cond:
            pending = [] if store.held else [e for e in store.events if e.rv > pos]
            while not pending and store.generation == gen and not self.server.stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                store.cond.wait(min(left, 1.0))
                pending = [] if store.held else [e for e in store.events if e.rv > pos]
            expired = bool(pending) and pending[0].rv > pos + 1 and pos < store.compacted
        return pending, expired

    def _gone(self, pos: int, compacted: int) -> None:
        gone = ApiFailure(410, "Expired", f"too old resource version: {pos} ({compacted})")
        self._chunk({"type": "ERROR", "object": gone.status()})

    def do_GET(self) -> None:  # noqa: N802 - the base class's names
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")

    def do_PUT(self) -> None:  # noqa: N802
        self._dispatch("PUT")

    def do_PATCH(self) -> None:  # noqa: N802
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch("DELETE")


class ApiServer(HttpServer):
    """The HTTP server around a `Store`. `start()` serves from a daemon thread; `url` is the
    address clients use; `stop()` ends every watch and closes the socket."""

    name = "lab API server"
    allow_reuse_address = True

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, store: Store | None = None,
                 verbose: bool = False) -> None:
        self.store = store or Store()
        self.verbose = verbose
        self.stopping = False
        self.requests: deque[tuple[str, str, str]] = deque(maxlen=10000)  # (method, path, content type)
        self._thread: threading.Thread | None = None
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://[{host}]:{port}" if ":" in str(host) else f"http://{host}:{port}"

    def start(self) -> ApiServer:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="apiserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping = True
        with self.store.cond:
            self.store.cond.notify_all()
        self.shutdown()
        self.server_close()

    def __enter__(self) -> ApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


