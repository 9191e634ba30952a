# SPDX-License-Identifier: Apache-2.0
"""`meshctl lab check`: a pod-to-pod ping matrix with the path each pair took, read from counters.

Pairs are pinged one at a time so counters move for one pair only, with pings of PING_BYTES read
in bytes (what a node's WireGuard sends its other peers meanwhile does not count). The path is what
the packets did, not what the plan says, named as the path ladder does: the source node's kilo0 TX rising
means "tunnel", "relay" when the WireGuard peer that carried the bytes is the relaying node the
source agent names for the destination (per-peer TX counters), or "wireguard-private" when its
WireGuard peer's endpoint is the destination's private address; its private NIC TX rising means
"direct", "direct+vxlan"/"direct+ipip" when the fast path's encap counter (or the kernel's VXLAN
device) rose too, or "via-leader" when its leader's kilo0 TX rose too. The source agent's
fast-path counters (datapath `direct`/`tunnel` actions) are reported next to it. A pair that lost
every ping is pinged once more, waiting longer, before it counts as down.

A lab with pods of both IP families (`lab.ip_families` with 6, or pod CIDRs of both) is checked
in each: every pair pings IPv4 pod to IPv4 pod and IPv6 pod to IPv6 pod, one row per family.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from meshctl import defaults
from meshctl.agent.server import fetch_status
from meshctl.agent.status import AgentStatus
from meshctl.errors import MeshError
from meshctl.lab.namespaces.state import ClusterState, LabState, NodeState
from meshctl.lab.rigs import netns
from meshctl.lab.rigs.waiting import agent_wait
from meshctl.mesh import global_ranges
from meshctl.mesh.fields import global_cidrs
from meshctl.mesh.model import ENCAP_RUNGS
from meshctl.mesh.model import Path as MeshPath
from meshctl.node.encap import VXLAN_DEV
from meshctl.node.wireguard.uapi import UapiClient

WG = defaults.WG_INTERFACE
CELL = 28  # "ok wireguard-private 0.08ms"
PING_WAIT = 1.0  # s a ping waits for its reply
# The check's pings carry this much payload, and the links' TX is read in bytes // PING_BYTES: a ping
# moves every link it crosses by one, while what WireGuard sends a node's other peers meanwhile (a
# keepalive is 32 bytes: `persistent_keepalive`, or the passive one 10 s after a peer's last data),
# an ARP or a handshake moves it by none. Read in packets, one keepalive in a pair's window made a
# direct pair "tunnel" (the 6.1 VM lab, where a window lasts seconds under TCG).
PING_BYTES = 1000
# A pair that lost every ping is waited for: one ping a second until one is answered, for up to
# PATIENT_S, and then measured again. A WireGuard session still being made can leave a pair silent
# that long: a first initiation lost, or two ends' initiations crossed while each was adding the
# other, waits for WireGuard's retry (REKEY_TIMEOUT, 5 s); an end whose session the other end
# dropped sends into it until its data has gone unanswered for KEEPALIVE_TIMEOUT + REKEY_TIMEOUT
# (15 s) and only then makes a new handshake. A pair that comes up costs only its wait.
PATIENT_S = 18  # whole seconds (ping's -w): 15 s, a retry's jitter and a round trip
RETRY_WAIT = 2.0  # s a ping of the measurement after the wait waits for its reply
# The source agent's counters after a pair's pings come from its next snapshot, which it builds
# within its fresh wait unless its loop is busy for longer (a pass in a loaded TCG guest): then it
# answers with the last one, from before the pings. A fast path that has counted none of them is
# asked again, at most this many times.
COUNTED_READS = 3
# What the counters say a pair's pings took: a Path (MeshPath.NONE: no ping came back), or
# `direct+encap` (encapsulated on the private NIC, the kind unknown) or `unknown` (no counter rose).
Measured = MeshPath | Literal["direct+encap", "unknown"]


class NodeRunner(Protocol):
    """Runs `argv` in namespace `ns` of a lab node's machine and never raises on exit status (a
    command killed at its timeout exits with node.shell.TIMED_OUT)."""

    def __call__(self, node: NodeState | None, ns: str | None, argv: list[str], timeout: float = 30
                 ) -> subprocess.CompletedProcess[str]: ...


def on_host(node: NodeState | None, ns: str | None, argv: list[str], timeout: float = 30
            ) -> subprocess.CompletedProcess[str]:
    """A NodeRunner for namespace labs: every node's namespace is on this host. A VM-per-node lab
    passes lab/vms/vmnodes.py's on_node instead (its nodes' namespaces are in their VMs)."""
    return netns.run(ns, argv, check=False, timeout=timeout)


def peer_tx(node: NodeState) -> dict[str, int]:
    """TX bytes per WireGuard peer (public key) of a lab node, from its wireguard-go socket (a VM
    node's is inside its guest: none here)."""
    if node.vm is not None:
        return {}
    try:
        st = UapiClient(Path(node.wg_run_dir) / f"{WG}.sock", timeout=2.0).get(allowed_ips=False)
    except MeshError:
        return {}
    return {k: p.tx_bytes for k, p in st.peers.items()}


def _carrier(before: dict[str, int], after: dict[str, int], status: AgentStatus | None) -> str | None:
    """The name of the peer whose TX bytes rose most between two readings."""
    deltas = {k: n - before.get(k, 0) for k, n in after.items()}
    if not deltas or max(deltas.values()) <= 0:
        return None
    key = max(deltas, key=lambda k: deltas[k])
    return next((p.name for p in (status.live.peers if status else ()) if p.public_key == key), None)


@dataclass
class PairResult:
    src: str
    dst: str
    ok: bool
    path: Measured
    rtt_ms: float | None
    sent: int = 0
    received: int = 0
    expected: MeshPath | None = None
    fastpath: dict[str, int] = field(default_factory=dict)
    family: int = 4  # of the pods' addresses pinged

    def public(self) -> dict[str, Any]:
        """The documented JSON form: {"src","dst","family","ok","path","rtt_ms"}."""
        return {"src": self.src, "dst": self.dst, "family": self.family, "ok": self.ok, "path": self.path,
                "rtt_ms": self.rtt_ms}


# How long a lab agent gets to answer /status: a VM node's longer, an emulated one's (a TCG guest
# on a busy host) longest (waiting.agent_wait). A pings' measurement without the source's fast-path
# counters cannot tell a direct pair from kilo0's own traffic: lab check reads them patiently.
HOST_STATUS_WAIT = 2.0
VM_STATUS_WAIT = 5.0


def status_wait(node: NodeState, host: float = HOST_STATUS_WAIT) -> float:
    if node.vm is None:
        return host
    return agent_wait(node.vm) or VM_STATUS_WAIT


def agent_status(node: NodeState, timeout: float | None = None, *, fresh: bool = False) -> dict[str, Any] | None:
    """A lab agent's /status, dialled from its namespace (a VM node's from its etcd's, on the
    public segment); None when it does not answer within `timeout` (None: `status_wait`).
    `fresh`: its counters as of the request (agent.server.fetch_status)."""
    try:
        return fetch_status(node.metrics_addr, node.dial_netns,
                            timeout=status_wait(node) if timeout is None else timeout, fresh=fresh)
    except MeshError:
        return None


def agent_view(node: NodeState, timeout: float | None = None) -> AgentStatus | None:
    """A lab agent's status, read (agent.status.AgentStatus); None when it does not answer."""
    doc = agent_status(node, timeout=timeout)
    return AgentStatus.from_json(doc) if doc is not None else None


def link_tx(node: NodeState, run: NodeRunner = on_host, what: str = "packets") -> dict[str, int]:
    """TX packets (or `what`="bytes") of every link of a lab node, by name (one reading of them all)."""
    p = run(node, node.netns, ["ip", "-j", "-s", "link", "show"])
    if p.returncode != 0:
        return {}
    out = {}
    with contextlib.suppress(ValueError):
        for link in json.loads(p.stdout):
            with contextlib.suppress(KeyError, TypeError):
                out[link["ifname"]] = int(link["stats64"]["tx"][what])
    return out


_RTT = re.compile(r"= [\d.]+/([\d.]+)/")
_RX = re.compile(r"(\d+) packets transmitted, (\d+) (?:packets )?received")


def ping(ns: str, dst: str, count: int = 5, interval: float = 0.02, wait: float = PING_WAIT, *,
         node: NodeState | None = None, run: NodeRunner = on_host, size: int | None = None,
         deadline: int | None = None) -> tuple[int, int, float | None]:
    """(sent, received, average RTT ms) of `count` pings (of `size` bytes of payload: ping's own
    default when None) from namespace `ns` (of `node`'s machine: its VM in a multi-VM lab).

    Once some replies came, ping waits only two round trips after its last ping: a reply delayed
    longer (a userspace WireGuard starved of CPU for a moment) counts as lost. With `deadline`, ping
    waits up to that many whole seconds (ping's `-w`) for every reply: late ones count, lost ones
    cost the wait."""
    sized = ["-s", str(size)] if size is not None else []
    until = ["-w", str(deadline)] if deadline is not None else []
    p = run(node, ns, ["ping", "-n", "-q", "-c", str(count), "-i", str(interval), "-W", str(wait), *until, *sized,
                       dst], timeout=max(count * interval + wait, deadline or 0) + 10)
    m = _RX.search(p.stdout)
    sent, recv = (int(m.group(1)), int(m.group(2))) if m else (count, 0)
    r = _RTT.search(p.stdout)
    return sent, recv, (float(r.group(1)) if r and recv else None)


def dial_address(src: ClusterState, dst: ClusterState, addr: str) -> str:
    """What a pod of cluster `src` dials to reach `addr`, a pod of cluster `dst`: its image in
    dst's global range (mesh.global_cidrs, docs/clustermesh.md) from another cluster, else itself."""
    mapping = dst.mesh.get("global_cidrs")
    if not addr or src is dst or not mapping:
        return addr
    return str(global_ranges.dial_address(ipaddress.ip_address(addr), global_cidrs(mapping, "global_cidrs")))


def _fp_packets(st: dict[str, Any] | None) -> dict[str, int]:
    if not st:
        return {}
    return {a: p for a, (p, _) in AgentStatus.from_json(st).live.datapath.counters.items()}


def check(st: LabState, *, count: int = 5, pairs: list[tuple[str, str]] | None = None,
          run: NodeRunner = on_host, families: tuple[int, ...] | None = None, retry: bool = True) -> list[PairResult]:
    """Ping every pod pair across nodes (first pod of each node) of every cluster of the lab, in
    each IP family of its pods (or of `families`): IPv4 rows first, then IPv6; a pair whose pods
    lack an address of a family has no row of it. `run` reaches the nodes' machines. A pair that
    loses every ping is waited for (one ping a second, up to PATIENT_S) and measured again once it
    answers, unless not `retry` (pairs expected to fail: the wait costs a pair that stays down
    PATIENT_S). A pair whose pings took another path than its agent planned is measured once more,
    against the plan read anew."""
    nodes = []
    multi = len(st.clusters) > 1
    for c in st.clusters:
        for n in c.nodes:
            label = f"{c.name}/{n.name}" if multi else n.name
            nodes.append((label, c, n))
    by_label = {lbl: (c, n) for lbl, c, n in nodes}
    todo = pairs if pairs is not None else [(a, b) for a, _, _ in nodes for b, _, _ in nodes if a != b]
    statuses: dict[str, AgentStatus | None] = {}
    lock = threading.Lock()

    def status_of(label: str) -> AgentStatus | None:
        with lock:
            if label not in statuses:
                statuses[label] = agent_view(by_label[label][1])
            return statuses[label]

    def target(src: str, dst: str, family: int) -> str:
        """What `src`'s pod dials to reach `dst`'s pod in `family`."""
        dc, dn = by_label[dst]
        return dial_address(by_label[src][0], dc, dn.pods[0].address(family) or "")

    def answers(src: str, dst: str, family: int) -> bool:
        """`src`'s pod reaches `dst`'s within PATIENT_S: one ping a second until one is answered."""
        sn = by_label[src][1]
        return ping(sn.pods[0].netns, target(src, dst, family), count=1, interval=1.0, wait=RETRY_WAIT,
                    node=sn, run=run, deadline=PATIENT_S)[1] > 0

    def measure(src: str, dst: str, family: int, wait: float, count: int = count, interval: float = 0.02
                ) -> PairResult:
        sc, sn = by_label[src]
        dc, dn = by_label[dst]
        s_st = status_of(src)
        summary = s_st.summary if s_st else None
        leader = summary.leader if summary else None
        # Only a pair that leaves its location can go through its leader: a pair of location mates
        # (the leader one of them) never does, whatever the leader's kilo0 carried meanwhile (its
        # forwarding probes, its other peers' traffic).
        mates = dc is sc and dn.location == sn.location
        leader_node = None if mates else next((n for n in sc.nodes if n.name == leader and n.name != sn.name), None)
        dst_key = f"{dc.name}/{dn.name}" if dc is not sc else dn.name
        expected = summary.paths.get(dst_key) if summary else None
        before = _tx(sn, leader_node, run)
        fp_before = _fp_packets(agent_status(sn, fresh=True))
        relay = summary.relays[dst_key].via if summary and dst_key in summary.relays else None
        tx_before = peer_tx(sn) if relay else {}
        sent, recv, rtt = ping(sn.pods[0].netns, target(src, dst, family), count=count, interval=interval, wait=wait,
                               node=sn, run=run, size=PING_BYTES)
        need = max(1, sent - 1)
        after = _tx(sn, leader_node, run)
        s_now, fp_after = _counted(sn, fp_before, need)
        view_now = AgentStatus.from_json(s_now) if s_now is not None else None
        delta = [(a - b) if a is not None and b is not None else 0 for a, b in zip(after, before, strict=True)]
        fp = {a: n - fp_before.get(a, 0) for a, n in fp_after.items() if n != fp_before.get(a, 0)}
        path = MeshPath.NONE if recv == 0 else _measured_path(
            delta, fp, need, expected,
            relayed=bool(relay and delta[0] >= need and _carrier(tx_before, peer_tx(sn), s_st) == relay),
            private_endpoint=_private_endpoint(view_now, dn))
        return PairResult(src, dst, recv > 0, path, rtt, sent, recv, expected, fp, family)

    def has(label: str, family: int) -> bool:
        n = by_label[label][1]
        return bool(n.pods) and n.pods[0].address(family) is not None

    out = []
    for family in families or tuple(st.pod_families):
        for src, dst in todo:
            if not (has(src, family) and has(dst, family)):
                continue
            r = measure(src, dst, family, PING_WAIT)
            if not r.ok and retry and answers(src, dst, family):
                # A pair's first packets over WireGuard wait for its session (PATIENT_S): it counts
                # as down only if it does not answer within that wait.
                r = measure(src, dst, family, RETRY_WAIT)
            if r.ok and r.expected is not None and r.path != r.expected:
                # The plan is read once per source, before its pairs: a rung that moved since (a
                # probe round lost on a loaded machine) is not a path taken against the plan. The
                # pair is measured again against its agent's plan of now; a mismatch that is
                # still there is reported.
                with lock:
                    statuses.pop(src, None)
                r = measure(src, dst, family, PING_WAIT)
            out.append(r)
    return out


def _counted(node: NodeState, before: dict[str, int], need: int) -> tuple[dict[str, Any] | None, dict[str, int]]:
    """The agent's status and fast-path counters once they count a pair's pings: every packet the
    pod sends passes the fast path, which counts it under some action, so counters that moved by
    fewer than `need` are a snapshot older than the pings (COUNTED_READS). Without a fast path
    (no counters) the first read is the answer."""
    for _ in range(COUNTED_READS):
        st = agent_status(node, fresh=True)
        fp = _fp_packets(st)
        if not before or sum(n - before.get(a, 0) for a, n in fp.items()) >= need:
            break
    return st, fp


def _tx(node: NodeState, leader: NodeState | None, run: NodeRunner) -> tuple[int | None, ...]:
    """TX of the links that tell the paths apart, in pings' worth (bytes // PING_BYTES): the node's
    kilo0, private NIC, its leader's kilo0 and the node's VXLAN device (None where a link does not exist)."""
    mine = link_tx(node, run, "bytes")
    theirs = link_tx(leader, run, "bytes") if leader else {}
    return tuple(None if b is None else b // PING_BYTES
                 for b in (mine.get(WG), mine.get("priv"), theirs.get(WG), mine.get(VXLAN_DEV)))


def _measured_path(delta: list[int], fp: dict[str, int], need: int, expected: MeshPath | None, *,
                   relayed: bool, private_endpoint: bool) -> Measured:
    """The path a pair's pings took, read off counters: `delta` the pings' worth sent meanwhile on
    (kilo0, the private NIC, the leader's kilo0, the VXLAN device), `fp` the fast path's
    counters that moved, `need` how many pings make a path; `expected` the rung the agent planned.
    kilo0 also carries what the node sends its other peers meanwhile: when the fast path says it
    sent the pings out of the private NIC itself (its `direct` counter, and the NIC's TX, rose by
    them), what kilo0 sent was not these pings."""
    sent_direct = fp.get("direct", 0) >= need and delta[1] >= need
    if delta[0] >= need and not sent_direct:
        if relayed:
            return MeshPath.RELAY
        return MeshPath.WIREGUARD_PRIVATE if private_endpoint else MeshPath.TUNNEL
    if delta[1] >= need and delta[2] >= need:
        return MeshPath.VIA_LEADER
    if delta[1] >= need and (fp.get("encap", 0) >= need or delta[3] >= need):
        # Encapsulated: by the fast path (its encap counter) or the kernel's VXLAN device.
        if expected is not None and expected in ENCAP_RUNGS:
            return expected
        return MeshPath.DIRECT_VXLAN if delta[3] >= need else "direct+encap"
    if delta[1] >= need:
        return MeshPath.DIRECT
    return "unknown"


def _private_endpoint(status: AgentStatus | None, dst: NodeState) -> bool:
    """The source's WireGuard peer for `dst` talks to dst's private address (wireguard-private)."""
    if not status or not dst.internal_ip:
        return False
    ip = dst.internal_ip.split("/")[0]
    for p in status.live.peers:
        if p.name == dst.name:
            host = str((p.live.live_endpoint if p.live else None) or p.endpoint or "").rsplit(":", 1)[0]
            return host.strip("[]") == ip
    return False


def format_matrix(results: list[PairResult]) -> str:
    """One matrix per IP family (headed `IPv4 pods`, `IPv6 pods`), then how many pairs answered."""
    lines: list[str] = []
    for family in sorted({r.family for r in results}):
        lines += [f"IPv{family} pods", *_matrix([r for r in results if r.family == family])]
    bad = [r for r in results if not r.ok]
    lines.append(f"{len(results) - len(bad)}/{len(results)} pairs reachable")
    return "\n".join(lines)


def _matrix(results: list[PairResult]) -> list[str]:
    names = sorted({r.src for r in results} | {r.dst for r in results})
    cell = {(r.src, r.dst): r for r in results}
    w = max(12, *(len(n) + 1 for n in names))
    lines = ["src \\ dst".ljust(w) + "".join(n.ljust(CELL) for n in names)]
    for s in names:
        row = s.ljust(w)
        for d in names:
            r = cell.get((s, d))
            if r is None:
                row += "-".ljust(CELL)
            else:
                txt = f"{'ok' if r.ok else 'FAIL'} {r.path} {r.rtt_ms:.2f}ms" if r.rtt_ms is not None else \
                    f"{'ok' if r.ok else 'FAIL'} {r.path}"
                row += txt.ljust(CELL)
        lines.append(row)
    return lines


def results_json(results: list[PairResult]) -> str:
    return json.dumps([r.public() for r in results], indent=1)



# --- leaders (docs/mesh.md, "Leaders that do not forward") -----------------------------------------


@dataclass(frozen=True)
class LeadersView:
    """Every agent's view at (about) one moment: per node, per location, the leaders it plans
    with; per node, its WireGuard peers' names and its counted leader moves per location."""

    leaders: dict[str, dict[str, tuple[str, ...]]]
    peers: dict[str, frozenset[str]]
    moves: dict[str, dict[str, int]]

    def agreed(self) -> dict[str, tuple[str, ...]] | None:
        """The leaders every agent plans with, when they all agree (None: some differ or did not answer)."""
        views = list(self.leaders.values())
        return views[0] if views and all(v == views[0] for v in views) else None

    def asymmetric(self) -> list[str]:
        """Pairs where one end has a WireGuard peer for the other and the other none for it."""
        return [f"{a} -> {b}" for a, names in sorted(self.peers.items()) for b in sorted(names)
                if b in self.peers and a not in self.peers[b]]


def leaders_view(st: LabState, timeout: float = 2.0) -> LeadersView:
    """Ask every agent at once (a node that does not answer is left out of `leaders`)."""
    nodes = [n for _, n in st.nodes()]
    got: dict[str, dict[str, Any] | None] = {}

    def ask(n: NodeState) -> None:
        got[n.name] = agent_status(n, timeout=timeout)

    threads = [threading.Thread(target=ask, args=(n,)) for n in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    leaders: dict[str, dict[str, tuple[str, ...]]] = {}
    peers: dict[str, frozenset[str]] = {}
    moves: dict[str, dict[str, int]] = {}
    for name, doc in got.items():
        lead = (doc or {}).get("leaders")
        if doc is None or not isinstance(lead, dict):
            continue
        leaders[name] = {str(loc.get("location")): tuple(loc.get("leaders", ())) for loc in lead.get("locations", ())}
        peers[name] = frozenset(str(p.get("name")) for p in doc.get("peers", ()))
        moves[name] = dict(lead.get("moves") or {})
    return LeadersView(leaders, peers, moves)
