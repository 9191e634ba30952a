# SPDX-License-Identifier: Apache-2.0
"""Run an etcd server process for the lab, the tests and the benchmarks.

One member, data on tmpfs, optionally inside a network namespace (started through nsenter so the
process is etcd itself and its PID is the one to kill), optionally serving TLS and requiring
client certificates. Stopping kills only the PID this object started.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from meshctl.errors import MeshError
from meshctl.etcd.client import EtcdClient
from meshctl.lab.rigs.pki import CertFiles
from meshctl.node.shell import exec_prefix, pid_alive

# Bounds of the wait for a starting etcd. A healthy one answers in milliseconds; a TLS handshake
# in a VM under TCG on a loaded host takes over a second, and a 0.5 s read never completed there.
START_WAIT = 60.0
HEALTH_TIMEOUT = 3.0


@dataclass
class EtcdServer:
    """`host` is the address clients use (inside `netns` when given), `more_hosts` others it also
    listens on (its address of the other IP family); `tls` makes the client URLs https with
    client-cert auth; `peer_port` stays on 127.0.0.1 of the same namespace."""

    name: str
    data_dir: Path
    host: str = "127.0.0.1"
    port: int = 2379
    peer_port: int = 2380
    netns: str | None = None
    tls: CertFiles | None = None
    log_file: Path | None = None
    pid: int | None = None
    more_hosts: tuple[str, ...] = ()
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def _url(self, host: str) -> str:
        host = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL is bracketed
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    @property
    def url(self) -> str:
        return self._url(self.host)

    @property
    def urls(self) -> list[str]:
        """Every client URL: `host`'s first, then `more_hosts`'."""
        return [self._url(h) for h in (self.host, *self.more_hosts)]

    def argv(self) -> list[str]:
        url = ",".join(self.urls)
        args = [
            "etcd", "--name", self.name, "--data-dir", str(self.data_dir),
            "--listen-client-urls", url, "--advertise-client-urls", url,
            "--listen-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.peer_port}",
            "--initial-cluster", f"{self.name}=http://127.0.0.1:{self.peer_port}",
            "--initial-cluster-state", "new", "--logger", "zap", "--log-level", "warn",
            # etcd's own defaults: one member has no peer to hear a heartbeat, and its raft ticks
            # are half of an idle etcd's CPU (measured: 0.58% of a host CPU at 50 ms, 0.30% at
            # 500 ms); in a TCG guest the lab's etcd took a fifth of a vCPU
            "--heartbeat-interval", "100", "--election-timeout", "1000",
            # Passwords here are 32 random bytes (backends/etcd_identity.py): bcrypt's cost guards
            # guessable passwords and adds nothing to these, but costs CPU on every login.
            "--bcrypt-cost", "4",
        ]
        if self.tls:
            args += ["--cert-file", str(self.tls.cert), "--key-file", str(self.tls.key),
                     "--trusted-ca-file", str(self.tls.ca), "--client-cert-auth"]
        return args

    def start(self, *, client_tls: CertFiles | None = None, wait: float = START_WAIT) -> int:
        """Start etcd and wait until it answers /health (with `client_tls` when TLS is on)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        log_path = Path(self.log_file or (self.data_dir.parent / f"{self.name}.log"))
        log = open(log_path, "ab")  # noqa: SIM115
        try:
            self._proc = subprocess.Popen([*exec_prefix(self.netns), *self.argv()], stdout=log, stderr=log,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        self.pid = self._proc.pid
        client = self.client(client_tls, timeout=HEALTH_TIMEOUT)
        deadline = time.monotonic() + wait
        try:
            while time.monotonic() < deadline:
                if self._proc.poll() is not None:
                    raise MeshError(f"etcd {self.name} exited with {self._proc.returncode}: "
                                    f"{last_error_line(log_path, _zap_error)} ({log_path})")
                if client.health():
                    return self.pid
                time.sleep(0.05)
        finally:
            client.close()
        self.stop()
        raise MeshError(f"etcd {self.name} did not become healthy within {wait:.0f} s")

    def client(self, tls: CertFiles | None = None, *, timeout: float = 2.0) -> EtcdClient:
        t = tls or self.tls
        return EtcdClient([self.url], ca=str(t.ca) if t else None, cert=str(t.cert) if t else None,
                          key=str(t.key) if t else None, timeout=timeout, netns=self.netns)

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL; only the PID started here."""
        if self.pid is None:
            return
        stop_pid(self.pid, timeout)
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=0.1)
        self.pid = None

    def kill(self) -> None:
        """SIGKILL without a clean shutdown (to test recovery)."""
        if self.pid is not None:
            stop_pid(self.pid, 0)
            self.pid = None


def stop_pid(pid: int, timeout: float = 5.0) -> None:
    """Terminate one process we started: SIGTERM, wait, SIGKILL (timeout 0: SIGKILL at once)."""
    try:
        os.kill(pid, signal.SIGTERM if timeout > 0 else signal.SIGKILL)
    except ProcessLookupError:
        return
    if _wait_gone(pid, timeout):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _wait_gone(pid, 2.0)


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if not _alive(pid):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def stop_pids(pids: list[int], timeout: float = 3.0) -> None:
    """SIGTERM many processes we started at once, then SIGKILL whatever is left after `timeout`."""
    live = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
            live.append(pid)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while live and time.monotonic() < deadline:
        live = [p for p in live if _alive(p)]
        time.sleep(0.02)
    for pid in live:
        stop_pid(pid, 0)


def _alive(pid: int) -> bool:
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    except ChildProcessError:
        pass
    return pid_alive(pid)


def last_error_line(log: Path, is_error: Callable[[str], bool]) -> str:
    """The last line of a server's log that `is_error` picks, else its last line (300 characters
    at most): what an error about a server that exited or never got ready quotes."""
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    errs = [ln for ln in lines if is_error(ln)] or lines
    return errs[-1][:300] if errs else "no output"


def _zap_error(line: str) -> bool:
    """An error or fatal line of etcd's log (zap's JSON lines)."""
    return '"level":"fatal"' in line or '"level":"error"' in line
