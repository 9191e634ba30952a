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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshctl import defaults
from meshctl.errors import InputError
from meshctl.mesh import fields
from meshctl.mesh.model import GRANULARITIES, Node

PREFIX = "meshctl.io/"
KILO_PREFIX = "kilo.squat.ai/"

# Written by the agent.
PUBLIC_KEY = PREFIX + "public-key"
ENDPOINT = PREFIX + "endpoint"
INTERNAL_IP = PREFIX + "internal-ip"
WIREGUARD_IP = PREFIX + "wireguard-ip"
LAST_SEEN = PREFIX + "last-seen"
GRANULARITY = PREFIX + "granularity"
DISCOVERED_ENDPOINTS = PREFIX + "discovered-endpoints"  # JSON {peer name: "ip:port"} (docs/nat.md)
UNREACHED_PEERS = PREFIX + "unreached-peers"  # comma-separated peer names
KILO_DISCOVERED_ENDPOINTS = KILO_PREFIX + "discovered-endpoints"  # Kilo's: {public key: {"IP", "Port"}}
AGENT_KEYS = (PUBLIC_KEY, ENDPOINT, INTERNAL_IP, WIREGUARD_IP, LAST_SEEN, GRANULARITY, DISCOVERED_ENDPOINTS,
              UNREACHED_PEERS)

# Set by people; each is also read under Kilo's prefix.
LOCATION = "location"
FORCE_ENDPOINT = "force-endpoint"
FORCE_INTERNAL_IP = "force-internal-ip"
LEADER = "leader"
PERSISTENT_KEEPALIVE = "persistent-keepalive"
ALLOWED_LOCATION_IPS = "allowed-location-ips"
USER_KEYS = (LOCATION, FORCE_ENDPOINT, FORCE_INTERNAL_IP, LEADER, PERSISTENT_KEEPALIVE, ALLOWED_LOCATION_IPS)

REGION_LABEL = defaults.REGION_LABEL


@dataclass(frozen=True)
class KubeNode:
    """A Node as the mesh sees it: the record, when its agent last published, and the
    creation time that orders admission."""

    node: Node
    last_seen: int
    created: str


def _user(ann: Mapping[str, str], key: str) -> tuple[str, str] | None:
    """(annotation name, value) of a user-set annotation, meshctl's before Kilo's."""
    for name in (PREFIX + key, KILO_PREFIX + key):
        if name in ann:
            return name, ann[name]
    return None


def _parsed(where: str, ann_name: str, parse: Any, value: Any) -> Any:
    """`parse(value)` with an error naming the node and the annotation."""
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


def parse_kube_node(obj: Mapping[str, Any], *, location_label: str = REGION_LABEL,
                    default_port: int | None = None) -> KubeNode | None:
    """The mesh record of a Kubernetes Node object (a dict as the API returns it).

    None when the node has no pod CIDR or its agent has not published a key and last-seen yet
    (not an error: it has not joined). InputError for a malformed value; its path names the node
    and the annotation (`node b2: meshctl.io/endpoint: 'x:1:2' is not an endpoint...`).
    Long because each annotation is read, with Kilo's fallback, in the order the docs list them.
    """
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    ann: Mapping[str, str] = meta.get("annotations") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    where = f"node {name}"
    pod_cidr_text = (obj.get("spec") or {}).get("podCIDR")
    if not pod_cidr_text or PUBLIC_KEY not in ann or LAST_SEEN not in ann:
        return None

    def field(ann_name: str, parse: Any, value: Any) -> Any:
        return _parsed(where, ann_name, parse, value)

    try:
        node_name = fields.node_name(name, "")
    except InputError as e:
        raise InputError(f"{where}: metadata.name", e.value, e.reason) from None
    pod_cidr = field("spec.podCIDR", fields.cidr, pod_cidr_text)
    key = field(PUBLIC_KEY, fields.wg_key, ann[PUBLIC_KEY])
    last_seen_text = ann[LAST_SEEN]
    if not fields.is_digits(last_seen_text):
        raise InputError(f"{where}: {LAST_SEEN}", last_seen_text, "is not a Unix time in seconds")

    def ep(value: Any, path: str) -> Any:
        return fields.endpoint(value, path, default_port)

    forced = _user(ann, FORCE_ENDPOINT)
    if forced and forced[1]:
        endpoint = field(forced[0], ep, forced[1])
    elif ann.get(ENDPOINT):
        endpoint = field(ENDPOINT, ep, ann[ENDPOINT])
    else:
        endpoint = None

    forced = _user(ann, FORCE_INTERNAL_IP)
    if forced and forced[1].strip() in ("", "-"):
        internal_ip = None  # Kilo's way to say "this node has no private network"
    elif forced:
        internal_ip = field(forced[0], fields.interface, forced[1])
    elif ann.get(INTERNAL_IP):
        internal_ip = field(INTERNAL_IP, fields.interface, ann[INTERNAL_IP])
    else:
        internal_ip = None

    loc = _user(ann, LOCATION)
    location = field(loc[0], fields.location, loc[1]) if loc else \
        field(f"label {location_label}", fields.location, labels.get(location_label, ""))
    lead = _user(ann, LEADER)
    leader = field(lead[0], lambda v, _p: _leader(lead[0], v), lead[1]) if lead else False
    ka = _user(ann, PERSISTENT_KEEPALIVE)
    keepalive = field(ka[0], fields.keepalive, ka[1]) if ka else 0
    ali = _user(ann, ALLOWED_LOCATION_IPS)
    allowed = field(ali[0], fields.cidr_list, ali[1]) if ali else ()
    wg = field(WIREGUARD_IP, fields.interface, ann[WIREGUARD_IP]) if ann.get(WIREGUARD_IP) else None
    gran = ann.get(GRANULARITY)
    if gran and gran not in GRANULARITIES:
        raise InputError(f"{where}: {GRANULARITY}", gran, f"is not one of {', '.join(GRANULARITIES)}")
    unreached = ann.get(UNREACHED_PEERS, "")
    node = Node(
        name=node_name, pod_cidr=pod_cidr, public_key=key, location=location, internal_ip=internal_ip,
        endpoint=endpoint, leader=leader, persistent_keepalive=keepalive, allowed_location_ips=allowed,
        wireguard_ip=wg, discovered_endpoints=_discovered(ann, where, node_name),
        unreached_peers=field(UNREACHED_PEERS, lambda v, p: fields.name_list(v, p, node_name),
                              [u.strip() for u in unreached.split(",") if u.strip()]),
    )
    return KubeNode(node, int(last_seen_text), str(meta.get("creationTimestamp") or ""))


def own_annotations(node: Node, granularity: str, now: float | None = None) -> dict[str, str | None]:
    """The agent-written annotations of `node`, as a merge patch: a field the node no longer has
    is removed (None), so a stale endpoint does not linger."""
    return {
        PUBLIC_KEY: node.public_key,
        ENDPOINT: str(node.endpoint) if node.endpoint is not None else None,
        INTERNAL_IP: str(node.internal_ip) if node.internal_ip is not None else None,
        WIREGUARD_IP: str(node.wireguard_ip) if node.wireguard_ip is not None else None,
        LAST_SEEN: str(int(time.time() if now is None else now)),
        GRANULARITY: granularity,
        DISCOVERED_ENDPOINTS: json.dumps({n: str(e) for n, e in node.discovered_endpoints}, sort_keys=True)
        if node.discovered_endpoints else None,
        UNREACHED_PEERS: ",".join(node.unreached_peers) or None,
    }


def settings_for_agent(obj: Mapping[str, Any], location_label: str = REGION_LABEL) -> dict[str, Any]:
    """AgentConfig fields from the agent's own Node: its pod CIDR, location and user-set
    annotations, for the fields its flags left unset. InputError names annotation and value."""
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    ann: Mapping[str, str] = meta.get("annotations") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    out: dict[str, Any] = {}

    def field(ann_name: str, parse: Any, value: Any) -> Any:
        return _parsed(f"node {name}", ann_name, parse, value)

    pod = (obj.get("spec") or {}).get("podCIDR")
    if pod:
        out["pod_cidr"] = field("spec.podCIDR", fields.cidr, pod)
    loc = _user(ann, LOCATION)
    out["location"] = field(loc[0], fields.location, loc[1]) if loc else \
        field(f"label {location_label}", fields.location, labels.get(location_label, ""))
    if (fe := _user(ann, FORCE_ENDPOINT)) and fe[1]:
        out["endpoint"] = fe[1]
    if (fi := _user(ann, FORCE_INTERNAL_IP)) and fi[1].strip() not in ("", "-"):
        out["force_internal_ip"] = field(fi[0], fields.interface, fi[1])
    if lead := _user(ann, LEADER):
        out["leader"] = field(lead[0], lambda v, _p: _leader(lead[0], v), lead[1])
    if ka := _user(ann, PERSISTENT_KEEPALIVE):
        out["persistent_keepalive"] = field(ka[0], fields.keepalive, ka[1])
    if ali := _user(ann, ALLOWED_LOCATION_IPS):
        out["allowed_location_ips"] = field(ali[0], fields.cidr_list, ali[1])
    return out
