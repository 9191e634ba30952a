# SPDX-License-Identifier: Apache-2.0
"""The kernel fallback of global ranges (node/global_ranges.py): the table it writes, and the
applier writing it only when it changes and removing it (traffic through it:
tests/clustermesh/test_global_ranges_lab.py, with cluster2's agents on --no-fastpath)."""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator

import pytest

from meshctl.lab.rigs import netns
from meshctl.node import global_ranges
from meshctl.node.global_ranges import TABLE, TranslationApplier, ruleset
from meshctl.setns import in_netns
from tests.names import unique

N = ipaddress.ip_network
RANGES = ((N("10.42.0.0/16"), N("10.142.0.0/16")), (N("fd42:42::/48"), N("fd42:142::/48")))


def test_the_table_rewrites_each_range_with_its_host_mask() -> None:
    text = ruleset(RANGES, [N("fd42:143:0:1::/64"), N("10.143.2.0/24"), N("10.143.1.0/24")])
    assert "set leaving4 { type ipv4_addr; flags interval; elements = { 10.143.1.0/24, 10.143.2.0/24 }; }" in text
    assert "    ip daddr 10.142.0.0/16 ip daddr set ip daddr & 0.0.255.255 | 10.42.0.0" in text
    assert "    ip saddr 10.42.0.0/16 ip daddr @leaving4 ip saddr set ip saddr & 0.0.255.255 | 10.142.0.0" in text
    assert "    ip6 daddr fd42:142::/48 ip6 daddr set ip6 daddr & ::ffff:ffff:ffff:ffff:ffff | fd42:42::" in text
    assert "type filter hook prerouting priority raw - 10" in text  # before conntrack
    assert "type filter hook postrouting priority srcnat + 10" in text  # after masquerade's decision
    empty = ruleset(RANGES[:1], [])
    assert "set leaving6 { type ipv6_addr; flags interval; }" in empty


@pytest.fixture
def ns() -> Iterator[str]:
    name = unique("gn")
    netns.add(name)
    try:
        yield name
    finally:
        netns.delete(name)


@pytest.mark.root
def test_the_applier_writes_on_change_and_removes_the_table(ns: str, monkeypatch: pytest.MonkeyPatch) -> None:
    a = TranslationApplier()

    def listed() -> str:
        return netns.run(ns, ["nft", "list", "table", "inet", TABLE], check=False).stdout

    def sync(*args: object) -> bool:
        return in_netns(ns, lambda: a.sync(*args))  # type: ignore[arg-type]

    assert sync(RANGES, [N("10.143.1.0/24")]) is True
    assert "10.143.1.0/24" in listed() and "ip daddr 10.142.0.0/16" in listed()
    assert sync(RANGES, [N("10.143.1.0/24")]) is False  # nothing changed: nothing written
    assert sync(RANGES, [N("10.143.1.0/24"), N("10.143.2.0/24")]) is True
    assert "10.143.2.0/24" in listed()
    netns.run(ns, ["nft", "delete", "table", "inet", TABLE])  # drift behind the applier's back
    a.forget()
    assert sync(RANGES, [N("10.143.1.0/24")]) is True and listed()
    assert in_netns(ns, a.clear) is True and listed() == ""
    assert in_netns(ns, a.present) is False
    # A full resync of a node without global ranges: the table is known absent, no nft runs.
    a.forget()
    ran: list[object] = []
    real = global_ranges.sh
    monkeypatch.setattr(global_ranges, "sh", lambda *args, **kw: ran.append(args) or real(*args, **kw))
    assert in_netns(ns, a.clear) is False and ran == []
    # A new applier (the agent started again) removes the table an earlier run left.
    netns.run(ns, ["nft", "add", "table", "inet", TABLE])
    assert in_netns(ns, TranslationApplier().clear) is True and listed() == "" and len(ran) == 1
