# SPDX-License-Identifier: Apache-2.0
"""`--cni install`: a CNI config for clusters that have none (Kilo's `install-cni`), written by the
agent from its own Node: the `bridge` plugin on `meshctl0` with `host-local` addresses from the
node's pod CIDR, and the pods' MTU that of the WireGuard device (a pod's packet may take the tunnel).

`--cni calico` and `--cni cilium` keep the CNI in charge too and read the pod CIDRs from its IPAM
(backends.kube.cni_ipam); beside Cilium the fast path stays off (FASTPATH_OFF).

The default is `--cni keep`: flannel, Cilium or the distribution's CNI stays in charge and meshctl
only routes between nodes. A Kilo leftover `10-kilo.conflist` would sort before ours and keep
giving pods Kilo's bridge, so `install` moves it aside (`10-kilo.conflist.meshctl-disabled`, kept for
a rollback); `keep` leaves it and the agent warns. `--cni flannel` keeps flannel (VXLAN or
host-gw) as the CNI and carrying the traffic inside a location (node/flannel.py).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from meshctl.mesh.model import IPNetwork

log = logging.getLogger("meshctl.cni")

CNI_MODES = ("keep", "install", "flannel", "calico", "cilium")
# Why the fast path stays off beside a CNI whose own tc programs sit on the devices it would
# attach to (docs/datapath.md, "Next to Cilium"): what `status` says on the datapath line.
FASTPATH_OFF = {
    "cilium": ("--cni cilium: Cilium's tc programs on lxc* and the native device end the tcx chain "
               "(TC_ACT_OK or a redirect), so meshctl's would never run after them, or run first and "
               "bypass Cilium's policy and conntrack; the fast path stays off on them (kernel routes)"),
}
CONF_NAME = "10-meshctl.conflist"
BRIDGE = "meshctl0"
KILO_LEFTOVER = "10-kilo.conflist"
DISABLED_SUFFIX = ".meshctl-disabled"


def conflist(pod_cidrs: Sequence[IPNetwork], mtu: int) -> dict[str, Any]:
    """The CNI config list (pure): bridge + host-local on the node's pod CIDRs, and portmap for
    hostPort. host-local gives a pod one address per range set, so the sets are per IP family (a
    dual-stack node's pods get an IPv4 and an IPv6 address), each set the family's CIDRs."""
    ranges = [[{"subnet": str(c)} for c in pod_cidrs if c.version == v]
              for v in sorted({c.version for c in pod_cidrs})]
    return {
        "cniVersion": "0.4.0",
        "name": "meshctl",
        "plugins": [
            {"type": "bridge", "bridge": BRIDGE, "isDefaultGateway": True, "forceAddress": True,
             "hairpinMode": True, "mtu": mtu,
             "ipam": {"type": "host-local", "ranges": ranges}},
            {"type": "portmap", "snat": True, "capabilities": {"portMappings": True}},
        ],
    }


def install(conf_dir: Path, pod_cidrs: Sequence[IPNetwork], mtu: int) -> list[str]:
    """Write the config if it differs (atomically: the kubelet may read it any moment) and move a
    Kilo leftover aside; returns what was done, one line each."""
    done = []
    conf_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(conflist(pod_cidrs, mtu), indent=2) + "\n"
    path = conf_dir / CONF_NAME
    if not path.exists() or path.read_text() != text:
        tmp = conf_dir / f".{CONF_NAME}.tmp"
        tmp.write_text(text)
        os.replace(tmp, path)
        done.append(f"wrote {path} (bridge {BRIDGE}, pods {','.join(str(c) for c in pod_cidrs)}, MTU {mtu})")
    kilo = conf_dir / KILO_LEFTOVER
    if kilo.exists():
        os.replace(kilo, conf_dir / (KILO_LEFTOVER + DISABLED_SUFFIX))
        done.append(f"moved Kilo's {kilo} aside ({KILO_LEFTOVER + DISABLED_SUFFIX}): it would sort before ours")
    for line in done:
        log.info("cni: %s", line)
    return done


def leftover_warning(conf_dir: Path) -> str | None:
    """With `--cni keep`: a Kilo config still installed gives pods Kilo's bridge, not the cluster's CNI."""
    if (conf_dir / KILO_LEFTOVER).exists():
        return (f"{conf_dir / KILO_LEFTOVER} (Kilo's CNI config) is still installed and sorts before other configs: "
                f"remove it, or run with --cni install")
    return None
