# SPDX-License-Identifier: Apache-2.0
"""The Kubernetes backend at scale: a real kube-apiserver (this tree's `ControlPlane`: v1.32.6 with
kube-controller-manager and etcd, TLS, RBAC) against the in-process stand-in the project used
before it (`lab/rigs/kube_apiserver` of revision `--against`, default 8f707a9), side by side in
one run. Each side runs its own tree's code: the stand-in and its clients (KubeBackend, admit,
plan) come from a `git archive` of that revision, run in subprocesses with PYTHONPATH on its
ctl/ (never both trees in one process); this tree's clients talk to the real server.

1. One Node annotation change -> every agent's routes, at each of `--sizes` Nodes. N Nodes as a
   kubelet creates them and a published agent leaves them (pod CIDR, public key, last-seen in the
   future so none goes stale, internal IP, endpoint, location in 10 locations), then:
   - N raw watch streams of /api/v1/nodes (one HTTP connection each, every event decoded; one
     asyncio process), the fan-out load of N agents each holding its own watch;
   - `--backends` full agents' views: a process each holding a KubeBackend whose `run()` feeds
     snapshot -> admit_local -> plan_node on every change (the agent's pipeline up to the plan).
   Each change merge-patches one Node's `meshctl.io/allowed-location-ips` (as an operator does)
   to a new /24, which every node outside that Node's location routes. Timed from just before
   the PATCH until (a) each raw watcher decoded the event, (b) each full backend's plan holds the
   route. Also counted: the CPU the server's processes spent per change (less what they spend idle:
   measured for 5 s just before), and the CPU of the watchers' process (the client's share).
2. An agent's memory at `--memory-nodes` Nodes: a fresh process creates one KubeBackend, runs
   its watch until its snapshot holds every Node; its RSS then, and before the backend existed.
   The servers' own RSS beside it.

A third side, `cross`, runs this tree's clients (watchers, backends) against the same stand-in
server: against `standin` it shows what the clients changed, against `real` what the server does.

Watchers and backends authenticate as the manifests' `meshctl` ServiceAccount on the real server
(a TokenRequest token: API Priority and Fairness treats them as it treats agents); the stand-in has
no authentication. Clocks: CLOCK_MONOTONIC, one for every process on the machine.

    .venv/bin/python bench/kube_scale.py [--sizes 50,500] [--changes 20] [--backends 3]
        [--memory-nodes 5000] [--against 8f707a9] [--sides real,standin,cross] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gc
import inspect
import json
import os
import queue
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MANIFESTS = ("00-namespace.yaml", "01-crd-peers.yaml")
LOCATIONS = 10
ALLOWED = "meshctl.io/allowed-location-ips"
BENCH_NET = "172.31.0.0/16"  # the changes' /24s: nothing else in the bench lies there
FUTURE = 10 * 365 * 86400  # last-seen this far ahead: no Node goes stale during a run
BACKEND_NODES = (0, 11, 22)  # loc-0's leader, members of loc-1 and loc-2; changes go to loc-3..9
WATCH_TIMEOUT = 3600


# --- Nodes as a kubelet and a published agent leave them ------------------------------------------

def node_name(i: int) -> str:
    return f"kb-{i:05d}"


def kubelet_node(i: int) -> dict[str, Any]:
    """Node i as a kubelet registers it (labels, pod CIDR, a status with conditions and addresses)."""
    loc, j = i % LOCATIONS, i // LOCATIONS
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    internal = f"172.{16 + loc}.{j // 250}.{1 + j % 250}"
    cidr = f"10.{64 + i // 256}.{i % 256}.0/24"
    conds = [{"type": t, "status": "False", "reason": f"Kubelet Has Sufficient {t}".replace(" ", ""),
              "message": "kubelet has sufficient", "lastHeartbeatTime": now, "lastTransitionTime": now}
             for t in ("MemoryPressure", "DiskPressure", "PIDPressure")]
    conds.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                  "message": "kubelet is posting ready status", "lastHeartbeatTime": now, "lastTransitionTime": now})
    res = {"cpu": "4", "memory": "16318500Ki", "pods": "110", "ephemeral-storage": "101430960Ki"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": node_name(i), "labels": {
            "kubernetes.io/hostname": node_name(i), "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "topology.kubernetes.io/region": f"loc-{loc}"}},
        "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        "status": {"capacity": res, "allocatable": res, "conditions": conds,
                   "addresses": [{"type": "InternalIP", "address": internal},
                                 {"type": "Hostname", "address": node_name(i)}],
                   "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
                   "nodeInfo": {"machineID": f"{i:032x}", "systemUUID": f"{i:032x}", "bootID": f"{i:032x}",
                                "kernelVersion": "6.1.0-18-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)",
                                "containerRuntimeVersion": "containerd://1.7.24", "kubeletVersion": "v1.32.6",
                                "kubeProxyVersion": "v1.32.6", "operatingSystem": "linux", "architecture": "amd64"}},
    }


def agent_annotations(i: int) -> dict[str, str]:
    """What node i's agent publishes (backends/kube/nodes.py own_annotations' names), plus the
    location an operator set."""
    loc, j = i % LOCATIONS, i // LOCATIONS
    return {
        "meshctl.io/public-key": base64.b64encode((i + 7).to_bytes(32, "big")).decode(),
        "meshctl.io/endpoint": f"198.18.{i // 250}.{1 + i % 250}:51820",
        "meshctl.io/internal-ip": f"172.{16 + loc}.{j // 250}.{1 + j % 250}/16",
        "meshctl.io/last-seen": str(int(time.time()) + FUTURE),
        "meshctl.io/granularity": "location",
        "meshctl.io/location": f"loc-{loc}",
    }


def change_target(k: int, n: int) -> int:
    """The Node of change k: in loc-3..loc-9, never one of the backends' locations."""
    return (LOCATIONS * k + 3 + k % 7) % n


# --- the two sides --------------------------------------------------------------------------------

@dataclass
class Side:
    """One API server and what its clients need: URL, admin HTTP session, the agents' kubeconfig
    and credentials, the PYTHONPATH of the tree its clients run."""

    name: str
    url: str
    pythonpath: str
    kubeconfig: Path
    ca: str = ""
    token_file: str = ""
    admin_cert: tuple[str, str] | None = None
    pids: dict[str, int] = field(default_factory=dict)  # the server's processes, by role
    nodes: int = 0
    stop: Callable[[], None] = lambda: None
    shared: Side | None = None  # the side whose server this one uses (its Nodes too)

    def session(self) -> Any:
        import requests

        s = requests.Session()
        s.trust_env = False
        if self.ca:
            s.verify = self.ca
        if self.admin_cert:
            s.cert = self.admin_cert
        return s

    def cpu(self) -> float:
        """CPU seconds (user + system) the server's processes used so far."""
        return sum(cpu_s(p) for p in self.pids.values())

    def rss(self) -> dict[str, float]:
        return {k: rss_mb(p)[0] for k, p in self.pids.items()}


def start_real(d: Path) -> Side:
    from meshctl.lab.rigs.kube_control_plane import ControlPlane

    # node_monitor_grace: the Nodes carry a Ready condition and no kubelet renews it; within the
    # run none turns Unknown (no node lifecycle updates among the measured events).
    cp = ControlPlane(d, node_monitor_grace=7200).start()
    try:
        for m in (*MANIFESTS, "02-rbac.yaml"):
            subprocess.run(["kubectl", "--kubeconfig", str(cp.admin_kubeconfig), "apply", "--server-side", "-f",
                            str(ROOT / "manifests" / m)], check=True, capture_output=True, timeout=120)
        token = cp.create_token("meshctl", "meshctl")
        tf = d / "agent.token"
        tf.write_text(token)
        kc = cp.kubeconfig(d / "agent.kubeconfig", token_file=tf, user="meshctl")
    except BaseException:
        cp.stop()
        raise
    pids = {k: v for k, v in cp.pids.items() if k in ("apiserver", "etcd", "controller-manager")}
    return Side("real", cp.url, str(ROOT / "ctl"), kc, ca=str(cp.ca), token_file=str(tf),
                admin_cert=(str(cp.pki_dir / "meshctl-admin.pem"), str(cp.pki_dir / "meshctl-admin-key.pem")),
                pids=pids, stop=cp.stop)


def start_standin(d: Path, tree: Path) -> Side:
    kc = d / "standin.kubeconfig"
    d.mkdir(parents=True, exist_ok=True)
    log = open(d / "standin.log", "wb")  # noqa: SIM115 - handed to the child
    p = subprocess.Popen([sys.executable, "-m", "meshctl.lab.rigs.kube_apiserver", "--listen", "127.0.0.1:0",
                          *(a for m in MANIFESTS for a in ("--load", str(tree / "manifests" / m))),
                          "--kubeconfig", str(kc)],
                         env=child_env(str(tree / "ctl")), stdout=log, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()

    def stop() -> None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)

    deadline = time.monotonic() + 60
    while not kc.exists():
        if p.poll() is not None or time.monotonic() > deadline:
            stop()
            raise SystemExit(f"the stand-in did not start: {(d / 'standin.log').read_text()[-500:]}")
        time.sleep(0.1)
    url = json.loads(kc.read_text())["clusters"][0]["cluster"]["server"]
    return Side("standin", url, str(tree / "ctl"), kc, pids={"standin": p.pid}, stop=stop)


def child_env(pythonpath: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KUBECONFIG")}
    env["PYTHONPATH"] = pythonpath
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def grow(side: Side, n: int) -> float:
    """Create Nodes side.nodes..n-1: a kubelet's POST, then the agent's merge patch of its
    annotations (two field managers, as on a cluster). Seconds taken."""
    t0 = time.monotonic()
    if side.shared is not None:
        grow(side.shared, n)
        side.nodes = n
        return time.monotonic() - t0
    local = threading.local()

    def one(i: int) -> None:
        s = getattr(local, "s", None)
        if s is None:
            s = local.s = side.session()
        r = s.post(f"{side.url}/api/v1/nodes", params={"fieldManager": "kubelet"}, json=kubelet_node(i), timeout=60)
        if r.status_code not in (200, 201):
            raise SystemExit(f"{side.name}: creating {node_name(i)}: {r.status_code} {r.text[:300]}")
        r = s.patch(f"{side.url}/api/v1/nodes/{node_name(i)}", params={"fieldManager": "meshctl"},
                    data=json.dumps({"metadata": {"annotations": agent_annotations(i)}}),
                    headers={"Content-Type": "application/merge-patch+json"}, timeout=60)
        if r.status_code != 200:
            raise SystemExit(f"{side.name}: annotating {node_name(i)}: {r.status_code} {r.text[:300]}")

    with ThreadPoolExecutor(8) as ex:
        list(ex.map(one, range(side.nodes, n)))
    side.nodes = n
    return time.monotonic() - t0


def nodes_rv(side: Side) -> str:
    with side.session() as s:
        r = s.get(f"{side.url}/api/v1/nodes", params={"limit": "1"}, timeout=60)
        r.raise_for_status()
        return str(r.json()["metadata"]["resourceVersion"])


def wait_quiet(side: Side, quiet: float = 10.0, limit: float = 600.0) -> int:
    """Wait until no Node changes for `quiet` seconds (the real controller manager's TTL
    controller annotates every Node, again when the cluster's size crosses a step); the number
    of Node events seen meanwhile."""
    rv = nodes_rv(side)
    seen = 0
    deadline = time.monotonic() + limit
    with side.session() as s:
        while time.monotonic() < deadline:
            got = 0
            with s.get(f"{side.url}/api/v1/nodes", params={"watch": "1", "resourceVersion": rv,
                                                           "timeoutSeconds": str(int(quiet))},
                       stream=True, timeout=quiet + 30) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if line:
                        ev = json.loads(line)
                        if ev.get("type") == "ERROR":
                            rv = nodes_rv(side)
                            break
                        rv = ev["object"]["metadata"]["resourceVersion"]
                        got += 1
            seen += got
            if not got:
                return seen
    raise SystemExit(f"{side.name}: Nodes still changing after {limit:.0f} s")


def patch_allowed(side: Side, s: Any, i: int, value: str) -> None:
    r = s.patch(f"{side.url}/api/v1/nodes/{node_name(i)}",
                data=json.dumps({"metadata": {"annotations": {ALLOWED: value}}}),
                headers={"Content-Type": "application/merge-patch+json"}, timeout=30)
    if r.status_code != 200:
        raise SystemExit(f"{side.name}: patching {node_name(i)}: {r.status_code} {r.text[:300]}")


# --- children: one JSON object per stdout line ------------------------------------------------------

class Child:
    """A worker process of this script (`--role`), run with a side's PYTHONPATH; its stdout lines
    (JSON) collected; closing its stdin stops it."""

    def __init__(self, side: Side, role: str, *args: str, log: Path) -> None:
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self._log = open(log, "ab")  # noqa: SIM115 - closed in stop()
        self.p = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--role", role, *args],
                                  env=child_env(side.pythonpath), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=self._log, start_new_session=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        for raw in self.p.stdout:
            try:
                self.lines.put(json.loads(raw))
            except ValueError:
                self.lines.put({"text": raw.decode(errors="replace").strip()})
        self.lines.put({"exit": True})

    def next(self, timeout: float) -> dict[str, Any] | None:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            assert self.p.stdin is not None
            self.p.stdin.close()
        try:
            self.p.wait(15)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait(5)
        self._log.close()


def stdin_closed() -> threading.Event:
    """Set when the parent closes our stdin (or dies)."""
    ev = threading.Event()

    def watch() -> None:
        sys.stdin.buffer.read()
        ev.set()

    threading.Thread(target=watch, daemon=True).start()
    return ev


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


# --- role: raw watchers ---------------------------------------------------------------------------

async def _one_watch(i: int, host: str, port: int, tls: ssl.SSLContext | None, request: bytes,
                     on_event: Callable[[int, dict[str, Any], float], None], opened: list[int],
                     errors: list[str]) -> None:
    for attempt in range(20):
        try:
            reader, writer = await asyncio.open_connection(host, port, ssl=tls, limit=1 << 24)
            break
        except OSError as e:  # the stand-in's listen backlog is 5: a burst of connects is refused
            if attempt == 19:
                errors.append(f"watcher {i}: connect: {e}")
                return
            await asyncio.sleep(0.2 * (attempt + 1))
    try:
        writer.write(request)
        status = await reader.readline()
        headers: dict[str, str] = {}
        while (h := await reader.readline()) not in (b"\r\n", b""):
            k, _, v = h.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        if b" 200 " not in status:
            body = await reader.read(300)
            errors.append(f"watcher {i}: {status.decode().strip()} {body[:200]!r}")
            return
        opened[0] += 1
        chunked = headers.get("transfer-encoding", "") == "chunked"
        buf = b""
        while True:
            if chunked:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    break
                buf += (await reader.readexactly(size + 2))[:-2]
            else:
                data = await reader.read(1 << 16)
                if not data:
                    break
                buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    ev = json.loads(line)
                    if ev.get("type") == "ERROR":
                        errors.append(f"watcher {i}: ERROR event {json.dumps(ev.get('object'))[:300]}")
                    on_event(i, ev, time.monotonic())
        errors.append(f"watcher {i}: stream ended")
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        errors.append(f"watcher {i}: {type(e).__name__}: {e}")
    finally:
        opened[0] -= 1
        writer.close()


def role_watchers(a: argparse.Namespace) -> None:
    """`--count` watch streams of /api/v1/nodes from `--rv`. Prints {"open": n} once every stream
    has its answer headers, a heartbeat each second ({"events", "open", "errors"}), and for each
    value of ALLOWED first seen in an event, once every open stream decoded it (or 30 s passed):
    {"value", "times": [monotonic per stream]}."""
    from urllib.parse import urlsplit

    u = urlsplit(a.url)
    host, port = u.hostname or "127.0.0.1", u.port or (443 if u.scheme == "https" else 80)
    tls = None
    if u.scheme == "https":
        tls = ssl.create_default_context(cafile=a.ca)
    auth = f"Authorization: Bearer {Path(a.token_file).read_text().strip()}\r\n" if a.token_file else ""
    request = (f"GET /api/v1/nodes?watch=1&resourceVersion={a.rv}&timeoutSeconds={WATCH_TIMEOUT} HTTP/1.1\r\n"
               f"Host: {host}:{port}\r\nAccept: application/json\r\nUser-Agent: kube-scale-watcher\r\n"
               f"{auth}\r\n").encode()
    stop = stdin_closed()
    first: dict[str, float] = {}
    times: dict[str, dict[int, float]] = {}
    reported: set[str] = set()
    events = [0]
    opened = [0]
    errors: list[str] = []

    def on_event(i: int, ev: dict[str, Any], t: float) -> None:
        events[0] += 1
        obj = ev.get("object") or {}
        value = ((obj.get("metadata") or {}).get("annotations") or {}).get(ALLOWED)
        if value and value not in reported:
            first.setdefault(value, t)
            times.setdefault(value, {}).setdefault(i, t)

    async def main() -> None:
        tasks = []
        for i in range(a.count):
            tasks.append(asyncio.create_task(_one_watch(i, host, port, tls, request, on_event, opened, errors)))
            if i % 20 == 19:
                await asyncio.sleep(0.05)
        deadline = time.monotonic() + 300
        while opened[0] + len(errors) < a.count and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        emit({"open": opened[0], "errors": errors[:5], "n_errors": len(errors)})
        last_hb = 0.0
        while not stop.is_set():
            await asyncio.sleep(0.01)
            now = time.monotonic()
            for value, ts in list(times.items()):
                if value in reported:
                    continue
                if len(ts) >= opened[0] or now - first[value] > 30:
                    reported.add(value)
                    emit({"value": value, "times": list(ts.values()), "open": opened[0]})
                    del times[value]
            if now - last_hb >= 1:
                last_hb = now
                emit({"events": events[0], "open": opened[0], "n_errors": len(errors), "errors": errors[-3:]})
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(main())


# --- role: a full backend -------------------------------------------------------------------------

def make_backend(kubeconfig: str, node: str) -> Any:
    """This tree's or the stand-in tree's `backend_from_options` (which took the API server's URL
    as its second argument)."""
    from meshctl.backends.kube.backend import backend_from_options

    if "api_server" in inspect.signature(backend_from_options).parameters:
        return backend_from_options(kubeconfig, None, node)  # type: ignore[call-arg]
    return backend_from_options(kubeconfig, node)


def role_backend(a: argparse.Namespace) -> None:
    """One agent's view: KubeBackend.run() in a thread; on each change snapshot -> admit_local ->
    plan_node for `--node`; prints {"t", "nodes", "routes"} (routes: the plan's routes inside
    BENCH_NET) whenever the node count or those routes changed."""
    import ipaddress

    import meshctl
    from meshctl.mesh.admit import admit_local
    from meshctl.mesh.plan import plan_node

    net = ipaddress.ip_network(BENCH_NET)
    b = make_backend(a.kubeconfig, a.node)
    stop = stdin_closed()
    wake = threading.Event()
    t = threading.Thread(target=b.run, args=(stop, wake.set), daemon=True)
    t.start()
    emit({"tree": str(Path(meshctl.__file__).parents[1])})
    last: tuple[int, list[str]] | None = None
    while not stop.is_set():
        if not wake.wait(0.5):
            continue
        wake.clear()
        st = b.snapshot()
        if not st.ready:
            emit({"not_ready": st.reason})
            continue
        if all(n.name != a.node for n in st.nodes):
            continue
        topo, _ = admit_local(st.topology())
        plan = plan_node(topo, a.node)
        now = time.monotonic()
        routes = sorted(str(r.dst) for r in plan.routes if r.dst.version == 4 and r.dst.subnet_of(net))
        if last != (len(st.nodes), routes):
            last = (len(st.nodes), routes)
            emit({"t": now, "nodes": len(st.nodes), "routes": routes})
    b.close()
    t.join(10)


# --- role: memory ---------------------------------------------------------------------------------

def role_memory(a: argparse.Namespace) -> None:
    """RSS of a fresh process: at start, after importing the backend, and holding one KubeBackend
    whose watch runs after its snapshot listed `--expect` Nodes."""
    start = rss_mb(os.getpid())[0]
    import meshctl
    import meshctl.backends.kube.backend  # noqa: F401 - what an agent imports before it has a backend
    from meshctl.mesh.admit import admit_local

    gc.collect()
    before = rss_mb(os.getpid())[0]
    t0 = time.monotonic()
    b = make_backend(a.kubeconfig, a.node)
    stop = threading.Event()
    wake = threading.Event()
    t = threading.Thread(target=b.run, args=(stop, wake.set), daemon=True)
    t.start()
    deadline = time.monotonic() + 600
    while True:
        st = b.snapshot()
        if st.ready and len(st.nodes) >= a.expect:
            break
        if time.monotonic() > deadline:
            emit({"error": f"snapshot holds {len(st.nodes)} of {a.expect} nodes ({st.reason})"})
            return
        wake.wait(0.5)
        wake.clear()
    listed = time.monotonic() - t0
    topo, rejected = admit_local(st.topology())
    del topo
    gc.collect()
    time.sleep(2)  # the watch running, nothing changing
    after = rss_mb(os.getpid())
    emit({"tree": str(Path(meshctl.__file__).parents[1]), "start": start, "before": before, "after": after[0],
          "peak": after[1], "nodes": len(st.nodes), "rejected": len(rejected), "listed_s": listed})
    stop.set()
    t.join(10)
    b.close()


# --- measuring ------------------------------------------------------------------------------------

def cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            parts = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of `pid` in MB."""
    out = {"VmRSS": 0.0, "VmHWM": 0.0}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k = line.split(":")[0]
            if k in out:
                out[k] = int(line.split()[1]) / 1024
    return out["VmRSS"], out["VmHWM"]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def last_heartbeat(w: Child) -> int:
    """The events the watchers decoded so far, from a heartbeat that came after this call."""
    for _ in drain(w):
        pass
    while True:
        m = w.next(5)
        if m is None or m.get("exit"):
            raise SystemExit("the watchers stopped")
        if "events" in m:
            return int(m["events"])


def drain(c: Child) -> Iterator[dict[str, Any]]:
    while (m := c.next(0)) is not None:
        yield m


def measure_changes(side: Side, n: int, changes: int, backends: int, first_value: int, d: Path) -> dict[str, Any]:
    """Part 1 at n Nodes on one side (see the module docstring)."""
    wait_quiet(side)
    rv = nodes_rv(side)
    wargs = ["--url", side.url, "--rv", rv, "--count", str(n)]
    if side.ca:
        wargs += ["--ca", side.ca, "--token-file", side.token_file]
    t_open = time.monotonic()
    w = Child(side, "watchers", *wargs, log=d / f"watchers-{side.name}-{n}.log")
    bs = [Child(side, "backend", "--kubeconfig", str(side.kubeconfig), "--node", node_name(i),
                log=d / f"backend-{side.name}-{n}-{i}.log") for i in BACKEND_NODES[:backends]]
    out: dict[str, Any] = {"side": side.name, "nodes": n, "changes": changes}
    try:
        m = None
        while m is None or "open" not in m:
            m = w.next(360)
            if m is None or m.get("exit"):
                raise SystemExit(f"{side.name}: the watchers did not open (see {d})")
        out["open"], out["open_s"], out["watch_errors"] = m["open"], time.monotonic() - t_open, m.get("errors")
        print(f"  {side.name} n={n}: {m['open']} of {n} watch streams open in {out['open_s']:.1f} s"
              + (f"; errors: {m['n_errors']} ({m['errors'][:2]})" if m.get("n_errors") else ""), flush=True)
        routes: list[set[str]] = [set() for _ in bs]
        trees: set[str] = set()
        for k, c in enumerate(bs):
            deadline = time.monotonic() + 300
            while True:
                msg = c.next(max(0.0, deadline - time.monotonic()))
                if msg is None or msg.get("exit"):
                    raise SystemExit(f"{side.name}: backend {k} did not list {n} nodes (see {d})")
                if "tree" in msg:
                    trees.add(msg["tree"])
                if msg.get("nodes") == n:
                    routes[k] = set(msg["routes"])
                    break
        out["trees"] = sorted(trees)
        wait_quiet(side)
        events0 = last_heartbeat(w)
        lat_w: list[float] = []
        last_w: list[float] = []
        lat_b: list[float] = []
        last_b: list[float] = []
        missing = 0
        rtt: list[float] = []
        idle0, t_idle = side.cpu(), time.monotonic()
        time.sleep(5)  # the server's own background CPU (leases, controllers), taken out below
        cpu0 = side.cpu()
        idle_rate = (cpu0 - idle0) / (time.monotonic() - t_idle)
        wcpu0 = cpu_s(w.p.pid)
        t_start = time.monotonic()
        with side.session() as s:
            for k in range(changes):
                value = f"172.31.{first_value + k}.0/24"
                target = change_target(k, n)
                t0 = time.monotonic()
                patch_allowed(side, s, target, value)
                rtt.append(time.monotonic() - t0)
                got_w: list[float] | None = None
                got_b: dict[int, float] = {}
                deadline = t0 + 60
                while (got_w is None or len(got_b) < len(bs)) and time.monotonic() < deadline:
                    for msg in drain(w):
                        if msg.get("value") == value:
                            got_w = msg["times"]
                    for j, c in enumerate(bs):
                        for msg in drain(c):
                            if "routes" in msg:
                                now_routes = set(msg["routes"])
                                if value in now_routes and value not in routes[j] and j not in got_b:
                                    got_b[j] = msg["t"]
                                routes[j] = now_routes
                    time.sleep(0.002)
                if got_w is None or len(got_b) < len(bs):
                    raise SystemExit(f"{side.name} n={n}: change {k} ({value} on {node_name(target)}) not seen "
                                     f"within 60 s: watchers {'yes' if got_w else 'no'}, backends {sorted(got_b)}")
                missing += n - len(got_w)
                lat_w += [t - t0 for t in got_w]
                last_w.append(max(got_w) - t0)
                lat_b += [t - t0 for t in got_b.values()]
                last_b.append(max(got_b.values()) - t0)
                time.sleep(0.3)
        elapsed = time.monotonic() - t_start
        cpu = side.cpu() - cpu0
        wcpu = cpu_s(w.p.pid) - wcpu0
        events1 = last_heartbeat(w)
        out.update(
            w_p50=statistics.median(lat_w), w_p95=pct(lat_w, 95), wlast_p50=statistics.median(last_w),
            wlast_p95=pct(last_w, 95), b_p50=statistics.median(lat_b), b_p95=pct(lat_b, 95),
            blast_p50=statistics.median(last_b), blast_p95=pct(last_b, 95), missing=missing,
            server_cpu_per_change=max(0.0, cpu - idle_rate * elapsed) / changes, idle_cpu=idle_rate,
            watcher_cpu_per_change=wcpu / changes, elapsed=elapsed,
            events=events1 - events0, patch_p50=statistics.median(rtt),
            server_rss=side.rss())
    finally:
        w.stop()
        for c in bs:
            c.stop()
    return out


def measure_memory(side: Side, n: int, d: Path) -> dict[str, Any]:
    t = time.monotonic()
    # The real TTL controller re-annotates every Node when the cluster's size crosses a step, at
    # the controller manager's 20 requests/s: minutes at 5,000 Nodes.
    events = wait_quiet(side, limit=1200)
    print(f"  {side.name}: quiet after {time.monotonic() - t:.0f} s ({events} Node events meanwhile)", flush=True)
    c = Child(side, "memory", "--kubeconfig", str(side.kubeconfig), "--node", node_name(0), "--expect", str(n),
              log=d / f"memory-{side.name}.log")
    try:
        while True:
            m = c.next(660)
            if m is None or m.get("exit"):
                raise SystemExit(f"{side.name}: the memory worker gave no figure (see {d})")
            if "after" in m or "error" in m:
                break
    finally:
        c.stop()
    if "error" in m:
        raise SystemExit(f"{side.name}: memory: {m['error']}")
    m["server_rss"] = side.rss()
    return m


def node_bytes(side: Side) -> int:
    with side.session() as s:
        r = s.get(f"{side.url}/api/v1/nodes/{node_name(0)}", timeout=30)
        r.raise_for_status()
        return len(r.content)


def ms(x: float) -> str:
    return f"{x * 1000:,.0f}" if x >= 0.01 else f"{x * 1000:.1f}"


def report(rows: list[dict[str, Any]], mem: list[dict[str, Any]]) -> None:
    print("\none Node annotation change -> every agent (ms; p50 / p95 over changes x receivers; "
          "'last' = the slowest receiver of each change; PATCH = the change's own request; server CPU: its "
          "processes' CPU during the changes less their idle rate)")
    print(f"{'nodes':>6} {'side':<8} {'PATCH':>6} {'watchers':>14} {'last watcher':>14} {'backends':>14} "
          f"{'last backend':>14} {'server CPU/change':>18} {'watchers CPU/change':>20}")
    by = {(r["nodes"], r["side"]): r for r in rows}
    for r in rows:
        print(f"{r['nodes']:>6} {r['side']:<8} {ms(r['patch_p50']):>6} {ms(r['w_p50']):>6} / {ms(r['w_p95']):>5} "
              f"{ms(r['wlast_p50']):>6} / {ms(r['wlast_p95']):>5} {ms(r['b_p50']):>6} / {ms(r['b_p95']):>5} "
              f"{ms(r['blast_p50']):>6} / {ms(r['blast_p95']):>5} {ms(r['server_cpu_per_change']):>15} ms "
              f"{ms(r['watcher_cpu_per_change']):>17} ms")
    for n in sorted({r["nodes"] for r in rows}):
        real = by.get((n, "real"))
        for other in ("standin", "cross"):
            si = by.get((n, other))
            if real and si:
                print(f"{n:>6} real/{other}: watchers p50 {real['w_p50'] / si['w_p50']:.2f}x p95 "
                      f"{real['w_p95'] / si['w_p95']:.2f}x; last watcher p50 "
                      f"{real['wlast_p50'] / si['wlast_p50']:.2f}x; backends p50 {real['b_p50'] / si['b_p50']:.2f}x "
                      f"p95 {real['b_p95'] / si['b_p95']:.2f}x; server CPU "
                      f"{real['server_cpu_per_change'] / si['server_cpu_per_change']:.2f}x")
    for r in rows:
        print(f"  {r['side']} n={r['nodes']}: {r['open']} streams open in {r['open_s']:.1f} s, events during the "
              f"changes {r['events']} (changes x streams: {r['changes'] * r['open']}), missed {r['missing']}, "
              f"server idle CPU {r['idle_cpu'] * 1000:.0f} ms/s, "
              "server RSS " + ", ".join(f"{k} {v:.0f} MB" for k, v in r["server_rss"].items())
              + f", clients' tree {r['trees']}")
    if mem:
        print("\nan agent's memory (MB): fresh process, one KubeBackend listed and watching")
        for m in mem:
            print(f"  {m['side']:<8} {m['nodes']:,} nodes: RSS at start {m['start']:.1f}, before the backend "
                  f"{m['before']:.1f}, holding it {m['after']:.1f} (+{m['after'] - m['before']:.1f}; peak "
                  f"{m['peak']:.1f}); listed in {m['listed_s']:.1f} s; server RSS "
                  + ", ".join(f"{k} {v:.0f}" for k, v in m["server_rss"].items()) + f"; tree {m['tree']}")
        real = next((m for m in mem if m["side"] == "real"), None)
        for m in mem:
            if real is not None and m is not real:
                print(f"  real/{m['side']}: the backend's growth "
                      f"{(real['after'] - real['before']) / (m['after'] - m['before']):.2f}x, "
                      f"RSS {real['after'] / m['after']:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--sizes", default="50,500")
    ap.add_argument("--changes", type=int, default=20)
    ap.add_argument("--backends", type=int, default=3)
    ap.add_argument("--memory-nodes", type=int, default=5000, help="0: skip part 2")
    ap.add_argument("--against", default="8f707a9", help="the revision whose stand-in and clients are the baseline")
    ap.add_argument("--sides", default="real,standin,cross",
                    help="real, standin, and cross: this tree's clients on the stand-in (needs standin)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    # worker roles (run by the bench itself)
    ap.add_argument("--role", choices=("watchers", "backend", "memory"), help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--rv", help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ca", help=argparse.SUPPRESS)
    ap.add_argument("--token-file", help=argparse.SUPPRESS)
    ap.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    ap.add_argument("--node", help=argparse.SUPPRESS)
    ap.add_argument("--expect", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.role:
        {"watchers": role_watchers, "backend": role_backend, "memory": role_memory}[a.role](a)
        return
    sizes = [int(x) for x in a.sizes.split(",") if x]
    wanted = a.sides.split(",")
    d = Path(tempfile.mkdtemp(prefix="kube-scale-"))
    sides: list[Side] = []
    rows: list[dict[str, Any]] = []
    mem: list[dict[str, Any]] = []
    print(f"load average: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}", flush=True)
    try:
        if "real" in wanted:
            t = time.monotonic()
            sides.append(start_real(d / "real"))
            print(f"real: kube-apiserver at {sides[-1].url} in {time.monotonic() - t:.1f} s", flush=True)
        if "standin" in wanted:
            tree = d / "standin-tree"
            tree.mkdir()
            archive = subprocess.run(["git", "archive", a.against, "ctl", "manifests"], cwd=ROOT, capture_output=True,
                                     check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
            sides.append(start_standin(d / "standin", tree))
            print(f"standin: {a.against}'s stand-in at {sides[-1].url}", flush=True)
            if "cross" in wanted:  # this tree's clients on the stand-in: which side of the wire a ratio comes from
                si = sides[-1]
                sides.append(Side("cross", si.url, str(ROOT / "ctl"), si.kubeconfig, pids=si.pids, shared=si))
        first = 0
        for n in sizes:
            for side in sides:
                took = grow(side, n)
                print(f"{side.name}: {n} Nodes ({took:.1f} s to create; {node_bytes(side):,} bytes per Node as served)",
                      flush=True)
            for side in sides:
                print(f"{side.name} n={n}: load {os.getloadavg()[0]:.2f}", flush=True)
                rows.append(measure_changes(side, n, a.changes, a.backends, first, d))
                first += a.changes
                r = rows[-1]
                print(f"  watchers p50 {ms(r['w_p50'])} p95 {ms(r['w_p95'])} ms; backends p50 {ms(r['b_p50'])} "
                      f"p95 {ms(r['b_p95'])} ms", flush=True)
        if a.memory_nodes:
            for side in sides:
                took = grow(side, a.memory_nodes)
                print(f"{side.name}: {a.memory_nodes} Nodes ({took:.1f} s to create)", flush=True)
            for side in sides:
                print(f"{side.name} memory: load {os.getloadavg()[0]:.2f}", flush=True)
                mem.append({"side": side.name, **measure_memory(side, a.memory_nodes, d)})
    finally:
        if rows or mem:  # what was measured, even when a later part failed
            report(rows, mem)
        print(f"load average: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
        for side in sides:
            side.stop()
        if a.keep:
            print(f"work directory kept: {d}")
        else:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
