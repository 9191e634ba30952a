# SPDX-License-Identifier: Apache-2.0
"""flannel's Node annotations (`flannel.alpha.coreos.com/...`, written by flannel's kube subnet
manager) as a `FlannelLease`, for `--cni flannel` (node/flannel.py).

Parsing is pure: `parse_flannel` gives None for a Node flannel has not annotated (no backend-type),
a lease otherwise, or raises InputError naming the node, the annotation and the value, so the
backend rejects that Node alone.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Mapping
from typing import Any

from meshctl.errors import InputError
from meshctl.mesh.flannel import FlannelLease
from meshctl.node.flannel import VXLAN

FLANNEL_PREFIX = "flannel.alpha.coreos.com/"
BACKEND_TYPE = FLANNEL_PREFIX + "backend-type"
BACKEND_DATA = FLANNEL_PREFIX + "backend-data"
PUBLIC_IP = FLANNEL_PREFIX + "public-ip"
KUBE_SUBNET_MANAGER = FLANNEL_PREFIX + "kube-subnet-manager"

_MAC = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")
_BACKEND = re.compile(r"^[a-z][a-z0-9-]*$")


def parse_flannel(name: str, ann: Mapping[str, str]) -> FlannelLease | None:
    """The lease flannel published on Node `name` (None: flannel has not annotated it yet)."""
    where = f"node {name}"
    if BACKEND_TYPE not in ann:
        return None
    backend = ann[BACKEND_TYPE]
    if not _BACKEND.match(backend):
        raise InputError(f"{where}: {BACKEND_TYPE}", backend, "is not a flannel backend type (vxlan, host-gw, ...)")
    text = ann.get(PUBLIC_IP, "")
    try:
        public_ip = ipaddress.ip_address(text)
    except ValueError:
        raise InputError(f"{where}: {PUBLIC_IP}", text, "is not an IP address") from None
    if backend != VXLAN:
        return FlannelLease(backend, public_ip)
    raw = ann.get(BACKEND_DATA, "")
    try:
        data: Any = json.loads(raw)
    except ValueError:
        raise InputError(f"{where}: {BACKEND_DATA}", raw, "is not JSON") from None
    if not isinstance(data, dict):
        raise InputError(f"{where}: {BACKEND_DATA}", raw, 'is not a JSON object ({"VNI": 1, "VtepMAC": "..."})')
    vni, mac = data.get("VNI"), data.get("VtepMAC")
    if not isinstance(vni, int) or isinstance(vni, bool) or not 0 < vni < 1 << 24:
        raise InputError(f"{where}: {BACKEND_DATA}.VNI", vni, "is not a VXLAN network identifier (1..16777215)")
    if not isinstance(mac, str) or not _MAC.match(mac):
        raise InputError(f"{where}: {BACKEND_DATA}.VtepMAC", mac, "is not a MAC address")
    return FlannelLease(backend, public_ip, vni, mac.lower())
