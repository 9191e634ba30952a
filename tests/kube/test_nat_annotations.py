# SPDX-License-Identifier: Apache-2.0
"""Discovered endpoints on Kubernetes Nodes: meshctl's own annotations round-trip, Kilo's
`kilo.squat.ai/discovered-endpoints` (keyed by public key, Go's net.UDPAddr JSON) is read too and
confirmed against the nodes it names, and bad values name the node and the annotation."""

from __future__ import annotations

import json

import pytest

from meshctl.backends.kube import nodes as A
from meshctl.errors import InputError
from meshctl.mesh.model import Endpoint
from meshctl.mesh.natview import nat_view

from .helpers import node_obj, wg_key


def test_own_annotations_round_trip():
    obj = node_obj("pa", "10.42.1.0/24", key=1, ann={A.DISCOVERED_ENDPOINTS: json.dumps({"ca": "203.0.113.3:20200"}),
                                                      A.UNREACHED_PEERS: "sb,sa"})
    n = A.parse_kube_node(obj)
    assert n is not None
    assert n.node.discovered_endpoints == (("ca", Endpoint("203.0.113.3", 20200)),)
    assert n.node.unreached_peers == ("sa", "sb")
    ann = A.own_annotations(n.node, "location", now=0)
    assert json.loads(ann[A.DISCOVERED_ENDPOINTS] or "") == {"ca": "203.0.113.3:20200"}
    assert ann[A.UNREACHED_PEERS] == "sa,sb"
    bare = A.parse_kube_node(node_obj("pb", "10.42.2.0/24", key=2))
    assert bare is not None
    assert A.own_annotations(bare.node, "location")[A.DISCOVERED_ENDPOINTS] is None  # removed when empty


def test_kilo_annotation_is_read_and_resolved_by_public_key():
    kilo = {wg_key(3): {"IP": "203.0.113.3", "Port": 20200, "Zone": ""}}
    pa = A.parse_kube_node(node_obj("pa", "10.42.1.0/24", key=1,
                                    ann={A.KILO_DISCOVERED_ENDPOINTS: json.dumps(kilo)}))
    pb = A.parse_kube_node(node_obj("pb", "10.42.2.0/24", key=2,
                                    ann={A.DISCOVERED_ENDPOINTS: json.dumps({"ca": "203.0.113.3:20200"})}))
    ca = A.parse_kube_node(node_obj("ca", "10.42.3.0/24", key=3, endpoint="192.168.3.2:51820"))
    assert pa and pb and ca
    assert pa.node.discovered_endpoints == ((wg_key(3), Endpoint("203.0.113.3", 20200)),)
    # Two reporters (one in Kilo's form, one in meshctl's) confirm ca's endpoint.
    assert nat_view([pa.node, pb.node, ca.node]).confirmed == {"ca": Endpoint("203.0.113.3", 20200)}


@pytest.mark.parametrize(("ann", "msg"), [
    ({A.DISCOVERED_ENDPOINTS: "{not json"}, "node pa: meshctl.io/discovered-endpoints: '{not json' is not JSON"),
    ({A.DISCOVERED_ENDPOINTS: json.dumps({"ca": "nowhere"})},
     "node pa: meshctl.io/discovered-endpoints.ca: 'nowhere' is not an endpoint: no port"),
    ({A.KILO_DISCOVERED_ENDPOINTS: json.dumps({wg_key(3): "1.2.3.4:5"})},
     f"node pa: kilo.squat.ai/discovered-endpoints.{wg_key(3)}: '1.2.3.4:5' is not an address"),
    ({A.UNREACHED_PEERS: "pa"}, "node pa: meshctl.io/unreached-peers[0]: 'pa' is the node's own name"),
])
def test_bad_values_name_node_and_annotation(ann, msg):
    with pytest.raises(InputError) as e:
        A.parse_kube_node(node_obj("pa", "10.42.1.0/24", key=1, ann=ann))
    assert str(e.value).startswith(msg), str(e.value)
