# SPDX-License-Identifier: Apache-2.0
"""The Multi-Cluster Services API on the namespace lab: two clusters, each a real control plane
(kube-apiserver, kube-controller-manager: its EndpointSlice controller lists the lab's pods, which
the kubelet reproduction reports Running and Ready), real agents and WireGuard, and each
cluster's cache running `meshctl clustermesh cache --mcs` with its own ServiceAccount's token, the
manifests' RBAC and admission policies. One lab for the module.

An export in one cluster makes the ServiceImport, the derived Service and the slices in the other;
`dig` from a pod of the other cluster resolves the name (the ClusterSetIP; a headless export's
endpoints and per-pod names); TCP to the ClusterSetIP reaches the exporting cluster's pod through
the mesh (kube-proxy's part reproduced by lab.namespaces.kube_proxy); conflicting ports are
reported on both exports; an unexport takes the import, its slices and its name away; bad exports
get one condition each and disturb nothing else."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from functools import partial
from importlib.resources import files
from typing import Any

import pytest

from meshctl import defaults
from meshctl.agent.status import AgentStatus
from meshctl.backends.file import load_yaml
from meshctl.cli.agent import format_status
from meshctl.errors import MeshError
from meshctl.lab.namespaces import build, kube_api, kube_cluster, kube_proxy
from meshctl.lab.namespaces import check as labcheck
from meshctl.lab.namespaces.state import ClusterState, LabState
from meshctl.lab.rigs import netns
from meshctl.mesh.mcs import IMPORTED, MCS_SERVICE_NAME_LABEL, MCS_SOURCE_CLUSTER_LABEL
from meshctl.mesh.services import MANAGED_BY_LABEL, MCS_MANAGED_BY
from tests.kube.helpers import lab_fixture
from tests.waiting import wait_until

wait = partial(wait_until, step=0.05)

pytestmark = [pytest.mark.root, pytest.mark.slow]

# The two Kubernetes clusters of the global-services lab file.
LAB = load_yaml(str(files("meshctl") / "lab" / "labs" / "global-services.yaml"))

bare_lab = lab_fixture(LAB, wait=180, prefix="ms", scope="module")
MCS = "/apis/multicluster.x-k8s.io/v1alpha1"
ZONE = "svc.clusterset.local"


@pytest.fixture(scope="module")
def lab(bare_lab: LabState) -> Iterator[LabState]:
    """The lab with both clusters' caches running the Multi-Cluster Services controller."""
    for c in bare_lab.clusters:
        wait(lambda c=c: all(x.get("ready") for x in (clustermesh_of(bare_lab, c.nodes[0].name).get("clusters")
                                                      or [{}])), 120, f"{c.name}'s cluster mesh ready")
        build.start_cache(bare_lab, c.name, mcs=True)
    try:
        yield bare_lab
    finally:
        for c in bare_lab.clusters:
            build.stop_cache(bare_lab, c.name)


def api(c: ClusterState, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
    assert c.kube is not None
    try:
        return 200, kube_api.request(c.kube, method, path, body, **kw)
    except MeshError as e:
        code = re.match(r"\S+ \S+: (\d+)", str(e))
        return (int(code.group(1)) if code else 0), str(e)


def ok(c: ClusterState, method: str, path: str, body: Any = None, **kw: Any) -> Any:
    code, doc = api(c, method, path, body, **kw)
    assert code == 200, doc
    return doc


def clustermesh_of(st: LabState, node: str) -> dict[str, Any]:
    s = labcheck.agent_status(st.lookup(node)[1]) or {}
    return s.get("remotes") or {}


def service(c: ClusterState, name: str, *, ns: str = "default", port: int = 7, **spec: Any) -> None:
    ok(c, "POST", f"/api/v1/namespaces/{ns}/services",
       {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": {"app": name}, "ports": [{"name": "echo", "port": port, "targetPort": 7}], **spec}})


def pod(lab: LabState, c: ClusterState, node: str, app: str, **kw: Any) -> str:
    """A Pod of `node`'s lab pod selected by `app`; its address."""
    ip = lab.lookup(node)[1].pods[0].ip
    ok(c, "POST", f"/api/v1/namespaces/{kw.pop('ns', 'default')}/pods",
       kube_cluster.pod_object(f"{app}-{node}", "default", node, ip, {"app": app}, **kw))
    return ip


def export(c: ClusterState, name: str, ns: str = "default") -> None:
    ok(c, "POST", f"{MCS}/namespaces/{ns}/serviceexports",
       {"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceExport",
        "metadata": {"name": name, "namespace": ns}})


def get(c: ClusterState, path: str) -> Any:
    code, doc = api(c, "GET", path)
    return doc if code == 200 else None


def conditions(c: ClusterState, name: str, ns: str = "default") -> dict[str, tuple[str, str, str]]:
    doc = get(c, f"{MCS}/namespaces/{ns}/serviceexports/{name}") or {}
    return {x["type"]: (x["status"], x["reason"], x["message"]) for x in (doc.get("status") or {}).get("conditions")
            or ()}


def mcs_slices(c: ClusterState, name: str, ns: str = "default") -> dict[str, tuple[str, list[str]]]:
    """The slices of an import: name -> (source cluster, addresses)."""
    sel = urllib.parse.quote(f"{MCS_SERVICE_NAME_LABEL}={name},{MANAGED_BY_LABEL}={MCS_MANAGED_BY}")
    doc = get(c, f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices?labelSelector={sel}") or {}
    return {s["metadata"]["name"]: (s["metadata"]["labels"][MCS_SOURCE_CLUSTER_LABEL],
                                    sorted(a for e in s["endpoints"] for a in e["addresses"]))
            for s in doc.get("items") or ()}


def json_of(text: str) -> Any:
    import json

    return json.loads(text)


def dig(lab: LabState, c: ClusterState, node: str, name: str, qtype: str = "A") -> tuple[str, list[str]]:
    """`dig` from `node`'s pod at cluster `c`'s clusterset.local server: (status, answers)."""
    host, port = build.cache_dns(c)
    out = netns.run(lab.lookup(node)[1].pods[0].netns,
                    ["dig", f"@{host}", "-p", str(port), name, qtype, "+time=1", "+tries=2", "+noall", "+answer",
                     "+comments"], check=False).stdout
    status = re.search(r"status: (\w+)", out)
    answers = sorted(line.split(None, 4)[4] for line in out.splitlines()
                     if line and not line.startswith(";") and len(line.split(None, 4)) == 5)
    return (status.group(1) if status else "no answer"), answers


def test_an_export_is_imported_resolved_and_reached_from_the_other_cluster(lab: LabState) -> None:
    c1, c2 = lab.clusters
    service(c2, "web")
    g1 = pod(lab, c2, "g1", "web")
    export(c2, "web")
    # cluster1: the ServiceImport with its ClusterSetIP and the exporting cluster ...
    wait(lambda: ((get(c1, f"{MCS}/namespaces/default/serviceimports/web") or {}).get("spec") or {}).get("ips"),
         30, "cluster1's ServiceImport with its IP")
    imp = ok(c1, "GET", f"{MCS}/namespaces/default/serviceimports/web")
    assert imp["spec"]["type"] == "ClusterSetIP"
    assert imp["spec"]["ports"] == [{"name": "echo", "port": 7, "protocol": "TCP"}]
    wait(lambda: (get(c1, f"{MCS}/namespaces/default/serviceimports/web") or {}).get("status", {}).get("clusters")
         == [{"cluster": "cluster2"}], 10, "the import's clusters")
    # ... the derived Service whose ClusterIP is the import's IP, and its slice with g1's pod.
    derived = ok(c1, "GET", "/api/v1/namespaces/default/services/derived-web")
    assert imp["spec"]["ips"] == [derived["spec"]["clusterIP"]] and "selector" not in derived["spec"]
    wait(lambda: mcs_slices(c1, "web") == {"derived-web-cluster2-v4-0": ("cluster2", [g1])}, 30, "cluster1's slice")
    # The exporting cluster imports it too (the set's view of the Service), its own pod in it.
    wait(lambda: mcs_slices(c2, "web") == {"derived-web-cluster2-v4-0": ("cluster2", [g1])}, 30, "cluster2's slice")
    wait(lambda: conditions(c2, "web").get("Valid", ("",))[0] == "True", 10, "Valid")
    assert conditions(c2, "web")["Conflict"][:2] == ("False", "NoConflicts")
    # The other cluster's pod resolves the name to the ClusterSetIP, and the port by SRV.
    vip = imp["spec"]["ips"][0]
    assert dig(lab, c1, "a1", f"web.default.{ZONE}") == ("NOERROR", [vip])
    assert dig(lab, c1, "a1", f"_echo._tcp.web.default.{ZONE}", "SRV") == ("NOERROR", [f"0 100 7 web.default.{ZONE}."])
    assert dig(lab, c1, "a1", f"api.default.{ZONE}")[0] == "NXDOMAIN"
    # TCP to the ClusterSetIP from a1's pod reaches g1's pod through the mesh (the lab's
    # reproduction of kube-proxy DNATs it on a1, as kube-proxy would from the derived Service).
    kube_proxy.sync(c1)
    server = subprocess.Popen(
        [*netns.exec_prefix(lab.lookup("g1")[1].pods[0].netns), sys.executable, "-c",
         "import socket\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
         f"s.bind(('{g1}', 7)); s.listen()\nwhile True:\n c, a = s.accept()\n c.sendall(b'g1 ' + a[0].encode())\n"
         " c.close()"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        a1_pod = lab.lookup("a1")[1].pods[0]
        probe = (f"import socket\nc=socket.create_connection(('{vip}', 7), timeout=2)\n"
                 "print(c.recv(100).decode())")
        got = wait(lambda: netns.run(a1_pod.netns, [sys.executable, "-c", probe], check=False).stdout.strip() or None,
                   30, "a TCP answer through the ClusterSetIP")
        assert got == f"g1 {a1_pod.ip}", got  # g1 saw a1's pod itself: no proxy of meshctl's on the way
    finally:
        server.kill()
        server.wait()
    # Status on cluster1's agents: its import, cluster2's export.
    def counted() -> str | None:
        doc = labcheck.agent_status(c1.nodes[0])
        text = format_status(AgentStatus.from_json(doc), verbose=True) if doc else ""
        return text if "1 imports" in text else None
    text = wait(counted, 20, "the import counted")
    assert re.search(r"ClusterMesh: 1/1 remote clusters ready, 0 global-services, 0 exports, 1 imports", text), text
    assert re.search(r"cluster2  ready  nodes 2  rejected 0  exports \d+", text), text
    assert f"default/web  ClusterSetIP {vip}  endpoints cluster2 1" in text, text
    # explain takes the name: the import, then the path from a1's pod to each endpoint.
    from click.testing import CliRunner

    from meshctl.cli import main

    a1_ip = lab.lookup("a1")[1].pods[0].ip
    r = CliRunner().invoke(main, ["explain", "--lab", lab.name, a1_ip, f"web.default.{ZONE}", "-o", "json"])
    assert r.exit_code == 0, r.output
    doc = json_of(r.stdout)
    assert doc["import"] == {"namespace": "default", "name": "web", "type": "ClusterSetIP", "ips": [vip],
                             "endpoints": {"cluster2": [g1]}}
    assert [(p["dst"]["node"], p["dst"]["address"]) for p in doc["paths"]] == [("cluster2/g1", g1)]
    assert doc["paths"][0]["hops"]
    r = CliRunner().invoke(main, ["explain", "--lab", lab.name, a1_ip, f"nope.default.{ZONE}"])
    assert r.exit_code == 1 and f"'nope.default.{ZONE}' is not imported in a1's cluster (no ServiceImport " \
        "default/nope there)" in r.output, r.output


def test_a_headless_export_resolves_to_its_endpoints_and_per_pod_names(lab: LabState) -> None:
    c1, c2 = lab.clusters
    service(c2, "db", clusterIP="None")
    ips = [pod(lab, c2, n, "db", hostname=f"db-{k}", subdomain="db") for k, n in enumerate(("g1", "g2"))]
    export(c2, "db")
    wait(lambda: dig(lab, c1, "a1", f"db.default.{ZONE}") == ("NOERROR", sorted(ips)), 30, "headless name")
    imp = ok(c1, "GET", f"{MCS}/namespaces/default/serviceimports/db")
    assert imp["spec"]["type"] == "Headless" and "ips" not in imp["spec"]
    assert ok(c1, "GET", "/api/v1/namespaces/default/services/derived-db")["spec"]["clusterIP"] == "None"
    assert dig(lab, c1, "a2", f"db-1.cluster2.db.default.{ZONE}") == ("NOERROR", [ips[1]])
    assert dig(lab, c1, "a2", f"db-0.cluster2.db.default.{ZONE}") == ("NOERROR", [ips[0]])
    assert dig(lab, c1, "a2", f"db-0.cluster1.db.default.{ZONE}")[0] == "NXDOMAIN"
    status, srv = dig(lab, c1, "a1", f"_echo._tcp.db.default.{ZONE}", "SRV")
    assert status == "NOERROR" and sorted(s.split()[3] for s in srv) == \
        [f"db-0.cluster2.db.default.{ZONE}.", f"db-1.cluster2.db.default.{ZONE}."]


def test_two_clusters_exporting_different_ports_conflict_and_the_oldest_wins(lab: LabState) -> None:
    c1, c2 = lab.clusters
    service(c1, "clash", port=7)
    export(c1, "clash")
    wait(lambda: get(c2, f"{MCS}/namespaces/default/serviceimports/clash"), 30, "cluster2 imports cluster1's")
    # cluster2's export is the younger (creation times have one-second steps: a tie goes to the
    # first cluster name, cluster1, too).
    service(c2, "clash", port=8)
    export(c2, "clash")
    for c in (c1, c2):
        wait(lambda c=c: conditions(c, "clash").get("Conflict", ("",))[0] == "True", 30, f"{c.name}'s Conflict")
        status, reason, message = conditions(c, "clash")["Conflict"]
        assert reason == "PortConflict", reason
        assert message == ("ports: cluster cluster2's port echo 8/TCP conflicts with echo 7/TCP of cluster "
                           "cluster1, which the import keeps (cluster1's export is older)"), message
        wait(lambda c=c: (get(c, f"{MCS}/namespaces/default/serviceimports/clash") or {}).get("status", {})
             .get("clusters") == [{"cluster": "cluster1"}, {"cluster": "cluster2"}], 30, f"{c.name}'s import of both")
        imp = ok(c, "GET", f"{MCS}/namespaces/default/serviceimports/clash")
        assert imp["spec"]["ports"] == [{"name": "echo", "port": 7, "protocol": "TCP"}]


def test_unexport_takes_the_import_its_slices_and_its_name_away(lab: LabState) -> None:
    c1, c2 = lab.clusters
    service(c2, "gone")
    g2 = pod(lab, c2, "g2", "gone")
    export(c2, "gone")
    wait(lambda: mcs_slices(c1, "gone") == {"derived-gone-cluster2-v4-0": ("cluster2", [g2])}, 30, "imported")
    wait(lambda: dig(lab, c1, "a1", f"gone.default.{ZONE}")[1] != [], 10, "resolves")
    t0 = time.monotonic()
    ok(c2, "DELETE", f"{MCS}/namespaces/default/serviceexports/gone")
    wait(lambda: mcs_slices(c1, "gone") == {}, 10, "slices gone")
    # Both controllers pass on events (their informers', the cache's watch): the other cluster's
    # slices follow at once (the figure printed), not at the next listing (SERVICES_RESYNC_S); a third
    # of that period is the line between the two, whatever the machine's load.
    took = time.monotonic() - t0
    print(f"unexport -> cluster1's slices gone: {took * 1000:.0f} ms")
    assert took < defaults.SERVICES_RESYNC_S / 3, took
    wait(lambda: get(c1, f"{MCS}/namespaces/default/serviceimports/gone") is None, 10, "import gone")
    wait(lambda: get(c1, "/api/v1/namespaces/default/services/derived-gone") is None, 10, "derived Service gone")
    wait(lambda: dig(lab, c1, "a1", f"gone.default.{ZONE}")[0] == "NXDOMAIN", 10, "name gone")
    assert get(c2, f"{MCS}/namespaces/default/serviceimports/gone") is None  # the exporting cluster's too


def test_bad_exports_get_one_condition_each_and_disturb_nothing(lab: LabState) -> None:
    c1, c2 = lab.clusters
    service(c2, "steady")
    pod(lab, c2, "g1", "steady")
    export(c2, "steady")
    wait(lambda: get(c1, f"{MCS}/namespaces/default/serviceimports/steady"), 30, "a good import first")
    export(c2, "ghost")  # no such Service
    service(c2, "ext", type="ExternalName", externalName="db.example.com", selector=None, ports=None)
    export(c2, "ext")
    ok(c2, "POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}})
    service(c2, "lonely", ns="team-a")
    export(c2, "lonely", ns="team-a")  # cluster1 has no namespace team-a
    wait(lambda: conditions(c2, "ghost") != {}, 30, "ghost judged")
    assert conditions(c2, "ghost") == {"Valid": ("False", "NoService", "Service default/ghost does not exist")}
    wait(lambda: conditions(c2, "ext") != {}, 30, "ext judged")
    assert conditions(c2, "ext") == {"Valid": ("False", "InvalidServiceType",
                                               "Service default/ext is of type ExternalName, which cannot be exported")}
    wait(lambda: conditions(c2, "lonely", "team-a").get(IMPORTED, ("",))[0] == "False", 30, "lonely judged")
    assert conditions(c2, "lonely", "team-a")[IMPORTED] == (
        "False", "NamespaceMissing",
        "cluster cluster1 has no namespace team-a: no ServiceImport there (create the namespace to import it)")
    assert conditions(c2, "lonely", "team-a")["Valid"][0] == "True"
    # Nothing else: no import of the bad ones anywhere, the good one stands and resolves.
    for c in (c1, c2):
        for name in ("ghost", "ext"):
            assert get(c, f"{MCS}/namespaces/default/serviceimports/{name}") is None
    assert get(c2, f"{MCS}/namespaces/team-a/serviceimports/lonely") is not None  # cluster2 has the namespace
    assert get(c1, f"{MCS}/namespaces/default/serviceimports/steady") is not None
    assert dig(lab, c1, "a1", f"steady.default.{ZONE}")[0] == "NOERROR"
    assert dig(lab, c1, "a1", f"lonely.team-a.{ZONE}")[0] == "NXDOMAIN"
