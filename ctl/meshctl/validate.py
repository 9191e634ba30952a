"""Field parsers and record checks shared by every input: topology files, etcd records, Kubernetes
annotations and remote clusters. Each parser raises `InputError(path, value, reason)`.

Checks between records (`admit_nodes`) never fail as a whole: they admit what is consistent and
return the rest as rejections, so one bad record can never take working routes down.
"""

from __future__ import annotations

import base64
import bisect
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import InputError
from .model import (
    GRANULARITIES,
    INTRA_SUBNET_MODES,
    Cluster,
    Endpoint,
    IPInterface,
    IPNetwork,
    MeshSettings,
    Node,
    Peer,
    Span,
    span,
)

_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_CLUSTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")
_LOCATION = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL = r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*\.?$")


def node_name(value: Any, path: str) -> str:
    if not isinstance(value, str) or len(value) > 253 or not _DNS1123.match(value):
        raise InputError(path, value, "is not a DNS-1123 name")
    return value


def cluster_name(value: Any, path: str) -> str:
    if not isinstance(value, str) or not _CLUSTER_NAME.match(value):
        raise InputError(path, value, "is not a cluster name (lowercase alnum and '-', 1-32 chars)")
    return value


def cluster_id(value: Any, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 255:
        raise InputError(path, value, "is not a cluster id in 1..255")
    return value


def location(value: Any, path: str) -> str:
    if value is None or value == "":
        return ""
    if not isinstance(value, str) or not _LOCATION.match(value):
        raise InputError(path, value, "is not a location name")
    return value


def cidr(value: Any, path: str) -> IPNetwork:
    """A network with its host bits zero."""
    if not isinstance(value, str) or "/" not in value:
        raise InputError(path, value, "is not a CIDR")
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise InputError(path, value, "is not a CIDR") from None


def network(value: Any, path: str) -> IPNetwork:
    """A CIDR that must be a network address (host bits zero)."""
    net = cidr(value, path)
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError:
        raise InputError(path, value, f"has host bits set (the network is {net})") from None
    return net


def interface(value: Any, path: str) -> IPInterface:
    """An address with its prefix (`10.10.0.4/24`): the prefix is the private subnet."""
    if not isinstance(value, str) or "/" not in value:
        raise InputError(path, value, "is not an address with a prefix (like 10.10.0.4/24)")
    try:
        iface = ipaddress.ip_interface(value)
    except ValueError:
        raise InputError(path, value, "is not an address with a prefix (like 10.10.0.4/24)") from None
    if iface.ip.is_multicast or iface.ip.is_unspecified:
        raise InputError(path, value, "is not a unicast address")
    return iface


def port(value: Any, path: str) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise InputError(path, value, "is not a port in 1..65535")
    return value


def endpoint(value: Any, path: str, default_port: int | None = None) -> Endpoint:
    """`host:port`, `[v6]:port` or `dns-name:port` (the port may be left out if a default is given)."""
    if not isinstance(value, str) or not value:
        raise InputError(path, value, "is not an endpoint (host:port, [v6]:port or name:port)")
    host: str
    port_text: str | None
    if value.startswith("["):
        m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?", value)
        if not m:
            raise InputError(path, value, "is not an endpoint (host:port, [v6]:port or name:port)")
        host, port_text = m.group(1), m.group(2)
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise InputError(path, value, "is not an endpoint: bad IPv6 address") from None
    else:
        if value.count(":") > 1:
            raise InputError(path, value, "is not an endpoint: write IPv6 as [addr]:port")
        host, _, port_text = value.partition(":")
        port_text = port_text or None
        if not host:
            raise InputError(path, value, "is not an endpoint: no host")
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            if not _HOSTNAME.match(host) or re.fullmatch(r"[\d.]+", host):
                raise InputError(path, value, "is not an endpoint: bad host") from None
    if port_text is None:
        if default_port is None:
            raise InputError(path, value, "is not an endpoint: no port")
        return Endpoint(host, default_port)
    try:
        p = int(port_text)
    except ValueError:
        raise InputError(path, value, "is not an endpoint: bad port") from None
    if not 1 <= p <= 65535:
        raise InputError(path, value, "is not an endpoint: port outside 1..65535")
    return Endpoint(host, p)


def wg_key(value: Any, path: str) -> str:
    """A WireGuard key: standard base64 of exactly 32 bytes."""
    if not isinstance(value, str) or len(value) != 44:
        raise InputError(path, _redact(value), "is not a WireGuard key (base64 of 32 bytes)")
    try:
        raw = base64.b64decode(value, validate=True)
    except ValueError:
        raise InputError(path, _redact(value), "is not a WireGuard key (base64 of 32 bytes)") from None
    if len(raw) != 32:
        raise InputError(path, _redact(value), "is not a WireGuard key (base64 of 32 bytes)")
    return value


def _redact(value: Any) -> Any:
    # Keys are public here, but a long string in an error line helps no one.
    return value if not isinstance(value, str) or len(value) <= 60 else value[:20] + "..."


def keepalive(value: Any, path: str) -> int:
    if value is None:
        return 0
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise InputError(path, value, "is not a keepalive in seconds (0..65535)")
    return value


def boolean(value: Any, path: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", ""):
        return value.lower() == "true"
    raise InputError(path, value, "is not true or false")


def cidr_list(value: Any, path: str) -> tuple[IPNetwork, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list):
        raise InputError(path, value, "is not a list of CIDRs")
    return tuple(network(v, f"{path}[{i}]") for i, v in enumerate(value))


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(path, value, "is not a mapping")
    return value


def _unknown(d: Mapping[str, Any], known: Iterable[str], path: str) -> None:
    for k in d:
        if k not in known:
            raise InputError(f"{path}.{k}" if path else str(k), d[k], "is not a known field")


NODE_FIELDS = (
    "name", "location", "internal_ip", "endpoint", "pod_cidr", "public_key", "leader",
    "persistent_keepalive", "allowed_location_ips", "wireguard_ip",
)


def parse_node(d: Any, path: str, *, cluster: str = "", default_port: int | None = None) -> Node:
    """A node record as written in a topology file or published by an agent."""
    d = _mapping(d, path)
    _unknown(d, NODE_FIELDS, path)
    p = f"{path}." if path else ""
    if "name" not in d:
        raise InputError(f"{p}name", None, "is required")
    if "pod_cidr" not in d:
        raise InputError(f"{p}pod_cidr", None, "is required")
    if "public_key" not in d:
        raise InputError(f"{p}public_key", None, "is required")
    return Node(
        name=node_name(d["name"], f"{p}name"),
        location=location(d.get("location"), f"{p}location"),
        internal_ip=interface(d["internal_ip"], f"{p}internal_ip") if d.get("internal_ip") else None,
        endpoint=endpoint(d["endpoint"], f"{p}endpoint", default_port) if d.get("endpoint") else None,
        pod_cidr=network(d["pod_cidr"], f"{p}pod_cidr"),
        public_key=wg_key(d["public_key"], f"{p}public_key"),
        leader=boolean(d.get("leader", False), f"{p}leader"),
        persistent_keepalive=keepalive(d.get("persistent_keepalive"), f"{p}persistent_keepalive"),
        allowed_location_ips=cidr_list(d.get("allowed_location_ips"), f"{p}allowed_location_ips"),
        wireguard_ip=interface(d["wireguard_ip"], f"{p}wireguard_ip") if d.get("wireguard_ip") else None,
        cluster=cluster,
    )


def node_to_record(n: Node) -> dict[str, Any]:
    """The JSON form of a node (the inverse of `parse_node`), as agents publish it."""
    rec: dict[str, Any] = {"name": n.name, "pod_cidr": str(n.pod_cidr), "public_key": n.public_key}
    if n.location:
        rec["location"] = n.location
    if n.internal_ip is not None:
        rec["internal_ip"] = str(n.internal_ip)
    if n.endpoint is not None:
        rec["endpoint"] = str(n.endpoint)
    if n.leader:
        rec["leader"] = True
    if n.persistent_keepalive:
        rec["persistent_keepalive"] = n.persistent_keepalive
    if n.allowed_location_ips:
        rec["allowed_location_ips"] = [str(c) for c in n.allowed_location_ips]
    if n.wireguard_ip is not None:
        rec["wireguard_ip"] = str(n.wireguard_ip)
    return rec


PEER_FIELDS = ("name", "public_key", "allowed_ips", "endpoint", "persistent_keepalive")


def parse_peer(d: Any, path: str) -> Peer:
    d = _mapping(d, path)
    _unknown(d, PEER_FIELDS, path)
    p = f"{path}."
    for req in ("name", "public_key", "allowed_ips"):
        if req not in d:
            raise InputError(f"{p}{req}", None, "is required")
    allowed = cidr_list(d["allowed_ips"], f"{p}allowed_ips")
    if not allowed:
        raise InputError(f"{p}allowed_ips", d["allowed_ips"], "is empty")
    return Peer(
        name=node_name(d["name"], f"{p}name"),
        public_key=wg_key(d["public_key"], f"{p}public_key"),
        allowed_ips=allowed,
        endpoint=endpoint(d["endpoint"], f"{p}endpoint") if d.get("endpoint") else None,
        persistent_keepalive=(
            keepalive(d["persistent_keepalive"], f"{p}persistent_keepalive")
            if d.get("persistent_keepalive") is not None else None
        ),
    )


MESH_FIELDS = ("granularity", "subnet", "port", "intra_subnet", "allow_default_route")


def parse_mesh(d: Any, path: str) -> MeshSettings:
    if d is None:
        return MeshSettings()
    d = _mapping(d, path)
    _unknown(d, MESH_FIELDS, path)
    gran = d.get("granularity", "location")
    if gran not in GRANULARITIES:
        raise InputError(f"{path}.granularity", gran, f"is not one of {', '.join(GRANULARITIES)}")
    intra = d.get("intra_subnet", "direct")
    if intra not in INTRA_SUBNET_MODES:
        raise InputError(f"{path}.intra_subnet", intra, f"is not one of {', '.join(INTRA_SUBNET_MODES)}")
    subnet = network(d.get("subnet", "10.4.0.0/16"), f"{path}.subnet")
    if subnet.num_addresses < 4:
        raise InputError(f"{path}.subnet", d.get("subnet"), "is too small for a WireGuard subnet")
    return MeshSettings(granularity=gran, subnet=subnet, port=port(d.get("port", 51820), f"{path}.port"),
                        intra_subnet=intra,
                        allow_default_route=boolean(d.get("allow_default_route", False), f"{path}.allow_default_route"))


def mesh_to_record(m: MeshSettings) -> dict[str, Any]:
    rec: dict[str, Any] = {"granularity": m.granularity, "subnet": str(m.subnet), "port": m.port,
                           "intra_subnet": m.intra_subnet}
    if m.allow_default_route:  # written only when set: agents that predate the field keep reading the record
        rec["allow_default_route"] = True
    return rec


def parse_cluster(d: Any, path: str) -> Cluster:
    if d is None:
        return Cluster()
    d = _mapping(d, path)
    _unknown(d, ("name", "id"), path)
    return Cluster(
        name=cluster_name(d.get("name", "default"), f"{path}.name"),
        id=cluster_id(d.get("id", 1), f"{path}.id"),
    )


# --- checks between records -------------------------------------------------------------------


def _overlap(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    return a[0] == b[0] and a[1] <= b[2] and b[1] <= a[2]


class Claims:
    """Disjoint address ranges with an owner each: answers "who already holds anything that
    overlaps this network?" in O(log n), so admitting 10,000 records stays fast."""

    def __init__(self) -> None:
        self._starts: list[tuple[int, int]] = []
        # (version, first, last, owner): an owner is a description, or a (prefix, node) pair
        # described only when someone conflicts with it (formatting 5,000 addresses is not free).
        self._items: list[tuple[int, int, int, str | tuple[str, Node]]] = []
        self._defaults: dict[int, str] = {}

    def conflict(self, net: IPNetwork | Span) -> str | None:
        """Who holds anything overlapping `net` (a network or its precomputed span), or None."""
        version, first, last = net if isinstance(net, tuple) else span(net)
        i = bisect.bisect_right(self._starts, (version, first))
        # Claims are disjoint and sorted: only the one starting at or before `first` and the first
        # one starting after it can overlap.
        for j in (i - 1, i):
            if 0 <= j < len(self._items):
                v, f, la, owner = self._items[j]
                if v == version and f <= last and first <= la:
                    if isinstance(owner, tuple):
                        prefix, node = owner
                        return f"{prefix}{node.qualified_name}'s pod CIDR {node.pod_cidr}"
                    return owner
        return None

    def add(self, net: IPNetwork | Span, owner: str | tuple[str, Node]) -> None:
        version, first, last = net if isinstance(net, tuple) else span(net)
        if first == 0 and last == (1 << (32 if version == 4 else 128)) - 1:
            # A default route is kept apart: longest-prefix match lets it coexist with everything.
            self._defaults[version] = owner if isinstance(owner, str) else f"{owner[0]}{owner[1].qualified_name}"
            return
        i = bisect.bisect_left(self._starts, (version, first))
        self._starts.insert(i, (version, first))
        self._items.insert(i, (version, first, last, owner))

    def remove(self, net: IPNetwork | Span) -> None:
        """Give up the claim that starts where `net` starts (a record rejected after all)."""
        version, first, _ = net if isinstance(net, tuple) else span(net)
        i = bisect.bisect_left(self._starts, (version, first))
        if i < len(self._starts) and self._starts[i] == (version, first):
            del self._starts[i]
            del self._items[i]

    def default_route(self, version: int) -> str | None:
        """Who holds the default route of this IP version, or None."""
        return self._defaults.get(version)


@dataclass(frozen=True)
class Rejection:
    """A record that was not admitted, and why (one line naming field and value)."""

    name: str
    reason: str


def admit_nodes(
    nodes: Sequence[Node],
    subnet: IPNetwork | None,
    *,
    claims: Claims | None = None,
    internal_ips: dict[Any, str] | None = None,
    hosts: dict[Any, str] | None = None,
    allow_default_route: bool = False,
    label: str = "nodes",
) -> tuple[list[Node], list[Rejection]]:
    """Admit nodes in the given order (older records first); reject a node whose name repeats,
    whose pod CIDR overlaps an admitted one or the WireGuard subnet, whose internal address is
    taken, or one of whose allowed location IPs is unsafe (see `_location_ips_problem`).
    `claims`, `internal_ips` and `hosts` may carry what other clusters already hold.

    Pod CIDRs are admitted first, location IPs after them: a location IP can never take a pod
    CIDR, whichever record is older."""
    claims = claims if claims is not None else Claims()
    internal_ips = internal_ips if internal_ips is not None else {}
    hosts = hosts if hosts is not None else {}
    names: set[str] = set()
    admitted: list[tuple[int, Node]] = []
    rejected: list[Rejection] = []
    subnet_span = span(subnet) if subnet is not None else None
    for i, n in enumerate(nodes):
        where = f"{label}[{i}]"
        if n.name in names:
            rejected.append(Rejection(n.qualified_name, f"{where}.name: {n.name!r} is a duplicate node name"))
            continue
        pod = n.pod_span
        if subnet_span is not None and _overlap(pod, subnet_span):
            rejected.append(Rejection(n.qualified_name, f"{where}.pod_cidr: {str(n.pod_cidr)!r} overlaps the "
                                      f"WireGuard subnet {subnet}"))
            continue
        owner = claims.conflict(pod)
        if owner is not None:
            rejected.append(Rejection(n.qualified_name, f"{where}.pod_cidr: {str(n.pod_cidr)!r} overlaps {owner}"))
            continue
        if n.internal_ip is not None and n.internal_ip.ip in internal_ips:
            rejected.append(Rejection(n.qualified_name, f"{where}.internal_ip: {str(n.internal_ip)!r} is already "
                                      f"used by {internal_ips[n.internal_ip.ip]}"))
            continue
        names.add(n.name)
        claims.add(pod, ("", n))
        if n.internal_ip is not None:
            internal_ips[n.internal_ip.ip] = n.qualified_name
        admitted.append((i, n))
    add_hosts(hosts, (n for _, n in admitted))
    if not any(n.allowed_location_ips for _, n in admitted):
        return [n for _, n in admitted], rejected
    host_index = sorted((a.version, int(a), owner) for a, owner in hosts.items())
    out: list[Node] = []
    for i, n in admitted:
        problem = _location_ips_problem(n, f"{label}[{i}]", subnet, subnet_span, claims, host_index,
                                        allow_default_route)
        if problem is None:
            for a in n.allowed_location_ips:
                claims.add(a, f"{n.qualified_name}'s allowed location IP {a}")
            out.append(n)
            continue
        rejected.append(Rejection(n.qualified_name, problem))
        claims.remove(n.pod_span)
        if n.internal_ip is not None and internal_ips.get(n.internal_ip.ip) == n.qualified_name:
            del internal_ips[n.internal_ip.ip]
    return out, rejected


def add_hosts(hosts: dict[Any, str], nodes: Iterable[Node]) -> None:
    """Record the addresses no location IP may cover: nodes' internal addresses and endpoints."""
    for n in nodes:
        if n.internal_ip is not None:
            hosts.setdefault(n.internal_ip.ip, f"{n.qualified_name}'s internal address")
        ep = n.endpoint.ip if n.endpoint is not None else None
        if ep is not None:
            hosts.setdefault(ep, f"{n.qualified_name}'s endpoint")


def _location_ips_problem(n: Node, where: str, subnet: IPNetwork | None, subnet_span: Span | None,
                          claims: Claims, hosts: list[tuple[int, int, str]], allow_default_route: bool) -> str | None:
    """Why one of `n`'s allowed location IPs may not route, or None. A location IP is routed to
    `n`'s tunnel on every node, so it may not cover any pod CIDR, the WireGuard subnet, any node's
    internal address or endpoint, another location IP or an extra peer's IPs; a default route only
    with `mesh.allow_default_route` (then it only has to be the one default route)."""
    mine: list[Span] = []
    for j, a in enumerate(n.allowed_location_ips):
        field = f"{where}.allowed_location_ips[{j}]: {str(a)!r}"
        sp = span(a)
        if a.prefixlen == 0:
            if not allow_default_route:
                return f"{field} is a default route (allowed only with mesh.allow_default_route: true)"
            owner = claims.default_route(a.version)
            if owner is not None:
                return f"{field} overlaps {owner}"
            mine.append(sp)
            continue
        if subnet_span is not None and _overlap(sp, subnet_span):
            return f"{field} overlaps the WireGuard subnet {subnet}"
        owner = claims.conflict(sp)
        if owner is not None:
            return f"{field} overlaps {owner}"
        k = bisect.bisect_left(hosts, (sp[0], sp[1], ""))
        if k < len(hosts) and hosts[k][0] == sp[0] and hosts[k][1] <= sp[2]:
            return f"{field} covers {hosts[k][2]} {ipaddress.ip_address(hosts[k][1])}"
        if any(_overlap(sp, m) for m in mine):
            return f"{field} overlaps another of its own location IPs"
        mine.append(sp)
    return None


def admit_peers(peers: Sequence[Peer], claims: Claims, label: str = "peers") -> tuple[list[Peer], list[Rejection]]:
    """Reject extra peers whose names repeat or whose allowed IPs overlap a pod CIDR."""
    names: set[str] = set()
    admitted: list[Peer] = []
    rejected: list[Rejection] = []
    for i, p in enumerate(peers):
        if p.name in names:
            rejected.append(Rejection(p.name, f"{label}[{i}].name: {p.name!r} is a duplicate peer name"))
            continue
        bad = None
        for j, a in enumerate(p.allowed_ips):
            owner = claims.conflict(a)
            if owner is not None:
                bad = Rejection(p.name, f"{label}[{i}].allowed_ips[{j}]: {str(a)!r} overlaps {owner}")
                break
        if bad:
            rejected.append(bad)
            continue
        names.add(p.name)
        admitted.append(p)
    return admitted, rejected
