# SPDX-License-Identifier: Apache-2.0
"""What global services and the Multi-Cluster Services controller ask of the API server in a
steady state, counted by the API server itself, for this tree and a baseline revision side by side.

The global-services lab (lab/labs/global-services.yaml: two Kubernetes clusters of 2 nodes, real
control planes, agents, WireGuard): 3 Services global in both clusters with a ready Pod on every
node, and one ServiceExport in cluster2. Once cluster1 holds the slices of cluster2's endpoints,
cluster1's API server's own counters (`/metrics`: apiserver_request_total,
apiserver_response_sizes_sum, apiserver_longrunning_requests) are read around three windows of
--seconds each:
  1. `agents`: both agents of cluster1;
  2. `elected`: the elected agent alone (the other stopped): the follower's share is 1 minus 2;
  3. `elected+mcs`: and cluster1's cache running the MCS controller (`clustermesh cache --mcs`):
     the controller's share is 3 minus 2.
A cluster of N nodes then asks elected + (N - 1) x follower (+ the controller, once per cluster).

The baseline (--against REV, default the revision this change started from) is a `git archive` of
REV's ctl/: the lab's agents, caches and kubelet reproduction run with PYTHONPATH on it (the lab
itself is built by this tree's code either way). Sides run one after the other, same command.

    .venv/bin/python bench/api_lists.py [--seconds 60] [--against c514298] [--sides base,this]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable
from importlib.resources import files
from pathlib import Path
from typing import Any

from meshctl.backends.file import load_yaml
from meshctl.errors import MeshError
from meshctl.lab.namespaces import build, kube_api, kube_cluster
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.namespaces.state import ClusterState, LabState
from meshctl.mesh.services import MANAGED_BY, MANAGED_BY_LABEL

ROOT = Path(__file__).resolve().parents[1]
# The two Kubernetes clusters of the global-services lab file.
LAB = load_yaml(str(files("meshctl") / "lab" / "labs" / "global-services.yaml"))
SERVICES = ("web0", "web1", "web2")
RESOURCES = ("services", "endpointslices", "serviceexports", "serviceimports", "namespaces", "leases")
WINDOWS = ("agents", "elected", "elected+mcs")
LABEL = re.compile(r'(\w+)="([^"]*)"')
Counters = dict[tuple[str, str, str], float]  # (what, verb, resource) -> value


def until(fn: Callable[[], Any], timeout: float, what: str, step: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not fn():
        if time.monotonic() > deadline:
            raise MeshError(f"{what}: not within {timeout:.0f} s")
        time.sleep(step)


def req(c: ClusterState, method: str, path: str, body: Any = None, **kw: Any) -> Any:
    assert c.kube is not None
    return kube_api.request(c.kube, method, path, body, **kw)


def counters(c: ClusterState) -> Counters:
    """The API server's request counts and LIST answer bytes (counters) and its open watches
    (a gauge), by verb and resource."""
    assert c.kube is not None
    text = kube_api.control_plane(c.kube).request_text("GET", "/metrics")
    out: Counters = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        what = {"apiserver_request_total": "requests", "apiserver_response_sizes_sum": "bytes",
                "apiserver_longrunning_requests": "open"}.get(name)
        if what is None:
            continue
        labels, _, value = rest.rpartition("} ")
        d = dict(LABEL.findall(labels))
        key = (what, d.get("verb", ""), d.get("resource", ""))
        out[key] = out.get(key, 0.0) + float(value)
    return out


def window(c: ClusterState, seconds: float) -> dict[str, Any]:
    """Rates over `seconds` of cluster `c`'s API server: LISTs/s and LIST MB/s, GETs and PUTs/s by
    resource, and the watches open at the end."""
    before, t0 = counters(c), time.monotonic()
    time.sleep(seconds)
    after, dt = counters(c), time.monotonic() - t0

    def rate(what: str, verb: str, res: str) -> float:
        return (after.get((what, verb, res), 0.0) - before.get((what, verb, res), 0.0)) / dt

    return {res: {"list": rate("requests", "LIST", res), "list_mb": rate("bytes", "LIST", res) / 1e6,
                  "get": rate("requests", "GET", res), "put": rate("requests", "PUT", res),
                  "watches": after.get(("open", "WATCH", res), 0.0)} for res in RESOURCES}


def prepare(st: LabState) -> None:
    """The global Services with a ready Pod on every node, the ServiceExport, and the wait until
    cluster1 serves cluster2's endpoints."""
    for c in st.clusters:
        for svc in SERVICES:
            req(c, "POST", "/api/v1/namespaces/default/services",
                {"apiVersion": "v1", "kind": "Service",
                 "metadata": {"name": svc, "annotations": {"service.cilium.io/global": "true"}},
                 "spec": {"selector": {"app": svc}, "ports": [{"name": "echo", "port": 7}]}})
            for n in c.nodes:
                pod = kube_cluster.pod_object(f"{svc}-{n.name}", "default", n.name, n.pods[0].ip, {"app": svc})
                req(c, "POST", "/api/v1/namespaces/default/pods", pod)
    c1, c2 = st.clusters
    req(c2, "POST", "/apis/multicluster.x-k8s.io/v1alpha1/namespaces/default/serviceexports",
        {"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport", "metadata": {"name": "web0"}})
    sel = urllib.parse.quote(f"{MANAGED_BY_LABEL}={MANAGED_BY}")
    until(lambda: len(req(c1, "GET", f"/apis/discovery.k8s.io/v1/namespaces/default/endpointslices?labelSelector={sel}")
                      ["items"]) == len(SERVICES), 120, "cluster1's slices of cluster2's endpoints")


def elected(node: Any) -> str | None:
    doc = labcheck.agent_status(node) or {}
    return (doc.get("remotes") or {}).get("services_leader")


def side(name: str, pythonpath: str | None, seconds: float) -> dict[str, Any]:
    """One side's three windows, in a lab of its own whose agents run the tree on `pythonpath`."""
    saved = os.environ.get("PYTHONPATH")
    if pythonpath is not None:
        os.environ["PYTHONPATH"] = pythonpath
    try:
        st = build.up(parse_lab(LAB), prefix=f"ifl{name[:1]}-", wait=240)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    try:
        c1 = st.clusters[0]
        until(lambda: all(x.get("ready") for x in ((labcheck.agent_status(c1.nodes[0]) or {}).get("remotes") or {})
                          .get("clusters") or [{}]), 180, "the cluster mesh")
        prepare(st)
        until(lambda: elected(c1.nodes[0]) is not None, 60, "an elected agent")
        leader = elected(c1.nodes[0])
        time.sleep(5)  # the last writes settle before counting starts
        out: dict[str, Any] = {"leader": leader}
        out["agents"] = window(c1, seconds)
        follower = next(n.name for n in c1.nodes if n.name != leader)
        build.stop_agent(st, follower)
        out["elected"] = window(c1, seconds)
        if pythonpath is not None:
            os.environ["PYTHONPATH"] = pythonpath
        try:
            build.start_cache(st, c1.name, mcs=True)
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
        time.sleep(5)  # its first lists
        out["elected+mcs"] = window(c1, seconds)
        return out
    finally:
        build.stop_cache(st, st.clusters[0].name)
        build.down(st.name)


def lists(w: dict[str, Any], resources: tuple[str, ...] = RESOURCES) -> float:
    return sum(w[r]["list"] for r in resources)


def report(results: dict[str, dict[str, Any]], seconds: float, against: str) -> None:
    print(f"\ncluster1's API server, {seconds:.0f} s per window; LIST/s by resource (LIST MB/s), lease GET/s, "
          "watches open")
    head = "| side | window | " + " | ".join(RESOURCES[:5]) + " | all LISTs | LIST MB/s | lease GET/s | watches |"
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for name, r in results.items():
        for w in WINDOWS:
            x = r[w]
            print(f"| {name} | {w} | " + " | ".join(f"{x[res]['list']:.2f}" for res in RESOURCES[:5])
                  + f" | {lists(x):.2f} | {sum(x[res]['list_mb'] for res in RESOURCES):.3f}"
                  f" | {x['leases']['get']:.2f} | {sum(x[res]['watches'] for res in RESOURCES):.0f} |")
    print("\nper role (LIST/s), and extrapolated to N agents: elected + (N-1) x follower (+ MCS, once)")
    print("| side | elected | follower | MCS controller | 500 agents | 5,000 agents |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        lead, foll = lists(r["elected"]), lists(r["agents"]) - lists(r["elected"])
        mcs = lists(r["elected+mcs"]) - lists(r["elected"])
        print(f"| {name} | {lead:.2f} | {foll:.2f} | {mcs:.2f} | {lead + 499 * foll + mcs:,.0f} | "
              f"{lead + 4999 * foll + mcs:,.0f} |")
    if len(results) == 2:
        (bn, b), (tn, t) = results.items()
        for w in WINDOWS:
            lb, lt = lists(b[w]), lists(t[w])
            print(f"{w}: {tn} / {bn} ({against}) LISTs: {lt:.2f} / {lb:.2f} = "
                  f"{(lt / lb if lb else float('nan')):.3f}x")


def baseline_tree(rev: str, into: Path) -> Path:
    """`rev`'s ctl/ unpacked under `into`; its PYTHONPATH entry."""
    archive = subprocess.run(["git", "archive", rev, "ctl"], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "ctl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--against", default="c514298", help="the baseline revision (default: before the informers)")
    ap.add_argument("--sides", default="base,this", help="base, this, or both (in that order)")
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="if-base-") as d:
        for s in a.sides.split(","):
            if s == "base":
                tree = baseline_tree(a.against, Path(d))
                results[f"base {a.against}"] = side("base", str(tree), a.seconds)
            elif s == "this":
                results["this tree"] = side("this", None, a.seconds)
            else:
                sys.exit(f"error: --sides: {s!r} is not base or this")
            print(json.dumps({s: results[list(results)[-1]]}, sort_keys=True), flush=True)
    report(results, a.seconds, a.against)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
