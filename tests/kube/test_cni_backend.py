# SPDX-License-Identifier: Apache-2.0
"""`--cni calico|cilium` through a real kube-apiserver (tests/kubernetes.py): the Kubernetes backend
watches the CNI's IPAM objects (CRDs with a v1 schema, created through the API), a bad record is
rejected alone, named, counted and logged, and a moved block reaches the snapshot through the watch."""

from __future__ import annotations

import logging
import time

from lightkube.generic_resource import create_global_resource
from lightkube.types import PatchType
from prometheus_client import CollectorRegistry

from meshctl.backends.kube.cni_ipam import BLOCK_AFFINITIES, CILIUM_NODES, IPAM_BLOCKS, CrdKind
from meshctl.lab.namespaces import cni_calico, cni_cilium
from meshctl.lab.namespaces.kube_cluster import wait_established
from meshctl.mesh.model import Topology
from tests.kubernetes import Api

from .helpers import Running, create_node, node_obj, wait_for
from .test_backend import backend
from .test_cni_ipam import nets


def resource(kind: CrdKind) -> type:
    return create_global_resource(kind.group, kind.version, kind.kind, kind.plural)


def create(kclient, kind: CrdKind, obj: dict) -> None:
    kclient.create(resource(kind).from_dict(obj))


def crds(api: Api, *kinds: CrdKind) -> None:
    api.apply(*(cni_calico.crd(k) for k in kinds))
    for k in kinds:
        wait_established(lambda args: api.kubectl(*args), k.name)


def pod_cidrs(st) -> dict[str, tuple]:
    return {n.name: n.pod_cidrs for n in st.nodes}


def test_calico_block_claimed_by_two_nodes_is_rejected_alone_and_a_moved_block_is_watched(api, kclient, caplog):
    crds(api, BLOCK_AFFINITIES, IPAM_BLOCKS)
    for i, name in enumerate(("a", "b", "c"), 1):
        create_node(kclient, node_obj(name, None, key=i))
    (a0, a1), (b0,), (c0,) = nets("10.42.0.0/26", "10.42.0.64/26"), nets("10.42.1.0/26"), nets("10.42.2.0/26")
    for node, block in (("a", a0), ("a", a1), ("b", b0), ("c", c0)):
        create(kclient, BLOCK_AFFINITIES, cni_calico.affinity_object(node, block))
        create(kclient, IPAM_BLOCKS, cni_calico.block_object("b" if block == a1 else node, block))  # a1: b's too
    reg = CollectorRegistry()
    be = backend(api, "a", registry=reg, cni="calico")
    with caplog.at_level(logging.WARNING, logger="meshctl.kube"):
        st = be.snapshot()
    assert pod_cidrs(st) == {"a": (a0,), "b": (b0,), "c": (c0,)}  # every node goes on; a0 alone is a's
    (r,) = st.rejections
    assert r.name == "block 10.42.0.64/26" and "claimed by nodes a, b" in r.reason
    assert reg.get_sample_value("meshctl_kube_rejected_records") == 1
    assert "rejected calico block 10.42.0.64/26: claimed by nodes a, b" in caplog.text
    # c's only block moves to b (Calico's order: c's affinity goes, then b claims it), seen by the watch.
    with Running(be):
        wait_for(lambda: be.snapshot().nodes and all(k.listed for k in be._kinds), what="every kind listed")
        relists = be.stats["relists"]
        t0 = time.monotonic()
        kclient.delete(resource(BLOCK_AFFINITIES), f"c-{cni_calico.block_name(c0)}")
        create(kclient, BLOCK_AFFINITIES, cni_calico.affinity_object("b", c0))
        kclient.patch(resource(IPAM_BLOCKS), cni_calico.block_name(c0), {"spec": {"affinity": "host:b"}},
                      patch_type=PatchType.MERGE)
        # well inside the 30 s resync, and without a relist: the watch brought it
        wait_for(lambda: be.pod_cidrs is not None and be.snapshot() and be.pod_cidrs.by_node.get("b") == (b0, c0),
                 timeout=10.0, what="b holding c's block")
        took = time.monotonic() - t0
        assert pod_cidrs(be.snapshot())["b"] == (b0, c0)  # both of b's blocks are its record's
        assert be.stats["relists"] == relists
    assert "c" not in be.pod_cidrs.by_node
    print(f"a moved block reached the snapshot {took:.3f} s after its objects changed")


def test_ciliumnode_overlapping_another_is_rejected_alone(api, kclient):
    crds(api, CILIUM_NODES)
    for i, name in enumerate(("a", "b", "c"), 1):
        create_node(kclient, node_obj(name, "10.99.0.0/24", key=i))  # spec.podCIDR is not Cilium's here
    topo_like = {"a": "10.0.0.0/24", "b": "10.0.0.128/25", "c": "10.0.2.0/24"}
    for name, cidr in topo_like.items():  # the server's creationTimestamp orders them (seconds: the name breaks a tie)
        obj = {"apiVersion": "cilium.io/v2", "kind": "CiliumNode", "metadata": {"name": name},
               "spec": {"ipam": {"podCIDRs": [cidr]}}}
        create(kclient, CILIUM_NODES, obj)
    reg = CollectorRegistry()
    st = backend(api, "a", registry=reg, cni="cilium").snapshot()
    assert {n: [str(c) for c in cs] for n, cs in pod_cidrs(st).items()} == {"a": ["10.0.0.0/24"],
                                                                              "c": ["10.0.2.0/24"]}
    assert [r.name for r in st.rejections] == ["b"]
    assert "ciliumnode b: spec.ipam.podCIDRs '10.0.0.128/25' overlaps node a's pod CIDR" in st.rejections[0].reason
    assert reg.get_sample_value("meshctl_kube_rejected_records") == 1
    assert st.pending == {"b": "its CNI's IPAM has given it no pod CIDR yet"}


def test_lab_seed_objects_are_what_the_readers_read() -> None:
    from meshctl.backends.kube.cni_ipam import calico_pod_cidrs, cilium_pod_cidrs
    from meshctl.lab.namespaces.spec import load_lab

    labs = cni_calico.__file__.rsplit("/namespaces/", 1)[0] + "/labs"
    topo: Topology = load_lab(f"{labs}/calico.yaml").clusters[0]
    objs = cni_calico.seed(topo)
    got = calico_pod_cidrs([o for o in objs if o["kind"] == "BlockAffinity"],
                           [o for o in objs if o["kind"] == "IPAMBlock"])
    assert got.rejections == () and all(len(v) == cni_calico.BLOCKS_PER_NODE for v in got.by_node.values())
    topo = load_lab(f"{labs}/cilium.yaml").clusters[0]
    got = cilium_pod_cidrs([o for o in cni_cilium.seed(topo) if o["kind"] == "CiliumNode"])
    assert dict(got.by_node) == {n.name: n.pod_cidrs for n in topo.nodes}
