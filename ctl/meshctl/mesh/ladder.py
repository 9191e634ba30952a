# SPDX-License-Identifier: Apache-2.0
"""The path ladder of a pair of nodes (docs/mesh.md, "The path ladder"): which rungs the records
allow between two nodes, cheapest first, and which one a pair takes given the probes' verdicts.
Pure functions of records; the plan reads them, and so does the prober (which peers it probes).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from meshctl.mesh.model import (
    ENCAP_KINDS,
    ENCAP_RUNGS,
    FIXED_RUNG,
    RUNGS,
    IPNetwork,
    Node,
    Path,
    Rung,
    Topology,
    private_joined,
    private_neighbours,
)

# The encapsulated rungs, cheapest first.
_ENCAPSULATED: tuple[Rung, ...] = tuple(r for r in RUNGS if r in ENCAP_RUNGS)
# The ladders pair_rungs hands out as shared values (a plan asks for one per pair; an enum member's
# lookup costs four times a module global's on Python 3.11): WireGuard over the public endpoint
# alone; WireGuard to the private address first (only another family's private network joins the
# pair); and each fixed mode's rung, then the tunnel.
TUNNEL_ONLY: tuple[Rung, ...] = (Path.TUNNEL,)
ENDPOINT_LADDER: tuple[Rung, ...] = (Path.WIREGUARD_PRIVATE, Path.TUNNEL)
_FIXED_LADDER: dict[str, tuple[Rung, ...]] = {mode: (rung, Path.TUNNEL) for mode, rung in FIXED_RUNG.items()}
# The fixed modes that use their rung between private neighbours only.
_NEIGHBOUR_MODES = ("direct", Path.WIREGUARD_PRIVATE.value, "wireguard")


def pair_rungs(mesh_intra: str, granularity: str, private_networks: tuple[IPNetwork, ...], me: Node, r: Node,
               family: int | None = None, *, cross_family: bool = True) -> tuple[Rung, ...]:
    """The rungs node `me` may use towards `r`'s pod CIDRs of IP version `family` (None: of any
    family; full/cross granularity), cheapest first; the last is always `tunnel`. The fixed modes
    direct and wireguard-private use their rung between private neighbours only (wireguard never);
    vxlan, ipip and auto take every pair one routed private network joins (private_joined). In
    cross granularity a private pair must share a location.

    Per family (docs/mesh.md, "Dual stack"): `direct` and the encapsulated rungs carry a family's
    pods over the private network of that family only (next hop and outer addresses of the
    pod's family); `wireguard-private` is an endpoint, so a pair joined in either family may use
    it for both (`cross_family`; False asks whether the family's own network joins the pair)."""
    same_loc_ok = granularity == "full" or me.location == r.location
    if mesh_intra in _NEIGHBOUR_MODES:
        if mesh_intra == "wireguard" or not same_loc_ok:
            return TUNNEL_ONLY
        fam = family if mesh_intra == "direct" or not cross_family else None
        return _FIXED_LADDER[mesh_intra] if private_neighbours(me, r, fam) else TUNNEL_ONLY
    if not same_loc_ok:
        return TUNNEL_ONLY
    if not private_joined(me, r, private_networks, family):
        # Only another family's private network may join the pair: its endpoint, not this family's path.
        other = family is not None and mesh_intra == "auto" and cross_family and private_joined(me, r, private_networks)
        return ENDPOINT_LADDER if other else TUNNEL_ONLY
    if mesh_intra != "auto":
        return _FIXED_LADDER[mesh_intra]
    return RUNGS if private_neighbours(me, r, family) else RUNGS[1:]  # `direct` only between neighbours


def member_rungs(mesh_intra: str, me: Node, m: Node, family: int | None = None) -> tuple[Rung, ...]:
    """The rungs between two members of one location (location granularity) for `m`'s pods of IP
    version `family` (None: any): inside a location traffic is private (Kilo's rule) and there is
    no WireGuard between members, so the ladder stops at the encapsulated rungs; the fixed modes
    other than vxlan and ipip use `direct`."""
    if mesh_intra in ENCAP_KINDS:
        return (FIXED_RUNG[mesh_intra],)
    if mesh_intra == "auto":
        first: tuple[Rung, ...] = (Path.DIRECT,) if private_neighbours(me, m, family) else ()
        return (*first, *_ENCAPSULATED)
    return (Path.DIRECT,)


def cheapest(rungs: Iterable[Rung]) -> Rung:
    """The cheapest of a pair's per-family rungs (the one `paths` names: the private path the pair
    uses at all, which the prober keeps probing and the graph draws)."""
    return min(rungs, key=RUNGS.index)


def choose_rung(rungs: Sequence[Rung], working: frozenset[str] | None) -> Rung:
    """The cheapest rung that delivers (`working`: the probed private rungs; None: all of them).
    `tunnel` (a ladder's last rung, when it has it) always delivers; a ladder without it falls
    back to its first rung."""
    if working is None:
        return rungs[0]
    for rung in rungs:
        if rung in working:
            return rung
    return rungs[-1] if rungs[-1] == Path.TUNNEL else rungs[0]


def probe_ladders(topo: Topology, name: str) -> dict[str, tuple[Rung, ...]]:
    """The peers node `name` probes under `intra_subnet: auto`, with each pair's ladder: every
    node whose ladder has a private rung (full/cross: pair_rungs; location: its own members)."""
    mesh = topo.mesh
    me = topo.node(name)
    if me is None or mesh.intra_subnet != "auto" or not me.internal_ips:
        return {}
    out: dict[str, tuple[Rung, ...]] = {}
    for r in topo.nodes:
        if r.name == me.name or not r.internal_ips:
            continue
        if mesh.granularity == "location":
            if r.location != me.location:
                continue
            ladder = member_rungs(mesh.intra_subnet, me, r)
        else:
            ladder = pair_rungs(mesh.intra_subnet, mesh.granularity, mesh.private_networks, me, r)
        if any(rung != Path.TUNNEL for rung in ladder):
            out[r.qualified_name] = ladder
    return out
