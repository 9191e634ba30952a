# SPDX-License-Identifier: Apache-2.0
"""The kernel settings the mesh needs, set only where they differ.

- Forwarding on: a node routes pod traffic for its pods and, as a location's leader, for its
  neighbours.
- rp_filter loose (2) on the private NIC and the WireGuard device: paths are asymmetric (a packet
  from a peer's pod may arrive on the private NIC through the fast path while the route back to
  its source goes through kilo0, or the other way round), and strict mode drops those. The kernel
  uses max(conf/all, conf/<if>), so 2 on the interface is loose whatever `all` says (0 or 1);
  `all` and `default` are left alone.

Writes go to /proc/sys/net, which the kernel resolves in the writing thread's network namespace,
so this acts on the current namespace like everything else here.
"""

from __future__ import annotations

import logging
from pathlib import Path

from meshctl.errors import MeshError

log = logging.getLogger(__name__)

PROC_SYS = Path("/proc/sys")


def conf_key(family: str, ifname: str, setting: str) -> str:
    return f"net.{family}.conf.{ifname}.{setting}"


def _conf_path(family: str, ifname: str, setting: str) -> Path:
    return PROC_SYS / "net" / family / "conf" / ifname / setting


def desired_sysctls(private_if: str | None, wg_if: str | None, *, ipv6: bool = False) -> dict[str, Path]:
    """key -> path of every setting `ensure_sysctls` would write (the value is always in VALUES)."""
    want: dict[str, Path] = {"net.ipv4.ip_forward": PROC_SYS / "net/ipv4/ip_forward"}
    if ipv6:
        want["net.ipv6.conf.all.forwarding"] = _conf_path("ipv6", "all", "forwarding")
    for ifname in (private_if, wg_if):
        if ifname:
            want[conf_key("ipv4", ifname, "rp_filter")] = _conf_path("ipv4", ifname, "rp_filter")
    return want


def _value(key: str) -> str:
    return "2" if key.endswith(".rp_filter") else "1"


def _ensure(key: str, path: Path, value: str) -> bool | None:
    """Write `value` to `path` unless it holds it; True if written, None when the interface is
    not there (yet)."""
    try:
        current = path.read_text().strip()
    except FileNotFoundError:
        log.info("sysctl %s: no such interface yet, skipped", key)
        return None
    if current == value:
        return False
    try:
        path.write_text(value + "\n")
    except OSError as e:
        raise MeshError(f"sysctl {key}={value}: {e.strerror}") from None
    log.info("sysctl %s: %s -> %s", key, current, value)
    return True


def ensure_sysctls(private_if: str | None, wg_if: str | None, *, ipv6: bool = False) -> dict[str, str]:
    """Set forwarding and loose rp_filter; return the keys that changed with their new values.

    IPv6 forwarding is opt-in (`ipv6=True`): turning it on makes the kernel ignore router
    advertisements on hosts that configure themselves from them. An interface that does not
    exist yet (kilo0 before its first start) is skipped and picked up on the next call.
    """
    changed: dict[str, str] = {}
    for key, path in desired_sysctls(private_if, wg_if, ipv6=ipv6).items():
        value = _value(key)
        if _ensure(key, path, value):
            changed[key] = value
    return changed


def promote_secondaries(ifname: str) -> bool:
    """`net.ipv4.conf.IFNAME.promote_secondaries=1`: removing the device's primary IPv4 address
    then promotes a secondary of the same subnet instead of deleting every secondary with it (and,
    with the last address, every route through the device). A WireGuard address that moves is added
    first and the old one removed after (make before break): without this, the removal would take
    the new address along. True if it was written."""
    key = conf_key("ipv4", ifname, "promote_secondaries")
    return bool(_ensure(key, _conf_path("ipv4", ifname, "promote_secondaries"), "1"))
