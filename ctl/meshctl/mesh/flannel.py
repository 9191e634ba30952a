# SPDX-License-Identifier: Apache-2.0
"""`--cni flannel` as the planner sees it (docs/kubernetes.md): flannel stays the CNI and carries
the pod traffic to the nodes of this node's own location; the plan leaves those nodes to it
(`plan_node(..., flannel=True)`: no route, no encapsulated fast-path entry, `Path.FLANNEL`).

"Own location" follows the granularity (`carried`): `full` makes every node its own location;
`location` and `cross` leave flannel the nodes of the same location, as Kilo's
`--compatibility=flannel` does. What flannel's annotations say of a node (`FlannelLease`) is
what the flannel applier (node/flannel.py) writes back in flannel's form.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshctl.mesh.model import IPAddress, Topology
from meshctl.mesh.segments import segment_key


@dataclass(frozen=True)
class FlannelLease:
    """What flannel's Node annotations say of one node (flannel.alpha.coreos.com/...):
    `backend_type` (vxlan, host-gw, wireguard, ...), `public_ip`, and for VXLAN the VNI and the
    VtepMAC of its `flannel.1`."""

    backend_type: str
    public_ip: IPAddress
    vni: int | None = None
    vtep_mac: str | None = None


def carried(topo: Topology, me_name: str, granularity: str) -> frozenset[str]:
    """The nodes whose pod traffic flannel carries for node `me_name`: none with `full` (every node
    is its own location), else the other nodes of its location (a node without an internal
    address is a location of its own, as in the plan's segments)."""
    me = topo.node(me_name)
    if me is None or granularity == "full":
        return frozenset()
    mine = segment_key(me, "location")
    return frozenset(n.name for n in topo.nodes if n.name != me_name and segment_key(n, "location") == mine)
