# SPDX-License-Identifier: Apache-2.0
"""The Multi-Cluster Services API, the pure part (mesh.mcs): what a cluster exports and the Valid
condition, how exports merge into one import (the oldest wins a conflict, ports are the union),
the Conflict and Imported conditions, the objects a cluster holds for its imports, and the
clusterset.local answers."""

from __future__ import annotations

import json
from ipaddress import ip_address
from typing import Any

import pytest

from meshctl.backends.etcd import MCS_EXPORTS, mcs_key, remote_records
from meshctl.errors import InputError
from meshctl.etcd import KeyValue
from meshctl.mesh.mcs import (
    CLUSTERSET_IP,
    HEADLESS,
    IMPORTED,
    MCS_SERVICE_NAME_LABEL,
    MCS_SOURCE_CLUSTER_LABEL,
    OTHER_CLUSTERS_ZONE,
    Condition,
    Export,
    answer,
    check_name,
    clusterset_zone,
    derived_name,
    desired_objects,
    export_conditions,
    local_exports,
    merge_all,
    merge_exports,
    parse_export_record,
    same_service,
    with_times,
)
from meshctl.mesh.records import parse_topology
from meshctl.mesh.services import (
    MANAGED_BY_LABEL,
    MCS_MANAGED_BY,
    SERVICE_NAME_LABEL,
    ServiceEndpoint,
    ServicePort,
    admit_records,
)

from .fixtures import CLUSTER2
from .test_services import Mirror

ECHO7 = ServicePort("echo", 7)


def export(cluster: str, created: str = "2026-01-01T00:00:00Z", *, typ: str = CLUSTERSET_IP, name: str = "web",
           ports: tuple[ServicePort, ...] = (ECHO7,), eps: tuple[tuple[str, str], ...] = (("10.43.1.5", ""),),
           ns: str = "default", local_first: bool = False) -> Export:
    return Export(cluster, ns, name, typ, created, ports, (ServicePort("echo", 8080),),
                  tuple(ServiceEndpoint(ip_address(a), "", h) for a, h in eps), local_first)


def svc(name: str, ns: str = "default", **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns},
            "spec": {"ports": [{"name": "echo", "port": 7, "protocol": "TCP", "targetPort": 8080}], **spec}}


def svc_export(name: str, ns: str = "default", created: str = "2026-01-01T00:00:00Z", **ann: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "creationTimestamp": created, "annotations": ann}}


def controller_slice(service: str, eps: list[dict[str, Any]], ns: str = "default", **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": f"{service}-x", "namespace": ns,
                         "labels": {SERVICE_NAME_LABEL: service,
                                    MANAGED_BY_LABEL: "endpointslice-controller.k8s.io", **labels}},
            "addressType": "IPv4", "ports": [{"name": "echo", "port": 8080, "protocol": "TCP"}], "endpoints": eps}


# --- exports and Valid --------------------------------------------------------------------------


def test_local_exports_judge_each_export_against_its_service() -> None:
    services = [svc("web"), svc("db", clusterIP="None"), svc("ext", type="ExternalName", externalName="x.example")]
    exports = [svc_export("web", **{"meshctl.io/local-first": "true"}), svc_export("db"), svc_export("ext"),
               svc_export("ghost")]
    slices = [controller_slice("web", [{"addresses": ["10.42.1.5"], "conditions": {"ready": True}, "zone": "z1"},
                                       {"addresses": ["10.42.1.6"], "conditions": {"ready": False}}]),
              controller_slice("db", [{"addresses": ["10.42.2.5"], "hostname": "db-0"}]),
              # a derived Service's slice: never published as this cluster's own
              controller_slice("web", [{"addresses": ["10.43.9.9"]}], **{MANAGED_BY_LABEL: MCS_MANAGED_BY})]
    got = local_exports("cluster1", exports, services, slices)
    assert {ref: (c.status, c.reason, c.message) for ref, c in got.valid.items()} == {
        ("default", "web"): ("True", "Valid", "Service default/web is exported"),
        ("default", "db"): ("True", "Valid", "Service default/db is exported"),
        ("default", "ext"): ("False", "InvalidServiceType",
                             "Service default/ext is of type ExternalName, which cannot be exported"),
        ("default", "ghost"): ("False", "NoService", "Service default/ghost does not exist"),
    }
    assert sorted(got.published) == [("default", "db"), ("default", "web")]
    web, db = got.published[("default", "web")], got.published[("default", "db")]
    assert web.to_record() == {
        "cluster": "cluster1", "namespace": "default", "name": "web", "type": CLUSTERSET_IP,
        "created": "2026-01-01T00:00:00Z", "local_first": True,
        "ports": [{"name": "echo", "port": 7, "protocol": "TCP"}],
        "target_ports": [{"name": "echo", "port": 8080, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["10.42.1.5"], "zone": "z1"}]}
    assert db.type == HEADLESS and [(str(e.address), e.hostname) for e in db.endpoints] == [("10.42.2.5", "db-0")]


BAD_RECORDS = [
    ("type", {"type": "LoadBalancer"}, "type: 'LoadBalancer' is not ClusterSetIP or Headless"),
    ("created", {"created": 7}, "created: 7 is not a time"),
    ("local-first", {"local_first": "yes"}, "local_first: 'yes' is not true or false"),
    ("hostname", {"endpoints": [{"addresses": ["10.43.1.5"], "hostname": "Web_0"}]},
     "endpoints[0].hostname: 'Web_0' is not a DNS label (lowercase alnum and '-', at most 63)"),
    ("port", {"ports": [{"name": "echo", "port": 70000}]}, "ports[0].port: 70000"),
    ("name", {"name": "api"}, "name: 'api' is not its key's 'web'"),
]


@pytest.mark.parametrize(("change", "error"), [c[1:] for c in BAD_RECORDS], ids=[c[0] for c in BAD_RECORDS])
def test_a_bad_export_record_is_refused_naming_the_field(change: dict[str, Any], error: str) -> None:
    doc = {**export("cluster2").to_record(), **change}
    with pytest.raises(InputError) as e:
        parse_export_record(doc, "k", "cluster2", "default", "web")
    assert str(e.value).startswith(f"k.{error}")


def test_remote_exports_are_admitted_like_global_services() -> None:
    """A remote export's endpoints must lie in that cluster's admitted pod CIDRs (an endpoint
    outside alone is rejected); only the cluster's own prefix is read from its mirror."""
    good = export("cluster2", eps=(("10.43.1.5", "web-0"), ("10.99.0.1", "")))
    mirrors = {"cluster2": Mirror([
        KeyValue(mcs_key(MCS_EXPORTS, "cluster2", "default", "web"), json.dumps(good.to_record()).encode(), 1, 1),
        KeyValue(mcs_key(MCS_EXPORTS, "cluster3", "default", "db"), b"{}", 2, 2),  # not under its own prefix
    ]), "cluster4": Mirror([KeyValue(mcs_key(MCS_EXPORTS, "cluster4", "default", "x"), b"{}", 1, 1)])}  # not admitted
    recs = remote_records(mirrors, {"cluster2"}, MCS_EXPORTS)
    nodes = {"cluster2": parse_topology(CLUSTER2).nodes}
    got, rejected = admit_records(recs, nodes, None, parse_export_record, MCS_EXPORTS)
    assert [(e.name, [(str(x.address), x.hostname) for x in e.endpoints]) for e in got] == \
        [("web", [("10.43.1.5", "web-0")])]
    assert [(r.name, r.reason) for r in rejected] == [(
        "cluster2/mcs/exports/default/web/10.99.0.1", "/meshctl/cluster2/mcs/exports/default/web.endpoints[1]: "
        "'10.99.0.1' is in no pod CIDR of cluster cluster2's admitted nodes")]


# --- merging and conflicts ------------------------------------------------------------------------


def test_the_same_export_in_two_clusters_merges_without_conflict() -> None:
    imp = merge_exports([export("cluster2", eps=(("10.43.1.5", ""),)), export("cluster1", eps=(("10.42.1.5", ""),))])
    assert (imp.type, imp.ports, imp.clusters, imp.conflicts) == (CLUSTERSET_IP, (ECHO7,), ("cluster1", "cluster2"), ())


MERGES = [
    # (exports as (cluster, created, type, ports), the import's ports, its type, the conflict reasons)
    ("union", [("c1", "T1", CLUSTERSET_IP, (ECHO7,)), ("c2", "T2", CLUSTERSET_IP, (ServicePort("http", 80),))],
     (ECHO7, ServicePort("http", 80)), CLUSTERSET_IP, []),
    ("port-differs-oldest-wins", [("c2", "T2", CLUSTERSET_IP, (ServicePort("echo", 8),)),
                                  ("c1", "T1", CLUSTERSET_IP, (ECHO7,))], (ECHO7,), CLUSTERSET_IP, ["PortConflict"]),
    ("same-time-by-cluster-name", [("c2", "T1", CLUSTERSET_IP, (ServicePort("echo", 8),)),
                                   ("c1", "T1", CLUSTERSET_IP, (ECHO7,))], (ECHO7,), CLUSTERSET_IP, ["PortConflict"]),
    ("port-number-under-another-name", [("c1", "T1", CLUSTERSET_IP, (ECHO7,)),
                                        ("c2", "T2", CLUSTERSET_IP, (ServicePort("ping", 7),))],
     (ECHO7,), CLUSTERSET_IP, ["PortConflict"]),
    ("protocol-differs", [("c1", "T1", CLUSTERSET_IP, (ECHO7,)),
                          ("c2", "T2", CLUSTERSET_IP, (ServicePort("echo", 7, "UDP"),))],
     (ECHO7,), CLUSTERSET_IP, ["PortConflict"]),
    ("type-differs", [("c1", "T1", HEADLESS, (ECHO7,)), ("c2", "T2", CLUSTERSET_IP, (ECHO7,))],
     (ECHO7,), HEADLESS, ["TypeConflict"]),
]


@pytest.mark.parametrize(("exports", "ports", "typ", "reasons"), [c[1:] for c in MERGES], ids=[c[0] for c in MERGES])
def test_merge_exports(exports: list[tuple[str, str, str, tuple[ServicePort, ...]]], ports: tuple[ServicePort, ...],
                       typ: str, reasons: list[str]) -> None:
    imp = merge_exports([export(c, t, typ=ty, ports=p) for c, t, ty, p in exports])
    assert (imp.ports, imp.type, [r for r, _ in imp.conflicts]) == (ports, typ, reasons)


def test_conditions_say_what_conflicts_who_won_and_who_lacks_the_namespace() -> None:
    local = local_exports("cluster2", [svc_export("web", created="2026-01-02T00:00:00Z"), svc_export("ghost")],
                          [{"metadata": {"name": "web", "namespace": "default"},
                            "spec": {"ports": [{"name": "echo", "port": 8}]}}], [])
    imports = merge_all([*local.published.values(), export("cluster1", "2026-01-01T00:00:00Z")])
    got = export_conditions(local, imports, {("default", "web"): ["cluster3"]})
    assert [c.type for c in got[("default", "ghost")]] == ["Valid"]  # an invalid export: that alone
    valid, conflict, imported = got[("default", "web")]
    assert (valid.type, valid.status) == ("Valid", "True")
    assert (conflict.status, conflict.reason, conflict.message) == (
        "True", "PortConflict", "ports: cluster cluster2's port echo 8/TCP conflicts with echo 7/TCP of cluster "
        "cluster1, which the import keeps (cluster1's export is older)")
    assert (imported.type, imported.status, imported.reason, imported.message) == (
        IMPORTED, "False", "NamespaceMissing",
        "cluster cluster3 has no namespace default: no ServiceImport there (create the namespace to import it)")
    # The oldest export is in conflict too (the KEP: on every constituent export).
    c1 = local_exports("cluster1", [svc_export("web")], [svc("web")], [])
    assert export_conditions(c1, imports, {})[("default", "web")][1].status == "True"
    quiet = export_conditions(c1, merge_all(c1.published.values()), {})[("default", "web")]
    assert [(c.status, c.reason) for c in quiet[1:]] == [("False", "NoConflicts"), ("True", "Imported")]


def test_condition_times_change_only_with_the_status() -> None:
    old = [{"type": "Valid", "status": "True", "reason": "Valid", "message": "m", "lastTransitionTime": "T0"},
           {"type": "Conflict", "status": "False", "reason": "NoConflicts", "message": "m", "lastTransitionTime": "T0"}]
    new = [Condition("Valid", "True", "Valid", "m2"), Condition("Conflict", "True", "PortConflict", "x")]
    assert [c["lastTransitionTime"] for c in with_times(old, new, "T1")] == ["T0", "T1"]


# --- what a cluster holds -------------------------------------------------------------------------


def test_desired_objects_make_an_import_a_derived_service_and_slices_per_cluster() -> None:
    imports = merge_all([export("cluster1", eps=(("10.42.1.5", ""),)), export("cluster2", "2026-02-01T00:00:00Z")])
    want = desired_objects("cluster2", imports, {"default"}, {("default", "web"): ["10.96.0.20"]})
    assert want.imports[("default", "web")] == {
        "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceImport",
        "metadata": {"name": "web", "namespace": "default", "labels": {"app.kubernetes.io/managed-by": MCS_MANAGED_BY}},
        "spec": {"type": CLUSTERSET_IP, "ports": [{"name": "echo", "port": 7, "protocol": "TCP"}],
                 "ips": ["10.96.0.20"]}}
    assert want.statuses[("default", "web")] == {"clusters": [{"cluster": "cluster1"}, {"cluster": "cluster2"}]}
    derived = want.services[("default", "derived-web")]
    assert derived["spec"] == {"type": "ClusterIP", "ports": [{"name": "echo", "port": 7, "protocol": "TCP"}]}
    assert sorted(want.slices) == [("default", "derived-web-cluster1-v4-0"), ("default", "derived-web-cluster2-v4-0")]
    s = want.slices[("default", "derived-web-cluster1-v4-0")]
    assert s["metadata"]["labels"] == {SERVICE_NAME_LABEL: "derived-web", MCS_SERVICE_NAME_LABEL: "web",
                                       MCS_SOURCE_CLUSTER_LABEL: "cluster1", MANAGED_BY_LABEL: MCS_MANAGED_BY}
    assert s["ports"] == [{"name": "echo", "port": 8080, "protocol": "TCP"}]  # the endpoints' own port
    assert s["endpoints"] == [{"addresses": ["10.42.1.5"], "conditions": {"ready": True}}]
    # Before the API server allocated the derived Service's IP, the import has none.
    assert "ips" not in desired_objects("cluster2", imports, {"default"}, {}).imports[("default", "web")]["spec"]
    # A cluster without the namespace holds nothing for it, and says so.
    none = desired_objects("cluster3", imports, {"kube-system"}, {})
    assert (none.imports, none.services, none.slices, none.missing) == ({}, {}, {}, (("default", "web"),))


def test_a_headless_import_has_a_headless_derived_service_and_hostnames() -> None:
    imports = merge_all([export("cluster1", typ=HEADLESS, eps=(("10.42.1.5", "db-0"),), name="db")])
    want = desired_objects("cluster2", imports, {"default"}, {})
    assert want.services[("default", "derived-db")]["spec"]["clusterIP"] == "None"
    assert "ips" not in want.imports[("default", "db")]["spec"]
    (s,) = want.slices.values()
    assert s["endpoints"][0]["hostname"] == "db-0"
    # Headlessness cannot change in place: a new Service.
    have = {"metadata": want.services[("default", "derived-db")]["metadata"],
            "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.9", "ports": [{"name": "echo", "port": 7,
                                                                              "protocol": "TCP", "targetPort": 7}]}}
    assert not same_service(have, want.services[("default", "derived-db")])


def test_local_first_hints_keep_traffic_in_the_cluster_while_it_has_endpoints() -> None:
    here = Export("cluster2", "default", "web", CLUSTERSET_IP, "2026-02-01T00:00:00Z", (ECHO7,), (ECHO7,),
                  (ServiceEndpoint(ip_address("10.43.1.5"), "gpu-a"),))
    imports = merge_all([export("cluster1", local_first=True), here])
    want = desired_objects("cluster2", imports, {"default"}, {})
    assert want.services[("default", "derived-web")]["spec"]["trafficDistribution"] == "PreferClose"
    hints = {k[1]: s["endpoints"][0]["hints"] for k, s in want.slices.items()}
    assert hints == {"derived-web-cluster1-v4-0": {"forZones": [{"name": OTHER_CLUSTERS_ZONE}]},
                     "derived-web-cluster2-v4-0": {"forZones": [{"name": "gpu-a"}]}}
    # Off by default: no hints, plain balancing over every cluster's endpoints.
    plain = desired_objects("cluster2", merge_all([export("cluster1"), here]), {"default"}, {})
    assert "trafficDistribution" not in plain.services[("default", "derived-web")]["spec"]
    assert all("hints" not in e for s in plain.slices.values() for e in s["endpoints"])


def test_derived_names_fit_a_service_name() -> None:
    assert derived_name("web") == "derived-web"
    long = derived_name("a" * 63)
    assert len(long) == 63 and long.startswith("derived-aaa") and long == derived_name("a" * 63)


# --- clusterset.local -----------------------------------------------------------------------------


def zone() -> Any:
    imports = merge_all([
        export("cluster1", ports=(ECHO7, ServicePort("dns", 53, "UDP"))),
        export("cluster1", name="db", typ=HEADLESS, eps=(("10.42.1.5", "db-0"), ("10.42.2.5", ""))),
        export("cluster2", name="db", typ=HEADLESS, eps=(("10.43.1.5", "db-0"),)),
        export("cluster1", name="hidden", ns="team-a"),
    ])
    return clusterset_zone(imports, {("default", "web"): ["10.96.0.20"]}, {("default", "web"), ("default", "db")}, 7)


D = "svc.clusterset.local"
ANSWERS = [
    ("clusterset-ip", f"web.default.{D}", "A", "NOERROR", ["10.96.0.20"]),
    ("case-and-dot", f"WEB.Default.{D}.", "A", "NOERROR", ["10.96.0.20"]),
    ("no-v6", f"web.default.{D}", "AAAA", "NOERROR", []),
    ("headless", f"db.default.{D}", "A", "NOERROR", ["10.42.1.5", "10.42.2.5", "10.43.1.5"]),
    ("per-pod", f"db-0.cluster2.db.default.{D}", "A", "NOERROR", ["10.43.1.5"]),
    ("per-pod-dashed", f"10-42-2-5.cluster1.db.default.{D}", "A", "NOERROR", ["10.42.2.5"]),
    ("per-pod-unknown", f"db-9.cluster2.db.default.{D}", "A", "NXDOMAIN", []),
    ("cluster-level", f"cluster1.db.default.{D}", "A", "NOERROR", []),
    ("srv-service", f"web.default.{D}", "SRV", "NOERROR", [f"0 100 7 web.default.{D}", f"0 100 53 web.default.{D}"]),
    ("srv-port", f"_dns._udp.web.default.{D}", "SRV", "NOERROR", [f"0 100 53 web.default.{D}"]),
    ("srv-port-unknown", f"_dns._tcp.web.default.{D}", "SRV", "NXDOMAIN", []),
    ("srv-headless", f"_echo._tcp.db.default.{D}", "SRV", "NOERROR",
     [f"0 33 7 10-42-2-5.cluster1.db.default.{D}", f"0 33 7 db-0.cluster1.db.default.{D}",
      f"0 33 7 db-0.cluster2.db.default.{D}"]),
    ("not-exported", f"api.default.{D}", "A", "NXDOMAIN", []),
    ("namespace-missing-here", f"hidden.team-a.{D}", "A", "NXDOMAIN", []),
    ("per-pod-of-clusterset-ip", f"x.cluster1.web.default.{D}", "A", "NXDOMAIN", []),
    ("namespace", f"default.{D}", "A", "NOERROR", []),
    ("outside", "web.default.svc.cluster.local", "A", "REFUSED", []),
    ("apex-soa", "clusterset.local", "SOA", "NOERROR", []),
]


@pytest.mark.parametrize(("qname", "qtype", "rcode", "data"), [c[1:] for c in ANSWERS], ids=[c[0] for c in ANSWERS])
def test_clusterset_local_answers(qname: str, qtype: str, rcode: str, data: list[str]) -> None:
    got = answer(zone(), qname, qtype)
    shown = [str(r.data) if r.type != "SRV" else f"{r.data.priority} {r.data.weight} {r.data.port} {r.data.target}"
             for r in got.records]
    assert (got.rcode, sorted(shown)) == (rcode, sorted(data))
    assert all(r.type == qtype for r in got.records)
    if rcode == "NXDOMAIN" or (rcode == "NOERROR" and not data and qtype != "SOA"):
        assert got.soa  # negative answers carry the SOA (its minimum bounds negative caching)


def test_check_name() -> None:
    assert check_name("web.default.svc.clusterset.local", "DST") == ("default", "web")
    with pytest.raises(InputError) as e:
        check_name("web.default.svc.cluster.local", "DST")
    assert str(e.value) == ("DST: 'web.default.svc.cluster.local' is not a name "
                            "<service>.<namespace>.svc.clusterset.local")


@pytest.mark.parametrize(("extra", "line"), [
    (["--dns-addr", "nowhere"], "error: --dns-addr: 'nowhere' is not host:port"),
    (["--kubeconfig", "/nonexistent/kubeconfig"], "error: --kubeconfig: '/nonexistent/kubeconfig' is not a file"),
])
def test_the_cache_refuses_bad_mcs_options_in_one_line(tmp_path: Any, extra: list[str], line: str) -> None:
    from click.testing import CliRunner

    from meshctl.cli import main

    argv = ["clustermesh", "cache", "--etcd-endpoints", "https://127.0.0.1:9", "--clustermesh-dir", str(tmp_path),
            "--state-dir", str(tmp_path / "state"), "--mcs", "--dns-addr", "127.0.0.1:1053", *extra]
    res = CliRunner().invoke(main, argv)
    assert res.exit_code == 2, res.output
    assert res.stderr.splitlines() == [line]
