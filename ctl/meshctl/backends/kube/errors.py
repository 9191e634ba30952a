# SPDX-License-Identifier: Apache-2.0
"""Every failure of a Kubernetes API call as one line that names the server and the cause.

lightkube surfaces a failure in several shapes: `ApiError` for a JSON Status answer,
`httpx.HTTPStatusError` for any other answer (and for every watch answer), `httpx.ConnectError`
with the socket's or TLS's reason, timeouts. A real kube-apiserver answers an API group it does
not serve with a plain-text `404 page not found`, which is how a missing CRD looks; a server that
is not a Kubernetes API at all answers its own 404 for `/api/v1/nodes`. `describe` turns each into
what a user can act on: which credentials were refused, which verb on which resource was
forbidden, that the CA does not match, that `127.0.0.1` in a copied k3s.yaml is the wrong host.

`add_content_type` is installed as a response hook on lightkube's httpx clients: an answer without
a Content-Type (some proxies and plain HTTP servers) otherwise ends in a KeyError inside lightkube.
"""

from __future__ import annotations

import json
import re
import ssl
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import httpx2 as httpx
from lightkube import ApiError

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")
# Set in a response's extensions by add_content_type: the server sent no Content-Type.
NO_CONTENT_TYPE = "meshctl.no_content_type"
_NOT_TLS = "the server does not speak TLS (an http:// server behind an https:// URL?)"


def add_content_type(response: httpx.Response) -> None:
    """httpx response hook: an answer without a Content-Type is marked text/plain (and remembered
    as having none, for the error line)."""
    if "content-type" not in response.headers:
        response.headers["Content-Type"] = "text/plain"
        response.extensions[NO_CONTENT_TYPE] = True


def install_hooks(client: Any, *more: Callable[[httpx.Response], Awaitable[None]]) -> None:
    """Add `add_content_type` to a lightkube Client or AsyncClient's httpx client (and, to an
    AsyncClient's, the response hooks `more`)."""
    inner = client._client._client  # lightkube keeps its httpx client there
    hooks = inner.event_hooks
    if inner.__class__.__name__.startswith("Async"):
        async def hook(response: httpx.Response) -> None:
            add_content_type(response)

        hooks.setdefault("response", []).extend([hook, *more])
    else:
        hooks.setdefault("response", []).append(add_content_type)
    inner.event_hooks = hooks


def status_of(e: BaseException) -> int | None:
    """The HTTP status of a failed call, None when no answer came."""
    if isinstance(e, ApiError):
        return int(e.status.code or 0)
    if isinstance(e, httpx.HTTPStatusError):
        return e.response.status_code
    return None


def _text(response: httpx.Response) -> str:
    """The answer's body, or "" when it was streamed and not read (a watch's)."""
    try:
        return response.text
    except httpx.ResponseNotRead:
        return ""


def _json_status(response: httpx.Response) -> dict[str, Any] | None:
    """The Status object of a JSON answer ({} when the body of a streamed JSON answer is unread)."""
    if "json" not in response.headers.get("content-type", ""):
        return None
    text = _text(response)
    if not text:
        return {}
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and doc.get("kind") == "Status" else None


def is_kubernetes_answer(e: BaseException) -> bool:
    """Whether a failed call's answer came from a Kubernetes API server: a JSON Status, or the
    API server's plain `404 page not found` for a path it does not serve."""
    if isinstance(e, ApiError):
        return True
    if isinstance(e, httpx.HTTPStatusError):
        r = e.response
        return _json_status(r) is not None or (r.status_code == 404 and _text(r).strip() == "404 page not found")
    return False


def _tls_reason(e: BaseException) -> str | None:
    chain = _chain(e)
    for cur in chain:  # the ssl module's own error first: its reason without the `(_ssl.c:NNN)` suffix
        if isinstance(cur, ssl.SSLCertVerificationError):
            return cur.verify_message or str(cur)
        if isinstance(cur, ssl.SSLError):
            return _NOT_TLS if "WRONG_VERSION" in (cur.reason or "") else cur.reason or str(cur)
    for cur in chain:
        text = re.sub(r"\s*\(_ssl\.c:\d+\)", "", str(cur))
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
            return text.split("certificate verify failed:", 1)[-1].strip(" ()") or "certificate verify failed"
        if "SSL" in text and ("WRONG_VERSION" in text or "wrong version" in text):
            return _NOT_TLS
    return None


def _chain(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = e
    while cur is not None and cur not in out:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _refused(e: BaseException) -> bool:
    return any(isinstance(c, ConnectionRefusedError) or "connection refused" in str(c).lower() for c in _chain(e))


def describe(e: BaseException, server: str, doing: str) -> str:
    """One line: `doing` (what was being done, e.g. `listing nodes`), the server, the cause."""
    where = f"kubernetes API {server}"
    code = status_of(e)
    if code is not None:
        message = ""
        if isinstance(e, ApiError):
            message = e.status.message or ""
        elif isinstance(e, httpx.HTTPStatusError):
            st = _json_status(e.response)
            message = str(st.get("message", "")) if st else ""
        if code == 401:
            return (f"{doing}: {where} refused the credentials (401 Unauthorized): the kubeconfig's user, "
                    "token or client certificate is not accepted by this cluster")
        if code == 403:
            return f"{doing}: {where}: 403 Forbidden: {message or 'the credentials may not do this'}"
        if not is_kubernetes_answer(e) and isinstance(e, httpx.HTTPStatusError):
            r = e.response
            ctype = "no Content-Type" if r.extensions.get(NO_CONTENT_TYPE) else r.headers.get("content-type", "")
            body = (_text(r).strip().splitlines() or [""])[0][:80]
            return (f"{doing}: {where} answered {code} {r.reason_phrase} ({ctype}{': ' + repr(body) if body else ''}): "
                    "this is not a Kubernetes API server (check the kubeconfig's server URL)")
        if not message and isinstance(e, httpx.HTTPStatusError):
            message = e.response.reason_phrase
        return f"{doing}: {where}: {code} {message}".rstrip()
    tls = _tls_reason(e)
    if tls is not None:
        return (f"{doing}: {where}: TLS: {tls} (is the kubeconfig's certificate-authority this cluster's CA?)")
    text = str(e) or type(e).__name__
    if _refused(e):
        hint = ""
        if (urlsplit(server).hostname or "") in LOOPBACK_HOSTS:
            hint = "; it names this machine: a k3s.yaml copied from a server needs `server:` set to its address"
        return f"{doing}: cannot connect to {where}: connection refused{hint}"
    if isinstance(e, httpx.RemoteProtocolError):
        return f"{doing}: {where} closed the connection mid-answer (stopped or restarted?)"
    if isinstance(e, httpx.TimeoutException):
        return f"{doing}: {where}: no answer in time ({type(e).__name__})"
    if isinstance(e, httpx.ConnectError):
        return f"{doing}: cannot connect to {where}: {text}"
    return f"{doing}: {where}: {text}"
