# SPDX-License-Identifier: Apache-2.0
"""The pure part of a pass (admission, the plan, the mesh CIDRs), kept while its inputs are the
same objects (the identity rule: mesh.memo), and the plan cache the agent owns (mesh.plan.PlanCache)."""

from __future__ import annotations

from dataclasses import dataclass

from meshctl.backends.base import ClusterState
from meshctl.mesh import admit
from meshctl.mesh.admit import Rejection
from meshctl.mesh.memo import same_items
from meshctl.mesh.model import IPNetwork, Node, PathState, Topology
from meshctl.mesh.plan import NodePlan, PlanCache, mesh_cidrs, plan_node
from meshctl.mesh.segments import Remote


@dataclass(frozen=True)
class _Admitted:
    """The last local admission and what it was computed from (same objects = unchanged)."""

    key: tuple[object, ...]
    nodes: tuple[Node, ...]
    peers: tuple[object, ...]
    topo: Topology
    rejections: list[Rejection]


class PureMemos:
    """Admission is redone only when a record, the mesh or our own record changed; the plan and
    the mesh CIDRs only for a new admitted topology, new admitted remote clusters or new probe
    verdicts. Remote admission hands out the same Remote object while a cluster's admission
    stands (mesh.admit_memo), so "the same remotes" is an identity check too. `plans`: what this
    node's plans keep between them (remote clusters' blocks and segments)."""

    def __init__(self, *, flannel: bool = False) -> None:
        self.flannel = flannel  # plan_node's flannel input (`--cni flannel`)
        self.plans = PlanCache()
        self._admitted: _Admitted | None = None
        self._plan: tuple[Topology, list[Remote], PathState, NodePlan] | None = None
        self._cidrs: tuple[Topology, list[Remote], frozenset[IPNetwork]] | None = None
        self._remote_cidrs: dict[int, tuple[Remote, frozenset[IPNetwork]]] = {}  # by id(Remote)

    def admit_local(self, state: ClusterState, me: Node) -> tuple[Topology, list[Rejection], bool]:
        """This cluster's admitted topology with our own record as discovered (the store may lag
        behind), its rejections, and whether the last result was reused."""
        key = (state.cluster, state.mesh, me)
        memo = self._admitted
        if memo is not None and memo.key == key and same_items(memo.nodes, state.nodes) \
                and same_items(memo.peers, state.peers):
            return memo.topo, memo.rejections, True
        nodes = [me if n.name == me.name else n for n in state.nodes]
        if all(n.name != me.name for n in nodes):
            nodes.append(me)
        topo, rejections = admit.admit_local(
            Topology(cluster=state.cluster, mesh=state.mesh, nodes=tuple(nodes), peers=state.peers))
        self._admitted = _Admitted(key, state.nodes, state.peers, topo, rejections)
        return topo, rejections, False

    def plan(self, topo: Topology, me: str, remotes: list[Remote], path_state: PathState) -> tuple[NodePlan, bool]:
        """plan_node, and whether the last plan was reused."""
        memo = self._plan
        if memo is not None and memo[0] is topo and same_items(memo[1], remotes) and memo[2] == path_state:
            return memo[3], True
        plan = plan_node(topo, me, remotes, path_state=path_state, flannel=self.flannel, cache=self.plans)
        self._plan = (topo, list(remotes), path_state, plan)
        return plan, False

    def mesh_cidrs(self, topo: Topology, remotes: list[Remote]) -> frozenset[IPNetwork]:
        """plan.mesh_cidrs of this topology and these remotes: this cluster's part and each remote
        cluster's part computed by it, each remote's kept while admission hands out the same
        Remote (a join in one of ten clusters of 5,000 recomputes one part), joined by set unions
        (which reuse the members' stored hashes)."""
        memo = self._cidrs
        if memo is None or memo[0] is not topo or not same_items(memo[1], remotes):
            before = self._remote_cidrs
            bare = Topology(cluster=topo.cluster, mesh=topo.mesh)
            self._remote_cidrs = {id(r): hit if (hit := before.get(id(r))) is not None and hit[0] is r
                                  else (r, mesh_cidrs(bare, [r])) for r in remotes}
            memo = self._cidrs = (topo, list(remotes), mesh_cidrs(topo, []).union(
                *(cidrs for _, cidrs in self._remote_cidrs.values())))
        return memo[2]
