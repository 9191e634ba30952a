# SPDX-License-Identifier: Apache-2.0
"""An in-process Kubernetes API server for tests and the namespace lab.

No real API server is available to the tests (none installs from Debian, PyPI or npm), so the
Kubernetes backend is tested against this one. It speaks real HTTP and keeps the semantics the
backend relies on, so a client that works here works against kube-apiserver:

- one cluster-wide resourceVersion counter; every write bumps it, a no-op patch does not;
- list returns the collection's resourceVersion; `limit`/`continue` page through a sorted list;
- watch streams ADDED/MODIFIED/DELETED as JSON lines; without a resourceVersion (or with "0") it
  starts with synthetic ADDED events for what exists, with one it resumes right after it; a
  version older than the kept history gets an ERROR event carrying a 410 Gone Status, as
  kube-apiserver does after etcd compaction; `timeoutSeconds` ends the stream; no BOOKMARKs;
- merge patch (RFC 7386), the one kind the backend sends; other patch kinds get 415; a patch or
  update carrying a stale metadata.resourceVersion gets 409 Conflict;
- built-in Nodes, Namespaces, ConfigMaps and Events; a CustomResourceDefinition that is created
  registers its resource (so the Peer CRD of manifests/ is exercised, not assumed), and its
  custom objects are pruned and validated against the version's openAPIV3Schema as kube-apiserver
  does: undeclared fields dropped (unless `x-kubernetes-preserve-unknown-fields`), type, required,
  pattern, range, length and item-count violations answered with 422 Invalid naming each field.

There is no authentication, no TLS and no admission: it binds where it is told (tests use
127.0.0.1 or an address inside a lab namespace). `python -m meshctl.lab.rigs.kube_apiserver --listen ADDR`
runs it standalone and can write a kubeconfig for clients.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import re
import signal
import socket
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

JSON = dict[str, Any]


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


BUILTIN = (
    ResourceType("", "v1", "Node", "nodes", False),
    ResourceType("", "v1", "Namespace", "namespaces", False),
    ResourceType("", "v1", "ConfigMap", "configmaps", True),
    ResourceType("", "v1", "Secret", "secrets", True),
    ResourceType("", "v1", "Event", "events", True),
    ResourceType("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False),
)


class ApiFailure(Exception):
    """An API error: becomes a Status object with this code and reason."""

    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> JSON:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


# --- patches ---------------------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, `null` removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# The patch kinds served: what the backend sends (lightkube PatchType.MERGE). Any other kind is
# answered 415 Unsupported Media Type, as kube-apiserver answers one it does not know.
PATCHERS = {
    "application/merge-patch+json": merge_patch,
}


# --- selectors -------------------------------------------------------------------------------


def _selector(text: str | None) -> list[tuple[str, str, str]]:
    """`a=b,c!=d,e` (equality, inequality and existence only)."""
    out: list[tuple[str, str, str]] = []
    for term in (text or "").split(","):
        term = term.strip()
        if not term:
            continue
        m = re.fullmatch(r"([^=!]+?)\s*(==|=|!=)\s*(.*)", term)
        if m:
            out.append((m.group(1), "!=" if m.group(2) == "!=" else "=", m.group(3)))
        elif term.startswith("!"):
            out.append((term[1:], "!exists", ""))
        else:
            out.append((term, "exists", ""))
    return out


def _field(obj: JSON, path: str) -> str | None:
    cur: Any = obj
    for p in path.split("."):
        if not isinstance(cur, dict) or p not in cur:
            return None
        cur = cur[p]
    return None if cur is None else str(cur)


def _matches(obj: JSON, labels: list[tuple[str, str, str]], fields: list[tuple[str, str, str]]) -> bool:
    lab = obj.get("metadata", {}).get("labels") or {}
    for key, op, val in labels:
        have = lab.get(key)
        if (op == "=" and have != val) or (op == "!=" and have == val) or (op == "exists" and have is None) \
                or (op == "!exists" and have is not None):
            return False
    for key, op, val in fields:
        have = _field(obj, key)
        if (op == "=" and (have or "") != val) or (op == "!=" and (have or "") == val):
            return False
    return True


# --- the store -------------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Event:
    rv: int
    rt: ResourceType
    type: str
    obj: JSON


_TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,),
                                        "integer": (int,), "number": (int, float), "boolean": (bool,)}


def prune(value: Any, schema: JSON) -> Any:
    """Drop the fields a structural schema does not declare (kube-apiserver's pruning), except under
    `x-kubernetes-preserve-unknown-fields: true` or `additionalProperties`."""
    if isinstance(value, dict) and schema.get("type", "object") == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        keep_all = schema.get("x-kubernetes-preserve-unknown-fields") is True
        out = {}
        for k, v in value.items():
            if props is not None and k in props:
                out[k] = prune(v, props[k])
            elif isinstance(extra, dict):
                out[k] = prune(v, extra)
            elif keep_all or (props is None and extra is None and schema.get("type") is None):
                out[k] = v
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(v, schema["items"]) for v in value]
    return value


def _json_type(value: Any) -> str:
    for name, types in (("boolean", (bool,)), ("integer", (int,)), ("number", (float,)), ("string", (str,)),
                        ("object", (dict,)), ("array", (list,))):
        if isinstance(value, types):
            return name
    return "null"


def validate(value: Any, schema: JSON, path: str, *, root: bool = False) -> list[str]:
    """Every violation of `schema` in `value`, worded as kube-apiserver words them
    (`spec.port: Invalid value: 70000: spec.port in body should be less than or equal to 65535`)."""
    out: list[str] = []
    want = schema.get("type")
    if want and value is not None:
        ok = isinstance(value, _TYPES.get(want, (object,))) and not (want in ("integer", "number")
                                                                     and isinstance(value, bool))
        if not ok:
            got = _json_type(value)
            return [f'{path}: Invalid value: "{got}": {path} in body must be of type {want}: "{got}"']
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for req in schema.get("required") or []:
            if req not in value:
                out.append(f"{path + '.' if path else ''}{req}: Required value")
        for k, v in value.items():
            if root and k in ("apiVersion", "kind", "metadata"):
                continue
            sub = props.get(k) or (schema["additionalProperties"] if isinstance(schema.get("additionalProperties"),
                                                                                 dict) else None)
            if sub is not None:
                out += validate(v, sub, f"{path + '.' if path else ''}{k}")
    elif isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            out.append(f"{path}: Invalid value: {len(value)}: {path} in body should have at least "
                       f"{schema['minItems']} items")
        if isinstance(schema.get("items"), dict):
            for i, v in enumerate(value):
                out += validate(v, schema["items"], f"{path}[{i}]")
    elif isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            out.append(f"{path}: Too long: may not be longer than {schema['maxLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f'{path}: Invalid value: {json.dumps(value)}: {path} in body should match '
                       f"'{schema['pattern']}'")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{path}: Invalid value: {value}: {path} in body should be greater than or equal to "
                       f"{schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{path}: Invalid value: {value}: {path} in body should be less than or equal to "
                       f"{schema['maximum']}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: Unsupported value: {json.dumps(value)}")
    return out


class Store:
    """Objects by (resource type, namespace, name), one revision counter and a bounded event
    history: a watch can resume from any version still in the history and gets 410 Gone for an
    older one. `compact()` drops the history, as etcd compaction does."""

    def __init__(self, history: int = 1000, namespaces: tuple[str, ...] = ("default", "kube-system")) -> None:
        self.cond = threading.Condition()
        self.rv = 0
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        # openAPIV3Schema per custom resource: objects are pruned and validated against it.
        self.schemas: dict[ResourceType, JSON] = {}
        self.objects: dict[tuple[ResourceType, str, str], JSON] = {}
        self.events: deque[_Event] = deque(maxlen=history)
        self.compacted = 0  # versions <= this one may be missing from the history
        self.generation = 0  # bumped by drop_watches: open watches end
        self.held = False  # while set, watches deliver nothing (a network partition, for tests)
        for rt in BUILTIN:
            self.register(rt)
        for ns in namespaces:
            self.create(self.types[("", "v1", "namespaces")], "", {"metadata": {"name": ns}})

    # types

    def register(self, rt: ResourceType) -> None:
        with self.cond:
            self.types[(rt.group, rt.version, rt.plural)] = rt

    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.types.get((group, version, plural))
        if rt is None:
            gv = f"{group}/{version}" if group else version
            raise ApiFailure(404, "NotFound", f"the server could not find the requested resource ({gv} {plural})")
        return rt

    def _crd_types(self, crd: JSON) -> list[ResourceType]:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        if not spec.get("group") or not names.get("plural") or not names.get("kind"):
            raise ApiFailure(422, "Invalid", "CustomResourceDefinition needs spec.group, spec.names.plural and kind")
        if crd["metadata"]["name"] != f"{names['plural']}.{spec['group']}":
            raise ApiFailure(422, "Invalid", f"metadata.name must be {names['plural']}.{spec['group']}")
        namespaced = spec.get("scope", "Namespaced") == "Namespaced"
        out = []
        for v in spec.get("versions") or []:
            if v.get("served", True):
                rt = ResourceType(spec["group"], v["name"], names["kind"], names["plural"], namespaced)
                schema = (v.get("schema") or {}).get("openAPIV3Schema")
                if schema:
                    self.schemas[rt] = schema
                out.append(rt)
        return out

    def _admit(self, rt: ResourceType, obj: JSON) -> JSON:
        """A custom object as a real API server stores it: unknown fields pruned (unless the schema
        preserves them), then validated; any violation is a 422 Invalid naming every field."""
        schema = self.schemas.get(rt)
        if schema is None:
            return obj
        meta = obj.get("metadata")
        out: JSON = prune(obj, schema)
        out["apiVersion"], out["kind"], out["metadata"] = obj.get("apiVersion"), obj.get("kind"), meta
        causes = validate(out, schema, "", root=True)
        if causes:
            name = (meta or {}).get("name", "")
            detail = causes[0] if len(causes) == 1 else "[" + ", ".join(causes) + "]"
            raise ApiFailure(422, "Invalid", f'{rt.kind}.{rt.group} "{name}" is invalid: {detail}')
        return out

    # writes (callers hold no lock)

    def _emit(self, rt: ResourceType, type_: str, obj: JSON) -> None:
        if len(self.events) == self.events.maxlen:
            self.compacted = self.events[0].rv
        self.events.append(_Event(self.rv, rt, type_, copy.deepcopy(obj)))
        self.cond.notify_all()

    def _bump(self, obj: JSON) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def create(self, rt: ResourceType, ns: str, obj: Any) -> JSON:
        if not isinstance(obj, dict):
            raise ApiFailure(400, "BadRequest", "the body is not an object")
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiFailure(400, "BadRequest", "metadata is not an object")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise ApiFailure(422, "Invalid", f"{rt.kind}: metadata.name: Required value")
        if rt.namespaced:
            if meta.get("namespace") not in (None, ns):
                raise ApiFailure(400, "BadRequest", "the namespace of the object does not match the namespace on "
                                 "the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        with self.cond:
            obj = self._admit(rt, obj)
            meta = obj["metadata"]
            if rt.namespaced and (self.types[("", "v1", "namespaces")], "", ns) not in self.objects:
                raise ApiFailure(404, "NotFound", f'namespaces "{ns}" not found')
            key = (rt, ns if rt.namespaced else "", name)
            if key in self.objects:
                raise ApiFailure(409, "AlreadyExists", f'{rt.plural} "{name}" already exists')
            new_types = self._crd_types(obj) if rt.plural == "customresourcedefinitions" else []
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            meta.pop("deletionTimestamp", None)
            self._bump(obj)
            self.objects[key] = obj
            for t in new_types:
                self.types[(t.group, t.version, t.plural)] = t
            self._emit(rt, "ADDED", obj)
            return copy.deepcopy(obj)

    def get(self, rt: ResourceType, ns: str, name: str) -> JSON:
        with self.cond:
            obj = self.objects.get((rt, ns if rt.namespaced else "", name))
            if obj is None:
                raise ApiFailure(404, "NotFound", f'{rt.plural} "{name}" not found')
            return copy.deepcopy(obj)

    def _replace(self, rt: ResourceType, ns: str, name: str, new: Any, expect_rv: str | None) -> JSON:
        """Store `new` in place of the current object (lock held): identity fields stay, a stale
        resourceVersion conflicts, an unchanged object is not written."""
        key = (rt, ns if rt.namespaced else "", name)
        old = self.objects.get(key)
        if old is None:
            raise ApiFailure(404, "NotFound", f'{rt.plural} "{name}" not found')
        if not isinstance(new, dict) or not isinstance(new.get("metadata", {}), dict):
            raise ApiFailure(422, "Invalid", "the result is not an object with metadata")
        if expect_rv and expect_rv != old["metadata"]["resourceVersion"]:
            raise ApiFailure(409, "Conflict", f'Operation cannot be fulfilled on {rt.plural} "{name}": the object '
                             "has been modified; please apply your changes to the latest version and try again")
        new = copy.deepcopy(new)
        meta = new.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise ApiFailure(400, "BadRequest", "metadata.name cannot be changed")
        for k in ("name", "namespace", "uid", "creationTimestamp", "resourceVersion"):
            if k in old["metadata"]:
                meta[k] = old["metadata"][k]
            else:
                meta.pop(k, None)
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        new = self._admit(rt, new)
        if new == old:
            return copy.deepcopy(old)
        self._bump(new)
        self.objects[key] = new
        self._emit(rt, "MODIFIED", new)
        return copy.deepcopy(new)

    def update(self, rt: ResourceType, ns: str, name: str, obj: Any) -> JSON:
        with self.cond:
            rv = (obj.get("metadata") or {}).get("resourceVersion") if isinstance(obj, dict) else None
            return self._replace(rt, ns, name, obj, rv)

    def patch(self, rt: ResourceType, ns: str, name: str, content_type: str, body: Any) -> JSON:
        patcher = PATCHERS.get(content_type)
        if patcher is None:
            raise ApiFailure(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                             f"accepted media types include: {', '.join(PATCHERS)}")
        with self.cond:
            current = self.get(rt, ns, name)
            new = patcher(current, body)
            rv = (new.get("metadata") or {}).get("resourceVersion") if isinstance(new, dict) else None
            return self._replace(rt, ns, name, new, rv)

    def delete(self, rt: ResourceType, ns: str, name: str) -> JSON:
        with self.cond:
            key = (rt, ns if rt.namespaced else "", name)
            obj = self.objects.pop(key, None)
            if obj is None:
                raise ApiFailure(404, "NotFound", f'{rt.plural} "{name}" not found')
            self._bump(obj)
            self._emit(rt, "DELETED", obj)
            if rt.plural == "namespaces":
                for k in [k for k in self.objects if k[0].namespaced and k[1] == name]:
                    gone = self.objects.pop(k)
                    self._bump(gone)
                    self._emit(k[0], "DELETED", gone)
            return copy.deepcopy(obj)

    # reads

    def list(self, rt: ResourceType, ns: str | None, labels: str | None = None, fields: str | None = None
             ) -> tuple[int, list[JSON]]:
        lsel, fsel = _selector(labels), _selector(fields)
        with self.cond:
            items = [copy.deepcopy(o) for (t, n, _), o in sorted(self.objects.items(), key=lambda kv: kv[0][1:])
                     if t == rt and (ns is None or n == ns) and _matches(o, lsel, fsel)]
            return self.rv, items

    def compact(self) -> int:
        """Forget the event history, as etcd compaction does: watches from older versions get 410."""
        with self.cond:
            self.events.clear()
            self.compacted = self.rv
            return self.rv

    def hold(self, on: bool = True) -> None:
        """Stop (or resume) delivering watch events: what happens meanwhile is what a client
        behind a partition misses. Lists and writes go on."""
        with self.cond:
            self.held = on
            self.cond.notify_all()

    def drop_watches(self) -> None:
        """End every open watch stream, as a restarting API server does; clients resume."""
        with self.cond:
            self.generation += 1
            self.cond.notify_all()


# --- HTTP ------------------------------------------------------------------------------------


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


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ApiServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        if self.server.verbose:
            super().log_message(format, *args)

    # plumbing

    def _send(self, code: int, body: JSON) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
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
                self._send(200, {"major": "1", "minor": "31", "gitVersion": "v1.31.0-meshctl-test"})
                return
            self._resource(method, parts, q)
        except ApiFailure as e:
            self._send(e.code, e.status())
        except (BrokenPipeError, ConnectionResetError):
            pass

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
            self._send(200, store.get(rt, nsv, name))
        elif method == "POST" and name is None:
            self._send(201, store.create(rt, nsv, self._body()))
        elif method == "PUT" and name is not None:
            self._send(200, store.update(rt, nsv, name, self._body()))
        elif method == "PATCH" and name is not None:
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            self._send(200, store.patch(rt, nsv, name, ctype, self._body() if ctype in PATCHERS else None))
        elif method == "DELETE" and name is not None:
            self._send(200, store.delete(rt, nsv, name))
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
        self._send(200, {"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": items})

    def _chunk(self, ev: JSON) -> None:
        data = json.dumps(ev).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _watch(self, rt: ResourceType, ns: str | None, q: dict[str, str]) -> None:
        """Serve one watch stream: replay from resourceVersion (410 Gone when it is compacted), then
        follow the store until the timeout; one loop whose states are easier to follow
        in one place than split."""
        store = self.server.store
        lsel, fsel = _selector(q.get("labelSelector")), _selector(q.get("fieldSelector"))
        timeout = float(q.get("timeoutSeconds") or 1800)
        deadline = time.monotonic() + timeout
        since = q.get("resourceVersion")
        pos = -1
        if since not in (None, "", "0"):
            try:
                pos = int(since)
            except ValueError:
                raise ApiFailure(400, "BadRequest", f"bad resourceVersion {since!r}") from None
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        # The stream ends with the connection: say so, or a client reuses it for its next watch and
        # meets a socket the server is closing.
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        initial: list[JSON] = []
        with store.cond:
            gen = store.generation
            compacted = store.compacted
            if pos < 0:
                pos = store.rv
                initial = [copy.deepcopy(o) for (t, n, _), o in sorted(store.objects.items(), key=lambda kv: kv[0][1:])
                           if t == rt and (ns is None or n == ns) and _matches(o, lsel, fsel)]
        if pos < compacted:
            gone = ApiFailure(410, "Expired", f"too old resource version: {pos} ({compacted})")
            self._chunk({"type": "ERROR", "object": gone.status()})
            self.wfile.write(b"0\r\n\r\n")
            return
        try:
            for o in initial:
                self._chunk({"type": "ADDED", "object": o})
            while True:
                with store.cond:
                    pending = [] if store.held else [e for e in store.events if e.rv > pos]
                    while not pending and store.generation == gen and not self.server.stopping:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        store.cond.wait(min(left, 1.0))
                        pending = [] if store.held else [e for e in store.events if e.rv > pos]
                    if pending and pending[0].rv > pos + 1 and pos < store.compacted:
                        # Events we should have sent were dropped from the history while we waited.
                        gone = ApiFailure(410, "Expired", f"too old resource version: {pos} ({store.compacted})")
                        self._chunk({"type": "ERROR", "object": gone.status()})
                        break
                for e in pending:
                    pos = e.rv
                    if e.rt == rt and (ns is None or e.obj["metadata"].get("namespace") == ns) \
                            and _matches(e.obj, lsel, fsel):
                        self._chunk({"type": e.type, "object": e.obj})
                if not pending:
                    break
            self.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass

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


class ApiServer(ThreadingHTTPServer):
    """The HTTP server around a `Store`. `start()` serves from a daemon thread; `url` is the
    address clients use; `stop()` ends every watch and closes the socket."""

    daemon_threads = True
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


def kubeconfig(url: str) -> JSON:
    """A kubeconfig for a client of this server (no credentials: it has no authentication)."""
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "meshctl-test",
        "clusters": [{"name": "meshctl-test", "cluster": {"server": url}}],
        "users": [{"name": "meshctl-test", "user": {}}],
        "contexts": [{"name": "meshctl-test", "context": {"cluster": "meshctl-test", "user": "meshctl-test"}}],
    }


def load_manifests(store: Store, paths: list[str]) -> int:
    """Create every object of the YAML files, or of a folder's *.yaml in name order, that this
    server serves (namespaced objects in their metadata.namespace); other kinds are skipped."""
    files: list[Path] = []
    for path in map(Path, paths):
        files += sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    n = 0
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            if not doc:
                continue
            api = doc.get("apiVersion", "")
            group, _, version = api.rpartition("/")
            rt = next((t for t in store.types.values()
                       if t.group == group and t.version == version and t.kind == doc.get("kind")), None)
            if rt is None:
                continue  # kinds this server does not serve (RBAC, DaemonSet, ...)
            store.create(rt, (doc.get("metadata") or {}).get("namespace") or "default" if rt.namespaced else "", doc)
            n += 1
    return n


def parse_listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit():
        raise SystemExit(f"error: --listen: {text!r} is not host:port")
    return host, int(port)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m meshctl.lab.rigs.kube_apiserver",
                                 description="An in-process Kubernetes API server for tests and the lab.")
    ap.add_argument("--listen", default="127.0.0.1:0", help="host:port to bind (port 0: any)")
    ap.add_argument("--load", action="append", default=[], help="YAML manifests to create at start")
    ap.add_argument("--kubeconfig", help="write a kubeconfig for clients here")
    ap.add_argument("--history", type=int, default=1000, help="watch events kept for resuming")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    host, port = parse_listen(args.listen)
    store = Store(history=args.history)
    server = ApiServer(host, port, store=store, verbose=args.verbose)
    load_manifests(store, args.load)
    if args.kubeconfig:
        Path(args.kubeconfig).write_text(json.dumps(kubeconfig(server.url)))
    print(f"apiserver: serving {server.url}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    server.start()
    done.wait()
    server.stop()


if __name__ == "__main__":
    main()
