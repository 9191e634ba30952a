# SPDX-License-Identifier: Apache-2.0
"""Kernel WireGuard through pyroute2's generic-netlink `WireGuard` class.

Used only where the kernel has the wireguard module (this development machine has none, so this
transport is exercised by the project's tests only where the module exists). It gives the same
`DeviceState` and takes the same `PeerOp`s as the UAPI transport.
"""

from __future__ import annotations

import ipaddress
from typing import Any

from meshctl.errors import MeshError
from meshctl.node.wireguard.state import DevicePeer, DeviceState, PeerOp


def _attr(msg: Any, name: str) -> Any:
    return msg.get_attr(name) if hasattr(msg, "get_attr") else None


def _key(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, dict):
        v = v.get("value")
    return v.decode() if isinstance(v, bytes) else v


class GenlClient:
    def __init__(self, ifname: str):
        self.ifname = ifname

    def _wg(self) -> Any:
        from pyroute2 import WireGuard as PyWireGuard

        return PyWireGuard()

    def get(self, *, allowed_ips: bool = True) -> DeviceState:
        st = DeviceState()
        wg = self._wg()
        try:
            msgs = list(wg.info(self.ifname))
        except Exception as e:  # NetlinkError: no such device or no wireguard family
            raise MeshError(f"wireguard {self.ifname}: {e}") from None
        finally:
            wg.close()
        # A large device is dumped over several messages and one peer may continue in the next.
        acc: dict[str, dict[str, Any]] = {}
        for m in msgs:
            pk = _key(_attr(m, "WGDEVICE_A_PRIVATE_KEY"))
            if pk:
                st.private_key = pk
            port = _attr(m, "WGDEVICE_A_LISTEN_PORT")
            if port is not None:
                st.listen_port = int(port)
            for p in _attr(m, "WGDEVICE_A_PEERS") or []:
                pub = _key(p.get_attr("WGPEER_A_PUBLIC_KEY"))
                if pub is None:
                    continue
                cur = acc.setdefault(pub, {"allowed": set()})
                ep = p.get_attr("WGPEER_A_ENDPOINT")
                if ep is not None and ep.get("addr") and ep.get("port"):
                    cur["endpoint"] = (str(ipaddress.ip_address(ep["addr"])), int(ep["port"]))
                for a in (p.get_attr("WGPEER_A_ALLOWEDIPS") or []) if allowed_ips else ():
                    if a.get("addr"):
                        cur["allowed"].add(ipaddress.ip_network(a["addr"], strict=False))
                for attr, k in (("WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL", "keepalive"),
                                ("WGPEER_A_RX_BYTES", "rx"), ("WGPEER_A_TX_BYTES", "tx")):
                    v = p.get_attr(attr)
                    if v is not None:
                        cur[k] = int(v)
                hs = p.get_attr("WGPEER_A_LAST_HANDSHAKE_TIME")
                if hs is not None and hs.get("tv_sec"):
                    cur["hs"] = hs["tv_sec"] + hs.get("tv_nsec", 0) / 1e9
        for pub, cur in acc.items():
            st.peers[pub] = DevicePeer(pub, cur.get("endpoint"), frozenset(cur["allowed"]), cur.get("keepalive", 0),
                                       cur.get("rx", 0), cur.get("tx", 0), cur.get("hs"))
        return st

    def set(self, *, private_key: str | None = None, listen_port: int | None = None,
            peers: list[PeerOp] = ()) -> None:  # type: ignore[assignment]
        wg = self._wg()
        try:
            if private_key is not None or listen_port is not None:
                wg.set(self.ifname, private_key=private_key, listen_port=listen_port)
            for op in peers:
                wg.set(self.ifname, peer=_peer_dict(op))
        except Exception as e:
            raise MeshError(f"wireguard {self.ifname}: set failed: {e}") from None
        finally:
            wg.close()


def _peer_dict(op: PeerOp) -> dict[str, Any]:
    d: dict[str, Any] = {"public_key": op.public_key}
    if op.remove:
        d["remove"] = True
        return d
    d["update_only"] = op.update_only
    if op.endpoint is not None:
        d["endpoint_addr"], d["endpoint_port"] = op.endpoint
    if op.persistent_keepalive is not None:
        d["persistent_keepalive"] = op.persistent_keepalive
    if op.preshared_key is not None:
        d["preshared_key"] = op.preshared_key
    if op.allowed_ips is not None:
        d["replace_allowed_ips"] = op.replace_allowed_ips
        d["allowed_ips"] = [str(n) for n in op.allowed_ips]
    return d
