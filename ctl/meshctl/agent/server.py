# SPDX-License-Identifier: Apache-2.0
"""The agent's HTTP face: Prometheus metrics on /metrics, /healthz and the /status JSON.

One registry per agent (registering a metric twice in the global one raises), and one custom
collector that reads the agent's status (agent.status.AgentStatus: the last pass's summary, the
live parts read on request), so a scrape never waits on the loop. Binds where --metrics-addr
says (127.0.0.1 by default), never 0.0.0.0 unless asked.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import parse_qs, quote, urlsplit

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from meshctl import defaults
from meshctl.agent.config import parse_addr
from meshctl.agent.status import (
    AgentStatus,
    DatapathStatus,
    LeadershipStatus,
    PassSummary,
    PeerRow,
    ProbeResult,
    RemotesStatus,
    RungChanges,
)
from meshctl.http_serving import HttpServer, QuietHandler
from meshctl.mesh.chooser import ProbeStatus
from meshctl.mesh.model import Path

log = logging.getLogger("meshctl.agent")


class StatusSource(Protocol):
    """The agent's status (agent.lifecycle.Agent.status); `node_list=False` leaves out the node
    list, which the metrics do not read and which at 50,000 nodes is 50,000 rows built anew for
    every new view and kept until the next."""

    def __call__(self, node_list: bool = True, fresh: bool = False) -> AgentStatus: ...


class StatusHttpServer(HttpServer):
    """The agent's `/status`, `/metrics` and probe API: a port an agent restarting moments ago
    held is taken again at once (reuse), unlike `meshctl ui`'s."""

    name = "meshctl agent"
    allow_reuse_address = True


class AgentCollector(Collector):
    """Turns the agent's status (agent.status.AgentStatus) into metric families."""

    def __init__(self, status: Callable[[], AgentStatus]) -> None:
        self._status = status

    def collect(self) -> Iterator[Any]:
        st = self._status()
        live, summary = st.live, st.summary
        yield from _plan_metrics(st)
        pif = GaugeMetricFamily("meshctl_pod_interfaces", "Pod interfaces found on this node, and those the fast "
                                "path is attached to", labels=["state"])
        pif.add_metric(["found"], len(live.pods.found))
        pif.add_metric(["fastpath"], len(live.pods.fastpath))
        yield pif
        yield from _pass_metrics(summary)
        yield from _datapath_metrics(live.datapath)
        yield from _peer_metrics(live.peers)
        own = live.backend.own_record
        if own is not None:
            r = CounterMetricFamily("meshctl_own_record_restored",
                                    "Times this agent put its record back after someone else deleted or changed it")
            r.add_metric([], own.restored_total)
            yield r
        if live.backend.lapsed is not None:
            yield GaugeMetricFamily("meshctl_lapsed_records",
                                    "Records kept through their lapse grace (their agents are away)",
                                    value=len(live.backend.lapsed))
        yield from _clustermesh_metrics(summary.remotes if summary else None)
        yield from _path_metrics(summary.paths if summary else {}, live.path_changes, live.path_probe)
        yield from _leader_metrics(summary.leaders if summary else None)


def _leader_metrics(lead: LeadershipStatus | None) -> Iterator[Any]:
    """Leader moves per location (every agent makes the same choice, so every agent counts the
    same moves), and 1 for each location whose leaders differ from the documented order's."""
    if lead is None:
        return
    moves = CounterMetricFamily("meshctl_leader_moves", "Times a location's leaders changed (mesh/leaders.py)",
                                labels=["location"])
    moved = GaugeMetricFamily("meshctl_leader_moved", "1 while a location is led by others than the "
                              "documented order names (its leader does not forward)", labels=["location"])
    for loc in lead.locations:
        name = str(loc.get("location") or loc.get("key", ""))
        moves.add_metric([name], lead.moves.get(name, 0))
        moved.add_metric([name], 1 if list(loc.get("leaders", ())) != list(loc.get("static", ())) else 0)
    yield moves
    yield moved


def _plan_metrics(st: AgentStatus) -> Iterator[Any]:
    """Nodes, peers, leadership, the backend, rejected records and routes of the plan in force."""
    s, g = st.summary, GaugeMetricFamily
    yield g("meshctl_nodes", "Nodes admitted into this agent's plan", value=s.nodes if s else 0)
    yield g("meshctl_peers", "WireGuard peers in the plan", value=len(st.live.peers))
    yield g("meshctl_leader", "1 if this node leads its segment", value=1 if s and s.is_leader else 0)
    yield g("meshctl_backend_ready", "1 if the backend is reachable and synced", value=1 if st.ready else 0)
    yield g("meshctl_rejected_records", "Records currently rejected (bad or conflicting)",
            value=len(s.rejections) if s else 0)
    yield g("meshctl_routes", "Routes this agent installs", value=s.routes if s else 0)


def _pass_metrics(s: PassSummary | None) -> Iterator[Any]:
    """Passes by result, failures by part of the agent, rejections seen."""
    c = CounterMetricFamily("meshctl_reconciles", "Reconcile passes", labels=["result"])
    c.add_metric(["ok"], s.reconcile.ok_total if s else 0)
    c.add_metric(["failed"], s.reconcile.failed_total if s else 0)
    yield c
    errs = CounterMetricFamily("meshctl_errors", "Failures by part of the agent", labels=["part"])
    for part, n in sorted((s.errors_total if s else {}).items()):
        errs.add_metric([part], n)
    yield errs
    rej = CounterMetricFamily("meshctl_rejections", "Rejections seen (counted once per record version)")
    rej.add_metric([], s.rejections_total if s else 0)
    yield rej


def _datapath_metrics(dp: DatapathStatus) -> Iterator[Any]:
    pk = CounterMetricFamily("meshctl_datapath_packets", "Fast-path packets by action", labels=["action"])
    by = CounterMetricFamily("meshctl_datapath_bytes", "Fast-path bytes by action", labels=["action"])
    for action, (p, b) in sorted(dp.counters.items()):
        pk.add_metric([action], p)
        by.add_metric([action], b)
    yield pk
    yield by
    mode = GaugeMetricFamily("meshctl_datapath_mode", "1 for the datapath mode in use", labels=["mode"])
    if dp.mode:
        mode.add_metric([dp.mode], 1)
    yield mode
    refused = CounterMetricFamily("meshctl_datapath_objects_refused",
                                  "Compiled objects refused for their map layout version")
    refused.add_metric([], dp.objects_refused or 0)
    yield refused
    if dp.route_cache_fills is not None:
        fills = CounterMetricFamily("meshctl_datapath_route_cache_fills",
                                    "Route cache misses: trie walks of from_pod that found an entry")
        fills.add_metric([], dp.route_cache_fills)
        yield fills


def _peer_metrics(peers: Sequence[PeerRow]) -> Iterator[Any]:
    rx = CounterMetricFamily("meshctl_wireguard_peer_receive_bytes", "Bytes received from a peer", labels=["peer"])
    tx = CounterMetricFamily("meshctl_wireguard_peer_transmit_bytes", "Bytes sent to a peer", labels=["peer"])
    hs = GaugeMetricFamily("meshctl_wireguard_peer_handshake_age_seconds",
                           "Seconds since the last handshake (-1: none)", labels=["peer"])
    now = time.time()
    for p in peers:
        live = p.live
        rx.add_metric([p.name], live.rx_bytes if live else 0)
        tx.add_metric([p.name], live.tx_bytes if live else 0)
        last = live.last_handshake if live else 0
        hs.add_metric([p.name], now - last if last else -1)
    yield rx
    yield tx
    yield hs


def _path_metrics(paths: Mapping[str, Path], changes: Sequence[RungChanges], probe: ProbeStatus | None
                  ) -> Iterator[Any]:
    """Pairs per rung of the path ladder, rung changes with their reason, probe RTTs."""
    pairs = GaugeMetricFamily("meshctl_path_pairs", "Other nodes reached on each rung of the path ladder",
                              labels=["rung"])
    counts: dict[Path, int] = {}
    for rung in paths.values():
        if rung != Path.LOCAL:
            counts[rung] = counts.get(rung, 0) + 1
    for rung, n in sorted(counts.items()):
        pairs.add_metric([rung], n)
    yield pairs
    fam = CounterMetricFamily("meshctl_path_changes", "Rung changes of a pair, by rungs and reason",
                              labels=["from", "to", "reason"])
    for c in changes:
        fam.add_metric([c.old, c.new, c.reason], c.count)
    yield fam
    rtt = GaugeMetricFamily("meshctl_path_probe_rtt_seconds", "Smoothed probe round-trip time per peer and kind",
                            labels=["peer", "kind"])
    up = GaugeMetricFamily("meshctl_path_probe_up", "1 if the probes of a kind reach the peer, 0 if not",
                           labels=["peer", "kind"])
    for peer, pair in sorted((probe.pairs if probe else {}).items()):
        for kind, h in sorted(pair.probes.items()):
            if h.rtt_ms is not None:
                rtt.add_metric([peer, kind], h.rtt_ms / 1000)
            if h.up is not None:
                up.add_metric([peer, kind], 1 if h.up else 0)
    yield rtt
    yield up


def _clustermesh_metrics(remotes: RemotesStatus | None) -> Iterator[Any]:
    """Per remote cluster: ready, nodes, rejected records, reconnects, last sync age."""
    if remotes is None or remotes.error is not None:
        return
    ready = GaugeMetricFamily("meshctl_clustermesh_remote_ready", "1 if the remote cluster is ready",
                              labels=["cluster"])
    nodes = GaugeMetricFamily("meshctl_clustermesh_remote_nodes", "Remote nodes in the plan", labels=["cluster"])
    rejected = GaugeMetricFamily("meshctl_clustermesh_remote_rejected_records",
                                 "Remote records rejected (unparsable or unsafe)", labels=["cluster"])
    reconnects = CounterMetricFamily("meshctl_clustermesh_remote_reconnects",
                                     "Times the remote etcd connection was lost", labels=["cluster"])
    age = GaugeMetricFamily("meshctl_clustermesh_remote_last_sync_age_seconds",
                            "Seconds since the remote view was last known current (-1: never)", labels=["cluster"])
    for c in remotes.clusters:
        ready.add_metric([c.name], 1 if c.ready else 0)
        nodes.add_metric([c.name], c.nodes)
        rejected.add_metric([c.name], c.rejected)
        reconnects.add_metric([c.name], c.reconnects)
        age.add_metric([c.name], -1 if c.last_sync_age is None else c.last_sync_age)
    yield from (ready, nodes, rejected, reconnects, age)


class StatusServer:
    """Serves /metrics, /healthz, /readyz and /status on `addr` in a daemon thread. /healthz says the
    loop is alive (liveness: restart when it is not); /readyz says a plan has been applied (readiness:
    a rolling update waits for it, so the next node's agent restarts only once this one carries
    traffic again). /probe?peer=NAME sends one probe to a peer on its rung now (`probe`; without
    it, 404) and answers agent.status.ProbeResult. /metrics reads the status without the node list
    (a scrape after each change would otherwise build and keep one row per node of the mesh)."""

    def __init__(self, addr: str, status: StatusSource, healthy: Callable[[], bool],
                 ready: Callable[[], bool] = lambda: True,
                 probe: Callable[[str], ProbeResult] | None = None) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(AgentCollector(lambda: status(node_list=False)))
        self.reconcile_seconds = Histogram(
            "meshctl_reconcile_duration_seconds", "Time of one reconcile pass", registry=self.registry,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
        )
        registry, status_fn = self.registry, status

        class Handler(QuietHandler):
            def do_GET(self) -> None:  # noqa: N802
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    self.send(200, generate_latest(registry), "text/plain; version=0.0.4")
                elif path == "/healthz":
                    ok = healthy()
                    self.send(200 if ok else 503, b"ok\n" if ok else b"unhealthy\n", "text/plain")
                elif path == "/readyz":
                    ok = ready()
                    self.send(200 if ok else 503, b"ready\n" if ok else b"no plan applied yet\n", "text/plain")
                elif path == "/status":
                    fresh = parse_qs(urlsplit(self.path).query).get("fresh", [""])[0] == "1"
                    self.send(200, json.dumps(status_fn(fresh=fresh).to_json(), default=str).encode(),
                              "application/json")
                elif path == "/probe" and probe is not None:
                    self._probe(probe)
                else:
                    self.send(404, b"not found\n", "text/plain")

            def _probe(self, fn: Callable[[str], ProbeResult]) -> None:
                peer = parse_qs(urlsplit(self.path).query).get("peer", [""])[0]
                if not peer:
                    self.send(400, json.dumps({"error": "peer: missing (/probe?peer=NAME)"}).encode(),
                               "application/json")
                    return
                self.send(200, json.dumps(fn(peer).to_json()).encode(), "application/json")

        host, port = parse_addr(addr, "--metrics-addr")
        self.httpd = StatusHttpServer((host, port), Handler)
        self.address = self.httpd.server_address
        self._thread = threading.Thread(target=self.httpd.serve_forever,
                                        name="status-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def answer_wait() -> float:
    """defaults.ANSWER_WAIT_S, or $MESHCTL_AGENT_WAIT where agents are known to answer slowly (a
    lab's commands run inside an emulated guest: lab/vms sets it there). InputError naming the
    variable when it is not a positive number of seconds."""
    from meshctl.errors import InputError

    raw = os.environ.get(defaults.ANSWER_WAIT_ENV)
    if raw is None:
        return defaults.ANSWER_WAIT_S
    try:
        wait = float(raw)
    except ValueError:
        wait = 0.0
    if not wait > 0:
        raise InputError(defaults.ANSWER_WAIT_ENV, raw, "is not a positive number of seconds")
    return wait


def fetch_status(addr: str, netns: str | None = None, timeout: float | None = None, *, fresh: bool = False
                 ) -> dict[str, Any]:
    """An agent's /status document over HTTP (dialled inside `netns` when given), as JSON;
    AgentStatus.from_json reads it. `timeout` None: answer_wait(). `fresh`: counters read after
    the request came (the agent waits up to snapshot.FRESH_WAIT_S for its loop), not the last
    pass's."""
    return _get_json(addr, "/status?fresh=1" if fresh else "/status", netns,
                     answer_wait() if timeout is None else timeout)


def fetch_probe(addr: str, peer: str, netns: str | None = None, timeout: float = 5.0) -> ProbeResult:
    """Ask the agent at `addr` to probe `peer` once now (/probe): what came back."""
    return ProbeResult.from_json(_get_json(addr, f"/probe?peer={quote(peer, safe='')}", netns, timeout))


def _get_json(addr: str, path: str, netns: str | None, timeout: float) -> dict[str, Any]:
    """A JSON document from an agent's HTTP face; MeshError (one line) when there is none."""
    import requests

    from meshctl.errors import MeshError
    from meshctl.etcd.nsconn import session

    try:
        with session(netns) as s:
            r = s.get(f"http://{addr}{path}", timeout=timeout)
            r.raise_for_status()
            out: dict[str, Any] = r.json()
            return out
    except requests.ConnectionError:
        raise MeshError(f"no meshctl agent answers at {addr}{f' in {netns}' if netns else ''} (is it running on "
                        f"this node? pass --addr for another address)") from None
    except requests.Timeout:
        raise MeshError(f"the meshctl agent at {addr} did not answer within {timeout:g} s") from None
    except (requests.RequestException, ValueError) as e:
        raise MeshError(f"no agent answer at {addr}{path}{f' in {netns}' if netns else ''}: {e}") from None
