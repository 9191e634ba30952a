# SPDX-License-Identifier: Apache-2.0
"""What a WireGuard device holds, in one shape for both transports (kernel genl and the UAPI socket
of wireguard-go), and the peer changes the applier sends. Keys are base64 here everywhere."""

from __future__ import annotations

import ipaddress
import time
from dataclasses import dataclass, field

from meshctl.mesh.model import IPNetwork, sort_key_net

# A handshake younger than this still keys a session (WireGuard's REJECT_AFTER_TIME): the path it
# came over works. Roaming endpoints are kept, and discovered endpoints published, only while fresh.
HANDSHAKE_FRESH_S = 180.0


def handshake_fresh(last_handshake: float | None, now: float | None = None) -> bool:
    if not last_handshake:
        return False
    return (time.time() if now is None else now) - last_handshake < HANDSHAKE_FRESH_S


@dataclass(frozen=True)
class DevicePeer:
    public_key: str
    endpoint: tuple[str, int] | None  # (ip literal, port)
    allowed_ips: frozenset[IPNetwork]
    persistent_keepalive: int = 0
    rx_bytes: int = 0
    tx_bytes: int = 0
    last_handshake: float | None = None  # epoch seconds


@dataclass
class DeviceState:
    # repr=False: a DeviceState may end up in a log line or a traceback; the key must not.
    private_key: str | None = field(default=None, repr=False)
    listen_port: int = 0
    peers: dict[str, DevicePeer] = field(default_factory=dict)


@dataclass(frozen=True, repr=False)
class PeerOp:
    """One peer change. Fields left None are not sent, so the device keeps what it has. (No repr:
    it may carry a pre-shared key.)"""

    def __repr__(self) -> str:
        return f"PeerOp({self.public_key}{', remove' if self.remove else ''})"

    public_key: str
    remove: bool = False
    update_only: bool = False
    endpoint: tuple[str, int] | None = None
    persistent_keepalive: int | None = None
    allowed_ips: tuple[IPNetwork, ...] | None = None  # replaces the peer's allowed IPs when given ...
    # ... unless False: then they are added to the peer's (and leave any other peer that held
    # them, in the same device call): how an address moves between peers without a gap
    replace_allowed_ips: bool = True
    preshared_key: str | None = None  # base64; psk.NO_KEY removes it
    # Turn the keepalive off and on again in the same change, which makes wireguard-go send a
    # keepalive now: a peer given a new endpoint is called there at once, not at the next packet.
    kick: bool = False


def format_endpoint(ep: tuple[str, int]) -> str:
    host, port = ep
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_endpoint(text: str) -> tuple[str, int] | None:
    """`1.2.3.4:51820` or `[fd00::1]:51820` (as a device reports them) -> (ip, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return None
    host = host.strip("[]")
    if "%" in host:  # a link-local scope suffix
        host = host.split("%", 1)[0]
    try:
        return (str(ipaddress.ip_address(host)), int(port))
    except ValueError:
        return None


def sorted_nets(nets: frozenset[IPNetwork] | set[IPNetwork]) -> tuple[IPNetwork, ...]:
    return tuple(sorted(nets, key=sort_key_net))
