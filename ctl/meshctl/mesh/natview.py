# SPDX-License-Identifier: Apache-2.0
"""Nodes behind NAT, as the records tell it (docs/nat.md): which discovered endpoints are
confirmed, which pairs of nodes cannot reach each other directly and which node relays for them.

Pure functions of admitted node records. What a node publishes about its peers
(`discovered_endpoints`, `unreached_peers`) are claims about OTHER nodes, so they route nothing
on one node's word:

- An endpoint for node X is used by third parties only when at least `DISCOVERY_QUORUM` (2)
  other nodes saw X's handshakes come from exactly that public address and port. One node's
  credentials therefore cannot send anyone's traffic for X to an address X never handshook
  from; and a symmetric NAT, whose mapping differs per destination, never reaches the quorum,
  which is right: what one peer saw of it is useless to every other.
- A pair (a, b) of nodes without public endpoints is relayed only by what a and b themselves say
  or lack: neither has a reachable
  endpoint (confirmed, or a private neighbour's), or one of them reported the other
  unreached; and never while either reports a handshake with the other (a direct path formed).
  A third node can only offer itself as relay by having a public endpoint, and it is chosen by
  a fixed order, not by its own claim.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from meshctl.mesh.model import FAMILIES, Endpoint, Node, private_neighbours

DISCOVERY_QUORUM = 2


@dataclass(frozen=True)
class NatView:
    """What the admitted records say about NAT traversal, built once per topology."""

    confirmed: dict[str, Endpoint]  # node name -> endpoint confirmed by the quorum
    handshakes: frozenset[tuple[str, str]]  # (observer, peer): the observer saw a fresh handshake
    unreached: frozenset[tuple[str, str]]  # (observer, peer): tried past the wait, no handshake

    def endpoint(self, r: Node, families: Iterable[int] = FAMILIES) -> Endpoint | None:
        """Where a node speaking `families` calls r: r's public configured endpoint of such a
        family, else its confirmed discovered one, else whatever it configured of such a family (a
        private address only a neighbour can use), else None."""
        fams = families if isinstance(families, frozenset) else frozenset(families)
        public = r.reachable_endpoint  # the first public one: of a family `fams` holds almost always
        if public is not None and public.family != 0 and public.family not in fams:
            public = next((e for e in r.endpoints if e.is_public and (e.family == 0 or e.family in fams)), None)
        found = self.confirmed.get(r.name)
        return public or (found if found is not None and found.family in fams else None) or r.endpoint_for(fams)

    def discovered(self, r: Node) -> bool:
        """r is called at an endpoint the mesh discovered (not one it configured)."""
        return r.reachable_endpoint is None and r.name in self.confirmed

    def reachable(self, me: Node, r: Node) -> bool:
        """`me` can call r unasked: r has a public or confirmed endpoint, or r's configured
        endpoint is on a private subnet `me` shares."""
        if r.reachable_endpoint is not None or r.name in self.confirmed:
            return True
        return r.endpoint is not None and private_neighbours(me, r)

    def direct_seen(self, a: Node, b: Node) -> bool:
        return (a.name, b.name) in self.handshakes or (b.name, a.name) in self.handshakes

    def relay_reason(self, a: Node, b: Node) -> str | None:
        """Why the pair (a, b) needs a relay, or None when it may (or does) go direct. Symmetric in
        a and b, so both ends decide the same."""
        gap = family_gap(a, b)
        if gap is not None:
            return gap
        if a.reachable_endpoint is not None or b.reachable_endpoint is not None or self.direct_seen(a, b):
            return None  # a public node is reached directly by anyone who can reach a relay
        x, y = sorted((a, b), key=lambda n: n.name)
        if not self.reachable(x, y) and not self.reachable(y, x):
            return f"neither {x.name} nor {y.name} has a reachable endpoint (both behind NAT, none confirmed)"
        for p, q in ((x, y), (y, x)):
            if (p.name, q.name) in self.unreached:
                return f"{p.name} reported no handshake with {q.name} within the direct wait"
        return None


def nat_view(nodes: Sequence[Node]) -> NatView:
    """Confirm discovered endpoints (quorum of distinct other reporters, public addresses only)
    and collect the handshake reports between admitted nodes."""
    names = {n.name for n in nodes}
    by_key = {n.public_key: n.name for n in nodes}  # Kilo's annotation names peers by public key
    votes: dict[str, Counter[Endpoint]] = {}
    handshakes: set[tuple[str, str]] = set()
    unreached: set[tuple[str, str]] = set()
    for obs in nodes:
        for claimed, ep in obs.discovered_endpoints:
            peer = by_key.get(claimed, claimed)
            if peer not in names or peer == obs.name:
                continue
            handshakes.add((obs.name, peer))
            if ep.is_public:
                votes.setdefault(peer, Counter())[ep] += 1
        for peer in obs.unreached_peers:
            if peer in names and peer != obs.name:
                unreached.add((obs.name, peer))
    confirmed: dict[str, Endpoint] = {}
    for peer, counts in votes.items():
        # Most reporters first, then the lowest endpoint: the same choice on every node.
        ep, n = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if n >= DISCOVERY_QUORUM:
            confirmed[peer] = ep
    return NatView(confirmed, frozenset(handshakes), frozenset(unreached - handshakes))


def family_names(n: Node) -> str:
    """`IPv4`, `IPv6` or `IPv4 and IPv6`: the families a node's underlay speaks."""
    return " and ".join(f"IPv{f}" for f in sorted(n.families))


def family_gap(a: Node, b: Node) -> str | None:
    """Why a and b can never call each other for want of an IP family both speak (an IPv4-only
    and an IPv6-only node), or None. Symmetric in a and b."""
    if a.families & b.families:
        return None
    x, y = sorted((a, b), key=lambda n: n.name)
    return f"{x.name} ({family_names(x)}) and {y.name} ({family_names(y)}) share no IP family"


def choose_relay(view: NatView, a: Node, b: Node, candidates: Sequence[Node]) -> Node | None:
    """The node that relays for (a, b): the first of `candidates` (WireGuard identities with a
    public endpoint) other than a and b that both can call (an endpoint in a family each speaks)
    and that reports neither of them unreached, leaders first, then by name. Independent of the
    order of a and b."""
    ok = [c for c in candidates
          if c.name not in (a.name, b.name) and c.reachable_endpoint is not None
          and _public_for(c, a) and _public_for(c, b)
          and (c.name, a.name) not in view.unreached and (c.name, b.name) not in view.unreached]
    return min(ok, key=lambda c: (not c.leader, c.name)) if ok else None


def _public_for(c: Node, n: Node) -> bool:
    """Node n can call c at a public endpoint of a family n speaks."""
    return any(e.is_public and (e.family == 0 or e.family in n.families) for e in c.endpoints)
