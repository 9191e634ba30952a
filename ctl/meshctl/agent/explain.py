# SPDX-License-Identifier: Apache-2.0
"""`meshctl explain SRC DST`: the path one packet takes from SRC to DST, hop by hop, read off the
agents' own state. A pure function of agent statuses (agent/status.py): the source node's agent
names the destination's record and the rung, the probes and the WireGuard peer it uses; each
further node's agent (where the caller could reach it) answers for its own hop.

Node names are as the source's agent writes them: a node of its own cluster by name, another
cluster's as `cluster/node`. `explain` returns which further agents would extend the answer
(`Explanation.wants`); the caller fetches those and calls again, so the core never dials.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from meshctl.agent.status import (
    JSON,
    AgentStatus,
    NodeRow,
    PeerRow,
    ProbeResult,
)
from meshctl.mesh import global_ranges
from meshctl.mesh.chooser import KIND_RUNGS, PairProbe, RungMove
from meshctl.mesh.model import ENCAP_RUNGS, PRIVATE_RUNGS, IPNetwork, Path
from meshctl.mesh.render import FastPathRow

MAX_HOPS = 4  # the longest chain: member -> leader -> relay -> leader -> member stops here
WIREGUARD_PATHS = (Path.WIREGUARD_PRIVATE, Path.TUNNEL, Path.RELAY)
# The rung of a hop whose node's agent was not asked (only its record is known).
UNKNOWN_RUNG: Literal["?"] = "?"
# The fast-path counter each action's packets move (datapath/layout.py COUNTERS).
COUNTER_OF: dict[str, str] = {"direct": "direct", "direct+ipip": "encap", "direct+vxlan": "encap",
                              "tunnel": "tunnel", "local": "local"}


@dataclass(frozen=True)
class PairEnd:
    """One end of the pair: as given, its pod address as the source's cluster sees it (None: a
    node was named), the node that owns it (as the source's agent names it), that node's cluster,
    where its record is from, and with global ranges (mesh.global_cidrs) the address's other form:
    the destination pod's own address in its cluster where the source's sees it at its image
    (`own_address`), the source pod's image as the destination's cluster sees it (`seen_as`)."""

    given: str
    address: str | None
    node: str
    cluster: str
    source: str
    own_address: str | None = None
    seen_as: str | None = None

    def to_json(self) -> JSON:
        return {"given": self.given, "address": self.address, "node": self.node, "cluster": self.cluster,
                "source": self.source, "own_address": self.own_address, "seen_as": self.seen_as}


@dataclass(frozen=True)
class KindProbe:
    """What one probe kind towards the next node showed: the rungs it tests, its verdict, smoothed
    and last RTT, probes lost in a row, and of this node's probes, how many were answered."""

    kind: str
    rungs: tuple[Path, ...]
    up: bool | None
    lost: int
    rtt_ms: float | None
    last_rtt_ms: float | None
    sent: int | None
    answered: int | None

    def to_json(self) -> JSON:
        return {"kind": self.kind, "rungs": list(self.rungs), "up": self.up, "lost": self.lost,
                "rtt_ms": self.rtt_ms, "last_rtt_ms": self.last_rtt_ms, "sent": self.sent, "answered": self.answered}


@dataclass(frozen=True)
class WireGuardHop:
    """The WireGuard peer a hop sends to: its name, endpoint (the live one when WireGuard knows
    it) and the last handshake's age (None: never)."""

    peer: str
    endpoint: str | None
    handshake_age_s: float | None

    def to_json(self) -> JSON:
        return {"peer": self.peer, "endpoint": self.endpoint, "handshake_age_s": self.handshake_age_s}


@dataclass(frozen=True)
class FastPathEnd:
    """A node's fast-path entry for the packet's destination, with the node's counter of that
    entry's action as (packets, bytes) (the maps count by action, not by entry)."""

    node: str
    mode: str | None
    entry: FastPathRow | None
    counter: str | None
    packets: int | None
    bytes: int | None

    def to_json(self) -> JSON:
        return {"node": self.node, "mode": self.mode, "entry": self.entry.to_json() if self.entry else None,
                "counter": self.counter, "packets": self.packets, "bytes": self.bytes}


@dataclass(frozen=True)
class Hop:
    """One node's step: where from and to, out of which interface, on which rung and why, the
    probes of the pair, its last rung moves, the WireGuard peer, the path MTU and the fast-path
    entry. `answered_by` is "agent" (that node's agent said) or "record" (only its record is known)."""

    node: str
    to: str
    interface: str | None
    rung: Path | Literal["?"]
    reason: str
    probes: tuple[KindProbe, ...] = ()
    moves: tuple[RungMove, ...] = ()
    wireguard: WireGuardHop | None = None
    mtu: int | None = None
    fastpath: FastPathEnd | None = None
    answered_by: str = "agent"

    def to_json(self) -> JSON:
        return {"node": self.node, "to": self.to, "interface": self.interface, "rung": self.rung,
                "reason": self.reason, "probes": [p.to_json() for p in self.probes],
                "moves": [m.to_json() for m in self.moves],
                "wireguard": self.wireguard.to_json() if self.wireguard else None, "mtu": self.mtu,
                "fastpath": self.fastpath.to_json() if self.fastpath else None, "answered_by": self.answered_by}


@dataclass(frozen=True)
class Explanation:
    """The answer: both ends, the hops, where the destination's record came from, the fast path
    where the packet arrives (None: that agent was not asked), the probe sent now, if any, and
    `no_path` (then `hops` is empty): why there is none. `wants`: agents that would say more."""

    src: PairEnd | None
    dst: PairEnd | None
    hops: tuple[Hop, ...] = ()
    record: str | None = None
    arrival: FastPathEnd | None = None
    probe: ProbeResult | None = None
    no_path: str | None = None
    wants: tuple[str, ...] = field(default=(), compare=False)

    def to_json(self) -> JSON:
        out: dict[str, Any] = {"src": self.src.to_json() if self.src else None,
                               "dst": self.dst.to_json() if self.dst else None,
                               "hops": [h.to_json() for h in self.hops], "record": self.record,
                               "arrival": self.arrival.to_json() if self.arrival else None,
                               "probe": self.probe.to_json() if self.probe else None, "no_path": self.no_path}
        return out


class NoPath(Exception):
    """The pair has no path; the message says why in one line."""


# --- names ---------------------------------------------------------------------------------------

def absolute(name: str, viewer_cluster: str) -> str:
    """`cluster/node` for a name as an agent of `viewer_cluster` writes it."""
    return name if "/" in name else f"{viewer_cluster}/{name}"


def relative(abs_name: str, viewer_cluster: str) -> str:
    """A `cluster/node` name as an agent of `viewer_cluster` writes it."""
    cluster, _, node = abs_name.partition("/")
    return node if cluster == viewer_cluster else abs_name


def cluster_of(st: AgentStatus) -> str:
    return st.summary.cluster if st.summary else ""


def rows_of(st: AgentStatus) -> tuple[NodeRow, ...]:
    if st.live.node_list is None:
        raise NoPath(f"the agent of {st.node} has no plan yet")
    return st.live.node_list


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def _global_cidrs(row: NodeRow) -> tuple[tuple[IPNetwork, IPNetwork], ...]:
    """The global ranges of a remote row's cluster (its pod CIDRs are their images), or ()."""
    ranges = row.dual.get("global_cidrs") or {}
    return tuple((ipaddress.ip_network(p), ipaddress.ip_network(g)) for p, g in ranges.items())


def _pod_address(text: str) -> tuple[str | None, ipaddress.IPv4Address | ipaddress.IPv6Address | None]:
    """`ADDRESS` (as the source's cluster sees it) or `CLUSTER/ADDRESS` (a pod's own address in
    its cluster): (the cluster or None, the address), or (None, None) for anything else."""
    cluster, _, addr = text.rpartition("/")
    ip = _address(addr)
    return (cluster or None, ip) if ip is not None else (None, None)


def resolve(st: AgentStatus, given: str, address: str | None = None) -> PairEnd:
    """The end `given` names (a pod address as the source's cluster sees it, a pod's own address
    in its cluster as `cluster/address`, or a node as `node` or `cluster/node`) as the agent `st`
    sees it; `address` is the pod address a lab pod's name stands for. Another cluster's pod with
    global ranges is named by either form (its image, or its own address), and the end holds both.
    NoPath when no node of its plan owns the address or has the name (naming a rejected or lapsed
    record when it is one)."""
    cluster, ip = _pod_address(address or given)
    rows = rows_of(st)
    if ip is not None:
        own = cluster_of(st)
        mine = [r for r in rows if cluster in (None, r.cluster) or (cluster == own and r.source == "local")]
        seen = ip
        if cluster not in (None, own) and mine:
            seen = global_ranges.dial_address(ip, _global_cidrs(mine[0]))  # the pod's image, as st's cluster sees it
        row = next((r for r in mine if any(seen in ipaddress.ip_network(c) for c in r.pod_cidrs)), None)
        if row is None:
            raise NoPath(f"no node of {st.node}'s plan owns {address or given} (it is in no pod CIDR)")
        mapping = _global_cidrs(row)
        own_form = global_ranges.local_address(seen, mapping) if mapping else None
        return PairEnd(given, str(seen), row.name, row.cluster, row.source,
                       str(own_form) if own_form is not None and own_form != seen else None)
    own = cluster_of(st)
    name = relative(given, own) if "/" in given else given
    row = next((r for r in rows if r.name == name), None)
    if row is None:
        raise NoPath(_missing(st, name))
    return PairEnd(given, None, row.name, row.cluster, row.source)


def _missing(st: AgentStatus, name: str) -> str:
    """Why `name` is not in the plan: its record was rejected (by which cluster), or is unknown."""
    s = st.summary
    rejected = {r.name: r.reason for r in (s.rejections if s else ())}
    for c in (s.remotes.clusters if s and s.remotes else ()):
        rejected.update({r.name if "/" in r.name else f"{c.name}/{r.name}": r.reason for r in c.rejections})
    if name in rejected:
        return f"{name}'s record is rejected: {rejected[name]}"
    return f"no node {name} in {st.node}'s plan (no record, or its lease lapsed and its grace ran out)"


# --- the hops ------------------------------------------------------------------------------------

def explain(src_st: AgentStatus, src_given: str, dst_given: str, others: Mapping[str, AgentStatus] = {},
            addresses: Mapping[str, str] = {}) -> Explanation:
    """The path from `src_given` to `dst_given` as the agent `src_st` (of the source's node) and
    the agents in `others` (by `cluster/node`) see it. `addresses`: pod addresses lab pod names
    stand for. Never raises for a pair without a path: `no_path` says why."""
    src = dst = None
    try:
        src = resolve(src_st, src_given, addresses.get(src_given))
        dst = resolve(src_st, dst_given, addresses.get(dst_given))
        if src.node != src_st.node:
            raise NoPath(f"{src_given} is on {src.node}, not {src_st.node}: {src.node}'s agent answers for it")
        dst_abs = absolute(dst.node, cluster_of(src_st))
        src = _seen_as(src_st, src, dst)
        _check_alive(src_st, dst.node)
        hops, wants, last = _walk(src_st, dst_abs, others)
    except NoPath as e:
        return Explanation(src, dst, no_path=str(e))
    arrival = _arrival(last, hops[-1].rung if hops else Path.LOCAL) if last is not None else None
    return Explanation(src, dst, tuple(hops), _record(src_st, dst), arrival, wants=tuple(wants))


def _seen_as(st: AgentStatus, src: PairEnd, dst: PairEnd) -> PairEnd:
    """`src` with the image the destination's cluster sees its pod at, when the pair crosses
    clusters and the source's has global ranges (what the receiver sees as the source)."""
    mapping = st.summary.mesh.global_cidrs if st.summary else ()
    if dst.source != "remote" or not mapping or src.address is None:
        return src
    image = global_ranges.dial_address(ipaddress.ip_address(src.address), mapping)
    return dataclasses.replace(src, seen_as=str(image)) if str(image) != src.address else src


def _check_alive(st: AgentStatus, node: str) -> None:
    lapsed = st.live.backend.lapsed or {}
    if node in lapsed:
        raise NoPath(f"{node}'s lease lapsed: its agent is away (its record is kept {lapsed[node]:.0f} s more)")


def _walk(st: AgentStatus, dst_abs: str, others: Mapping[str, AgentStatus]
          ) -> tuple[list[Hop], list[str], AgentStatus | None]:
    """The hops from `st`'s node to `dst_abs`, each answered by its node's agent while one is
    known; the agents that would say more; the destination's agent, if known."""
    hops: list[Hop] = []
    cur, cur_abs = st, absolute(st.node, cluster_of(st))
    for _ in range(MAX_HOPS):
        if cur_abs == dst_abs:
            return hops, [], cur
        hop, nxt_abs = _hop(cur, dst_abs)
        hops.append(hop)
        nxt = others.get(nxt_abs)
        if nxt is None:
            if nxt_abs != dst_abs:
                hops.append(_record_hop(st, nxt_abs, dst_abs))
            return hops, [nxt_abs], None
        cur, cur_abs = nxt, nxt_abs
    raise NoPath(f"more than {MAX_HOPS} hops to {relative(dst_abs, cluster_of(st))}: the agents disagree")


def _row(st: AgentStatus, name: str) -> NodeRow:
    row = next((r for r in rows_of(st) if r.name == name), None)
    if row is None:
        raise NoPath(_missing(st, name))
    return row


def _leader_for(st: AgentStatus, r: NodeRow) -> str | None:
    """The leader a member hands `r`'s traffic to: the node whose private address is the next hop
    of `r`'s fast-path entry (a location with several leaders deals other locations round them)."""
    hop = r.fastpath[0].nexthop if r.fastpath else None
    if hop is None or st.live.node_list is None:
        return None
    return next((n.name for n in st.live.node_list
                 if n.internal_ip is not None and n.internal_ip.split("/")[0] == hop), None)


def _leader_note(st: AgentStatus, location: str) -> str:
    """Why the location is led by others than the documented order names ("" when it is not)."""
    lead = st.summary.leaders if st.summary is not None else None
    for loc in lead.locations if lead is not None else ():
        if loc.get("location") == location and list(loc.get("leaders", ())) != list(loc.get("static", ())):
            return f" (in place of {','.join(loc.get('static', ()))}: {loc.get('reason')})"
    return ""


def _hop(st: AgentStatus, dst_abs: str) -> tuple[Hop, str]:
    """This node's step towards `dst_abs`, and the node it hands the packet to."""
    own, s = cluster_of(st), st.summary
    r = _row(st, relative(dst_abs, own))
    if r.path in (Path.NONE, Path.LOCAL) or s is None:
        raise NoPath(f"{st.node} has no path to {r.name}")
    private = s.interfaces.private if s.interfaces else None
    wg_dev = s.interfaces.wireguard if s.interfaces else None
    # A hop follows the destination's first pod CIDR (its record's first family): one rung and
    # one WireGuard peer carry all of a node's pod CIDRs (the plan gives a pair one rung).
    fp = _fastpath_end(st, r.fastpath[0] if r.fastpath else None)
    if r.path == Path.VIA_LEADER:
        location = _row(st, st.node).location or "-"
        leader = _leader_for(st, r) or s.leader
        why = f"{st.node} is a member of location {location}: its leader {leader} carries what leaves the " \
              f"location{_leader_note(st, location)}"
        return Hop(st.node, leader or "-", private, Path.DIRECT, why, mtu=_mtu(st, Path.DIRECT), fastpath=fp), \
            absolute(leader or "", own)
    peer = _wg_peer(st, r.pod_cidrs[0]) if r.path in WIREGUARD_PATHS and r.pod_cidrs else None
    nxt = absolute(peer.peer, own) if peer is not None else dst_abs
    pair = st.live.path_probe.pairs.get(r.name) if st.live.path_probe else None
    if r.path == Path.RELAY:
        why = f"relayed through {r.relay}: {r.relay_reason or 'no direct WireGuard'}"
        return Hop(st.node, relative(nxt, own), wg_dev, Path.RELAY, why, wireguard=peer, mtu=_mtu(st, Path.TUNNEL),
                   fastpath=fp), nxt
    hop = Hop(st.node, relative(nxt, own), private if r.path in PRIVATE_RUNGS and r.path != Path.WIREGUARD_PRIVATE
              else wg_dev, r.path, _why(st, _row(st, st.node), r, pair), _kind_probes(pair),
              pair.history if pair else (), peer, _mtu(st, r.path), fp)
    return hop, nxt


def _record_hop(st: AgentStatus, via_abs: str, dst_abs: str) -> Hop:
    """The hop of a node whose agent was not asked: only its record (the source's view) is known."""
    own = cluster_of(st)
    return Hop(relative(via_abs, own), relative(dst_abs, own), None, UNKNOWN_RUNG,
               f"{relative(via_abs, own)}'s agent was not reached: it forwards inside its location "
               "(ask its agent for the rest)", answered_by="record")


def _mtu(st: AgentStatus, rung: Path) -> int | None:
    mtus = st.summary.path_mtu if st.summary else None
    return mtus.get(rung) if mtus else None


def _fastpath_end(st: AgentStatus, entry: FastPathRow | None) -> FastPathEnd:
    dp = st.live.datapath
    counter = COUNTER_OF.get(entry.rung) if entry else None
    pkts, nbytes = dp.counters.get(counter, (None, None)) if counter else (None, None)
    return FastPathEnd(st.node, dp.mode, entry, counter, pkts, nbytes)


def _arrival(st: AgentStatus, rung: Path | Literal["?"]) -> FastPathEnd:
    """The destination node's own entry, with the counter its arriving packets move (decap for
    an encapsulated rung)."""
    own = next((r for r in rows_of(st) if r.name == st.node), None)
    end = _fastpath_end(st, own.fastpath[0] if own and own.fastpath else None)
    if rung in ENCAP_RUNGS:
        pkts, nbytes = st.live.datapath.counters.get("decap", (None, None))
        end = FastPathEnd(end.node, end.mode, end.entry, "decap", pkts, nbytes)
    return end


def _wg_peer(st: AgentStatus, pod_cidr: str) -> WireGuardHop | None:
    """The WireGuard peer whose allowed IPs carry `pod_cidr` (the most specific one)."""
    net = ipaddress.ip_network(pod_cidr)
    best: tuple[int, PeerRow] | None = None
    for p in st.live.peers:
        for a in p.allowed_ips:
            cover = ipaddress.ip_network(a, strict=False)
            inside = cover.version == net.version and cover.prefixlen <= net.prefixlen and net.network_address in cover
            if inside and (best is None or cover.prefixlen > best[0]):
                best = (cover.prefixlen, p)
    if best is None:
        return None
    p = best[1]
    return WireGuardHop(p.name, (p.live.live_endpoint if p.live else None) or p.endpoint,
                        p.live.handshake_age_s if p.live else None)


def _kind_probes(pair: PairProbe | None) -> tuple[KindProbe, ...]:
    if pair is None:
        return ()
    return tuple(KindProbe(k, tuple(r for r in KIND_RUNGS.get(k, ()) if r in pair.ladder), v.up, v.lost, v.rtt_ms,
                           v.last_rtt_ms, v.sent, v.answered) for k, v in pair.probes.items())


def _record(st: AgentStatus, dst: PairEnd) -> str:
    """Where the destination's record came from (this cluster's backend, or a remote etcd) and
    what it publishes."""
    s = st.summary
    origin = f"cluster {dst.cluster}'s {s.backend if s else '?'} backend"
    if dst.source == "remote" and s is not None and s.remotes is not None:
        c = next((c for c in s.remotes.clusters if c.name == dst.cluster), None)
        origin = f"cluster {dst.cluster}'s etcd {', '.join(c.endpoints) if c and c.endpoints else '?'}"
    r = _row(st, dst.node)
    return f"{dst.node}: record from {origin} (location {r.location or '-'}, internal {r.internal_ip or '-'}, " \
           f"endpoint {r.endpoint or '-'}, pod CIDRs {', '.join(r.pod_cidrs)})"


# --- why this rung -------------------------------------------------------------------------------

def joined(me: NodeRow, r: NodeRow, private_networks: tuple[Any, ...]) -> str | None:
    """What joins the two nodes' private addresses (mesh.model.private_joined, said in words), or
    None: nothing does."""
    if not me.internal_ip or not r.internal_ip:
        return None
    a, b = ipaddress.ip_interface(me.internal_ip), ipaddress.ip_interface(r.internal_ip)
    if a.version != b.version:
        return None
    if a.ip in b.network and b.ip in a.network:
        return f"same subnet {a.network}"
    if me.location and me.location == r.location and me.source == r.source == "local":
        return f"same location {me.location}"
    net = next((n for n in private_networks if n.version == a.version and a.ip in n and b.ip in n), None)
    return f"mesh.private_networks {net} holds both" if net is not None else None


def _probe_reason(pair: PairProbe, rung: Path) -> str:
    """What the probes did to the pair's rung: the last move and its reason, and on the tunnel
    whether every private probe kind is down."""
    said = "the cheapest rung whose probes answer"
    if pair.history:
        m = pair.history[-1]
        said = f"probes moved it {m.old or 'none'} -> {m.new}: {m.reason}"
    if rung == Path.TUNNEL and pair.probes and all(v.up is False for v in pair.probes.values()):
        said += " (every private probe kind is down)"
    return said


def _why(st: AgentStatus, me: NodeRow, r: NodeRow, pair: PairProbe | None) -> str:
    """Why node `me` reaches `r` on `r.path`: what joins them privately (or not), the fixed
    intra_subnet or the probes that chose the rung, and NAT."""
    s = st.summary
    assert s is not None
    mesh = s.mesh
    join = joined(me, r, mesh.private_networks)
    parts = [f"{r.name} is a node of cluster {r.cluster}"] if r.source == "remote" else []
    if join is None:
        parts.append("no private network joins them (not one subnet, not one location, not both in "
                     "mesh.private_networks)")
    elif mesh.granularity == "cross" and me.location != r.location:
        parts.append(f"{join}, but granularity cross keeps private rungs inside a location")
    else:
        parts.append(join)
    if mesh.intra_subnet != "auto":
        parts.append(f"intra_subnet {mesh.intra_subnet} is fixed")
    elif pair is not None:
        parts.append(_probe_reason(pair, r.path))
    ep = s.discovered_endpoints.get(r.name)
    if ep:
        parts.append(f"behind NAT: endpoint {ep} learned from its handshakes")
    if r.name in s.unreached_peers:
        parts.append("no handshake yet from its NAT")
    return "; ".join(parts)


# --- text ------------------------------------------------------------------------------------------

def _ms(v: float | None) -> str:
    return f"{v:.2f} ms" if v is not None else "-"


def _age(at: float | None, now: float) -> str:
    return f"{max(0.0, now - at):.1f} s ago" if at else "never"


def format_explanation(e: Explanation, now: float) -> str:
    """`meshctl explain` in lines: the pair, then each hop, the arrival, the record, the probe."""
    if e.no_path is not None:
        return f"no path: {e.no_path}"
    assert e.src is not None and e.dst is not None
    lines = [f"{_end(e.src)} -> {_end(e.dst)}: {len(e.hops)} hop(s)" if e.hops else
             f"{_end(e.src)} -> {_end(e.dst)}: the same node (local)"]
    for i, h in enumerate(e.hops, 1):
        lines += _hop_lines(i, h, now)
    if e.arrival is not None:
        lines.append("  arrives: " + _fp_text(e.arrival))
    if e.record:
        lines.append(f"  {e.record}")
    if e.probe is not None:
        lines.append(_probe_line(e.probe, e.hops[0].rung if e.hops else None))
    return "\n".join(lines)


def _probe_line(p: ProbeResult, chosen: Path | Literal["?"] | None) -> str:
    if p.error:
        return f"  probe now: {p.error}"
    what = f"{p.kind} on {p.rung}" + ("" if p.rung == chosen else
                                     f", the cheapest private rung: {chosen} itself is not probed")
    if p.answered:
        return f"  probe now ({what}): came back in {_ms(p.rtt_ms)}"
    return f"  probe now ({what}): LOST (no answer within {p.timeout_s:.1f} s)"


def _end(p: PairEnd) -> str:
    if p.own_address:
        return f"{p.node} ({p.address}, {p.own_address} in cluster {p.cluster})"
    if p.seen_as:
        return f"{p.node} ({p.address}, seen as {p.seen_as} by the other cluster)"
    return f"{p.node} ({p.address})" if p.address else p.node


def _fp_text(f: FastPathEnd) -> str:
    if f.mode != "ebpf":
        return f"fast path at {f.node}: {f.mode or 'off'} (kernel routes)"
    e = f.entry
    entry = "no entry" if e is None else f"{e.prefix} {e.rung}" + (f" via {e.nexthop}" if e.nexthop else "") + \
        (f" outer {e.outer_src}->{e.outer_dst}" if e.encap else "")
    count = f"; counter {f.counter} {f.packets} pkts/{f.bytes} B" if f.counter and f.packets is not None else ""
    return f"fast path at {f.node}: {entry}{count}"


def _hop_lines(i: int, h: Hop, now: float) -> list[str]:
    head = f"  hop {i}: {h.node} -> {h.to}" + (f" on {h.interface}" if h.interface else "") + f", rung {h.rung}"
    head += (f", path MTU {h.mtu}" if h.mtu else "") + (" (from its record only)" if h.answered_by == "record" else "")
    out = [head, f"    why: {h.reason}"]
    for p in h.probes:
        tally = f", {p.answered}/{p.sent} answered" if p.sent is not None else \
            ", none sent from here (the peer's probes are the evidence)" if p.up is not None else ""
        state = "up" if p.up else "DOWN" if p.up is False else "no verdict"
        out.append(f"    probe {p.kind} ({', '.join(p.rungs)}): {state}, rtt {_ms(p.rtt_ms)} "
                   f"(last {_ms(p.last_rtt_ms)}), lost {p.lost} in a row{tally}")
    for m in h.moves:
        out.append(f"    moved {m.old or 'none'} -> {m.new} {_age(m.at, now)}: {m.reason}")
    if h.wireguard is not None:
        w = h.wireguard
        hs = f"{w.handshake_age_s:.0f} s ago" if w.handshake_age_s is not None else "never"
        out.append(f"    wireguard peer {w.peer}, endpoint {w.endpoint or '-'}, handshake {hs}")
    if h.fastpath is not None:
        out.append("    " + _fp_text(h.fastpath))
    return out
