# SPDX-License-Identifier: Apache-2.0
"""The fast path's status block (`datapath` in the agent's /status, `meshctl datapath status`),
typed, and its JSON form (a published interface: a None field is an absent key). Built in one
place: `meshctl.datapath.Datapath.status_block`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

JSON = dict[str, Any]


def opt_key(d: JSON, key: str, value: object) -> None:
    """Put `key` in `d` only when `value` is not None (blocks that are absent rather than null)."""
    if value is not None:
        d[key] = value


@dataclass(frozen=True)
class DatapathStatus:
    """The fast path: its mode (None while it loads or when disabled) and why, counters by action
    as (packets, bytes). `synced` (the maps hold a plan) is None until a datapath is open; `attach`
    (tcx or clsact) and `fallbacks` (helpers the programs do without on this kernel) are None
    unless the mode is ebpf. `objects` says which of the three outcomes the node has (programs
    `shipped` with the image, `compiled (bcc)` here, or `kernel routes: <reason>`: Datapath.objects)
    and `objects_refused` how many compiled objects were refused for their map layout version;
    both None until a datapath is open. `route_cache_fills`: the trie walks from_pod made that
    found an entry (each a route cache miss), None unless the mode is ebpf. A None field is an
    absent key."""

    mode: str | None
    reason: str | None
    counters: dict[str, tuple[int, int]] = field(default_factory=dict)
    synced: bool | None = None
    attach: str | None = None
    fallbacks: tuple[str, ...] | None = None
    objects: str | None = None
    objects_refused: int | None = None
    route_cache_fills: int | None = None

    def to_json(self) -> JSON:
        out: JSON = {"mode": self.mode, "reason": self.reason,
                     "counters": {k: list(v) for k, v in self.counters.items()}}
        opt_key(out, "route_cache_fills", self.route_cache_fills)
        opt_key(out, "synced", self.synced)
        opt_key(out, "attach", self.attach)
        opt_key(out, "fallbacks", list(self.fallbacks) if self.fallbacks is not None else None)
        opt_key(out, "objects", self.objects)
        opt_key(out, "objects_refused", self.objects_refused)
        return out

    @classmethod
    def from_json(cls, d: JSON) -> DatapathStatus:
        fb = d.get("fallbacks")
        counters = {k: (int(v[0]), int(v[1])) for k, v in (d.get("counters") or {}).items()}
        return cls(d.get("mode"), d.get("reason"), counters, d.get("synced"), d.get("attach"),
                   tuple(fb) if fb is not None else None, d.get("objects"), d.get("objects_refused"),
                   d.get("route_cache_fills"))
