# SPDX-License-Identifier: Apache-2.0
"""A real Kubernetes control plane for the tests and the Kubernetes labs: Debian's etcd, the
`kube-apiserver` and `kube-controller-manager` that kube_binaries finds, with TLS, RBAC, the Node
authorizer, NodeRestriction and ValidatingAdmissionPolicy, as a kubeadm or k3s server runs them.
What it does not run is a kubelet: kubelets.py reproduces the part of one the mesh depends on.

Everything is made at start under one directory: a CA (also the cluster signer), the API server's
serving certificate (SANs: the listen address, 127.0.0.1, the `kubernetes` Service names), client
certificates (the admin in `system:masters`, the controller manager, and one per node for the
kubelet reproduction), the service-account signing key, and an admin kubeconfig. In a network
namespace (a lab cluster) the processes run there; the host reaches the API server through
tcp_forward. Stopping kills only the PIDs started here.

Faults come from the real processes: `restart_apiserver` (broken watches; a watch cache that starts
after a client's resourceVersion answers 410 Gone), `compact` (an etcd compaction), `pause_etcd` /
`resume_etcd` (a stopped etcd, by SIGSTOP/SIGCONT).
"""

from __future__ import annotations

import base64
import contextlib
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

from meshctl.errors import MeshError
from meshctl.etcd.nsconn import session
from meshctl.lab.rigs import kube_binaries, pki
from meshctl.lab.rigs.etcd_process import EtcdServer, last_error_line, stop_pid
from meshctl.node.shell import exec_prefix

SERVICE_CIDR = "10.96.0.0/16"
API_PORT = 6443
# The first address of SERVICE_CIDR: the `kubernetes` Service's ClusterIP, in the serving SANs.
_SERVICE_IP = str(next(ipaddress.ip_network(SERVICE_CIDR).hosts()))
_SERVICE_NAMES = ("kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
ADMIN = "meshctl-admin"
START_WAIT = 90.0
PORT_TRIES = 3  # starts of etcd on new free ports when another socket took one first


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the kernel's pick; another process may still take it)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def write_kubeconfig(path: Path, server: str, ca: Path, *, user: str, cert: Path | None = None,
                     key: Path | None = None, token_file: Path | None = None, namespace: str | None = None) -> Path:
    """A kubeconfig with one cluster, one user (client certificate or token file) and one context."""
    u: dict[str, str] = {}
    if cert is not None and key is not None:
        u = {"client-certificate": str(cert), "client-key": str(key)}
    if token_file is not None:
        u["tokenFile"] = str(token_file)
    ctx: dict[str, str] = {"cluster": "meshctl-lab", "user": user}
    if namespace:
        ctx["namespace"] = namespace
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "meshctl-lab",
           "clusters": [{"name": "meshctl-lab", "cluster": {"server": server, "certificate-authority": str(ca)}}],
           "users": [{"name": user, "user": u}], "contexts": [{"name": "meshctl-lab", "context": ctx}]}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path


def _url(host: str, port: int) -> str:
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


@dataclass
class ControlPlane:
    """One control plane under `dir`. `host` is the API server's listen address (inside `netns`
    when given); port 0 picks a free one. `node_monitor_grace` is the controller manager's
    `--node-monitor-grace-period` (how long a Node without heartbeats stays Ready)."""

    dir: Path
    host: str = "127.0.0.1"
    port: int = 0
    netns: str | None = None
    extra_sans: tuple[str, ...] = ()
    node_monitor_grace: int = 40
    version: str = kube_binaries.VERSION
    etcd: EtcdServer | None = None
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, repr=False)

    # --- paths -------------------------------------------------------------------------------------

    @property
    def pki_dir(self) -> Path:
        return self.dir / "pki"

    @property
    def ca(self) -> Path:
        return self.pki_dir / "ca.pem"

    @property
    def url(self) -> str:
        return _url(self.host, self.port)

    @property
    def admin_kubeconfig(self) -> Path:
        return self.dir / "admin.kubeconfig"

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self, wait: float = START_WAIT) -> ControlPlane:
        """etcd, the API server (until /readyz answers ok), the controller manager."""
        bins = kube_binaries.find(self.version)
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.port == 0:
            self.port = API_PORT if self.netns else free_port(self.host)
        self._make_pki()
        try:
            self._start_etcd()
            self._start_apiserver(bins, wait)
            self._start_controller_manager(bins)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_etcd(self) -> None:
        """etcd on 2379/2380 of the control plane's own namespace, or on two free ports of this
        host's loopback. A free port is only the kernel's pick of the moment: on a busy host an
        outgoing connection can take it as its source port before etcd binds it (a Kubernetes
        fixture's etcd exited so under make test). Such a start is tried again on new ports."""
        loopback = "127.0.0.1"
        for attempt in range(1, PORT_TRIES + 1):
            etcd_port, peer_port = (2379, 2380) if self.netns else (free_port(loopback), free_port(loopback))
            if attempt > 1:
                shutil.rmtree(self.dir / "etcd", ignore_errors=True)  # what the failed start wrote
            self.etcd = EtcdServer("kube-etcd", self.dir / "etcd", host=loopback, port=etcd_port,
                                   peer_port=peer_port, netns=self.netns, log_file=self.dir / "etcd.log")
            try:
                self.pids["etcd"] = self.etcd.start()
                return
            except MeshError as e:
                if self.netns or attempt == PORT_TRIES or "address already in use" not in str(e):
                    raise

    def stop(self) -> None:
        """Every process started here, newest first."""
        for name in ("kubelets", "controller-manager", "apiserver-2", "apiserver"):
            pid = self.pids.pop(name, None)
            if pid is not None:
                stop_pid(pid, 5.0)
            p = self._procs.pop(name, None)
            if p is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(timeout=1)
        if self.etcd is not None:
            self.resume_etcd()
            self.etcd.stop()
            self.pids.pop("etcd", None)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- faults ------------------------------------------------------------------------------------

    def restart_apiserver(self, wait: float = START_WAIT) -> None:
        """Stop the API server (every watch breaks) and start it again on the same port."""
        self.stop_apiserver()
        self.start_apiserver(wait)

    def stop_apiserver(self, name: str = "apiserver") -> None:
        pid = self.pids.pop(name, None)
        if pid is not None:
            stop_pid(pid, 5.0)

    def start_apiserver(self, wait: float = START_WAIT, name: str = "apiserver") -> None:
        """Start (again) the API server `name` on its port."""
        self._start_apiserver(kube_binaries.find(self.version), wait, name)

    def second_apiserver(self, wait: float = START_WAIT) -> str:
        """A second API server on the same etcd (an HA control plane's other member), on a port
        of its own; its URL. Stopped with the rest (or `stop_apiserver("apiserver-2")`)."""
        self.ports["apiserver-2"] = free_port(self.host) if not self.netns else API_PORT + 1
        self._start_apiserver(kube_binaries.find(self.version), wait, "apiserver-2")
        return _url(self.host, self.ports["apiserver-2"])

    def pause_etcd(self) -> None:
        if self.etcd is not None and self.etcd.pid is not None:
            os.kill(self.etcd.pid, signal.SIGSTOP)

    def resume_etcd(self) -> None:
        if self.etcd is not None and self.etcd.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.etcd.pid, signal.SIGCONT)

    def compact(self) -> int:
        """Compact etcd at its current revision; returns that revision."""
        assert self.etcd is not None
        c = self.etcd.client()
        try:
            rev = int(c.call("/v3/maintenance/status", {})["header"]["revision"])
            c.call("/v3/kv/compaction", {"revision": rev, "physical": True})
        finally:
            c.close()
        return rev

    # --- clients -----------------------------------------------------------------------------------

    def http(self) -> requests.Session:
        """A requests session as the admin (client certificate), inside the namespace if any."""
        s = session(self.netns)
        s.verify = str(self.ca)
        s.cert = (str(self.pki_dir / f"{ADMIN}.pem"), str(self.pki_dir / f"{ADMIN}-key.pem"))
        return s

    def request(self, method: str, path: str, body: Any = None, *, timeout: float = 10.0) -> Any:
        """One admin request; the decoded answer, or MeshError with the server's message."""
        with self.http() as s:
            r = s.request(method, self.url + path, json=body, timeout=timeout)
        if r.status_code >= 400:
            try:
                msg = r.json().get("message", r.text)
            except ValueError:
                msg = r.text.strip()
            raise MeshError(f"{method} {path}: {r.status_code} {msg}")
        return r.json() if r.content else None

    def request_text(self, method: str, path: str, *, timeout: float = 10.0) -> str:
        """One admin request whose answer is text (/metrics, /readyz?verbose)."""
        with self.http() as s:
            r = s.request(method, self.url + path, timeout=timeout)
        r.raise_for_status()
        return r.text

    def create_token(self, account: str, namespace: str, *, pod: str | None = None, node: str | None = None,
                     seconds: int = 86400) -> str:
        """A service-account token from the TokenRequest API, bound to `pod` (as the kubelet
        projects it into a Pod, with the Pod's node in its claims) or to `node`."""
        spec: dict[str, Any] = {"expirationSeconds": seconds}
        if pod is not None:
            p = self.request("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}")
            spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": pod, "uid": p["metadata"]["uid"]}
        elif node is not None:
            n = self.request("GET", f"/api/v1/nodes/{node}")
            spec["boundObjectRef"] = {"kind": "Node", "apiVersion": "v1", "name": node, "uid": n["metadata"]["uid"]}
        doc = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        out = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", doc)
        return str(out["status"]["token"])

    def admin_identity(self) -> pki.CertFiles:
        """The admin's client certificate (group system:masters)."""
        return pki.CertFiles(self.pki_dir / f"{ADMIN}.pem", self.pki_dir / f"{ADMIN}-key.pem", self.ca)

    def node_identity(self, node: str) -> pki.CertFiles:
        """A kubelet's client certificate for `node` (user system:node:<node>, group system:nodes)."""
        ca = pki.CertFiles(self.ca, self.pki_dir / "ca-key.pem", self.ca)
        name = f"node-{node}"
        if (self.pki_dir / f"{name}.pem").exists():
            return pki.CertFiles(self.pki_dir / f"{name}.pem", self.pki_dir / f"{name}-key.pem", self.ca)
        return pki.make_cert(ca, self.pki_dir, name, subject=f"/O=system:nodes/CN=system:node:{node}")

    def kubeconfig(self, path: Path, *, server: str | None = None, token_file: Path | None = None,
                   identity: pki.CertFiles | None = None, user: str = "user") -> Path:
        """A kubeconfig for this API server at `server` (default: its URL) with a token file or a
        client certificate."""
        return write_kubeconfig(path, server or self.url, self.ca, user=user, token_file=token_file,
                                cert=identity.cert if identity else None, key=identity.key if identity else None)

    def start_kubelets(self, nodes: dict[str, str]) -> int:
        """The kubelet and scheduler reproduction (kubelets.py) for `nodes` (name -> address) in one
        process, each node with its own client certificate; returns its PID (in `pids["kubelets"]`)."""
        for n in nodes:
            self.node_identity(n)
        self.paused_file.touch()
        argv = [sys.executable, "-m", "meshctl.lab.rigs.kubelets", "--server", self.url, "--certs", str(self.pki_dir),
                "--paused", str(self.paused_file), *(f"{n}={ip}" for n, ip in nodes.items())]
        return self._spawn("kubelets", argv).pid

    @property
    def paused_file(self) -> Path:
        return self.dir / "kubelets-paused"

    def pause_kubelet(self, node: str, paused: bool = True) -> None:
        """Stop (or resume) `node`'s heartbeats, as if its kubelet died (or came back)."""
        names = set(self.paused_file.read_text().split()) if self.paused_file.exists() else set()
        names = names | {node} if paused else names - {node}
        self.paused_file.write_text("".join(f"{n}\n" for n in sorted(names)))

    # --- internals ---------------------------------------------------------------------------------

    def _make_pki(self) -> None:
        d = self.pki_dir
        ca = pki.make_ca(d, "meshctl-kube-ca")
        sans = {self.host, "127.0.0.1", _SERVICE_IP, *self.extra_sans, *_SERVICE_NAMES}
        if not (d / "apiserver.pem").exists():
            pki.make_cert(ca, d, "apiserver", server=True, hosts=tuple(sorted(sans)), subject="/CN=kube-apiserver")
        if not (d / f"{ADMIN}.pem").exists():
            pki.make_cert(ca, d, ADMIN, subject=f"/O=system:masters/CN={ADMIN}")
        if not (d / "scheduler.pem").exists():
            pki.make_cert(ca, d, "scheduler", subject="/CN=system:kube-scheduler")
        if not (d / "controller-manager.pem").exists():
            pki.make_cert(ca, d, "controller-manager", subject="/CN=system:kube-controller-manager")
        pki.make_keypair(d, "sa")
        self.kubeconfig(self.admin_kubeconfig, user=ADMIN,
                        identity=pki.CertFiles(d / f"{ADMIN}.pem", d / f"{ADMIN}-key.pem", ca.cert))
        self.kubeconfig(self.dir / "controller-manager.kubeconfig", user="controller-manager",
                        identity=pki.CertFiles(d / "controller-manager.pem", d / "controller-manager-key.pem", ca.cert))

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log = open(self.dir / f"{name}.log", "ab")  # noqa: SIM115
        try:
            p = subprocess.Popen([*exec_prefix(self.netns), *argv], stdout=log, stderr=log,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()
        self._procs[name] = p
        self.pids[name] = p.pid
        return p

    def _start_apiserver(self, bins: Path, wait: float, name: str = "apiserver") -> None:
        assert self.etcd is not None
        d = self.pki_dir
        port = self.ports.get(name, self.port)
        url = _url(self.host, port)
        argv = [str(bins / "kube-apiserver"),
                f"--bind-address={self.host}", f"--secure-port={port}", f"--advertise-address={self.host}",
                "--endpoint-reconciler-type=none", f"--etcd-servers={self.etcd.url}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction",
                f"--client-ca-file={d / 'ca.pem'}",
                f"--tls-cert-file={d / 'apiserver.pem'}", f"--tls-private-key-file={d / 'apiserver-key.pem'}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={d / 'sa.pub'}", f"--service-account-signing-key-file={d / 'sa.key'}",
                "--allow-privileged=true", "--profiling=false", "--v=1"]
        p = self._spawn(name, argv)
        deadline = time.monotonic() + wait
        last = "no answer"
        with self.http() as s:
            while time.monotonic() < deadline:
                if p.poll() is not None:
                    raise MeshError(f"kube-apiserver exited with {p.returncode}: {self._tail(name)}")
                try:
                    r = s.get(url + "/readyz", timeout=2)
                    if r.status_code == 200:
                        return
                    last = f"/readyz {r.status_code}"
                except requests.RequestException as e:
                    last = type(e).__name__
                time.sleep(0.1)
        raise MeshError(f"kube-apiserver at {url} not ready within {wait:.0f} s ({last}): {self._tail(name)}")

    def _start_controller_manager(self, bins: Path) -> None:
        d = self.pki_dir
        kc = self.dir / "controller-manager.kubeconfig"
        port = 10257 if self.netns else free_port("127.0.0.1")
        argv = [str(bins / "kube-controller-manager"),
                f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
                "--use-service-account-credentials=true", f"--service-account-private-key-file={d / 'sa.key'}",
                f"--root-ca-file={d / 'ca.pem'}", f"--cluster-signing-cert-file={d / 'ca.pem'}",
                f"--cluster-signing-key-file={d / 'ca-key.pem'}", "--controllers=*", "--leader-elect=false",
                "--bind-address=127.0.0.1", f"--secure-port={port}", f"--client-ca-file={d / 'ca.pem'}",
                "--authentication-skip-lookup=true",
                f"--node-monitor-grace-period={self.node_monitor_grace}s", "--v=1"]
        self._spawn("controller-manager", argv)

    def _tail(self, name: str) -> str:
        """The last error (klog's E and F lines) of process `name`'s log."""
        return last_error_line(self.dir / f"{name}.log", lambda ln: ln[:1] in ("E", "F"))


def token_claims(token: str) -> dict[str, Any]:
    """The claims of a service-account JWT (not verified: for tests and the lab's checks)."""
    part = token.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))))
