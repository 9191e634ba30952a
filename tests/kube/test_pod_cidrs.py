# SPDX-License-Identifier: Apache-2.0
"""A Node's pod CIDRs: `spec.podCIDRs` (one per family, as the controller manager allocates them
for a dual-stack cluster), else `spec.podCIDR`. A dual-stack Node plans both families; a bad one is
rejected alone, named and counted, and the other Nodes go on."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from meshctl.backends.kube.backend import state_from_objects
from meshctl.mesh.model import Cluster, MeshSettings

from .helpers import create_node, node_obj
from .test_backend import backend, plan_of

V4, V6 = "10.42.2.0/24", "fd00:42:2::/64"


def dual(name: str, cidrs: Any, *, key: int, single: str | None = None) -> dict[str, Any]:
    """A Node with `spec.podCIDRs` (and `spec.podCIDR`, as Kubernetes writes the first of them)."""
    obj = node_obj(name, single, key=key, endpoint=f"198.51.100.{key}:51820")
    obj["spec"]["podCIDRs"] = cidrs
    return obj


def test_node_with_pod_cidrs_in_both_families_plans_both(api, kclient) -> None:
    create_node(kclient, node_obj("a1", "10.42.1.0/24", key=1, endpoint="198.51.100.1:51820"))
    create_node(kclient, dual("a2", [V4, V6], key=2, single=V4))
    st = backend(api).snapshot()
    assert st.rejections == ()
    a2 = next(n for n in st.nodes if n.name == "a2")
    assert [str(c) for c in a2.pod_cidrs] == [V4, V6]
    plan = plan_of(st, "a1")
    peer = next(p for p in plan.peers if p.name == "a2")
    for c in (V4, V6):
        assert c in [str(r.dst) for r in plan.routes], c
        assert c in [str(a) for a in peer.allowed_ips], c
        assert c in [str(e.prefix) for e in plan.fastpath], c


@pytest.mark.parametrize("spec, line", [
    pytest.param({"podCIDRs": [V4, "10.42.3.0/24"]},
                 f"node a2: spec.podCIDRs[1]: '10.42.3.0/24' is a second IPv4 pod CIDR (after {V4}): one per family",
                 id="two CIDRs of one family"),
    pytest.param({"podCIDRs": [V4, "fd00:42:2::/129"]}, "node a2: spec.podCIDRs[1]: 'fd00:42:2::/129' is not a CIDR",
                 id="a /129"),
    pytest.param({"podCIDRs": [V4, "fd00:42:2::%eth0/64"]},
                 "node a2: spec.podCIDRs[1]: 'fd00:42:2::%eth0/64' has a zone index (%...): write the address "
                 "without it", id="a zone index"),
    pytest.param({"podCIDRs": V4}, f"node a2: spec.podCIDRs: '{V4}' is not a list of CIDRs", id="not a list"),
    pytest.param({"podCIDR": "10.42.2.0/33"}, "node a2: spec.podCIDR: '10.42.2.0/33' is not a CIDR",
                 id="a bad spec.podCIDR"),
])
def test_bad_pod_cidrs_reject_the_node_alone(spec: dict[str, Any], line: str) -> None:
    bad = node_obj("a2", None, key=2)
    bad["spec"] = spec
    objs = [node_obj("a1", "10.42.1.0/24", key=1), bad, node_obj("a3", "10.42.3.0/24", key=3)]
    st = state_from_objects(objs, [], Cluster(), MeshSettings(), now=0, max_age=1e12)
    assert [(r.name, r.reason) for r in st.rejections] == [("a2", line)]
    assert [n.name for n in st.nodes] == ["a1", "a3"]


@pytest.mark.parametrize("spec, message", [
    pytest.param({"podCIDRs": [V4, "10.42.3.0/24"]}, "may specify no more than one CIDR for each IP family",
                 id="two CIDRs of one family"),
    pytest.param({"podCIDRs": [V4, "fd00:42:2::/129"]}, "must be a valid CIDR value", id="a /129"),
    pytest.param({"podCIDR": "10.42.2.0/33"}, "must be a valid CIDR value", id="a bad spec.podCIDR"),
])
def test_the_api_server_refuses_what_it_can_tell_is_not_a_cidr(api, kclient, spec: dict[str, Any],
                                                               message: str) -> None:
    """A real cluster never hands an agent these (the backend's own checks above are for the rest)."""
    from lightkube import ApiError

    obj = node_obj("a2", None, key=2)
    obj["spec"] = spec
    with pytest.raises(ApiError) as e:
        create_node(kclient, obj)
    assert e.value.status.code == 422 and message in (e.value.status.message or ""), e.value.status.message


def test_bad_pod_cidrs_are_counted_by_the_backend(api, kclient) -> None:
    """What the API server accepts and meshctl does not: Go's lenient parser reads `010.42.3.0/24`
    as 10.42.3.0/24, Python's refuses the leading zero (octal or decimal?); the node is rejected
    alone, named and counted, and a dual-stack node beside it plans both families."""
    create_node(kclient, node_obj("a1", "10.42.1.0/24", key=1))
    create_node(kclient, dual("a2", ["010.42.3.0/24"], key=2))
    create_node(kclient, dual("a3", ["10.42.4.0/24", "fd00:42:4::/64"], key=3))
    reg = CollectorRegistry()
    st = backend(api, registry=reg).snapshot()
    assert [n.name for n in st.nodes] == ["a1", "a3"]
    assert [(r.name, r.reason) for r in st.rejections] == [
        ("a2", "node a2: spec.podCIDRs[0]: '010.42.3.0/24' is not a CIDR")]
    assert reg.get_sample_value("meshctl_kube_rejected_records") == 1
