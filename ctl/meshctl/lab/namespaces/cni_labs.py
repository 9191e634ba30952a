# SPDX-License-Identifier: Apache-2.0
"""`lab.cni`: which reproduction of a CNI's node state a lab builds (one module per CNI), the one
switch spec, build and kube_cluster consult. Without `lab.cni` nodes are wired the lab's own way
(namespaces/wiring.py)."""

from __future__ import annotations

from typing import Any, Protocol

from meshctl.lab.namespaces import cni_calico, cni_cilium, cni_flannel
from meshctl.lab.namespaces.state import LabState, NodeState, PodState
from meshctl.mesh.model import Node, Topology


class CniLab(Protocol):
    """What a CNI's lab module provides."""

    def seed(self, topo: Topology) -> list[dict[str, Any]]:
        """The API objects (CRDs first) the CNI would have made before meshctl's agents start."""
        ...

    def node_annotations(self, topo: Topology) -> dict[str, dict[str, str]]:
        """The annotations the CNI writes on the Nodes, by node name."""
        ...

    def wire_node(self, st: LabState, ns: str, topo: Topology, node: Node, count: int) -> list[PodState]:
        """The node's devices and routes as the CNI leaves them, with `count` pods. Called once the
        node's private NIC holds its internal address."""
        ...

    def cni_state(self, node: NodeState) -> dict[str, Any]:
        """The CNI's own node state, to compare before and after the agents."""
        ...


CNI_LABS: dict[str, CniLab] = {"flannel": cni_flannel, "calico": cni_calico, "cilium": cni_cilium}
