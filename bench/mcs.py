# SPDX-License-Identifier: Apache-2.0
"""Multi-Cluster Services: how fast an export becomes a name in the other cluster, and how many
answers the clusterset.local server gives on one core.

1. Export -> name: the two-cluster Kubernetes lab (real control planes, agents, WireGuard), each
   cluster's cache running `clustermesh cache --mcs`. For each of N Services of cluster2: the
   ServiceExport is created, and cluster1's clusterset.local server is asked (UDP, every 10 ms,
   from its namespace) until `<svc>.default.svc.clusterset.local` has an A record (the
   ClusterSetIP of cluster1's derived Service). Then the export is deleted and the time until the
   name is NXDOMAIN is taken too. Baseline, side by side (alternating): a Cilium-style global
   Service, annotated global in cluster2 with a ready Pod, until cluster1's agent has written the
   EndpointSlice carrying it.
2. Answers per second: the server (backends.clusterset_dns) in a process pinned to one core, a zone
   of 1,000 imports, asked by a client pinned to the other core with 64 questions in flight
   (A for a ClusterSetIP name, A for a headless name of 3 endpoints, NXDOMAIN, alternately), for
   3 s. Baseline: the same server loop answering every question with one fixed A record (dnslib's
   parse and pack alone, no zone).

    .venv/bin/python bench/mcs.py [--exports 50] [--seconds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
from ipaddress import ip_address
from pathlib import Path
from typing import Any

from dnslib import QTYPE, RR, A, DNSRecord

from meshctl.backends.clusterset_dns import AnswerMemo
from meshctl.errors import MeshError
from meshctl.lab.namespaces import build, kube_api, kube_cluster
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.namespaces.state import ClusterState, LabState
from meshctl.mesh.mcs import CLUSTERSET_IP, HEADLESS, Export, clusterset_zone, merge_all
from meshctl.mesh.services import MANAGED_BY, MANAGED_BY_LABEL, ServiceEndpoint, ServicePort
from meshctl.setns import in_netns

LAB = {
    "clusters": [
        {"cluster": {"name": "cluster1", "id": 1}, "mesh": {"granularity": "location", "subnet": "10.4.0.0/16"},
         "nodes": [{"name": "a1", "location": "loc-a", "internal_ip": "10.10.1.11/24", "pod_cidr": "10.42.1.0/24"}]},
        {"cluster": {"name": "cluster2", "id": 2}, "mesh": {"granularity": "location", "subnet": "10.5.0.0/16"},
         "nodes": [{"name": "g1", "location": "gpu-a", "internal_ip": "10.10.1.21/24", "pod_cidr": "10.43.1.0/24"}]},
    ],
    "lab": {"backend": "kubernetes", "clustermesh": True, "lease_ttl": 3, "fastpath": False},
}
MCS = "/apis/multicluster.x-k8s.io/v1alpha1/namespaces/default"
ZONE = "svc.clusterset.local"


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100 * (len(s) - 1))))]


def req(c: ClusterState, method: str, path: str, body: Any = None, **kw: Any) -> Any:
    assert c.kube is not None
    return kube_api.request(c.kube, method, path, body, **kw)


def ask(c: ClusterState, name: str) -> tuple[int, list[str]]:
    """One UDP question to cluster `c`'s clusterset.local server, from its namespace."""
    host, port = build.cache_dns(c)
    q = DNSRecord.question(name, "A").pack()

    def go() -> tuple[int, list[str]]:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(0.5)
            s.sendto(q, (host, port))
            try:
                r = DNSRecord.parse(s.recv(4096))
            except (TimeoutError, ConnectionRefusedError):
                return -1, []  # not answering (yet)
            return r.header.rcode, [str(x.rdata) for x in r.rr]

    return in_netns(c.etcd.netns, go)


def until(fn: Any, timeout: float, what: str, step: float = 0.01) -> float:
    t0 = time.monotonic()
    while not fn():
        if time.monotonic() - t0 > timeout:
            raise MeshError(f"{what}: not within {timeout} s")
        time.sleep(step)
    return time.monotonic()


def service(c: ClusterState, name: str, annotations: dict[str, str] | None = None) -> None:
    req(c, "POST", "/api/v1/namespaces/default/services",
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "annotations": annotations or {}},
         "spec": {"selector": {"app": name}, "ports": [{"name": "echo", "port": 7}]}})


def one_export(c1: ClusterState, c2: ClusterState, name: str) -> tuple[float, float]:
    """Export -> A record in cluster1, and unexport -> NXDOMAIN there, in seconds."""
    service(c2, name)
    fq = f"{name}.default.{ZONE}"
    t0 = time.monotonic()
    req(c2, "POST", f"{MCS}/serviceexports", {"apiVersion": "multicluster.x-k8s.io/v1alpha1",
                                              "kind": "ServiceExport", "metadata": {"name": name}})
    up = until(lambda: ask(c1, fq)[1] != [], 30, f"{fq} resolves") - t0
    t1 = time.monotonic()
    req(c2, "DELETE", f"{MCS}/serviceexports/{name}")
    down = until(lambda: ask(c1, fq)[0] == 3, 30, f"{fq} gone") - t1
    return up, down


def one_global(st: LabState, c1: ClusterState, c2: ClusterState, name: str) -> float:
    """The Cilium-style path: cluster2's Service made global (its Pod ready) -> cluster1's slice."""
    service(c1, name, {"service.cilium.io/global": "true"})
    service(c2, name)
    ip = st.lookup("g1")[1].pods[0].ip
    req(c2, "POST", "/api/v1/namespaces/default/pods",
        kube_cluster.pod_object(f"{name}-g1", "default", "g1", ip, {"app": name}))
    sel = urllib.parse.quote(f"kubernetes.io/service-name={name}")
    until(lambda: any(e.get("addresses") == [ip] for s in req(
        c2, "GET", f"/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?labelSelector={sel}")["items"]
        for e in s.get("endpoints") or ()), 30, "cluster2's controller slice")
    mine = urllib.parse.quote(f"kubernetes.io/service-name={name},{MANAGED_BY_LABEL}={MANAGED_BY}")
    t0 = time.monotonic()
    req(c2, "PATCH", f"/api/v1/namespaces/default/services/{name}",
        {"metadata": {"annotations": {"service.cilium.io/global": "true"}}},
        content_type="application/merge-patch+json")
    return until(lambda: req(c1, "GET", "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
                             f"?labelSelector={mine}")["items"], 30, "cluster1's slice") - t0


def export_to_name(n: int) -> dict[str, Any]:
    st = build.up(parse_lab(LAB), prefix="msb-", wait=180)
    try:
        c1, c2 = st.clusters
        until(lambda: all(x.get("ready") for x in ((build.check.agent_status(c1.nodes[0]) or {}).get("remotes") or {})
                          .get("clusters") or [{}]), 120, "the cluster mesh", step=0.5)
        for c in st.clusters:
            build.start_cache(st, c.name, mcs=True)
        until(lambda: ask(c1, f"none.default.{ZONE}")[0] == 3, 60, "cluster1's server answers", step=0.2)
        one_export(c1, c2, "warm")  # the first pass after start lists everything once
        ups, downs, globals_ = [], [], []
        for i in range(n):
            up, down = one_export(c1, c2, f"e{i}")
            ups.append(up)
            downs.append(down)
            if i % 5 == 0:  # the baseline, alternating (it leaves a Pod and slices behind: fewer of them)
                globals_.append(one_global(st, c1, c2, f"g{i}"))
        return {"export_to_name": ups, "unexport_to_nxdomain": downs, "global_service_to_slice": globals_}
    finally:
        for c in st.clusters:
            build.stop_cache(st, c.name)
        build.down(st.name)


# --- answers per second ---------------------------------------------------------------------------


def big_zone(n: int = 1000) -> Any:
    exports = []
    for i in range(n):
        typ = HEADLESS if i % 2 else CLUSTERSET_IP
        eps = tuple(ServiceEndpoint(ip_address(f"10.43.{i // 250}.{i % 250 + k}"), "", f"p-{k}") for k in range(3))
        exports.append(Export("cluster2", "default", f"s{i}", typ, "2026-01-01T00:00:00Z", (ServicePort("echo", 7),),
                              (ServicePort("echo", 7),), eps))
    imports = merge_all(exports)
    ips = {ref: [f"10.96.{int(ref[1][1:]) // 250}.{int(ref[1][1:]) % 250 + 1}"] for ref in imports}
    return clusterset_zone(imports, ips, imports.keys(), 1)


def serve(mode: str, port_file: str) -> None:
    """The server loop of backends.clusterset_dns over one UDP socket; `echo`: one fixed A record."""
    zone = big_zone()
    memo = AnswerMemo()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    Path(port_file + ".tmp").write_text(str(s.getsockname()[1]))
    os.replace(port_file + ".tmp", port_file)
    while True:
        data, peer = s.recvfrom(4096)
        if mode == "zone":
            out = memo.reply(data, zone)
        else:
            r = DNSRecord.parse(data)
            rep = r.reply()
            rep.add_answer(RR(r.q.qname, QTYPE.A, rdata=A("10.96.0.1"), ttl=5))
            out = rep.pack()
        if out is not None:
            s.sendto(out, peer)


def blast(port: int, seconds: float, window: int = 64) -> float:
    """Answers per second with `window` questions in flight."""
    names = [f"s10.default.{ZONE}", f"s11.default.{ZONE}", f"nope.default.{ZONE}"]
    qs = [bytearray(DNSRecord.question(n, "A").pack()) for n in names]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("127.0.0.1", port))
    s.settimeout(1)
    got = sent = 0
    t0 = time.monotonic()
    end = t0 + seconds
    for k in range(window):
        s.send(qs[k % 3])
        sent += 1
    while time.monotonic() < end:
        try:
            s.recv(4096)
        except TimeoutError:
            for k in range(window):  # lost ones: refill the window
                s.send(qs[k % 3])
            continue
        got += 1
        q = qs[sent % 3]
        q[0], q[1] = (sent >> 8) & 0xFF, sent & 0xFF
        s.send(q)
        sent += 1
    return got / (time.monotonic() - t0)


def answers_per_second(seconds: float) -> dict[str, float]:
    out = {}
    for mode in ("echo", "zone", "echo", "zone"):  # alternating; the better of two each
        pf = f"/tmp/msb-dns-{os.getpid()}-{mode}"
        p = subprocess.Popen(["taskset", "-c", "0", sys.executable, __file__, "serve", mode, pf])
        try:
            until(lambda pf=pf: os.path.exists(pf) and Path(pf).read_text().strip() != "", 60, "server up")
            port = int(Path(pf).read_text())
            qps = subprocess.run(["taskset", "-c", "1", sys.executable, __file__, "blast", str(port), str(seconds)],
                                 capture_output=True, text=True, check=True).stdout
            out[mode] = max(out.get(mode, 0.0), float(qps))
        finally:
            p.kill()
            p.wait()
            Path(pf).unlink(missing_ok=True)
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2], sys.argv[3])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "blast":
        print(blast(int(sys.argv[2]), float(sys.argv[3])))
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("--exports", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--skip-lab", action="store_true", help="Only the answers per second.")
    a = ap.parse_args()
    qps = answers_per_second(a.seconds)
    print(f"clusterset.local answers/s on one core: {qps['zone']:.0f} (zone of 1,000 imports); "
          f"baseline dnslib fixed answer {qps['echo']:.0f}; ratio {qps['zone'] / qps['echo']:.2f}")
    if a.skip_lab:
        return
    r = export_to_name(a.exports)
    for k, xs in r.items():
        ms = [x * 1000 for x in xs]
        print(f"{k}: p50 {statistics.median(ms):.0f} ms, p95 {pct(ms, 95):.0f} ms, max {max(ms):.0f} ms over {len(ms)}")
    ratio = statistics.median(r["export_to_name"]) / statistics.median(r["global_service_to_slice"])
    print(f"ratio export->name / global service->slice (p50): {ratio:.2f}")
    print(json.dumps({k: [round(x, 4) for x in v] for k, v in r.items()}))


if __name__ == "__main__":
    main()
