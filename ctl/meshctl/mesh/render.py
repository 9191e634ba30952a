# SPDX-License-Identifier: Apache-2.0
"""Plans and topologies as people and programs read them: JSON, tables and wg-quick configs
(the graph's DOT: mesh.graph). Pure functions of the plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshctl.errors import InputError
from meshctl.mesh.model import (
    Endpoint,
    IPInterface,
    IPNetwork,
    KeyRef,
    Node,
    Path,
    Peer,
    Topology,
    path_of,
    sort_key_net,
)
from meshctl.mesh.plan import Encap, FamilyRungs, FastPathEntry, NodePlan, PeerPlan, Route
from meshctl.mesh.segments import Remote, Segment, segment_addresses, segments, static_leaders


def plan_to_json(p: NodePlan) -> dict[str, Any]:
    return {
        "node": p.node,
        "granularity": p.granularity,
        "leader": p.leader,
        # Every leader of the node's location when it has several (mesh.leaders_per_location).
        **({"leaders": list(p.leaders)} if p.leaders else {}),
        "wireguard_ip": str(p.wireguard_ip) if p.wireguard_ip else None,
        # Both families' addresses in a dual-stack mesh (mesh.subnet6); absent otherwise.
        **({"wireguard_ips": [str(a) for a in p.wireguard_ips]} if p.wireguard_ips else {}),
        "peers": [peer_json(x) for x in p.peers],
        "routes": [route_json(r) for r in p.routes],
        "fastpath": [fastpath_json(e) for e in p.fastpath],
        # The cluster's global ranges (mesh.global_cidrs); absent without them.
        **({"global_cidrs": {str(pod): str(glob) for pod, glob in p.global_cidrs}} if p.global_cidrs else {}),
    }


def peer_json(x: PeerPlan) -> dict[str, Any]:
    """One WireGuard peer of a plan as `plan -o json` prints it."""
    return {
        "name": x.name,
        "kind": x.kind,
        "public_key": x.public_key,
        "endpoint": x.endpoint,
        "allowed_ips": [str(a) for a in x.allowed_ips],
        "persistent_keepalive": x.persistent_keepalive,
        **({"preshared_key": str(x.preshared_key)} if x.preshared_key else {}),
    }


def route_json(r: Route) -> dict[str, Any]:
    return {"dst": str(r.dst), "via": str(r.via) if r.via else None, "dev": r.dev}


def fastpath_json(e: FastPathEntry) -> dict[str, Any]:
    return {"prefix": str(e.prefix), "action": e.action, "nexthop": str(e.nexthop) if e.nexthop else None,
            **_encap_json(e.encap), **({"translate": True} if e.translate else {})}


def _encap_json(e: Encap | None) -> dict[str, Any]:
    """The encapsulation keys of a fast-path entry: none for a raw entry, whose JSON is its
    prefix, action and next hop only."""
    if e is None:
        return {}
    return {"encap": e.kind, "outer_src": str(e.local), "outer_dst": str(e.remote)}


def encap_text(e: Encap | None) -> str | None:
    return f"{e.kind} {e.local}->{e.remote}" if e is not None else None


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A plain aligned table (no colours: it goes to logs and pipes as often as to terminals)."""
    cells = [[str(h) for h in header]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def joined(items: Sequence[object]) -> str | None:
    """Addresses of both families as one cell (`10.0.0.4/24,fd10::4/64`), None for none."""
    return ",".join(map(str, items)) or None


def path_text(path: str, families: Sequence[tuple[int, str]] | None) -> str:
    """A pair's path as tables show it: its rung, or each family's when they differ
    (`IPv4 wireguard-private, IPv6 direct`)."""
    return ", ".join(f"IPv{f} {rung}" for f, rung in families) if families else path


def plan_to_table(p: NodePlan) -> str:
    wg = joined(p.wireguard_ips or ([p.wireguard_ip] if p.wireguard_ip else [])) or "- (not a leader)"
    out = [f"node {p.node}  granularity {p.granularity}  leader {p.leader}  wireguard {wg}", ""]
    out.append(f"PEERS ({len(p.peers)})")
    out.append(table([(x.name, x.kind, x.endpoint, ",".join(map(str, x.allowed_ips)), x.persistent_keepalive or None)
                      for x in p.peers], ["NAME", "KIND", "ENDPOINT", "ALLOWED IPS", "KEEPALIVE"]))
    out += ["", f"ROUTES ({len(p.routes)})"]
    out.append(table([(r.dst, r.via, r.dev) for r in p.routes], ["DST", "VIA", "DEV"]))
    out += ["", f"FAST PATH ({len(p.fastpath)})"]
    out.append(table([(e.prefix, e.action, e.nexthop, encap_text(e.encap)) for e in p.fastpath],
                     ["PREFIX", "ACTION", "NEXT HOP", "ENCAP"]))
    if p.global_cidrs:  # what leaves the cluster from a pod range carries its image in the global range
        out += ["", "GLOBAL RANGES (sources to other clusters translated; fast-path entries of other clusters: "
                f"{sum(1 for e in p.fastpath if e.translate)})"]
        out.append(table(list(p.global_cidrs), ["POD RANGE", "GLOBAL RANGE"]))
    if p.paths:
        out += ["", "PATHS"]
        out.append(table([(name, path_text(path, p.family_paths.get(name))) for name, path in sorted(p.paths.items())],
                         ["NODE", "PATH"]))
    return "\n".join(out)


PRIVATE_KEY_PLACEHOLDER = "# PrivateKey = <kept on the node, never printed>"
# The formats of `meshctl showconf -o`: `wireguard` is what `wg setconf` reads (Kilo's kgctl
# default); `wg-quick` adds the Address lines wg-quick wants; json and yaml are for programs.
SHOWCONF_FORMATS: tuple[str, ...] = ("wireguard", "wg-quick", "json", "yaml")


@dataclass(frozen=True)
class WgPeer:
    """One [Peer] section. `preshared_key` is where the key comes from (a Secret reference), never
    the key: showconf prints configs people paste and pipe."""

    name: str
    public_key: str
    endpoint: Endpoint | None
    allowed_ips: tuple[IPNetwork, ...]
    persistent_keepalive: int | None = None
    preshared_key: KeyRef | None = None
    # Only in the config a peer itself uses (showconf peer): the key read from `preshared_key`
    # where the shell could read it, else why not and where it is. Never in a repr or a log.
    preshared_key_value: str | None = field(default=None, repr=False)
    preshared_key_note: str | None = None


# Why a peer's config leaves a node out (showconf peer).
NO_REACHABLE_ENDPOINT = "no endpoint the peer can reach"


@dataclass(frozen=True)
class WgConf:
    """A whole WireGuard config without its private key: [Interface] and its peers; `left_out`:
    the nodes it has no [Peer] for, because neither end could start a handshake."""

    listen_port: int | None
    addresses: tuple[IPInterface | IPNetwork, ...]
    peers: tuple[WgPeer, ...]
    note: str | None = None
    left_out: tuple[str, ...] = ()


def _endpoint_of(text: str | None) -> Endpoint | None:
    if not text:
        return None
    host, _, port = text.rpartition(":")
    return Endpoint(host.strip("[]"), int(port))


def node_conf(topo: Topology, plan: NodePlan) -> WgConf:
    """The config of node `plan.node`'s WireGuard device, from its plan."""
    peers = tuple(WgPeer(p.name, p.public_key, _endpoint_of(p.endpoint), p.allowed_ips, p.persistent_keepalive or None,
                         p.preshared_key) for p in plan.peers)
    note = None if plan.wireguard_ip is not None else \
        f"{plan.node} is not a segment leader: it reaches the mesh through {plan.leader}"
    return WgConf(topo.mesh.port, plan.device_addresses, peers, note)


def _segment_peer(s: Segment, keepalive: int | None, extra: Sequence[IPNetwork] = (),
                  psk: KeyRef | None = None) -> WgPeer:
    addrs = [*segment_addresses(s.members, s, None), *extra]
    return WgPeer(s.peer_name, s.leader.public_key, s.leader.endpoint, tuple(sorted(set(addrs), key=sort_key_net)),
                  keepalive, psk)


def _peer_of(topo: Topology, name: str) -> Peer:
    peer = next((p for p in topo.peers if p.name == name), None)
    if peer is None:
        raise InputError("peer", name, "is not a peer of the topology")
    return peer


def peer_conf(topo: Topology, name: str) -> WgConf:
    """The config a non-node peer uses to join the mesh: one [Peer] per segment leader, carrying
    that segment's addresses and the peer's pre-shared key reference (Kilo's `kgctl showconf
    peer`). A segment whose leader has no endpoint is left out when the peer has none either:
    neither end could ever start the handshake (its nodes are named in `left_out`)."""
    peer = _peer_of(topo, name)
    kept, left_out = [], []
    for s in segments(topo):
        if s.leader.endpoint is None and peer.endpoint is None:
            left_out += [m.name for m in s.members]
        else:
            kept.append(_segment_peer(s, peer.persistent_keepalive, psk=peer.preshared_key))
    return WgConf(None, peer.allowed_ips, tuple(kept), left_out=tuple(left_out))


def node_as_peer(topo: Topology, name: str, extra: Sequence[IPNetwork] = ()) -> WgPeer:
    """Node `name` as other WireGuard devices (another cluster, a laptop) must know it: its
    segment's leader key and endpoint, the segment's addresses plus `extra` (Kilo's `--as-peer`
    with `--allowed-ips`). For a member that does not lead, that is its leader's segment."""
    s = next(s for s in segments(topo) if any(m.name == name for m in s.members))
    return _segment_peer(s, s.leader.persistent_keepalive or None, extra)


def peer_as_peer(topo: Topology, name: str, extra: Sequence[IPNetwork] = ()) -> WgPeer:
    """Peer `name` as the mesh's nodes know it."""
    p = _peer_of(topo, name)
    allowed = tuple(sorted(set(p.allowed_ips) | set(extra), key=sort_key_net))
    return WgPeer(p.name, p.public_key, p.endpoint, allowed, p.persistent_keepalive, p.preshared_key)


def _peer_lines(p: WgPeer) -> list[str]:
    out = ["[Peer]", f"# {p.name}", f"PublicKey = {p.public_key}"]
    if p.preshared_key_value is not None:
        out.append(f"PresharedKey = {p.preshared_key_value}")
    elif p.preshared_key_note is not None:
        out.append(f"# PresharedKey: {p.preshared_key_note}")
    elif p.preshared_key:
        out.append(f"# PresharedKey = <from {p.preshared_key}, never printed>")
    if p.endpoint is not None:
        out.append(f"Endpoint = {p.endpoint}")
    if p.allowed_ips:  # none: a standby peer (it carries nothing); `wg setconf` wants no empty line
        out.append(f"AllowedIPs = {', '.join(map(str, p.allowed_ips))}")
    if p.persistent_keepalive:
        out.append(f"PersistentKeepalive = {p.persistent_keepalive}")
    return out


def conf_text(conf: WgConf, fmt: str) -> str:
    """`wireguard` (what `wg setconf` accepts: the addresses are comments) or `wg-quick`."""
    out = ["[Interface]", PRIVATE_KEY_PLACEHOLDER]
    if conf.listen_port:
        out.append(f"ListenPort = {conf.listen_port}")
    if conf.addresses:
        out.append(f"{'' if fmt == 'wg-quick' else '# '}Address = {', '.join(map(str, conf.addresses))}")
    if conf.note:
        out.append(f"# Note: {conf.note}")
    out += [f"# left out: {n} ({NO_REACHABLE_ENDPOINT})" for n in conf.left_out]
    for p in conf.peers:
        out += ["", *_peer_lines(p)]
    return "\n".join(out) + "\n"


def peer_text(p: WgPeer) -> str:
    return "\n".join(_peer_lines(p)) + "\n"


def _peer_dict(p: WgPeer) -> dict[str, Any]:
    """A [Peer] for programs: the pre-shared key itself only where it was read, else where it is."""
    psk: dict[str, Any] = {}
    if p.preshared_key_value is not None:
        psk = {"preshared_key": p.preshared_key_value}
    elif p.preshared_key is not None:
        psk = {"preshared_key_from": str(p.preshared_key),
               **({"preshared_key_note": p.preshared_key_note} if p.preshared_key_note else {})}
    return {"name": p.name, "public_key": p.public_key, "endpoint": str(p.endpoint) if p.endpoint else None,
            "allowed_ips": [str(a) for a in p.allowed_ips], "persistent_keepalive": p.persistent_keepalive or 0,
            **psk}


def conf_dict(conf: WgConf) -> dict[str, Any]:
    left_out = [{"name": n, "reason": NO_REACHABLE_ENDPOINT} for n in conf.left_out]
    return {"interface": {"listen_port": conf.listen_port, "addresses": [str(a) for a in conf.addresses],
                          **({"note": conf.note} if conf.note else {})},
            "peers": [_peer_dict(p) for p in conf.peers], **({"left_out": left_out} if left_out else {})}


def peer_resource(p: WgPeer, api_version: str, name: str | None = None) -> dict[str, Any]:
    """A Peer object (meshctl.io or kilo.squat.ai v1alpha1) another cluster can apply."""
    spec: dict[str, Any] = {"allowedIPs": [str(a) for a in p.allowed_ips], "publicKey": p.public_key}
    if p.endpoint is not None:
        host = "ip" if p.endpoint.ip is not None else "dns"
        spec["endpoint"] = {"dnsOrIP": {host: p.endpoint.host}, "port": p.endpoint.port}
    if p.persistent_keepalive:
        spec["persistentKeepalive"] = p.persistent_keepalive
    if p.preshared_key is not None and p.preshared_key.source == "secret":
        spec["presharedKey"] = {"secretKeyRef": {"name": p.preshared_key.name, "key": p.preshared_key.key}}
    return {"apiVersion": api_version, "kind": "Peer", "metadata": {"name": name or p.name}, "spec": spec}


# The keys a node row gains beyond its one-address fields: a dual-stack node's (dual_keys), and the
# global ranges of a remote node's cluster (mesh.global_cidrs, {pod range: global range}: its pod
# CIDRs in the row are their images, `explain` gives both forms of an address).
JSON = dict[str, Any]

DUAL_KEYS = ("internal_ips", "endpoints", "wireguard_ips", "family_paths", "global_cidrs")


def dual_keys(internal_ips: Sequence[object], endpoints: Sequence[object], wireguard_ips: Sequence[object],
              family_paths: FamilyRungs | None) -> dict[str, Any]:
    """A node row's keys of a dual-stack node, each only where it holds more than the one-address
    key beside it says (`internal_ip` etc. keep the first address: readers of one address go on):
    `internal_ips`, `endpoints`, `wireguard_ips` (lists) and `family_paths` ({"IPv4": rung, ...})."""
    out: dict[str, Any] = {k: [str(x) for x in v] for k, v in zip(DUAL_KEYS, (internal_ips, endpoints, wireguard_ips),
                                                                   strict=False) if len(v) > 1}
    if family_paths:
        out[DUAL_KEYS[3]] = {f"IPv{f}": rung for f, rung in family_paths}
    return out


def node_list(topo: Topology, remotes: Sequence[Remote], plan: NodePlan, *, fastpath: bool = False
              ) -> list[NodeRow]:
    """`meshctl node list` from one node's point of view: every local and remote node, its
    addresses, its segment's WireGuard address (leaders only) and the path this node takes to it
    (with the relaying node and why, for path `relay`); with `fastpath`, the plan's fast-path
    entries for its pod CIDRs (the agent's node list)."""
    rows: list[NodeRow] = []
    relays, paths, none = plan.relays, plan.paths, Path.NONE
    entries = fastpath_rows(plan.fastpath) if fastpath else {}

    def add(nodes: Sequence[Node], segs: Sequence[Segment], source: str, cluster: str, count: int,
            global_cidrs: Sequence[tuple[IPNetwork, IPNetwork]] = ()) -> None:
        wg = {leader.name: s.addresses for s in segs for leader in s.all_leaders}
        leads = lead_roles(segs, count)
        ranges = {DUAL_KEYS[4]: {str(p): str(g) for p, g in global_cidrs}} if global_cidrs else {}
        for n in nodes:
            wgs = wg.get(n.name, ())
            pods = tuple(str(c) for c in n.pod_cidrs)
            q = n.qualified_name
            rows.append(NodeRow(
                q, cluster, source, n.location, str(n.internal_ip) if n.internal_ip else None,
                str(n.endpoint) if n.endpoint else None, pods, str(wgs[0]) if wgs else None, paths.get(q, none),
                relays[q][0] if q in relays else None, relays[q][1] if q in relays else None,
                tuple(entries[c] for c in pods if c in entries),
                {**dual_keys(n.internal_ips, n.endpoints, wgs, plan.family_paths.get(q)), **ranges}, leads.get(n.name)))

    add(topo.nodes, segments(topo), "local", topo.cluster.name, _per_location(topo))
    for r in remotes:
        add(r.nodes, r.segments or segments(r.topology), "remote", r.topology.cluster.name, _per_location(r.topology),
            r.topology.mesh.global_cidrs)
    rows.sort(key=lambda r: (r.source != "local", r.name))
    return rows


def _per_location(topo: Topology) -> int:
    return topo.mesh.leaders_per_location if topo.mesh.granularity == "location" else 1


def lead_roles(segs: Sequence[Segment], count: int) -> dict[str, str]:
    """Who leads a location of several members, by node name: `leads`, `leads (for a1)` when it
    leads in place of a node the documented order names, `out (does not forward)` for that node."""
    out: dict[str, str] = {}
    for s in segs:
        if len(s.members) < 2 or not s.key.startswith("location:"):
            continue
        chosen = [n.name for n in s.all_leaders]
        replaced = [n.name for n in static_leaders(s.members, count) if n.name not in chosen]
        for name in chosen:
            out[name] = f"leads (for {','.join(replaced)})" if replaced and name not in \
                {n.name for n in static_leaders(s.members, count)} else "leads"
        for name in replaced:
            out[name] = "out (does not forward)"
    return out


def node_rows(topo: Topology, remotes: Sequence[Remote], plan: NodePlan) -> list[dict[str, Any]]:
    """`node_list` as JSON rows (`meshctl node list --lab`)."""
    return [r.to_json() for r in node_list(topo, remotes, plan)]


def fastpath_rows(entries: Sequence[FastPathEntry]) -> dict[str, FastPathRow]:
    """A plan's fast-path entries by pod CIDR, as the node list carries them."""
    return {str(e.prefix): FastPathRow(str(e.prefix), e.action, str(e.nexthop) if e.nexthop else None,
                                       e.encap.kind if e.encap else None, str(e.encap.local) if e.encap else None,
                                       str(e.encap.remote) if e.encap else None) for e in entries}


@dataclass(frozen=True)
class FastPathRow:
    """The fast-path entry this node's plan holds for a node's pod CIDR: its action, private next
    hop, and the encapsulation with its outer addresses (None for a raw entry)."""

    prefix: str
    action: str
    nexthop: str | None
    encap: str | None = None
    outer_src: str | None = None
    outer_dst: str | None = None

    @property
    def rung(self) -> str:
        return self.action if self.encap is None else f"{self.action}+{self.encap}"

    def to_json(self) -> JSON:
        return {"prefix": self.prefix, "action": self.action, "nexthop": self.nexthop, "encap": self.encap,
                "outer_src": self.outer_src, "outer_dst": self.outer_dst}

    @classmethod
    def from_json(cls, d: JSON) -> FastPathRow:
        return cls(str(d.get("prefix", "")), str(d.get("action", "")), d.get("nexthop"), d.get("encap"),
                   d.get("outer_src"), d.get("outer_dst"))


@dataclass(frozen=True)
class NodeRow:
    """`meshctl node list` from this node: a local or remote node, its addresses, its segment's
    WireGuard address (leaders only), the path this node takes to it, the relay, if any, and the
    fast-path entries for its pod CIDRs (one per CIDR the plan has an entry for; empty, the key
    absent: the plan has none)."""

    name: str
    cluster: str
    source: str
    location: str
    internal_ip: str | None
    endpoint: str | None
    pod_cidrs: tuple[str, ...]
    wireguard_ip: str | None
    path: Path
    relay: str | None
    relay_reason: str | None
    fastpath: tuple[FastPathRow, ...] = ()
    # A dual-stack node's every address and each family's rung (render.dual_keys): absent for one;
    # a remote node's cluster's global ranges (DUAL_KEYS' `global_cidrs`): absent without.
    dual: dict[str, Any] = field(default_factory=dict, compare=False)
    # A member of a location of several: whether it leads (lead_roles); absent otherwise.
    lead: str | None = None

    def to_json(self) -> JSON:
        out: JSON = {"name": self.name, "cluster": self.cluster, "source": self.source, "location": self.location,
                     "internal_ip": self.internal_ip, "endpoint": self.endpoint,
                     "pod_cidrs": list(self.pod_cidrs),
                     "wireguard_ip": self.wireguard_ip, "path": self.path, "relay": self.relay,
                     "relay_reason": self.relay_reason, **self.dual}
        if self.fastpath:
            out["fastpath"] = [e.to_json() for e in self.fastpath]
        if self.lead is not None:
            out["lead"] = self.lead
        return out

    @classmethod
    def from_json(cls, d: JSON, fastpath_of: Mapping[str, FastPathRow] | None = None) -> NodeRow:
        """The row `d` (render.node_rows' or a served one); with `fastpath_of` (the plan's
        entries by pod CIDR, fastpath_rows), its fast-path entries are those of its pod
        CIDRs there, not `d`'s."""
        # An agent that predates pod_cidrs wrote one `pod_cidr` and one fast-path entry.
        pods = tuple(str(c) for c in d.get("pod_cidrs", [d["pod_cidr"]] if d.get("pod_cidr") else []))
        if fastpath_of is not None:
            fastpath = tuple(fastpath_of[c] for c in pods if c in fastpath_of)
        else:
            fp = d.get("fastpath")
            entries = [fp] if isinstance(fp, dict) else fp if isinstance(fp, list) else []
            fastpath = tuple(FastPathRow.from_json(e) for e in entries if isinstance(e, dict))
        return cls(str(d.get("name", "")), str(d.get("cluster", "")), str(d.get("source", "")),
                   str(d.get("location") or ""), d.get("internal_ip"), d.get("endpoint"), pods,
                   d.get("wireguard_ip"), path_of(d.get("path", Path.NONE), f"node {d.get('name')}: path"),
                   d.get("relay"), d.get("relay_reason"),
                   fastpath, {k: d[k] for k in DUAL_KEYS if k in d}, d.get("lead"))




def node_rows_table(rows: Sequence[dict[str, Any]]) -> str:
    return table([(r["name"], r["source"], r["location"] or None, joined(r.get("internal_ips") or [])
                   or r["internal_ip"], ",".join(r["pod_cidrs"]),
                   joined(r.get("wireguard_ips") or []) or r["wireguard_ip"],
                   path_text(r["path"], [(int(f.removeprefix("IPv")), rung)
                                         for f, rung in r.get("family_paths", {}).items()]),
                   r.get("relay"), r.get("lead")) for r in rows],
                 ["NAME", "SOURCE", "LOCATION", "INTERNAL", "POD CIDRS", "WIREGUARD", "PATH", "RELAY", "LEAD"])
