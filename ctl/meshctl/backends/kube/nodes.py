# SPDX-License-Identifier: Apache-2.0
"""Kubernetes Node objects: meshctl's own annotation set and the user-set part of Kilo's, turned into `model.Node`.

Two kinds of annotation live on a Node:
- written by the node's agent (public key, endpoint, internal address, WireGuard address, last
  seen, granularity): `own_annotations` makes them and `KubeBackend.publish` patches them in;
- set by people (location, forced endpoint or internal address, leader, keepalive, extra location
  IPs). Kilo's names for these (`kilo.squat.ai/...`) are read too, so a Kilo cluster can switch
  without re-annotating; when both are set, meshctl's wins.

Parsing is pure: `parse_kube_node` gives a Node, None while the node's agent has not published
yet, or raises InputError naming the node, the annotation and the value.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from meshctl import defaults
from meshctl.errors import InputError
from meshctl.mesh import fields
from meshctl.mesh.model import GRANULARITIES, Endpoint, IPInterface, IPNetwork, Node

PREFIX = "meshctl.io/"
KILO_PREFIX = "kilo.squat.ai/"

# Written by the agent (AGENT_ANNOTATIONS: every annotation it owns on its Node).
PUBLIC_KEY = PREFIX + "public-key"
ENDPOINT = PREFIX + "endpoint"
INTERNAL_IP = PREFIX + "internal-ip"
WIREGUARD_IP = PREFIX + "wireguard-ip"
LAST_SEEN = PREFIX + "last-seen"
GRANULARITY = PREFIX + "granularity"
DISCOVERED_ENDPOINTS = PREFIX + "discovered-endpoints"  # JSON {peer name: "ip:port"} (docs/nat.md)
UNREACHED_PEERS = PREFIX + "unreached-peers"  # comma-separated peer names
KILO_DISCOVERED_ENDPOINTS = KILO_PREFIX + "discovered-endpoints"  # Kilo's: {public key: {"IP", "Port"}}
AGENT_ANNOTATIONS = (PUBLIC_KEY, ENDPOINT, INTERNAL_IP, WIREGUARD_IP, LAST_SEEN, GRANULARITY,
                     DISCOVERED_ENDPOINTS, UNREACHED_PEERS)

# Set by people; each is also read under Kilo's prefix.
LOCATION = "location"
FORCE_ENDPOINT = "force-endpoint"
FORCE_INTERNAL_IP = "force-internal-ip"
LEADER = "leader"
PERSISTENT_KEEPALIVE = "persistent-keepalive"
ALLOWED_LOCATION_IPS = "allowed-location-ips"
USER_KEYS = (LOCATION, FORCE_ENDPOINT, FORCE_INTERNAL_IP, LEADER, PERSISTENT_KEEPALIVE, ALLOWED_LOCATION_IPS)

@dataclass(frozen=True)
class KubeNode:
    """A Node as the mesh sees it: the record, when its agent last published, and the
    creation time that orders admission."""

    node: Node
    last_seen: int
    created: str


T = TypeVar("T")


def _user(ann: Mapping[str, str], key: str) -> tuple[str, str] | None:
    """(annotation name, value) of a user-set annotation, meshctl's before Kilo's."""
    for name in (PREFIX + key, KILO_PREFIX + key):
        if name in ann:
            return name, ann[name]
    return None


def _parsed(where: str, ann_name: str, parse: Callable[[Any, str], T], value: Any) -> T:
    """`parse(value, path)` (a field parser of mesh/fields.py) with an error naming the node and
    the annotation."""
    try:
        return parse(value, "")
    except InputError as e:
        raise InputError(f"{where}: {ann_name}{e.path}", e.value, e.reason) from None


def _leader(name: str, value: str) -> bool:
    # Kilo treats the annotation's presence as "leader"; an explicit "false" turns it off.
    if value.strip().lower() in ("", "true"):
        return True
    if value.strip().lower() == "false":
        return False
    raise InputError(name, value, "is not true, false or empty")


def _discovered(ann: Mapping[str, str], where: str, owner: str) -> Any:
    """meshctl's discovered-endpoints annotation, else Kilo's (keyed by public key, values Go's
    JSON of a net.UDPAddr), as the record field; InputError names the annotation."""
    name = DISCOVERED_ENDPOINTS if DISCOVERED_ENDPOINTS in ann else KILO_DISCOVERED_ENDPOINTS
    if name not in ann:
        return ()
    try:
        doc = json.loads(ann[name])
    except ValueError:
        raise InputError(f"{where}: {name}", ann[name], "is not JSON") from None
    if name == KILO_DISCOVERED_ENDPOINTS and isinstance(doc, dict):
        conv: dict[str, Any] = {}
        for k, v in doc.items():
            if not isinstance(v, dict) or not isinstance(v.get("IP"), str) or not isinstance(v.get("Port"), int):
                raise InputError(f"{where}: {name}.{k}", v, "is not an address ({\"IP\": ..., \"Port\": ...})")
            conv[k] = f"[{v['IP']}]:{v['Port']}" if ":" in v["IP"] else f"{v['IP']}:{v['Port']}"
        doc = conv
    return _parsed(where, name, lambda v, p: fields.discovered_endpoints(v, p, owner), doc)


def _node_name(where: str, name: str) -> str:
    """The Node's name as a mesh node name; InputError names `metadata.name`."""
    try:
        return fields.node_name(name, "")
    except InputError as e:
        raise InputError(f"{where}: metadata.name", e.value, e.reason) from None


def _last_seen(where: str, text: str) -> int:
    """The agent's last-seen annotation: Unix time in whole seconds."""
    if not fields.is_digits(text):
        raise InputError(f"{where}: {LAST_SEEN}", text, "is not a Unix time in seconds")
    return int(text)


def _addresses(value: Any, path: str) -> tuple[IPInterface, ...]:
    """An address annotation: one address with its prefix, or one per IP family comma-separated
    (`10.0.0.4/24,fd10::4/64`, a dual-stack node)."""
    if isinstance(value, str) and "," in value:
        return fields.interfaces(value, path, "address")
    return (fields.interface(value, path),)


def _joined(items: tuple[object, ...]) -> str | None:
    """What `_addresses` and `_endpoint` read: the items comma-separated (None for none)."""
    return ",".join(map(str, items)) or None


def _endpoint(ann: Mapping[str, str], where: str, default_port: int | None) -> tuple[Endpoint, ...]:
    """The forced endpoints when a non-empty value is set, else the ones the agent published, else
    none: one endpoint, or one per IP family comma-separated."""
    def ep(value: Any, path: str) -> tuple[Endpoint, ...]:
        if isinstance(value, str) and "," in value:
            return fields.endpoints(value, path, default_port)
        return (fields.endpoint(value, path, default_port),)

    forced = _user(ann, FORCE_ENDPOINT)
    if forced and forced[1]:
        return _parsed(where, forced[0], ep, forced[1])
    if ann.get(ENDPOINT):
        return _parsed(where, ENDPOINT, ep, ann[ENDPOINT])
    return ()


def _internal_ip(ann: Mapping[str, str], where: str) -> tuple[IPInterface, ...]:
    """The forced internal addresses when set, else the ones the agent published, else none (one,
    or one per family comma-separated). A forced value of "" or "-" is Kilo's way to say "this
    node has no private network"."""
    forced = _user(ann, FORCE_INTERNAL_IP)
    if forced and forced[1].strip() in ("", "-"):
        return ()
    if forced:
        return _parsed(where, forced[0], _addresses, forced[1])
    if ann.get(INTERNAL_IP):
        return _parsed(where, INTERNAL_IP, _addresses, ann[INTERNAL_IP])
    return ()


def _metadata(obj: Mapping[str, Any]) -> tuple[str, Mapping[str, str], Mapping[str, str]]:
    """A Node object's name, annotations and labels (empty where absent)."""
    meta = obj.get("metadata") or {}
    return meta.get("name", ""), meta.get("annotations") or {}, meta.get("labels") or {}


def _location(ann: Mapping[str, str], labels: Mapping[str, str], location_label: str, where: str) -> str:
    """The location annotation when set, else the location label (empty when neither is)."""
    loc = _user(ann, LOCATION)
    if loc:
        return _parsed(where, loc[0], fields.location, loc[1])
    return _parsed(where, f"label {location_label}", fields.location, labels.get(location_label, ""))


def _leader_of(ann: Mapping[str, str], where: str) -> bool:
    """Whether the leader annotation is set and not "false"."""
    lead = _user(ann, LEADER)
    if lead is None:
        return False
    ann_name, value = lead
    return _parsed(where, ann_name, lambda v, _p: _leader(ann_name, v), value)


def _user_parsed(ann: Mapping[str, str], where: str, key: str, parse: Callable[[Any, str], T], default: T) -> T:
    """A user-set annotation parsed, meshctl's before Kilo's; `default` when neither is set."""
    found = _user(ann, key)
    return _parsed(where, found[0], parse, found[1]) if found else default


def _check_granularity(ann: Mapping[str, str], where: str) -> None:
    gran = ann.get(GRANULARITY)
    if gran and gran not in GRANULARITIES:
        raise InputError(f"{where}: {GRANULARITY}", gran, f"is not one of {', '.join(GRANULARITIES)}")


def _unreached(ann: Mapping[str, str], where: str, owner: str) -> tuple[str, ...]:
    """The comma-separated unreached-peers annotation as node names other than `owner`."""
    names = [u.strip() for u in ann.get(UNREACHED_PEERS, "").split(",") if u.strip()]
    return _parsed(where, UNREACHED_PEERS, lambda v, p: fields.name_list(v, p, owner), names)


def parse_kube_node(obj: Mapping[str, Any], *, location_label: str = defaults.REGION_LABEL,
                    default_port: int | None = None,
                    pod_cidrs: tuple[IPNetwork, ...] | None = None) -> KubeNode | None:
    """The mesh record of a Kubernetes Node object (a dict as the API returns it).

    None when the node has no pod CIDR or its agent has not published a key and last-seen yet
    (not an error: it has not joined). InputError for a malformed value; its path names the node
    and the annotation (`node b2: meshctl.io/endpoint: 'x:1:2' is not an endpoint...`). The
    annotations are read, with Kilo's fallback, in the order the docs list them, so the first
    malformed one in that order is the one reported.

    `pod_cidrs` given (`--cni calico|cilium`: the CNI's IPAM, backends.kube.cni_ipam) replaces
    `spec.podCIDRs`/`spec.podCIDR`: every CIDR given (all of a node's Calico blocks, any number
    of one family) becomes the node's; an empty tuple means the CNI has given the node no pod
    CIDR yet (None).
    """
    name, ann, labels = _metadata(obj)
    where = f"node {name}"
    has_cidr = bool(pod_cidrs) if pod_cidrs is not None else has_pod_cidr(obj)
    if not has_cidr or PUBLIC_KEY not in ann or LAST_SEEN not in ann:
        return None
    node_name = _node_name(where, name)
    pods = pod_cidrs if pod_cidrs else spec_pod_cidrs(obj, where)
    key = _parsed(where, PUBLIC_KEY, fields.wg_key, ann[PUBLIC_KEY])
    last_seen = _last_seen(where, ann[LAST_SEEN])
    endpoint = _endpoint(ann, where, default_port)
    internal_ip = _internal_ip(ann, where)
    location = _location(ann, labels, location_label, where)
    leader = _leader_of(ann, where)
    keepalive = _user_parsed(ann, where, PERSISTENT_KEEPALIVE, fields.keepalive, 0)
    allowed: tuple[IPNetwork, ...] = _user_parsed(ann, where, ALLOWED_LOCATION_IPS, fields.cidr_list, ())
    wg = _parsed(where, WIREGUARD_IP, _addresses, ann[WIREGUARD_IP]) if ann.get(WIREGUARD_IP) else ()
    _check_granularity(ann, where)
    discovered = _discovered(ann, where, node_name)
    unreached = _unreached(ann, where, node_name)
    node = Node(
        name=node_name, pod_cidrs=pods, public_key=key, location=location, internal_ips=internal_ip,
        endpoints=endpoint, leader=leader, persistent_keepalive=keepalive, allowed_location_ips=allowed,
        wireguard_ips=wg, discovered_endpoints=discovered, unreached_peers=unreached,
    )
    created = (obj.get("metadata") or {}).get("creationTimestamp") or ""
    return KubeNode(node, last_seen, str(created))


def pending_reason(obj: Mapping[str, Any], pod_cidrs: tuple[IPNetwork, ...] | None = None) -> str:
    """What a Node that `parse_kube_node` leaves out (None) still lacks, in words for `plan`,
    `graph` and `node list`: its pod CIDR, or its agent's first publication."""
    _, ann, _ = _metadata(obj)
    if not (bool(pod_cidrs) if pod_cidrs is not None else has_pod_cidr(obj)):
        return ("its CNI's IPAM has given it no pod CIDR yet" if pod_cidrs is not None
                else "it has no pod CIDR yet (spec.podCIDR: the controller manager's --allocate-node-cidrs)")
    missing = [k for k in (PUBLIC_KEY, LAST_SEEN) if k not in ann]
    return f"its agent has not published yet (no {' or '.join(missing)} annotation)"


def has_pod_cidr(obj: Mapping[str, Any]) -> bool:
    """The Node has been given a pod CIDR (`spec.podCIDRs` or `spec.podCIDR`)."""
    spec = obj.get("spec") or {}
    return bool(spec.get("podCIDRs") or spec.get("podCIDR"))


def spec_pod_cidrs(obj: Mapping[str, Any], where: str) -> tuple[IPNetwork, ...]:
    """A Node's pod CIDRs: `spec.podCIDRs` (one per family, as the controller manager allocates
    them), else `spec.podCIDR` (clusters and objects that predate dual stack); () for neither.
    InputError names the node and the field."""
    spec = obj.get("spec") or {}
    listed = spec.get("podCIDRs")
    if listed:
        if not isinstance(listed, list):
            raise InputError(f"{where}: spec.podCIDRs", listed, "is not a list of CIDRs")
        nets = tuple(_parsed(where, f"spec.podCIDRs[{i}]", fields.cidr, v) for i, v in enumerate(listed))
        return _parsed(where, "spec.podCIDRs", fields.one_per_family_of, nets)
    if spec.get("podCIDR"):
        return (_parsed(where, "spec.podCIDR", fields.cidr, spec["podCIDR"]),)
    return ()


def own_annotations(node: Node, granularity: str, now: float | None = None) -> dict[str, str | None]:
    """The agent-written annotations of `node`, as a merge patch: a field the node no longer has
    is removed (None), so a stale endpoint does not linger."""
    return {
        PUBLIC_KEY: node.public_key,
        ENDPOINT: _joined(node.endpoints),
        INTERNAL_IP: _joined(node.internal_ips),
        WIREGUARD_IP: _joined(node.wireguard_ips),
        LAST_SEEN: str(int(time.time() if now is None else now)),
        GRANULARITY: granularity,
        DISCOVERED_ENDPOINTS: json.dumps({n: str(e) for n, e in node.discovered_endpoints}, sort_keys=True)
        if node.discovered_endpoints else None,
        UNREACHED_PEERS: ",".join(node.unreached_peers) or None,
    }


def settings_for_agent(obj: Mapping[str, Any], location_label: str = defaults.REGION_LABEL) -> dict[str, Any]:
    """AgentConfig fields from the agent's own Node: its pod CIDR, location and user-set
    annotations, for the fields its flags left unset. InputError names annotation and value."""
    name, ann, labels = _metadata(obj)
    out: dict[str, Any] = {}

    def field(ann_name: str, parse: Any, value: Any) -> Any:
        return _parsed(f"node {name}", ann_name, parse, value)

    if has_pod_cidr(obj):
        out["pod_cidrs"] = spec_pod_cidrs(obj, f"node {name}")
    out["location"] = _location(ann, labels, location_label, f"node {name}")
    if (fe := _user(ann, FORCE_ENDPOINT)) and fe[1]:
        out["endpoint"] = fe[1]
    if (fi := _user(ann, FORCE_INTERNAL_IP)) and fi[1].strip() not in ("", "-"):
        out["force_internal_ip"] = field(fi[0], lambda v, at: fields.interfaces(v, at, "internal address"), fi[1])
    if lead := _user(ann, LEADER):
        out["leader"] = field(lead[0], lambda v, _p: _leader(lead[0], v), lead[1])
    if ka := _user(ann, PERSISTENT_KEEPALIVE):
        out["persistent_keepalive"] = field(ka[0], fields.keepalive, ka[1])
    if ali := _user(ann, ALLOWED_LOCATION_IPS):
        out["allowed_location_ips"] = field(ali[0], fields.cidr_list, ali[1])
    return out
