# SPDX-License-Identifier: Apache-2.0
"""The agent's one face on the node's network (`--secure-metrics-addr`), for what must reach it from
elsewhere: the kubelet's probes and Prometheus.

The full API (`/status`, `/probe`, `/metrics`) stays on `--metrics-addr`, loopback by default: the
DaemonSet runs in the host's network, so anything bound to 0.0.0.0 there is open to every pod. Here
only three paths answer, over TLS: `/healthz` and `/readyz` to anyone (they say no more than the
Pod's conditions do), and `/metrics` to a bearer token whose user the cluster's RBAC lets `get` the
non-resource URL `/metrics` (backends.kube.authn.DelegatedAuth: TokenReview and
SubjectAccessReview, as kube-rbac-proxy does). The serving certificate is self-signed at start,
kept in the state directory (key 0600); scrapers verify the token path, not the certificate, as
with kube-rbac-proxy's default.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from meshctl.agent.config import parse_addr
from meshctl.http_serving import HttpServer, QuietHandler
from meshctl.node.shell import sh

log = logging.getLogger("meshctl.agent")


class Authorizer(Protocol):
    """Whether a bearer token may read /metrics: None, or the HTTP status and why not (401: the
    token is not known; 403: its user may not)."""

    def check(self, token: str) -> tuple[int, str] | None: ...


class NoAuthority:
    """Refuses every token, saying why (a backend with no cluster to ask)."""

    def __init__(self, why: str) -> None:
        self.why = why

    def check(self, token: str) -> tuple[int, str] | None:
        return 403, self.why


@runtime_checkable
class MetricsAuthority(Protocol):
    """A backend that can ask the cluster who may read /metrics (the Kubernetes backend)."""

    def metrics_auth(self) -> Authorizer: ...


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed EC certificate for `name` in `directory` (tls.crt, tls.key 0600), made once."""
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "tls.crt", directory / "tls.key"
    if cert.exists() and key.exists():
        return cert, key
    fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.close(fd)
    sh(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", str(key), "-out", str(cert), "-days", "3650", "-subj", f"/CN={name}",
        "-addext", f"subjectAltName=DNS:{name}"])
    os.chmod(key, 0o600)
    return cert, key


class SecureMetricsServer:
    """HTTPS on `addr`: /healthz, /readyz open; /metrics (the body `metrics()` gives) for tokens
    `auth` allows. Runs in a daemon thread."""

    def __init__(self, addr: str, cert: Path, key: Path, metrics: Callable[[], bytes], auth: Authorizer,
                 healthy: Callable[[], bool], ready: Callable[[], bool]) -> None:
        class Handler(QuietHandler):
            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?", 1)[0]
                if path == "/healthz":
                    ok = healthy()
                    self.send(200 if ok else 503, b"ok\n" if ok else b"unhealthy\n")
                elif path == "/readyz":
                    ok = ready()
                    self.send(200 if ok else 503, b"ready\n" if ok else b"no plan applied yet\n")
                elif path == "/metrics":
                    header = self.headers.get("Authorization", "")
                    token = header[7:].strip() if header[:7].lower() == "bearer " else ""
                    refused = auth.check(token)
                    if refused is None:
                        self.send(200, metrics(), "text/plain; version=0.0.4")
                    else:
                        self.send(refused[0], f"{refused[1]}\n".encode())
                else:
                    self.send(404, b"not found (this port serves /metrics, /healthz, /readyz)\n")

        host, port = parse_addr(addr, "--secure-metrics-addr")
        self.httpd = _TlsServer((host, port), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(str(cert), str(key))
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True, do_handshake_on_connect=False)
        self.address = self.httpd.server_address
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        name="secure-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _TlsServer(HttpServer):
    name = "meshctl agent (secure metrics)"
    allow_reuse_address = True

    def finish_request(self, request: Any, client_address: Any) -> None:
        # The handshake runs in the request's thread, so one slow or plain-HTTP client cannot hold
        # the accept loop.
        try:
            request.do_handshake()
        except (ssl.SSLError, OSError):
            return
        super().finish_request(request, client_address)
