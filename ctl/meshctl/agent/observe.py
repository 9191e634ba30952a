# SPDX-License-Identifier: Apache-2.0
"""What this node's WireGuard saw of its NATed peers, published in its own record (docs/nat.md).

For every peer the plan marks as roaming (it may sit behind NAT), the agent reports either the
endpoint its latest fresh handshake came from (`discovered_endpoints`, Kilo's
`discovered-endpoints`), or, once the peer has been tried at the same planned endpoint for longer
than the direct wait without any handshake, that it is unreached (`unreached_peers`). Other
nodes' plans confirm the endpoints (mesh.natview: quorum of two) and decide relays from them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from meshctl.mesh.model import Endpoint
from meshctl.mesh.plan import NodePlan, PeerPlan
from meshctl.node.wireguard import PeerStatus
from meshctl.node.wireguard.state import handshake_fresh, parse_endpoint

Observation = tuple[tuple[tuple[str, Endpoint], ...], tuple[str, ...]]


class HandshakeObserver:
    """Turns live WireGuard peer state into this node's discovered/unreached claims. Remembers when
    each peer was first tried at its current planned endpoint (a new endpoint is a new attempt)."""

    def __init__(self, direct_wait: float) -> None:
        self.direct_wait = direct_wait
        self._tried: dict[str, tuple[str | None, float]] = {}
        self._watched: tuple[object, bool] = (None, False)

    def watches(self, plan: NodePlan) -> bool:
        """The plan has a peer to observe (else WireGuard need not be read: a mesh without NAT
        pays nothing). Remembered per plan object."""
        if self._watched[0] is not plan.peers:
            self._watched = (plan.peers, any(_observed(p) for p in plan.peers))
        return self._watched[1]

    def observe(self, plan: NodePlan, live: Sequence[PeerStatus], *, now: float | None = None,
                wall: float | None = None) -> Observation:
        now = time.monotonic() if now is None else now
        by_key = {p.public_key: p for p in live}
        discovered: list[tuple[str, Endpoint]] = []
        unreached: list[str] = []
        names = set()
        for p in plan.peers:
            if not _observed(p):
                continue
            names.add(p.name)
            tried = self._tried.get(p.name)
            if tried is None or tried[0] != p.endpoint:
                tried = self._tried[p.name] = (p.endpoint, now)
            st = by_key.get(p.public_key)
            ep = parse_endpoint(st.endpoint) if st is not None and st.endpoint else None
            if st is not None and ep is not None and handshake_fresh(st.last_handshake, wall):
                discovered.append((p.name, Endpoint(*ep)))
            elif now - tried[1] >= self.direct_wait:
                unreached.append(p.name)
        for gone in set(self._tried) - names:
            del self._tried[gone]
        return tuple(sorted(discovered)), tuple(sorted(unreached))


def _observed(p: PeerPlan) -> bool:
    """A roaming node peer of this cluster (remote clusters' peers are named cluster/node and are
    not this cluster's records; extra peers are not nodes)."""
    return p.roaming and p.kind != "peer" and "/" not in p.name
