# SPDX-License-Identifier: Apache-2.0
"""The `Peer` custom resource: WireGuard peers that are not nodes (a laptop, a VPN gateway).

Its spec has the shape of Kilo's `kilo.squat.ai/v1alpha1` Peer, so Kilo's Peers are read as they
are, and checked the way Kilo checks them: allowed IPs are CIDRs, the public key is base64 of 32
bytes, the endpoint is a DNS-1123 name or an IP with a port in 1..65535, the keepalive >= 0.
A preshared key is refused rather than dropped: a peer configured with one would not connect.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshctl.errors import MISSING, InputError
from meshctl.mesh import fields
from meshctl.mesh.model import Endpoint, Peer


@dataclass(frozen=True)
class PeerResource:
    """Where Peers are served: (group, version, plural)."""

    group: str
    version: str
    plural: str = "peers"
    kind: str = "Peer"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


MESHCTL_PEERS = PeerResource("meshctl.io", "v1alpha1")
KILO_PEERS = PeerResource("kilo.squat.ai", "v1alpha1")

SPEC_FIELDS = ("allowedIPs", "endpoint", "persistentKeepalive", "presharedKey", "publicKey")


def _endpoint(value: Any, path: str) -> Endpoint:
    if not isinstance(value, Mapping):
        raise InputError(path, value, "is not a mapping with dnsOrIP and port")
    dns_or_ip = value.get("dnsOrIP") or {}
    if not isinstance(dns_or_ip, Mapping):
        raise InputError(f"{path}.dnsOrIP", dns_or_ip, "is not a mapping with dns or ip")
    port = fields.port(value.get("port"), f"{path}.port")
    ip, dns = dns_or_ip.get("ip"), dns_or_ip.get("dns")
    if ip:  # IPs are more specific, so they win, as in Kilo
        try:
            return Endpoint(str(ipaddress.ip_address(ip)), port)
        except ValueError:
            raise InputError(f"{path}.dnsOrIP.ip", ip, "is not an IP address") from None
    if dns:
        try:
            return Endpoint(fields.node_name(dns, ""), port)  # node names are DNS-1123 subdomains
        except InputError:
            raise InputError(f"{path}.dnsOrIP.dns", dns, "is not a DNS-1123 subdomain") from None
    raise InputError(f"{path}.dnsOrIP", dict(dns_or_ip), "needs a dns name or an ip")


def parse_peer_object(obj: Mapping[str, Any]) -> Peer:
    """A Peer object (a dict as the API returns it) as a mesh peer; InputError names the peer
    and the field (`peer laptop: spec.publicKey: 'abc' is not a WireGuard key ...`)."""
    if not isinstance(obj, Mapping) or not isinstance(obj.get("metadata") or {}, Mapping):
        raise InputError("peer", obj, "is not an object with metadata and spec")
    name = (obj.get("metadata") or {}).get("name", "")
    where = f"peer {name}"
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise InputError(f"{where}: spec", spec, "is not a mapping")
    fields.no_unknown_fields(spec, SPEC_FIELDS, f"{where}: spec")
    try:
        psk = fields.secret_key_ref(spec["presharedKey"], "spec.presharedKey") if spec.get("presharedKey") else None
        if "publicKey" not in spec:
            raise InputError("spec.publicKey", MISSING, "is required")
        allowed = spec.get("allowedIPs")
        if not isinstance(allowed, list) or not allowed:
            raise InputError("spec.allowedIPs", allowed, "is not a non-empty list of CIDRs")
        keepalive = spec.get("persistentKeepalive")
        if isinstance(keepalive, int) and not isinstance(keepalive, bool) and keepalive < 0:
            raise InputError("spec.persistentKeepalive", keepalive, "must be >= 0")
        return Peer(
            name=fields.node_name(name, "metadata.name"),
            public_key=fields.wg_key(spec["publicKey"], "spec.publicKey"),
            allowed_ips=tuple(fields.cidr(a, f"spec.allowedIPs[{i}]") for i, a in enumerate(allowed)),
            endpoint=_endpoint(spec["endpoint"], "spec.endpoint") if spec.get("endpoint") else None,
            persistent_keepalive=fields.keepalive(keepalive, "spec.persistentKeepalive") if keepalive else None,
            preshared_key=psk,
        )
    except InputError as e:
        raise InputError(f"{where}: {e.path}", e.value, e.reason) from None
