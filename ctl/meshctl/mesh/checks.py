# SPDX-License-Identifier: Apache-2.0
"""Warnings about a topology that is valid but will not do what its author most likely meant.

Errors (`InputError`, rejections) are for input that cannot be planned safely; the lines here are
for a plan that is safe but has a part that can never work, or a default the author may not have
meant. They never change the plan: `meshctl plan|graph|showconf` print them on stderr and exit 0.
The table of every case and why it is a warning or an error is in docs/mesh.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from meshctl.errors import InputError
from meshctl.mesh.fields import endpoint
from meshctl.mesh.model import Node, Topology, private_neighbours
from meshctl.mesh.segments import segments

# How many unreachable pairs are named before the rest are counted.
MAX_PAIRS_NAMED = 5


def topology_warnings(topo: Topology, doc: Any = None) -> list[str]:
    """Every warning for `topo`; `doc` is the parsed YAML it came from (for what parsing filled in)."""
    out = _endpoint_ports(topo, doc)
    out += host_prefix_warnings(topo.nodes)
    out += dead_tunnels(topo)
    return out


def _endpoint_ports(topo: Topology, doc: Any) -> list[str]:
    if not isinstance(doc, Mapping) or not isinstance(doc.get("nodes"), list):
        return []
    out = []
    for i, raw in enumerate(doc["nodes"]):
        ep = raw.get("endpoint") if isinstance(raw, Mapping) else None
        if not isinstance(ep, str) or not ep:
            continue
        try:
            endpoint(ep, "")
        except InputError:
            out.append(f"nodes[{i}].endpoint: {ep!r} has no port: the mesh port {topo.mesh.port} is used")
    return out


def host_prefix_warnings(nodes: Sequence[Node], label: str = "nodes") -> list[str]:
    """A /32 (/128) internal address says nothing about the private subnet, so the node is nobody's
    private neighbour: every path to it goes through WireGuard."""
    out = []
    for i, n in enumerate(nodes):
        ip = n.internal_ip
        if ip is not None and ip.network.prefixlen == ip.max_prefixlen:
            out.append(f"{label}[{i}].internal_ip: {str(ip)!r} is a host address: {n.name} shares a private subnet "
                       f"with no node, so every path to it is WireGuard (write the subnet's prefix, or run its agent "
                       f"with --internal-cidr)")
    return out


def dead_tunnels(topo: Topology, only: str | None = None) -> list[str]:
    """WireGuard pairs in which neither side has an endpoint: neither can send the first handshake,
    so the tunnel never starts. Pairs that go direct (or use the private address as endpoint) are
    not tunnels of this kind. `only`: just the pairs of that node (an agent's own view)."""
    gran, intra = topo.mesh.granularity, topo.mesh.intra_subnet
    leaders = [s.leader for s in segments(topo)] if topo.nodes else []
    blind = sorted((n for n in leaders if n.endpoint is None), key=lambda n: n.name)
    pairs: list[str] = []
    total = 0
    for i, a in enumerate(blind):
        for b in blind[i + 1:]:
            if only is not None and only not in (a.name, b.name):
                continue
            if gran != "location" and intra != "wireguard" and private_neighbours(a, b) and \
                    (gran == "full" or a.location == b.location):
                continue  # direct, or WireGuard to the private address
            total += 1
            if len(pairs) < MAX_PAIRS_NAMED:
                pairs.append(f"nodes {a.name} and {b.name}")
        for p in topo.peers if only in (None, a.name) else ():
            if p.endpoint is None:
                total += 1
                if len(pairs) < MAX_PAIRS_NAMED:
                    pairs.append(f"node {a.name} and peer {p.name}")
    why = "neither has an endpoint, so the WireGuard tunnel between them can never start (give one an endpoint)"
    out = [f"{pair}: {why}" for pair in pairs]
    if total > len(pairs):
        out.append(f"{total - len(pairs)} more pairs: {why}")
    return out
