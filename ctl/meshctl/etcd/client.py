# SPDX-License-Identifier: Apache-2.0
"""A small etcd v3 client over etcd's JSON gateway (`/v3/...`), with mTLS.

Why not a library: the gRPC clients pin old protobufs, and the gateway needs nothing but
`requests`. Keys and values are bytes on the wire as base64; int64 fields arrive as strings.
The Session ignores the environment (`trust_env=False`): this machine sets REQUESTS_CA_BUNDLE,
which would otherwise override the CA we pass.
"""

from __future__ import annotations

import base64
import contextlib
import json
import socket
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import urllib3

from meshctl.errors import MeshError
from meshctl.etcd.nsconn import session


class EtcdError(MeshError):
    """etcd unreachable or answering with an error."""


class PermissionDenied(EtcdError):
    """etcd refused the request for this identity (auth on, the role does not allow it)."""


class TokenRefused(EtcdError):
    """etcd no longer knows our auth token (expired, or etcd restarted): log in again."""


class WatchIdle(EtcdError):
    """A watch stream stayed silent past its idle timeout: watch again from the last revision."""


class Compacted(EtcdError):
    """A watch asked for a revision etcd has compacted away: list again."""

    def __init__(self, revision: int):
        super().__init__(f"watch revision compacted (oldest kept {revision})")
        self.revision = revision


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int = 0


@dataclass(frozen=True)
class Event:
    type: str  # "PUT" | "DELETE"
    kv: KeyValue


def _b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def prefix_end(prefix: str) -> str:
    """The range end that makes a range cover every key starting with `prefix`."""
    b = bytearray(prefix.encode())
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return base64.b64encode(bytes(b[: i + 1])).decode()
    return _b64(b"\0")


# One request of a command a user types (`node list`, `plan --backend etcd`): etcdctl's
# --command-timeout. The agent keeps the client's own 2 s (its loop must not stall on a request).
COMMAND_TIMEOUT_S = 5.0
READ_CHUNK = 64 * 1024  # bytes asked of the socket per read while streaming


def stream_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """The newline-separated lines of a byte stream, in time linear in its size.

    requests' `iter_lines` joins the pending part of a line to each new chunk and splits again, so
    a line of n bytes read in 512-byte chunks costs O(n^2), which a record of megabytes makes
    noticeable. Here each chunk is searched once and a line's parts are joined once, when it ends."""
    parts: list[bytes] = []
    for chunk in chunks:
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                if start < len(chunk):
                    parts.append(chunk[start:])
                break
            parts.append(chunk[start:nl])
            line = b"".join(parts) if len(parts) > 1 else parts[0]
            parts = []
            start = nl + 1
            if line.strip():
                yield line
    if parts:
        line = b"".join(parts)
        if line.strip():
            yield line


def _kv(d: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=base64.b64decode(d.get("key", "")).decode(errors="replace"),
        value=base64.b64decode(d.get("value", "")),
        create_revision=int(d.get("create_revision", 0)),
        mod_revision=int(d.get("mod_revision", 0)),
        lease=int(d.get("lease", 0)),
    )


class EtcdClient:
    """Talks to one of `endpoints` (tried in turn). `ca`, `cert`, `key` are file paths for mTLS;
    `netns` opens the connections inside that network namespace (the lab, the tests).

    `user` with `password_file` is the etcd identity (when etcd has auth on): the client logs in
    (`/v3/auth/authenticate`), sends the token with every request and logs in again when etcd
    says the token is no longer valid. The JSON gateway cannot take the user from a certificate's
    CN, so this is how a gateway client says who it is (docs/security.md)."""

    def __init__(self, endpoints: Sequence[str], *, ca: str | None = None, cert: str | None = None,
                 key: str | None = None, timeout: float = 2.0, netns: str | None = None,
                 user: str | None = None, password_file: str | None = None) -> None:
        if not endpoints:
            raise MeshError("no etcd endpoints given")
        if bool(user) != bool(password_file):
            raise MeshError("an etcd user needs its password file (and the other way)")
        self.endpoints = [e.rstrip("/") for e in endpoints]
        self.timeout = timeout
        self._ca, self._cert, self._key, self._netns = ca, cert, key, netns
        self.user = user or None
        self._password_file = password_file
        self._token: str | None = None
        self._token_lock = threading.Lock()
        self._local = threading.local()
        self._current = 0
        self._watch: requests.Response | None = None

    def _password(self) -> str:
        assert self._password_file is not None
        try:
            return Path(self._password_file).read_text().strip()
        except OSError as e:
            raise EtcdError(f"etcd password file {self._password_file}: {e.strerror}") from None

    def _login(self, stale: str | None) -> str:
        """A token for our user; a new one if the current token is `stale` (etcd refused it)."""
        with self._token_lock:
            if self._token is not None and self._token != stale:
                return self._token
            self._token = None
            r = self._post("/v3/auth/authenticate", {"name": self.user, "password": self._password()}, auth=False)
            try:
                token = r.json().get("token")
            except ValueError:
                token = None
            if not token:
                raise EtcdError(f"etcd login as {self.user}: no token in the answer")
            self._token = str(token)
            return self._token

    def _session(self) -> requests.Session:
        # One Session per thread: the watch stream and the keepalive thread never share a pool.
        s = getattr(self._local, "s", None)
        if s is None:
            s = session(self._netns)
            if self._ca:
                s.verify = self._ca
            if self._cert and self._key:
                s.cert = (self._cert, self._key)
            self._local.s = s
        return s

    def abort_watch(self) -> None:
        """Close the open watch stream from another thread (so a stopping agent need not wait).
        The socket is shut down first: that ends the reader's blocked read at once, where closing
        the stream alone waits for that read to return (up to the watch's idle timeout)."""
        r = self._watch
        if r is not None:
            conn = r.raw.connection if isinstance(r.raw, urllib3.HTTPResponse) else None
            if conn is not None and conn.sock is not None:
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(Exception):
                r.close()

    def close(self) -> None:
        s = getattr(self._local, "s", None)
        if s is not None:
            s.close()
            self._local.s = None

    def _post(self, path: str, body: dict[str, Any], *, stream: bool = False,
              timeout: float | tuple[float, float | None] | None = None, auth: bool = True) -> requests.Response:
        token = self._login(None) if auth and self.user else None
        try:
            return self._post_once(path, body, stream, timeout, token)
        except TokenRefused:
            # Tokens expire (etcd's --auth-token-ttl) and vanish when etcd restarts: log in again, once.
            return self._post_once(path, body, stream, timeout, self._login(token))

    def _post_once(self, path: str, body: dict[str, Any], stream: bool,
                   timeout: float | tuple[float, float | None] | None, token: str | None) -> requests.Response:
        last: Exception | None = None
        n = len(self.endpoints)
        headers = {"Authorization": token} if token else None
        for i in range(n):
            idx = (self._current + i) % n
            url = self.endpoints[idx] + path
            try:
                r = self._session().post(url, data=json.dumps(body), stream=stream, headers=headers,
                                         timeout=timeout if timeout is not None else self.timeout)
            except requests.RequestException as e:
                last = e
                continue
            self._current = idx
            if r.status_code == 401 and token:
                raise TokenRefused(f"etcd {path}: token refused")
            if r.status_code != 200:
                try:
                    msg = r.json().get("error") or r.json().get("message") or r.text
                except ValueError:
                    msg = r.text
                err = PermissionDenied if r.status_code == 403 else EtcdError
                raise err(f"etcd {path}: HTTP {r.status_code}: {str(msg).strip()[:200]}")
            return r
        raise EtcdError(f"etcd unreachable at {', '.join(self.endpoints)}: {_short(last)}")

    def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Any other v3 gateway call (`/v3/auth/...`: the user and role API), as this identity."""
        return self._call(path, body)

    def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self._post(path, body)
        try:
            out: dict[str, Any] = r.json()
            return out
        except ValueError:
            raise EtcdError(f"etcd {path}: answer is not JSON") from None

    # --- KV --------------------------------------------------------------------------------

    def range(self, key: str, *, prefix: bool = False, keys_only: bool = False) -> tuple[list[KeyValue], int]:
        """The key (or every key under the prefix) and the store's revision."""
        body: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            body["range_end"] = prefix_end(key)
        if keys_only:
            body["keys_only"] = True
        d = self._call("/v3/kv/range", body)
        return [_kv(x) for x in d.get("kvs", [])], int(d.get("header", {}).get("revision", 0))

    def get(self, key: str) -> KeyValue | None:
        kvs, _ = self.range(key)
        return kvs[0] if kvs else None

    def put(self, key: str, value: str | bytes, *, lease: int = 0) -> int:
        """Write a key; returns the new revision."""
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        d = self._call("/v3/kv/put", body)
        return int(d.get("header", {}).get("revision", 0))

    def delete(self, key: str, *, prefix: bool = False) -> int:
        """Delete a key (or a prefix); returns how many were deleted."""
        body: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            body["range_end"] = prefix_end(key)
        d = self._call("/v3/kv/deleterange", body)
        return int(d.get("deleted", 0))

    def put_if_absent(self, key: str, value: str | bytes, *, lease: int = 0) -> bool:
        """Create the key only if it does not exist (a transaction); True if this call created it."""
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        body = {
            "compare": [{"key": _b64(key), "target": "CREATE", "result": "EQUAL", "create_revision": "0"}],
            "success": [{"request_put": put}],
        }
        return bool(self._call("/v3/kv/txn", body).get("succeeded", False))

    def put_many(self, items: Sequence[tuple[str, str | bytes]], *, batch: int = 100) -> None:
        """Write many keys, `batch` per transaction (etcd allows 128 operations per txn)."""
        for i in range(0, len(items), batch):
            ops = [{"request_put": {"key": _b64(k), "value": _b64(val)}} for k, val in items[i:i + batch]]
            self._call("/v3/kv/txn", {"success": ops})

    # --- leases ----------------------------------------------------------------------------

    def lease_grant(self, ttl: int) -> int:
        d = self._call("/v3/lease/grant", {"TTL": str(ttl)})
        if d.get("error"):
            raise EtcdError(f"etcd lease grant: {d['error']}")
        return int(d["ID"])

    def lease_keepalive(self, lease: int) -> int:
        """Refresh a lease once; returns its remaining TTL (0: the lease is gone). The gateway's
        keepalive stream ends after the one answer to our one request: read to its end, the
        session keeps the connection (closed early, every refresh cost a TLS handshake)."""
        d = self._call("/v3/lease/keepalive", {"ID": str(lease)})
        if d.get("error"):
            raise EtcdError(f"etcd lease keepalive: {d['error']}")
        return int(d.get("result", {}).get("TTL", 0))

    def lease_revoke(self, lease: int) -> None:
        self._call("/v3/lease/revoke", {"ID": str(lease)})

    # --- watch -----------------------------------------------------------------------------

    def watch(self, key: str, *, prefix: bool = False, start_revision: int = 0,
              idle_timeout: float = 15.0) -> Iterator[tuple[int, list[Event]]]:
        """Yield (revision, events) batches until the stream ends. Raises EtcdError when the
        connection is lost or idles longer than `idle_timeout` (progress notifications arrive far
        less often, so callers just watch again from the last revision), Compacted when
        `start_revision` is gone."""
        req: dict[str, Any] = {"key": _b64(key), "progress_notify": True}
        if prefix:
            req["range_end"] = prefix_end(key)
        if start_revision:
            req["start_revision"] = str(start_revision)
        r = self._post("/v3/watch", {"create_request": req}, stream=True, timeout=(self.timeout, idle_timeout))
        self._watch = r
        try:
            for line in stream_lines(r.iter_content(chunk_size=READ_CHUNK)):
                try:
                    d = json.loads(line)
                except ValueError:
                    raise EtcdError("etcd watch: answer is not JSON") from None
                if "error" in d:
                    raise EtcdError(f"etcd watch: {d['error'].get('message', d['error'])}")
                res = d.get("result", {})
                if int(res.get("compact_revision", 0) or 0):
                    raise Compacted(int(res["compact_revision"]))
                if res.get("canceled"):
                    raise EtcdError(f"etcd watch canceled: {res.get('cancel_reason', '')}")
                rev = int(res.get("header", {}).get("revision", 0))
                events = [Event(e.get("type", "PUT"), _kv(e.get("kv", {}))) for e in res.get("events", [])]
                yield rev, events
        except requests.RequestException as e:
            if "timed out" in str(e):
                raise WatchIdle(f"etcd watch idle for {idle_timeout:.0f} s") from None
            raise EtcdError(f"etcd watch: {_short(e)}") from None
        except (AttributeError, OSError) as e:
            # The stream was closed under us (abort_watch) or the socket failed mid-read.
            raise EtcdError(f"etcd watch closed: {_short(e)}") from None
        finally:
            r.close()
        raise EtcdError("etcd watch: stream ended")

    def health(self) -> bool:
        try:
            r = self._session().get(self.endpoints[self._current] + "/health", timeout=self.timeout)
            return r.status_code == 200 and r.json().get("health") in ("true", True)
        except (requests.RequestException, ValueError):
            return False


def _short(e: BaseException | None) -> str:
    if e is None:
        return "no endpoint answered"
    s = str(e)
    # requests wraps urllib3 errors in long reprs; the last clause says what happened.
    for marker in ("Connection refused", "timed out", "No route to host", "Network is unreachable",
                   "certificate verify failed", "Connection reset"):
        if marker in s:
            return marker
    return s.splitlines()[0][:200] if s else type(e).__name__
