# SPDX-License-Identifier: Apache-2.0
"""Reproductions of the kubelet and the scheduler, as far as a control plane without them needs.

No kubelet runs in the lab or the tests (no container runtime runs the lab's pods), yet the control
plane's controllers act on what kubelets report: a Node without heartbeats turns NotReady and is
tainted, a Pod that never reports Running has no endpoint, a Pod being deleted never finishes.
This process does, per node and with that node's own credentials (user `system:node:<name>` in
group `system:nodes`, so the Node authorizer and NodeRestriction hold it to its own objects),
what the kubelet documents for those three:

- it reports the Node Ready (status.conditions, status.addresses) at start and every
  `STATUS_EVERY` seconds, and renews the Node's Lease in `kube-node-lease` every `LEASE_EVERY`
  seconds (the kubelet's heartbeat since Kubernetes 1.17);
- it watches the Pods bound to the node and reports each Running, with the node's address as its
  IP for a hostNetwork Pod and the address in the annotation `POD_IP_ANNOTATION` for any other
  (the lab sets it: the lab, not a CNI, wires those pods), Ready unless the annotation
  `READY_ANNOTATION` says "false" (what a failing readiness probe would make it);
- a Pod marked for deletion is deleted for good (what the kubelet does once its containers stop).

No kube-scheduler runs either (none is built for these machines), so `Scheduler` binds each
unscheduled Pod through the Binding subresource, as user `system:kube-scheduler`: a DaemonSet's
Pod to the node its node affinity names (what the default scheduler does for DaemonSet Pods), any
other Pod to the first listed node whose taints it tolerates.

A node listed in the `--paused` file stops its heartbeats (the lab's way to make a kubelet die
while the node's network and agent stay up). Run it as `python -m meshctl.lab.rigs.kubelets
--server URL --certs DIR --paused FILE [--netns NS] NODE=IP ...`, with DIR holding `ca.pem` and
each node's `node-<name>.pem`/`node-<name>-key.pem` (ControlPlane.node_identity).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from meshctl.etcd.nsconn import session

LEASE_EVERY = 10.0
LEASE_SECONDS = 40
STATUS_EVERY = 60.0
POD_IP_ANNOTATION = "lab.meshctl.io/pod-ip"
READY_ANNOTATION = "lab.meshctl.io/ready"
log = logging.getLogger("meshctl.lab.kubelets")


def _now(micro: bool = False) -> str:
    t = datetime.now(UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ") if micro else t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _family(ip: str) -> str:
    return "IPv6" if ":" in ip else "IPv4"


class Kubelet:
    """One node's heartbeat and pod reports."""

    def __init__(self, name: str, ip: str, server: str, creds: Path, paused: Path, stop: threading.Event,
                 netns: str | None = None) -> None:
        self.name, self.ip, self.server, self.stop = name, ip, server, stop
        self.paused_file = paused
        self.http = session(netns)
        self.http.verify = str(creds / "ca.pem")
        self.http.cert = (str(creds / f"node-{name}.pem"), str(creds / f"node-{name}-key.pem"))

    def paused(self) -> bool:
        try:
            return self.name in self.paused_file.read_text().split()
        except OSError:
            return False

    def _call(self, method: str, path: str, body: Any = None, ctype: str = "application/json",
              **params: str) -> requests.Response:
        data = json.dumps(body) if body is not None else None
        return self.http.request(method, self.server + path, data=data, params=params, timeout=10,
                                 headers={"Content-Type": ctype})

    def report_node(self) -> None:
        now = _now()
        cond = [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "kubelet is posting ready status (meshctl lab reproduction)",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}]
        for t, reason in (("MemoryPressure", "KubeletHasSufficientMemory"),
                          ("DiskPressure", "KubeletHasNoDiskPressure"), ("PIDPressure", "KubeletHasSufficientPID")):
            cond.append({"type": t, "status": "False", "reason": reason, "lastHeartbeatTime": now,
                         "lastTransitionTime": now})
        body = {"status": {"conditions": cond, "addresses": [{"type": "InternalIP", "address": self.ip},
                                                              {"type": "Hostname", "address": self.name}]}}
        self._call("PATCH", f"/api/v1/nodes/{self.name}/status", body, "application/strategic-merge-patch+json")

    def renew_lease(self) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": _now(micro=True)}
        r = self._call("PATCH", path, {"spec": spec}, "application/merge-patch+json")
        if r.status_code == 404:
            node = self._call("GET", f"/api/v1/nodes/{self.name}").json()
            owner = {"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": node["metadata"]["uid"]}
            self._call("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                       {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": self.name, "ownerReferences": [owner]}, "spec": spec})

    def heartbeat(self) -> None:
        last_status = 0.0
        while not self.stop.is_set():
            if not self.paused():
                try:
                    if time.monotonic() - last_status >= STATUS_EVERY:
                        self.report_node()
                        last_status = time.monotonic()
                    self.renew_lease()
                except requests.RequestException as e:
                    log.warning("%s: heartbeat: %s", self.name, e)
            self.stop.wait(LEASE_EVERY)

    def pod_ip(self, pod: dict[str, Any]) -> str:
        if (pod.get("spec") or {}).get("hostNetwork"):
            return self.ip
        return str(((pod.get("metadata") or {}).get("annotations") or {}).get(POD_IP_ANNOTATION, ""))

    def sync_pod(self, pod: dict[str, Any]) -> None:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        if meta.get("deletionTimestamp"):
            self._call("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}",
                       {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                        "preconditions": {"uid": meta.get("uid")}})
            return
        ip = self.pod_ip(pod)
        ready = "False" if (meta.get("annotations") or {}).get(READY_ANNOTATION) == "false" else "True"
        now_ready = [c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"]
        if status.get("phase") == "Running" and now_ready == [ready] and (status.get("podIP") or "") == ip:
            return
        now = _now()
        kinds = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
        conds = [{"type": t, "status": ready if t in ("Ready", "ContainersReady") else "True",
                  "lastTransitionTime": now} for t in kinds]
        spec = pod.get("spec") or {}

        def running(c: dict[str, Any]) -> dict[str, Any]:
            return {"name": c.get("name", ""), "image": c.get("image", ""), "imageID": "", "ready": True,
                    "started": True, "restartCount": 0, "state": {"running": {"startedAt": now}}}

        def done(c: dict[str, Any]) -> dict[str, Any]:
            return {"name": c.get("name", ""), "image": c.get("image", ""), "imageID": "", "ready": False,
                    "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}

        # A native sidecar (an init container with restartPolicy Always) keeps running beside the
        # containers; any other init container has completed.
        inits = [running(c) if c.get("restartPolicy") == "Always" else done(c)
                 for c in spec.get("initContainers") or []]
        st: dict[str, Any] = {"phase": "Running", "conditions": conds, "hostIP": self.ip,
                              "hostIPs": [{"ip": self.ip}], "startTime": status.get("startTime") or now,
                              "containerStatuses": [running(c) for c in spec.get("containers") or []],
                              "initContainerStatuses": inits}
        if ip:
            st.update(podIP=ip, podIPs=[{"ip": ip}])
        self._call("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", {"status": st},
                   "application/strategic-merge-patch+json")

    def pods(self) -> None:
        sel = f"spec.nodeName={self.name}"
        while not self.stop.is_set():
            try:
                r = self._call("GET", "/api/v1/pods", fieldSelector=sel)
                listing = r.json()
                for pod in listing.get("items") or []:
                    self.sync_pod(pod)
                rv = listing["metadata"]["resourceVersion"]
                with self.http.get(self.server + "/api/v1/pods", stream=True, timeout=(10, 70),
                                   params={"fieldSelector": sel, "watch": "1", "resourceVersion": rv,
                                           "timeoutSeconds": "60", "allowWatchBookmarks": "true"}) as w:
                    for line in w.iter_lines():
                        if self.stop.is_set():
                            return
                        if not line:
                            continue
                        ev = json.loads(line)
                        if ev.get("type") in ("ADDED", "MODIFIED"):
                            self.sync_pod(ev["object"])
                        elif ev.get("type") == "ERROR":
                            break
            except (requests.RequestException, ValueError, KeyError) as e:
                log.warning("%s: pods: %s", self.name, e)
                self.stop.wait(1.0)


class Scheduler:
    """Binds unscheduled Pods (see the module docstring)."""

    def __init__(self, server: str, creds: Path, nodes: list[str], stop: threading.Event) -> None:
        self.server, self.nodes, self.stop = server, nodes, stop
        self.http = session(None)
        self.http.verify = str(creds / "ca.pem")
        self.http.cert = (str(creds / "scheduler.pem"), str(creds / "scheduler-key.pem"))

    def target(self, pod: dict[str, Any]) -> str | None:
        spec = pod.get("spec") or {}
        req = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
               .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
        for term in req.get("nodeSelectorTerms") or []:
            for f in term.get("matchFields") or []:
                if f.get("key") == "metadata.name" and f.get("operator") == "In" and f.get("values"):
                    return str(f["values"][0])
        return self.nodes[0] if self.nodes else None

    def bind(self, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        node = self.target(pod)
        if node is None or (pod.get("spec") or {}).get("nodeName") or meta.get("deletionTimestamp"):
            return
        ns, name = meta.get("namespace", ""), meta.get("name", "")
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": ns},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        r = self.http.post(f"{self.server}/api/v1/namespaces/{ns}/pods/{name}/binding", json=body, timeout=10)
        if r.status_code >= 400 and r.status_code != 409:
            log.warning("binding %s/%s to %s: %s %s", ns, name, node, r.status_code, r.text[:200])

    def run(self) -> None:
        sel = "spec.nodeName="
        while not self.stop.is_set():
            try:
                listing = self.http.get(self.server + "/api/v1/pods", params={"fieldSelector": sel}, timeout=10).json()
                for pod in listing.get("items") or []:
                    self.bind(pod)
                rv = listing["metadata"]["resourceVersion"]
                with self.http.get(self.server + "/api/v1/pods", stream=True, timeout=(10, 70),
                                   params={"fieldSelector": sel, "watch": "1", "resourceVersion": rv,
                                           "timeoutSeconds": "60"}) as w:
                    for line in w.iter_lines():
                        if self.stop.is_set():
                            return
                        if line:
                            ev = json.loads(line)
                            if ev.get("type") == "ADDED":
                                self.bind(ev["object"])
                            elif ev.get("type") == "ERROR":
                                break
            except (requests.RequestException, ValueError, KeyError) as e:
                log.warning("scheduler: %s", e)
                self.stop.wait(1.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m meshctl.lab.rigs.kubelets")
    ap.add_argument("--server", required=True, help="the API server's URL")
    ap.add_argument("--certs", required=True, type=Path, help="holds ca.pem and node-<name>.pem/-key.pem")
    ap.add_argument("--paused", required=True, type=Path, help="a file naming the nodes whose heartbeats stop")
    ap.add_argument("--netns", help="the network namespace the API server is reached from")
    ap.add_argument("nodes", nargs="+", help="NODE=IP")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    names = [spec.partition("=")[0] for spec in a.nodes]
    threads = [threading.Thread(target=Scheduler(a.server, a.certs, names, stop).run, name="scheduler", daemon=True)]
    threads[0].start()
    for spec in a.nodes:
        name, _, ip = spec.partition("=")
        k = Kubelet(name, ip, a.server, a.certs, a.paused, stop, a.netns)
        for fn in (k.heartbeat, k.pods):
            t = threading.Thread(target=fn, name=f"{name}-{fn.__name__}", daemon=True)
            t.start()
            threads.append(t)
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
