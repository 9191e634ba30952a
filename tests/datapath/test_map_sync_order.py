# SPDX-License-Identifier: Apache-2.0
"""Make before break in the fast path's LPM map: while a sync changes the routes map, every address
that both the old and the new content cover finds an entry after each kernel call the sync makes
(a batch update or delete), and the datapath's stage leaves the entries the plan dropped until its
retire. Observed on a real pinned map: each of the sync's libbpf calls is followed by lookups of
the probe addresses (an LPM lookup with a /32 key returns the longest matching entry)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from meshctl.datapath import Datapath, layout, libbpf, maps
from meshctl.mesh.plan import FastPathEntry

pytestmark = pytest.mark.root

N = ipaddress.ip_network
NH = ipaddress.ip_address("192.168.0.2")
LO = 1  # the loopback's ifindex: direct entries need one


def _entry(prefix: str, action: str = "direct") -> FastPathEntry:
    return FastPathEntry(N(prefix), action, NH if action == "direct" else None)


def _covers(entries: Sequence[FastPathEntry], addr: ipaddress.IPv4Address) -> bool:
    return any(addr in e.prefix for e in entries)


def _probes(old: Sequence[FastPathEntry], new: Sequence[FastPathEntry]) -> list[ipaddress.IPv4Address]:
    """Two addresses of every prefix of either side that both sides cover."""
    out = []
    for e in [*old, *new]:
        for a in (e.prefix.network_address + 1, e.prefix.broadcast_address - 1):
            if _covers(old, a) and _covers(new, a):
                out.append(a)
    return out


class Watch:
    """After each batch/single update or delete the map makes, the probe addresses that found no
    entry (and the call after which they did not)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fd: int, probes: list[ipaddress.IPv4Address]) -> None:
        self.fd, self.probes = fd, probes
        self.calls: list[str] = []
        self.missing: list[tuple[str, str]] = []
        for name in ("update_batch", "delete_batch", "update", "delete"):
            monkeypatch.setattr(maps.libbpf, name, self._after(name, getattr(libbpf, name)))

    def _after(self, name: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kw: Any) -> Any:
            out = real(*args, **kw)
            self.calls.append(name)
            for a in self.probes:
                if libbpf.lookup(self.fd, layout.route_key(N(f"{a}/32")), layout.ROUTE_VALUE.size) is None:
                    self.missing.append((name, str(a)))
            return out
        return call


@pytest.fixture
def dp(unit_dp: Datapath) -> Datapath:
    """The module's loaded node (tests/datapath/conftest.py); each test fills its map first."""
    return unit_dp


def _switch(dp: Datapath, monkeypatch: pytest.MonkeyPatch, old: list[FastPathEntry],
            new: list[FastPathEntry]) -> Watch:
    assert dp.maps is not None
    dp.maps.routes.sync(layout.route_table(old, LO))
    w = Watch(monkeypatch, dp.maps.routes.fd, _probes(old, new))
    assert w.probes
    dp.maps.routes.sync(layout.route_table(new, LO))
    monkeypatch.undo()
    assert layout.route_table(new, LO) == dp.maps.routes.items()
    return w


def test_prefixes_replaced_by_a_covering_one_are_never_missing(dp: Datapath, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three /24s give way to the /16 that covers them (a location's pod CIDRs aggregated): the
    /16 is written before the /24s go."""
    old = [_entry("10.42.1.0/24"), _entry("10.42.2.0/24", "tunnel"), _entry("10.42.3.0/24"), _entry("10.43.0.0/24")]
    new = [_entry("10.42.0.0/16", "tunnel"), _entry("10.43.0.0/24", "tunnel")]
    w = _switch(dp, monkeypatch, old, new)
    assert w.calls.index("update_batch" if "update_batch" in w.calls else "update") == 0, w.calls
    assert not w.missing, w.missing


def test_a_key_both_hold_is_never_missing(dp: Datapath, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys held by both with other values (direct -> tunnel), beside keys added and dropped."""
    old = [_entry(f"10.42.{i}.0/24") for i in range(1, 40)]
    new = [_entry(f"10.42.{i}.0/24", "tunnel") for i in range(20, 60)]
    w = _switch(dp, monkeypatch, old, new)
    assert "delete_batch" in w.calls or "delete" in w.calls  # 1..19 went
    assert not w.missing, w.missing


def test_stage_leaves_dropped_entries_until_retire(dp: Datapath) -> None:
    """Datapath.stage writes the new plan and keeps what it dropped; retire deletes those; the next
    stage of the same plan writes nothing."""
    assert dp.maps is not None
    dp.sync([_entry("10.42.1.0/24"), _entry("10.42.2.0/24")], "lo")
    st = dp.stage([_entry("10.42.2.0/24", "tunnel"), _entry("10.42.0.0/16", "tunnel")], "lo")
    assert (st.added, st.changed) == (1, 1)
    held = {layout.decode_route(k, v).entry.prefix for k, v in dp.maps.routes.items().items()}
    assert held == {N("10.42.1.0/24"), N("10.42.2.0/24"), N("10.42.0.0/16")}
    assert dp.retire() == 1
    held = {layout.decode_route(k, v).entry.prefix for k, v in dp.maps.routes.items().items()}
    assert held == {N("10.42.2.0/24"), N("10.42.0.0/16")}
    assert dp.stage([_entry("10.42.2.0/24", "tunnel"), _entry("10.42.0.0/16", "tunnel")], "lo").total == 0
    assert dp.retire() == 0
