# SPDX-License-Identifier: Apache-2.0
"""The memory layout of records (issue 23, 50,000 nodes): slotted records whose derived values
follow their fields through replace, copy and pickle, and one object per network."""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from meshctl.mesh.model import Endpoint, Node, host_net, interned, network_of
from meshctl.node.prefixes import parse_prefix

NODE = Node("g1", (ipaddress.ip_network("10.43.1.0/24"), ipaddress.ip_network("fd43::/64")), "k" * 43 + "=",
            location="x", internal_ip=ipaddress.ip_interface("10.20.0.1/24"), endpoint=Endpoint("198.51.100.3", 51820),
            cluster="cluster2")


def derived(n: Node) -> tuple[object, ...]:
    return (n.pod_spans, n.pod_families, n.families, n.reachable_endpoint, n.qualified_name, n.internal_keys,
            hash(n))


@pytest.mark.parametrize("remake", [
    pytest.param(lambda n: pickle.loads(pickle.dumps(n)), id="pickle"),
    pytest.param(copy.copy, id="copy"),
    pytest.param(copy.deepcopy, id="deepcopy"),
])
def test_a_node_made_again_derives_the_same_values(remake: Callable[[Node], Node]) -> None:
    again = remake(NODE)
    assert again == NODE and derived(again) == derived(NODE)
    assert not hasattr(again, "__dict__")


def test_replace_derives_from_the_new_fields() -> None:
    moved = dataclasses.replace(NODE, cluster="", endpoint=Endpoint("10.0.0.9", 51820))
    assert moved.qualified_name == "g1"
    assert moved.reachable_endpoint is None and moved.endpoint == Endpoint("10.0.0.9", 51820)
    assert moved.families == frozenset({4})


def test_an_endpoint_made_again_keeps_its_address() -> None:
    ep = pickle.loads(pickle.dumps(Endpoint("fd00::1", 51820)))
    assert ep.ip == ipaddress.ip_address("fd00::1") and ep.family == 6 and not ep.is_public
    assert Endpoint("wg.example.net", 1).family == 0 and Endpoint("wg.example.net", 1).is_public


@pytest.mark.parametrize("text,network", [
    pytest.param("10.4.0.0/16", "10.4.0.0/16", id="a network"),
    pytest.param("10.4.0.5", "10.4.0.5/32", id="an address alone is a host prefix"),
    pytest.param("10.4.0.5/24", "10.4.0.0/24", id="host bits masked"),
    pytest.param("fd00::1", "fd00::1/128", id="an IPv6 address alone"),
])
def test_parse_prefix_gives_the_one_object_of_its_network(text: str, network: str) -> None:
    net = parse_prefix(text)
    assert net == ipaddress.ip_network(network)
    assert parse_prefix(text) is net and interned(ipaddress.ip_network(network)) is net
    assert network_of(net.version, int(net.network_address), net.prefixlen) is net


@pytest.mark.parametrize("text", [
    pytest.param("10.4.0.0/33", id="prefix too long"),
    pytest.param("fd00::/129", id="IPv6 prefix too long"),
    pytest.param("10.4.0.0/x", id="prefix not a number"),
    pytest.param("10.4.0/8", id="not an address"),
])
def test_parse_prefix_refuses_what_is_not_a_prefix(text: str) -> None:
    with pytest.raises(ValueError):
        parse_prefix(text)


def test_a_host_prefix_carries_no_closure_and_is_shared() -> None:
    iface = ipaddress.ip_interface("100.64.9.9/24")
    net: Any = host_net(iface)
    assert net == ipaddress.ip_network("100.64.9.9/32") and "hosts" not in vars(net)
    assert parse_prefix("100.64.9.9") is net
