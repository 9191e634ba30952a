# SPDX-License-Identifier: Apache-2.0
"""Records: the one JSON/YAML shape of nodes, peers, mesh settings and clusters that every
backend stores and every topology file holds, parsed into the model and written back.

`parse_*` take a decoded document and the path that names it and raise `InputError` on the first
bad field; `*_to_record` are their inverses (what agents publish). `parse_topology` also runs
admission over the file's records: a topology file is one person's statement, so the first
conflict in it is an error, not a rejection.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from meshctl.errors import MISSING, InputError
from meshctl.mesh import admit, global_ranges
from meshctl.mesh.fields import (
    boolean,
    cidr_list,
    cluster_id,
    cluster_name,
    discovered_endpoints,
    endpoint,
    endpoints,
    global_cidrs,
    granularity,
    integer,
    interface,
    interfaces,
    keepalive,
    key_file,
    location,
    mapping,
    name_list,
    network,
    no_unknown_fields,
    node_name,
    pod_cidrs,
    port,
    wg_key,
    wireguard_addressing,
)
from meshctl.mesh.model import (
    DEFAULT_INTRA_SUBNET,
    DEFAULT_LEADER_HOLD,
    DEFAULT_PORT,
    DEFAULT_SUBNET,
    INTRA_SUBNET_MODES,
    MAX_LEADER_HOLD,
    MAX_LEADERS_PER_LOCATION,
    PRIVATE_RUNGS,
    Cluster,
    IPNetwork,
    MeshSettings,
    Node,
    PathState,
    Peer,
    Topology,
)

T = TypeVar("T")

NODE_FIELDS = (
    "name", "location", "internal_ip", "internal_ips", "endpoint", "endpoints", "pod_cidrs", "pod_cidr",
    "public_key", "leader", "persistent_keepalive", "allowed_location_ips", "wireguard_ip", "wireguard_ips",
    "discovered_endpoints", "unreached_peers",
)


def parse_node(d: Any, path: str, *, cluster: str = "", default_port: int | None = None,
               one_per_family: bool = True) -> Node:
    """A node record as written in a topology file or published by an agent. `one_per_family`
    holds its pod CIDRs to one per IP family (what a person or a Kubernetes Node gives); records
    an agent publishes from its CNI's IPAM (several Calico blocks) are read with it False."""
    d = mapping(d, path)
    no_unknown_fields(d, NODE_FIELDS, path)
    p = f"{path}." if path else ""
    if "name" not in d:
        raise InputError(f"{p}name", MISSING, "is required")
    pods = node_pod_cidrs(d, p, one_per_family)
    if "public_key" not in d:
        raise InputError(f"{p}public_key", MISSING, "is required")
    name = node_name(d["name"], f"{p}name")
    return Node(
        name=name,
        location=location(d.get("location"), f"{p}location"),
        internal_ips=one_or_many(d, p, "internal_ip", lambda v, at: (interface(v, at),),
                                 lambda v, at: interfaces(v, at, "internal address")),
        endpoints=one_or_many(d, p, "endpoint", lambda v, at: (endpoint(v, at, default_port),),
                              lambda v, at: endpoints(v, at, default_port)),
        pod_cidrs=pods,
        public_key=wg_key(d["public_key"], f"{p}public_key"),
        leader=boolean(d.get("leader", False), f"{p}leader"),
        persistent_keepalive=keepalive(d.get("persistent_keepalive"), f"{p}persistent_keepalive"),
        allowed_location_ips=cidr_list(d.get("allowed_location_ips"), f"{p}allowed_location_ips"),
        wireguard_ips=one_or_many(d, p, "wireguard_ip", lambda v, at: (interface(v, at),),
                                  lambda v, at: interfaces(v, at, "WireGuard address")),
        cluster=cluster,
        discovered_endpoints=discovered_endpoints(d.get("discovered_endpoints"), f"{p}discovered_endpoints", name),
        unreached_peers=name_list(d.get("unreached_peers"), f"{p}unreached_peers", name),
    )


def node_pod_cidrs(d: Any, p: str, one_per_family: bool = True) -> tuple[IPNetwork, ...]:
    """A node record's pod CIDRs: `pod_cidrs` (a list, one per family unless told otherwise) or
    `pod_cidr` (one CIDR, the one-element form records had before dual stack), never both."""
    pods = one_or_many(d, p, "pod_cidr", lambda v, at: (network(v, at),),
                       lambda v, at: pod_cidrs(v, at, one_per_family), optional=False)
    if not pods:
        raise InputError(f"{p}pod_cidrs", MISSING, "is required")
    return pods


def one_or_many(d: Any, p: str, one: str, parse_one: Callable[[Any, str], tuple[T, ...]],
                parse_many: Callable[[Any, str], tuple[T, ...]], optional: bool = True) -> tuple[T, ...]:
    """A field a record gives in its one-element form (`one`, e.g. `internal_ip`) or as a list
    (`one` + "s", one per family), never both; empty when neither is given. An `optional` field
    given empty (null, "") counts as not given; any other is parsed as it is."""
    many = f"{one}s"
    if many in d and one in d:
        raise InputError(f"{p}{one}", d[one], f"is given with {many}: write one of them")
    if many in d and (d[many] or not optional):
        return parse_many(d[many], f"{p}{many}")
    if one in d and (d[one] or not optional):
        return parse_one(d[one], f"{p}{one}")
    return ()


def _one_or_list(rec: dict[str, Any], one: str, items: Sequence[object]) -> None:
    """Write a list field in its one-element form when it holds one item (agents that predate the
    list keep reading it), as the list when it holds more, not at all when empty."""
    if len(items) == 1:
        rec[one] = str(items[0])
    elif items:
        rec[f"{one}s"] = [str(x) for x in items]


def node_to_record(n: Node) -> dict[str, Any]:
    """The JSON form of a node (the inverse of `parse_node`), as agents publish it."""
    rec: dict[str, Any] = {"name": n.name}
    _one_or_list(rec, "pod_cidr", n.pod_cidrs)
    rec["public_key"] = n.public_key
    if n.location:
        rec["location"] = n.location
    _one_or_list(rec, "internal_ip", n.internal_ips)
    _one_or_list(rec, "endpoint", n.endpoints)
    if n.leader:
        rec["leader"] = True
    if n.persistent_keepalive:
        rec["persistent_keepalive"] = n.persistent_keepalive
    if n.allowed_location_ips:
        rec["allowed_location_ips"] = [str(c) for c in n.allowed_location_ips]
    _one_or_list(rec, "wireguard_ip", n.wireguard_ips)
    if n.discovered_endpoints:
        rec["discovered_endpoints"] = {name: str(ep) for name, ep in n.discovered_endpoints}
    if n.unreached_peers:
        rec["unreached_peers"] = list(n.unreached_peers)
    return rec


PEER_FIELDS = ("name", "public_key", "allowed_ips", "endpoint", "persistent_keepalive", "preshared_key_file")


def parse_peer(d: Any, path: str) -> Peer:
    d = mapping(d, path)
    no_unknown_fields(d, PEER_FIELDS, path)
    p = f"{path}."
    for req in ("name", "public_key", "allowed_ips"):
        if req not in d:
            raise InputError(f"{p}{req}", MISSING, "is required")
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
        preshared_key=key_file(d["preshared_key_file"], f"{p}preshared_key_file")
        if d.get("preshared_key_file") is not None else None,
    )


MESH_FIELDS = ("granularity", "subnet", "subnet6", "port", "intra_subnet", "private_networks", "allow_default_route",
               "wireguard_addressing", "global_cidrs", "service_cidrs",
               "leader_hold", "leaders_per_location")


def parse_mesh(d: Any, path: str) -> MeshSettings:
    if d is None:
        return MeshSettings()
    d = mapping(d, path)
    no_unknown_fields(d, MESH_FIELDS, path)
    gran = granularity(d.get("granularity", "location"), f"{path}.granularity")
    intra = d.get("intra_subnet", DEFAULT_INTRA_SUBNET)
    if intra not in INTRA_SUBNET_MODES:
        raise InputError(f"{path}.intra_subnet", intra, f"is not one of {', '.join(INTRA_SUBNET_MODES)}")
    subnet = _wg_subnet(d.get("subnet", str(DEFAULT_SUBNET)), f"{path}.subnet")
    subnet6 = _wg_subnet(d["subnet6"], f"{path}.subnet6") if d.get("subnet6") else None
    if subnet6 is not None and subnet6.version != 6:
        raise InputError(f"{path}.subnet6", d["subnet6"], "is not an IPv6 network (mesh.subnet6 is the IPv6 WireGuard "
                         "subnet)")
    if subnet6 is not None and subnet.version != 4:
        raise InputError(f"{path}.subnet6", d["subnet6"], f"is given with the IPv6 mesh.subnet {subnet}: write the "
                         "IPv4 WireGuard subnet in subnet, the IPv6 one in subnet6")
    mesh = MeshSettings(granularity=gran, subnet=subnet, subnet6=subnet6,
                        port=port(d.get("port", DEFAULT_PORT), f"{path}.port"),
                        intra_subnet=intra,
                        private_networks=cidr_list(d.get("private_networks"), f"{path}.private_networks"),
                        allow_default_route=boolean(d.get("allow_default_route", False), f"{path}.allow_default_route"),
                        wireguard_addressing=wireguard_addressing(d.get("wireguard_addressing", "index"),
                                                                  f"{path}.wireguard_addressing"),
                        global_cidrs=global_cidrs(d.get("global_cidrs"), f"{path}.global_cidrs"),
                        service_cidrs=cidr_list(d.get("service_cidrs"), f"{path}.service_cidrs"),
                        leader_hold=integer(d.get("leader_hold", DEFAULT_LEADER_HOLD), f"{path}.leader_hold", 1,
                                            MAX_LEADER_HOLD, f"is not a number of seconds in 1..{MAX_LEADER_HOLD}"),
                        leaders_per_location=integer(d.get("leaders_per_location", 1), f"{path}.leaders_per_location",
                                                     1, MAX_LEADERS_PER_LOCATION,
                                                     f"is not a number of leaders in 1..{MAX_LEADERS_PER_LOCATION}"))
    problem = global_ranges.settings_problem(mesh, path)
    if problem is not None:
        raise InputError.from_line(problem)
    return mesh


def _wg_subnet(value: Any, path: str) -> IPNetwork:
    subnet = network(value, path)
    if subnet.num_addresses < 4:
        raise InputError(path, value, "is too small for a WireGuard subnet")
    return subnet


def mesh_to_record(m: MeshSettings) -> dict[str, Any]:
    rec: dict[str, Any] = {"granularity": m.granularity, "subnet": str(m.subnet), "port": m.port,
                           "intra_subnet": m.intra_subnet}
    if m.subnet6 is not None:  # written only when set, as allow_default_route
        rec["subnet6"] = str(m.subnet6)
    if m.private_networks:
        rec["private_networks"] = [str(n) for n in m.private_networks]
    if m.allow_default_route:  # written only when set: agents that predate the field keep reading the record
        rec["allow_default_route"] = True
    if m.wireguard_addressing != "index":  # written only when set, as allow_default_route
        rec["wireguard_addressing"] = m.wireguard_addressing
    if m.global_cidrs:  # written only when set, as allow_default_route
        rec["global_cidrs"] = {str(pod): str(glob) for pod, glob in m.global_cidrs}
    if m.service_cidrs:
        rec["service_cidrs"] = [str(n) for n in m.service_cidrs]
    if m.leader_hold != DEFAULT_LEADER_HOLD:  # written only when set, as allow_default_route
        rec["leader_hold"] = m.leader_hold
    if m.leaders_per_location != 1:  # written only when set, as allow_default_route
        rec["leaders_per_location"] = m.leaders_per_location
    return rec


CLUSTER_FIELDS = ("name", "id")


def parse_cluster(d: Any, path: str) -> Cluster:
    if d is None:
        return Cluster()
    d = mapping(d, path)
    no_unknown_fields(d, CLUSTER_FIELDS, path)
    return Cluster(
        name=cluster_name(d.get("name", "default"), f"{path}.name"),
        id=cluster_id(d.get("id", 1), f"{path}.id"),
    )


# A lab file is a topology file plus what only the lab reads (lab/namespaces/spec.py): the `lab:`
# block and each node's `kernel` and `ip_families` (the families of the lab node's NICs). A topology
# file may carry them; plan, graph and showconf ignore them.
TOPOLOGY_FIELDS = ("cluster", "mesh", "nodes", "peers", "lab")
LAB_NODE_FIELDS = ("kernel", "ip_families")


def _without_lab_fields(d: Any) -> Any:
    """A node of a topology file with the lab-only fields left out (anything else as it is)."""
    if not isinstance(d, dict) or not any(k in d for k in LAB_NODE_FIELDS):
        return d
    return {k: v for k, v in d.items() if k not in LAB_NODE_FIELDS}


def parse_topology(doc: Any) -> Topology:
    """A parsed YAML document to a Topology; raises InputError on the first problem."""
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise InputError("", doc, "is not a topology (a mapping with cluster, mesh, nodes, peers)")
    no_unknown_fields(doc, TOPOLOGY_FIELDS, "")
    cluster = parse_cluster(doc.get("cluster"), "cluster")
    mesh = parse_mesh(doc.get("mesh"), "mesh")
    raw_nodes = doc.get("nodes") or []
    if not isinstance(raw_nodes, list):
        raise InputError("nodes", raw_nodes, "is not a list")
    nodes = [parse_node(_without_lab_fields(d), f"nodes[{i}]", default_port=mesh.port)
             for i, d in enumerate(raw_nodes)]
    raw_peers = doc.get("peers") or []
    if not isinstance(raw_peers, list):
        raise InputError("peers", raw_peers, "is not a list")
    peers = [parse_peer(d, f"peers[{i}]") for i, d in enumerate(raw_peers)]
    for i, n in enumerate(nodes):
        problem = global_ranges.node_problem(n, f"nodes[{i}]", mesh)
        if problem is not None:
            raise InputError.from_line(problem)
    claims = admit.Claims()
    _, rejected = admit.admit_nodes(nodes, mesh.subnets, claims=claims, allow_default_route=mesh.allow_default_route)
    if rejected:
        raise InputError.from_line(rejected[0].reason)
    _, rejected_peers = admit.admit_peers(peers, claims, subnet=mesh.subnets)
    if rejected_peers:
        raise InputError.from_line(rejected_peers[0].reason)
    return Topology(cluster=cluster, mesh=mesh, nodes=tuple(nodes), peers=tuple(peers))


def parse_path_state(d: Any, path: str) -> PathState:
    """A path-state document: peer (qualified name) -> the private rungs that deliver to it, as
    the prober reports them (`{a2: [direct+vxlan, wireguard-private], b1: []}`)."""
    if d is None:
        return {}
    d = mapping(d, path)
    out: PathState = {}
    for name, rungs in d.items():
        p = f"{path}.{name}"
        if not isinstance(name, str) or not name:
            raise InputError(path, name, "is not a node name")
        if rungs is None:
            rungs = []
        if not isinstance(rungs, list):
            raise InputError(p, rungs, "is not a list of rungs")
        for i, r in enumerate(rungs):
            if r not in PRIVATE_RUNGS:
                raise InputError(f"{p}[{i}]", r, f"is not one of {', '.join(PRIVATE_RUNGS)}")
        out[name] = frozenset(rungs)
    return out
