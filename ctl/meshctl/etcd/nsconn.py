# SPDX-License-Identifier: Apache-2.0
"""HTTP connections opened inside another network namespace, from any thread of this process.

A socket belongs to the namespace it was created in, whatever thread later uses it. So one helper
thread per namespace joins it (setns only moves the calling thread) and creates sockets on request;
connecting, TLS and reading then run in the caller's thread as usual. This lets the CLI and the
tests talk to an etcd or an agent's status server inside a lab namespace without touching the
root namespace and without `ip netns exec` subprocesses.
"""

from __future__ import annotations

import os
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.util.connection import create_connection
from urllib3.util.timeout import _DEFAULT_TIMEOUT

from meshctl.errors import MeshError
from meshctl.setns import NETNS_DIR, join_netns

# name -> (the namespace's identity (st_dev, st_ino), the executor whose one thread lives in it)
_executors: dict[str, tuple[tuple[int, int], ThreadPoolExecutor]] = {}
_lock = threading.Lock()


def _join(ns: str, ident: tuple[int, int]) -> None:
    fd = os.open(NETNS_DIR / ns, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != ident:
            raise MeshError(f"network namespace {ns} changed while joining it")
        join_netns(fd, ns)
    finally:
        os.close(fd)


def _identity(ns: str) -> tuple[int, int] | None:
    try:
        st = os.stat(NETNS_DIR / ns)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _executor(ns: str) -> ThreadPoolExecutor:
    """The executor for `ns` as it is now. A thread in a namespace keeps that namespace alive after
    `ip netns delete`; if its name is then reused, the old thread would open sockets in the dead
    one. So each use checks the namespace's identity, and threads of namespaces that are gone or
    were replaced are let go (their threads end, the dead namespace with them)."""
    with _lock:
        for name, (ident, ex) in list(_executors.items()):
            if _identity(name) != ident:
                del _executors[name]
                ex.shutdown(wait=False)
        hit = _executors.get(ns)
        if hit is not None:
            return hit[1]
        now = _identity(ns)
        if now is None:
            raise MeshError(f"network namespace {ns} does not exist")
        ex = ThreadPoolExecutor(1, thread_name_prefix=f"netns-{ns}", initializer=_join, initargs=(ns, now))
        _executors[ns] = (now, ex)
        return ex


def release(ns: str) -> None:
    """Let go of the thread kept for `ns` now (before deleting the namespace, for example)."""
    with _lock:
        hit = _executors.pop(ns, None)
    if hit is not None:
        hit[1].shutdown(wait=False)


def ns_socket(ns: str, family: int = socket.AF_INET, type: int = socket.SOCK_STREAM) -> socket.socket:
    """A new socket that lives in namespace `ns`."""
    return _executor(ns).submit(socket.socket, family, type).result()


def ns_create_connection(ns: str, address: tuple[str, int], timeout: Any = None,
                         source_address: Any = None, socket_options: Any = None) -> socket.socket:
    """`socket.create_connection` for a literal IP address inside `ns`."""
    host, port = address
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = ns_socket(ns, fam)
    try:
        for opt in socket_options or ():
            sock.setsockopt(*opt)
        if timeout is not _DEFAULT_TIMEOUT:
            sock.settimeout(timeout)
        sock.connect((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _conn_class(base: type[HTTPConnection], ns: str | None) -> type[HTTPConnection]:
    class NsConnection(base):  # type: ignore[misc, valid-type]
        def _new_conn(self) -> socket.socket:
            if ns is None:
                return create_connection((self._dns_host, self.port), self.timeout,
                                         source_address=self.source_address, socket_options=self.socket_options)
            return ns_create_connection(ns, (self._dns_host, self.port), self.timeout,
                                        socket_options=self.socket_options)

    return NsConnection


class NetnsAdapter(HTTPAdapter):
    """A requests adapter whose connections are opened inside namespace `ns`."""

    def __init__(self, ns: str, **kw: Any) -> None:
        self.ns = ns
        super().__init__(**kw)

    def init_poolmanager(self, *args: Any, **kw: Any) -> None:
        super().init_poolmanager(*args, **kw)
        ns = self.ns

        class Http(HTTPConnectionPool):
            ConnectionCls = _conn_class(HTTPConnection, ns)

        class Https(HTTPSConnectionPool):
            ConnectionCls = _conn_class(HTTPSConnection, ns)  # type: ignore[assignment]  # urllib3's stub narrows it

        self.poolmanager.pool_classes_by_scheme = {"http": Http, "https": Https}
        self.poolmanager.key_fn_by_scheme = dict(self.poolmanager.key_fn_by_scheme)


def session(ns: str | None = None) -> requests.Session:
    """A requests Session that ignores the environment (REQUESTS_CA_BUNDLE, proxies) and, with `ns`,
    opens its connections inside that namespace."""
    s = requests.Session()
    s.trust_env = False
    if ns is not None:
        a = NetnsAdapter(ns)
        s.mount("http://", a)
        s.mount("https://", a)
    return s
