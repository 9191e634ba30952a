# SPDX-License-Identifier: Apache-2.0
"""Global services, the pure part (mesh.services) and the Lease decision: which Services are
global, what a cluster publishes, what a reader admits, and the slices a cluster should hold."""

from __future__ import annotations

import json
from dataclasses import replace
from ipaddress import ip_network
from typing import Any

import pytest

from meshctl.backends.etcd import remote_records, service_key, split_service_key
from meshctl.backends.kube.services import next_lease
from meshctl.errors import InputError
from meshctl.etcd import KeyValue
from meshctl.mesh.records import parse_topology
from meshctl.mesh.services import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MAX_SERVICE_RECORD_BYTES,
    SERVICE_NAME_LABEL,
    SLICE_ENDPOINTS,
    GlobalService,
    RecordIn,
    ServiceSettings,
    admit_services,
    desired_slices,
    local_services,
    service_settings,
    slice_changes,
    slice_name,
)

from .fixtures import CLUSTER2


def svc(name: str, ns: str = "default", **ann: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "annotations": dict(ann)}}


def eps_slice(name: str, service: str, addrs: list[tuple[str, bool | None, str]], *, ns: str = "default",
              managed: str | None = None, port: int = 80) -> dict[str, Any]:
    labels = {SERVICE_NAME_LABEL: service}
    if managed:
        labels[MANAGED_BY_LABEL] = managed
    eps = []
    for a, ready, zone in addrs:
        ep: dict[str, Any] = {"addresses": [a], "zone": zone}
        if ready is not None:
            ep["conditions"] = {"ready": ready}
        eps.append(ep)
    return {"metadata": {"name": name, "namespace": ns, "labels": labels, "resourceVersion": "7"},
            "addressType": "IPv4", "ports": [{"name": "http", "port": port, "protocol": "TCP"}], "endpoints": eps}


SETTINGS = [
    ("cilium-global", {"service.cilium.io/global": "true"}, ServiceSettings(True)),
    ("alias-global", {"meshctl.io/global": "True"}, ServiceSettings(True)),
    ("not-annotated", {}, ServiceSettings(False)),
    ("global-false", {"service.cilium.io/global": "false"}, ServiceSettings(False)),
    ("not-shared-remote-affinity", {"service.cilium.io/global": "true", "service.cilium.io/shared": "false",
                                    "service.cilium.io/affinity": "remote"},
     ServiceSettings(True, shared=False, affinity="remote")),
    ("bad-global", {"service.cilium.io/global": "yes"},
     "service default/web: annotations.service.cilium.io/global: 'yes' is not true or false"),
    ("bad-affinity", {"service.cilium.io/global": "true", "service.cilium.io/affinity": "near"},
     "service default/web: annotations.service.cilium.io/affinity: 'near' is not one of local|remote|none"),
    ("bad-shared", {"service.cilium.io/shared": "0"},
     "service default/web: annotations.service.cilium.io/shared: '0' is not true or false"),
]


@pytest.mark.parametrize(("ann", "want"), [c[1:] for c in SETTINGS], ids=[c[0] for c in SETTINGS])
def test_service_settings(ann: dict[str, str], want: ServiceSettings | str) -> None:
    if isinstance(want, str):
        with pytest.raises(InputError) as e:
            service_settings(svc("web", **ann))
        assert str(e.value) == want
    else:
        assert service_settings(svc("web", **ann)) == want


def test_local_services_publish_ready_own_endpoints_only() -> None:
    """Annotated Services only: an MCS export makes a ServiceImport (mesh.mcs), not a global
    Service, so the exported Service's own name stays the cluster's."""
    services = [svc("web", **{"service.cilium.io/global": "true"}), svc("db"),
                svc("quiet", **{"service.cilium.io/global": "true", "service.cilium.io/shared": "false"}),
                svc("bad", **{"service.cilium.io/global": "maybe"}), svc("mcs", "apps")]
    slices = [
        eps_slice("web-abc", "web", [("10.42.1.5", True, "z1"), ("10.42.1.6", False, "z1"),
                                     ("10.42.2.7", None, "z2")]),
        # imported: never published back
        eps_slice("web-cluster2-v4-0", "web", [("10.43.1.9", True, "gpu")], managed=MANAGED_BY),
        eps_slice("quiet-1", "quiet", [("10.42.1.8", True, "z1")]),
        eps_slice("mcs-1", "mcs", [("10.42.3.3", True, "z3")], ns="apps", port=8080),
    ]
    got = local_services("cluster1", services, slices)
    assert set(got.settings) == {("default", "web"), ("default", "quiet")}
    assert set(got.published) == {("default", "web")}  # quiet: shared false
    web = got.published[("default", "web")].to_record()
    assert web == {"cluster": "cluster1", "namespace": "default", "name": "web",
                   "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
                   "endpoints": [{"addresses": ["10.42.1.5"], "zone": "z1"},
                                 {"addresses": ["10.42.2.7"], "zone": "z2"}]}
    assert {r.name: r.reason for r in got.rejections} == {
        "service/default/bad": "service default/bad: annotations.service.cilium.io/global: 'maybe' is not true or "
                               "false",
    }
    assert got.zones == ("z1", "z2", "z3")


def record(cluster: str, name: str, addrs: list[str], *, ns: str = "default", **extra: Any) -> bytes:
    d = {"cluster": cluster, "namespace": ns, "name": name, "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
         "endpoints": [{"addresses": [a], "zone": "gpu-a"} for a in addrs], **extra}
    return json.dumps(d).encode()


class Mirror:
    """A remote cluster's mirror as the cluster-mesh watcher holds it."""

    def __init__(self, kvs: list[KeyValue]) -> None:
        self.kvs = kvs

    def records_under(self, prefix: str) -> list[KeyValue]:
        return [kv for kv in self.kvs if kv.key.startswith(prefix)]


def rin(source: str, key_cluster: str, name: str, value: bytes) -> RecordIn:
    """The record as the reader decodes it from `source`'s mirror (remote_records); a key under
    another cluster's prefix, which no watcher mirrors, as if it had been."""
    key = service_key(key_cluster, "default", name)
    if key_cluster != source:
        return RecordIn(source, key_cluster, "default", name, key, json.loads(value))
    [r] = remote_records({source: Mirror([KeyValue(key, value, 1, 1)])}, {source})
    return r


C2_NODES = {"cluster2": parse_topology(CLUSTER2).nodes}  # pod CIDRs 10.43.1.0/24 .. 10.43.4.0/24

ADMIT = [
    ("good", [rin("cluster2", "cluster2", "web", record("cluster2", "web", ["10.43.1.5", "10.43.4.9"]))],
     {"default/web": ["10.43.1.5", "10.43.4.9"]}, {}),
    ("endpoint-outside-pod-cidrs-rejected-alone",
     [rin("cluster2", "cluster2", "web", record("cluster2", "web", ["10.43.1.5", "10.99.0.5"]))],
     {"default/web": ["10.43.1.5"]},
     {"cluster2/services/default/web/10.99.0.5": "/meshctl/cluster2/services/default/web.endpoints[1]: '10.99.0.5' "
                                                 "is in no pod CIDR of cluster cluster2's admitted nodes"}),
    ("record-naming-another-cluster", [rin("cluster2", "cluster2", "web", record("cluster3", "web", ["10.43.1.5"])),
                                       rin("cluster2", "cluster2", "api", record("cluster2", "api", ["10.43.2.1"]))],
     {"default/api": ["10.43.2.1"]},
     {"cluster2/services/default/web": "/meshctl/cluster2/services/default/web.cluster: 'cluster3' is not its key's "
                                       "'cluster2'"}),
    ("key-of-another-cluster", [rin("cluster2", "cluster3", "web", record("cluster3", "web", ["10.43.1.5"]))], {},
     {"cluster2/services/default/web": "/meshctl/cluster3/services/default/web: cluster cluster2 cannot publish for "
                                       "cluster cluster3"}),
    ("not-json", [rin("cluster2", "cluster2", "web", b"{nope")], {},
     {"cluster2/services/default/web": "/meshctl/cluster2/services/default/web: '{nope' is not JSON"}),
    ("too-large", [rin("cluster2", "cluster2", "web", b" " * (MAX_SERVICE_RECORD_BYTES + 1))], {},
     {"cluster2/services/default/web": f"/meshctl/cluster2/services/default/web: '{MAX_SERVICE_RECORD_BYTES + 1} "
                                       f"bytes' is larger than a record may be "
                                       f"({MAX_SERVICE_RECORD_BYTES} bytes)"}),
    ("bad-port", [rin("cluster2", "cluster2", "web", record("cluster2", "web", ["10.43.1.5"],
                                                           ports=[{"port": 70000}]))], {},
     {"cluster2/services/default/web": "/meshctl/cluster2/services/default/web.ports[0].port: 70000 is not a port "
                                       "in 1..65535"}),
    ("cluster-without-admitted-nodes", [rin("cluster9", "cluster9", "web", record("cluster9", "web", ["10.43.1.5"]))],
     {"default/web": []},
     {"cluster9/services/default/web/10.43.1.5": "/meshctl/cluster9/services/default/web.endpoints[0]: '10.43.1.5' is "
                                                 "in no pod CIDR of cluster cluster9's admitted nodes"}),
]


@pytest.mark.parametrize(("records", "want", "rejected"), [c[1:] for c in ADMIT], ids=[c[0] for c in ADMIT])
def test_admit_services(records: list[RecordIn], want: dict[str, list[str]], rejected: dict[str, str]) -> None:
    got, rej = admit_services(records, C2_NODES)
    assert {s.ref: [str(e.address) for e in s.endpoints] for s in got} == want
    assert {r.name: r.reason for r in rej} == rejected


# cluster2's g1 dual stack, and g2 holding two IPv4 blocks (a CNI's IPAM, read from etcd).
C2_MULTI = {"cluster2": tuple(
    replace(n, pod_cidrs=(n.pod_cidrs[0], ip_network("fd00:43:1::/64"))) if n.name == "g1" else
    replace(n, pod_cidrs=(n.pod_cidrs[0], ip_network("10.43.200.0/26"))) if n.name == "g2" else n
    for n in C2_NODES["cluster2"])}

ADMIT_MULTI = [
    ("ipv6-endpoint-in-a-dual-stack-node", ["fd00:43:1::7"], ["fd00:43:1::7"]),
    ("endpoint-in-a-nodes-second-block", ["10.43.200.9", "10.43.2.4"], ["10.43.200.9", "10.43.2.4"]),
    ("outside-every-cidr-of-every-node", ["10.43.200.99", "fd00:43:2::1"], []),
]


@pytest.mark.parametrize(("addrs", "want"), [c[1:] for c in ADMIT_MULTI], ids=[c[0] for c in ADMIT_MULTI])
def test_admit_services_uses_every_pod_cidr_of_a_node(addrs: list[str], want: list[str]) -> None:
    """An endpoint is admitted inside ANY of a node's pod CIDRs (each family, each block), and
    still nowhere else."""
    got, rej = admit_services([rin("cluster2", "cluster2", "web", record("cluster2", "web", addrs))], C2_MULTI)
    assert [str(e.address) for s in got for e in s.endpoints] == want
    assert len(rej) == len(addrs) - len(want)


def test_service_keys_round_trip() -> None:
    assert split_service_key(service_key("cluster2", "apps", "web")) == ("cluster2", "apps", "web")
    for other in ("/meshctl/cluster2/nodes/g1", "/meshctl/cluster2/services/web", "/other/c/services/a/b"):
        assert split_service_key(other) is None, other


def remote_web(addrs: list[str], cluster: str = "cluster2", name: str = "web") -> GlobalService:
    got, rej = admit_services([rin(cluster, cluster, name, record(cluster, name, addrs))],
                              {cluster: parse_topology(CLUSTER2).nodes})
    assert not rej
    return got[0]


def local_with(affinity: str | None = None, **more: str) -> Any:
    ann = {"service.cilium.io/global": "true", **more}
    if affinity:
        ann["service.cilium.io/affinity"] = affinity
    return local_services("cluster1", [svc("web", **ann)],
                          [eps_slice("web-1", "web", [("10.42.1.5", True, "z1"), ("10.42.2.5", True, "z2")])])


HINTS = [
    ("none", None, None),
    ("local", "local", {"forZones": [{"name": "gpu-a"}]}),
    ("remote", "remote", {"forZones": [{"name": "z1"}, {"name": "z2"}]}),
]


@pytest.mark.parametrize(("affinity", "hints"), [c[1:] for c in HINTS], ids=[c[0] for c in HINTS])
def test_desired_slices_carry_labels_and_affinity_hints(affinity: str | None, hints: Any) -> None:
    want = desired_slices(local_with(affinity), [remote_web(["10.43.1.5", "10.43.2.6"])])
    assert list(want) == [("default", "web-cluster2-v4-0")]
    s = want[("default", "web-cluster2-v4-0")]
    assert s["metadata"]["labels"] == {SERVICE_NAME_LABEL: "web", MANAGED_BY_LABEL: "meshctl.io",
                                       "meshctl.io/source-cluster": "cluster2"}
    assert s["addressType"] == "IPv4" and s["ports"] == [{"name": "http", "port": 80, "protocol": "TCP"}]
    assert [e["addresses"] for e in s["endpoints"]] == [["10.43.1.5"], ["10.43.2.6"]]
    assert all(e.get("hints") == hints for e in s["endpoints"])


def test_desired_slices_only_for_services_global_here_and_chunked() -> None:
    not_here = local_services("cluster1", [svc("web")], [])
    assert desired_slices(not_here, [remote_web(["10.43.1.5"])]) == {}
    many = [f"10.43.1.{i}" for i in range(1, SLICE_ENDPOINTS + 6)]
    want = desired_slices(local_with(), [remote_web(many)])
    assert sorted(want) == [("default", "web-cluster2-v4-0"), ("default", "web-cluster2-v4-1")]
    assert [len(s["endpoints"]) for _, s in sorted(want.items())] == [SLICE_ENDPOINTS, 5]


def test_slice_changes_touch_only_meshctl_slices() -> None:
    want = desired_slices(local_with(), [remote_web(["10.43.1.5"]), remote_web(["10.43.2.5"], name="api")])
    local = local_with()
    assert ("default", "api-cluster2-v4-0") not in want  # api is not global here
    mine_stale = eps_slice("web-cluster2-v4-0", "web", [("10.43.1.99", True, "gpu-a")], managed=MANAGED_BY)
    mine_gone = eps_slice("old-cluster3-v4-0", "old", [("10.44.1.1", True, "")], managed=MANAGED_BY)
    theirs = eps_slice("web-x", "web", [("10.42.1.5", True, "z1")])
    theirs_same_name = eps_slice("web-cluster2-v4-0", "web", [("10.42.9.9", True, "")], ns="other",
                                 managed="someone-else")
    ch = slice_changes([mine_stale, mine_gone, theirs, theirs_same_name], want)
    assert [u["metadata"]["name"] for u in ch.updates] == ["web-cluster2-v4-0"]
    assert ch.updates[0]["metadata"]["resourceVersion"] == "7"
    assert ch.creates == () and ch.deletes == (("default", "old-cluster3-v4-0"),)
    # A desired name someone else already holds is left to them: neither created nor replaced.
    clash = eps_slice("web-cluster2-v4-0", "web", [("10.42.9.9", True, "")], managed="someone-else")
    assert not slice_changes([clash], want)
    # Once in place, nothing to do.
    in_place = [{**want[k], "metadata": {**want[k]["metadata"], "resourceVersion": "9"}} for k in want]
    assert not slice_changes(in_place, desired_slices(local, [remote_web(["10.43.1.5"])]))


def lease(holder: str | None, rv: str = "5", transitions: int = 2, duration: int = 15) -> dict[str, Any]:
    return {"metadata": {"name": "l", "namespace": "meshctl", "resourceVersion": rv},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "acquireTime": "t0",
                     "renewTime": "t1", "leaseTransitions": transitions}}


LEASES = [
    # name, lease, observed at, now -> holder written (None: not ours), transitions, rv carried
    ("no-lease-created", None, 0.0, 0.0, "a1", 0, None),
    ("other-holder-still-valid", lease("a2"), 100.0, 114.0, None, None, None),
    ("other-holder-unrenewed-for-its-duration", lease("a2"), 100.0, 115.5, "a1", 3, "5"),
    ("own-lease-renewed", lease("a1"), 100.0, 101.0, "a1", 2, "5"),
    ("released-lease-taken", lease(None), 100.0, 100.0, "a1", 3, "5"),
]


@pytest.mark.parametrize(("current", "observed", "now", "holder", "transitions", "rv"), [c[1:] for c in LEASES],
                         ids=[c[0] for c in LEASES])
def test_next_lease_follows_client_go(current: Any, observed: float, now: float, holder: str | None,
                                      transitions: int | None, rv: str | None) -> None:
    got = next_lease(current, "a1", "meshctl", "l", now=now, observed_at=observed, duration=15, wall=1.7e9)
    if holder is None:
        assert got is None
        return
    assert got is not None
    assert got["spec"]["holderIdentity"] == holder and got["spec"]["leaseTransitions"] == transitions
    assert got["metadata"].get("resourceVersion") == rv
    assert got["spec"]["renewTime"].startswith("2023-11-14T22:13:20.000000")
    # the acquire time stays while we hold it, and is new when we take it
    assert (got["spec"]["acquireTime"] == "t0") == (current is not None and current["spec"]["holderIdentity"] == "a1")


def test_long_slice_names_are_cut_with_a_stable_hash() -> None:
    long = "a" * 60
    names = {slice_name(long, "cluster2", 4, i) for i in range(3)}
    assert len(names) == 3 and all(len(n) <= 63 for n in names)
    assert slice_name(long, "cluster2", 4, 0) == slice_name(long, "cluster2", 4, 0)
    assert slice_name("web", "cluster2", 6, 1) == "web-cluster2-v6-1"


def test_slices_of_a_cluster_not_connected_yet_are_kept() -> None:
    stale = eps_slice("web-cluster2-v4-0", "web", [("10.43.1.99", True, "")], managed=MANAGED_BY)
    stale["metadata"]["labels"]["meshctl.io/source-cluster"] = "cluster2"
    assert slice_changes([stale], {}).deletes == (("default", "web-cluster2-v4-0"),)
    assert not slice_changes([stale], {}, keep={"cluster2"})
