# SPDX-License-Identifier: Apache-2.0
"""What a node observes of its peers, as it publishes it next to its record: per peer the rung in
use now, the rung its ladder starts at, the last probe's RTT and loss, and the WireGuard handshake's
age. Pictures (`graph --live`, `meshctl ui`) and `explain` read these summaries instead of asking
every agent, so they work from the backend alone and show what the nodes do, not what the plan says.

The summary is bounded (MAX_PEERS peers, names and rungs of bounded length) and parsed strictly:
a summary is data another node wrote, so `from_json` rejects what does not fit with a MeshError
naming the field and the value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshctl.errors import InputError, MeshError
from meshctl.mesh.model import Path, path_of

MAX_PEERS = 5000  # peers in one node's summary: the largest mesh the project serves
MAX_SEEN_BYTES = 1 << 20  # a summary's JSON: MAX_PEERS peers fit with room; a larger one is refused unread
MAX_NAME = 253  # characters of a peer's name ("cluster/node" for another cluster's node)
JSON = dict[str, Any]


@dataclass(frozen=True)
class PeerSeen:
    """One peer as a node sees it. `rung` None: no path works now (else the pair's Path: a rung,
    via-leader, relay...); `first` the rung the node's ladder for this peer starts at (None when
    unknown); `loss` a fraction of the last probe window."""

    rung: Path | None
    first: Path | None = None
    rtt_ms: float | None = None
    loss: float | None = None
    handshake_age_s: float | None = None

    @property
    def fell_back(self) -> bool:
        """The pair works, on a rung below the one its ladder starts at."""
        return self.rung is not None and self.first is not None and self.rung != self.first

    def to_json(self) -> JSON:
        out: JSON = {"rung": self.rung}
        for k, v in (("first", self.first), ("rtt_ms", self.rtt_ms), ("loss", self.loss),
                     ("handshake_age_s", self.handshake_age_s)):
            if v is not None:
                out[k] = v
        return out

    @classmethod
    def from_json(cls, d: object, where: str = "peer") -> PeerSeen:
        if not isinstance(d, dict):
            raise MeshError(f"{where}: a summary's peer must be an object, not {d!r}")
        return cls(_opt_path(d, "rung", where), _opt_path(d, "first", where), _opt_num(d, "rtt_ms", where),
                   _opt_num(d, "loss", where, upper=1.0), _opt_num(d, "handshake_age_s", where))


@dataclass(frozen=True)
class NodeSeen:
    """A node's summary: who wrote it (`node` of `cluster`), when (`at`, unix seconds), and its
    peers keyed by name."""

    node: str
    cluster: str
    at: float
    peers: Mapping[str, PeerSeen] = field(default_factory=dict)

    def to_json(self) -> JSON:
        return {"node": self.node, "cluster": self.cluster, "at": self.at,
                "peers": {k: v.to_json() for k, v in sorted(self.peers.items())}}

    @classmethod
    def from_json(cls, d: object) -> NodeSeen:
        if not isinstance(d, dict):
            raise MeshError(f"summary: must be an object, not {type(d).__name__}")
        node = _opt_str(d, "node", "summary")
        cluster = _opt_str(d, "cluster", "summary")
        at = _opt_num(d, "at", "summary")
        if not node or cluster is None or at is None:
            raise MeshError(f"summary: needs node, cluster and at, got {sorted(d)!r}")
        peers = d.get("peers") or {}
        if not isinstance(peers, dict):
            raise MeshError(f"summary of {node}: peers must be an object, not {type(peers).__name__}")
        if len(peers) > MAX_PEERS:
            raise MeshError(f"summary of {node}: peers holds {len(peers)}, at most {MAX_PEERS}")
        out = {}
        for name, p in peers.items():
            if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
                raise MeshError(f"summary of {node}: peer name {name!r} is not a name")
            out[name] = PeerSeen.from_json(p, f"summary of {node}: peer {name}")
        return cls(node, cluster, at, out)


def summary_of(doc: object, where: str, node: str, owner: str) -> NodeSeen:
    """The summary `doc` found at `where` (a key, a ConfigMap), which only `node`'s credentials may
    write: refused when it is not a summary or names another node than `owner` says."""
    s = NodeSeen.from_json(doc)
    if s.node != node:
        raise InputError(where, s.node, f"names another node than {owner}")
    return s


def _opt_str(d: Mapping[str, object], key: str, where: str) -> str | None:
    v = d.get(key)
    if v is None:
        return None
    if not isinstance(v, str) or len(v) > MAX_NAME:
        raise MeshError(f"{where}: {key} must be a short string, not {v!r}")
    return v


def _opt_path(d: Mapping[str, object], key: str, where: str) -> Path | None:
    v = d.get(key)
    return None if v is None else path_of(v, f"{where}: {key}")


def _opt_num(d: Mapping[str, object], key: str, where: str, upper: float | None = None) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0 \
            or (upper is not None and v > upper):
        raise MeshError(f"{where}: {key} must be a number{' in [0, 1]' if upper else ' >= 0'}, not {v!r}")
    return float(v)
