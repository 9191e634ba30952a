# SPDX-License-Identifier: Apache-2.0
"""manifests/ on a real API server, as a user installs them (`kubectl apply -k manifests/`), and
each agent with the token the kubelet gives its Pod (the `meshctl` ServiceAccount, bound to the
node's DaemonSet Pod): what RBAC and the ValidatingAdmissionPolicies let one node's agent do, and
what they refuse, each refusal checked by the server's own message."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from meshctl.backends.kube import nodes as A
from meshctl.backends.kube.forwarding import FORWARDING_DATA_KEY, FORWARDING_LABEL
from meshctl.lab.rigs.kube_control_plane import ControlPlane, token_claims
from meshctl.mesh.leaders import ForwardingReport, Judged
from tests.kubernetes import MANIFESTS, kubectl, start_control_plane
from tests.waiting import wait_until

NODES = {"n1": "192.0.2.1", "n2": "192.0.2.2"}
SA = "system:serviceaccount:meshctl:meshctl"


@dataclass
class As:
    """Requests with one bearer token, as that identity."""

    cp: ControlPlane
    token: str

    def call(self, method: str, path: str, body: Any = None, ctype: str = "application/merge-patch+json"
             ) -> requests.Response:
        with requests.Session() as s:
            s.trust_env = False
            return s.request(method, self.cp.url + path, verify=str(self.cp.ca), timeout=10,
                             data=json.dumps(body) if body is not None else None,
                             headers={"Authorization": f"Bearer {self.token}", "Content-Type": ctype})


def refused(r: requests.Response, code: int, words: str) -> None:
    assert r.status_code == code, (r.status_code, r.text)
    assert words in r.json()["message"], r.json()["message"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, dict[str, As]]]:
    cp = start_control_plane(tmp_path_factory.mktemp("kube-policy"), manifests=())
    try:
        for name in NODES:
            cp.request("POST", "/api/v1/nodes", {
                "apiVersion": "v1", "kind": "Node", "spec": {"podCIDR": f"10.42.{name[1]}.0/24"},
                "metadata": {"name": name, "annotations": {A.PREFIX + A.LOCATION: "loc-a"}}})
        kubectl(cp.admin_kubeconfig, "apply", "-k", str(MANIFESTS))
        cp.start_kubelets(NODES)

        def pods() -> dict[str, str]:
            items = cp.request("GET", "/api/v1/namespaces/meshctl/pods?labelSelector=app.kubernetes.io/name%3Dmeshctl")
            return {p["spec"].get("nodeName"): p["metadata"]["name"] for p in items["items"]
                    if (p.get("status") or {}).get("phase") == "Running"}

        running = wait_until(lambda: (p := pods()) and set(NODES) <= set(p) and p, 60, "the DaemonSet's Pods running")
        agents = {n: As(cp, cp.create_token("meshctl", "meshctl", pod=running[n])) for n in NODES}
        # The API server enforces a ValidatingAdmissionPolicy once its informers hold the policy and
        # its binding, a moment after `apply` returned: wait for n1's dry-run writes to n2's Node and
        # summary to be refused.
        n1 = agents["n1"]
        other_cm = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"seen": "{}"},
                    "metadata": {"name": "meshctl-seen-n2", "namespace": "meshctl"}}
        wait_until(lambda: n1.call("PATCH", "/api/v1/nodes/n2?dryRun=All",
                                   {"metadata": {"annotations": {A.PREFIX + A.LOCATION: "x"}}}).status_code == 403
                   and n1.call("POST", "/api/v1/namespaces/meshctl/configmaps?dryRun=All", other_cm,
                               "application/json").status_code == 403, 60, "the policies enforced")
        yield cp, agents
    finally:
        cp.stop()


def test_the_default_install_holds_the_policies(cluster) -> None:
    cp, agents = cluster
    names = {p["metadata"]["name"] for p in cp.request(
        "GET", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies")["items"]}
    assert names == {"meshctl-agent-own-node", "meshctl-agent-own-summary", "meshctl-agent-endpointslices",
                     "meshctl-agent-election", "meshctl-clustermesh-cache-mcs"}
    # The token is the kubelet's kind: bound to the Pod, naming its node.
    assert token_claims(agents["n1"].token)["kubernetes.io"]["node"]["name"] == "n1"


def test_an_agent_changes_its_own_annotations_and_nothing_else_of_any_node(cluster) -> None:
    _, agents = cluster
    n1 = agents["n1"]
    ok = n1.call("PATCH", "/api/v1/nodes/n1", {"metadata": {"annotations": {A.PUBLIC_KEY: "x" * 43 + "=",
                                                                              A.LAST_SEEN: "1"}}})
    assert ok.status_code == 200, ok.text
    refused(n1.call("PATCH", "/api/v1/nodes/n2", {"metadata": {"annotations": {A.PUBLIC_KEY: "y" * 43 + "="}}}),
            403, "meshctl's agent on n1 may not change node n2")
    refused(n1.call("PATCH", "/api/v1/nodes/n1", {"metadata": {"annotations": {A.PREFIX + A.LOCATION: "elsewhere"}}}),
            403, "the agent may change only its own annotations")
    refused(n1.call("PATCH", "/api/v1/nodes/n1", {"metadata": {"labels": {"topology.kubernetes.io/region": "x"}}}),
            403, "may not change a node's labels or spec")
    refused(n1.call("PATCH", "/api/v1/nodes/n2", {"metadata": {"labels": {"topology.kubernetes.io/region": "x"}}}),
            403, "may not change node n2")


def test_an_agent_writes_only_its_own_summary_configmap(cluster) -> None:
    _, agents = cluster
    n1 = agents["n1"]
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "meshctl-seen-n1", "namespace": "meshctl"},
          "data": {"seen": "{}"}}
    assert n1.call("POST", "/api/v1/namespaces/meshctl/configmaps", cm, "application/json").status_code == 201
    other = {**cm, "metadata": {"name": "meshctl-seen-n2", "namespace": "meshctl"}}
    refused(n1.call("POST", "/api/v1/namespaces/meshctl/configmaps", other, "application/json"), 403,
            "may write only configmaps meshctl-seen-n1 and meshctl-forwarding-n1, not meshctl-seen-n2")
    # The shared settings every agent reads: no agent rewrites them.
    refused(n1.call("PATCH", "/api/v1/namespaces/meshctl/configmaps/meshctl", {"data": {"granularity": "full"}}),
            403, "may write only configmaps meshctl-seen-n1 and meshctl-forwarding-n1, not meshctl")


def report_configmap(name: str, node: str, verdict: str) -> dict[str, Any]:
    doc = ForwardingReport(node, "default", 100.0, {"n9": Judged(verdict, 90.0)})  # type: ignore[arg-type]
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "meshctl", "labels": {FORWARDING_LABEL: "true"}},
            "data": {FORWARDING_DATA_KEY: json.dumps(doc.to_json())}}


def test_an_agent_writes_only_its_own_forwarding_report(cluster) -> None:
    """Two reports are two witnesses only if one node's token cannot write another's: n1 creates
    and rewrites its own report; n2's, whether new or already written by n2, it cannot touch."""
    _, agents = cluster
    n1, n2 = agents["n1"], agents["n2"]
    cms = "/api/v1/namespaces/meshctl/configmaps"
    assert n1.call("POST", cms, report_configmap("meshctl-forwarding-n1", "n1", "ok"), "application/json"
                   ).status_code == 201
    patch = {"data": {FORWARDING_DATA_KEY: report_configmap("x", "n1", "bad")["data"][FORWARDING_DATA_KEY]}}
    assert n1.call("PATCH", f"{cms}/meshctl-forwarding-n1", patch).status_code == 200
    refused(n1.call("POST", cms, report_configmap("meshctl-forwarding-n2", "n2", "bad"), "application/json"), 403,
            "meshctl's agent on n1 may write only configmaps meshctl-seen-n1 and meshctl-forwarding-n1, "
            "not meshctl-forwarding-n2")
    assert n2.call("POST", cms, report_configmap("meshctl-forwarding-n2", "n2", "ok"), "application/json"
                   ).status_code == 201
    forged = {"data": {FORWARDING_DATA_KEY: report_configmap("x", "n2", "bad")["data"][FORWARDING_DATA_KEY]}}
    refused(n1.call("PATCH", f"{cms}/meshctl-forwarding-n2", forged), 403,
            "may write only configmaps meshctl-seen-n1 and meshctl-forwarding-n1, not meshctl-forwarding-n2")
    # Every agent reads every report (it watches them by their label).
    listed = n2.call("GET", f"{cms}?labelSelector={FORWARDING_LABEL}%3Dtrue")
    assert listed.status_code == 200, listed.text
    assert sorted(i["metadata"]["name"] for i in listed.json()["items"]) == ["meshctl-forwarding-n1",
                                                                            "meshctl-forwarding-n2"]
    assert '"bad"' in next(i for i in listed.json()["items"]
                           if i["metadata"]["name"] == "meshctl-forwarding-n1")["data"][FORWARDING_DATA_KEY]


def test_an_agent_cannot_write_peers(cluster) -> None:
    _, agents = cluster
    peer = {"apiVersion": "meshctl.io/v1alpha1", "kind": "Peer", "metadata": {"name": "sneaky"},
            "spec": {"allowedIPs": ["10.99.0.0/16"], "publicKey": "z" * 43 + "="}}
    refused(agents["n1"].call("POST", "/apis/meshctl.io/v1alpha1/peers", peer, "application/json"), 403,
            f'User "{SA}" cannot create resource "peers" in API group "meshctl.io"')


def test_an_agent_reads_the_peer_keys_secret_only(cluster) -> None:
    cp, agents = cluster
    for name in ("meshctl-peer-keys", "meshctl-clustermesh"):
        cp.request("POST", "/api/v1/namespaces/meshctl/secrets", {
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": {"k": "c2VjcmV0"}})
    n1 = agents["n1"]
    assert n1.call("GET", "/api/v1/namespaces/meshctl/secrets/meshctl-peer-keys").status_code == 200
    refused(n1.call("GET", "/api/v1/namespaces/meshctl/secrets/meshctl-clustermesh"), 403,
            f'User "{SA}" cannot get resource "secrets" in API group "" in the namespace "meshctl"')
    refused(n1.call("GET", "/api/v1/namespaces/meshctl/secrets"), 403, 'cannot list resource "secrets"')
    # The cluster-mesh cache mounts its credentials with an account of its own that holds no grant.
    cache = cp.request("GET", "/apis/apps/v1/namespaces/meshctl/deployments/meshctl-clustermesh-cache")
    assert cache["spec"]["template"]["spec"]["serviceAccountName"] == "meshctl-clustermesh-cache"


def slice_of(name: str, ns: str, managed_by: str = "meshctl.io") -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": ns, "labels": {
                "kubernetes.io/service-name": "web", "endpointslice.kubernetes.io/managed-by": managed_by}},
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.43.1.5"]}], "ports": [{"port": 80}]}


def test_only_the_elected_agent_writes_endpointslices_and_only_its_own(cluster) -> None:
    cp, agents = cluster
    n1, n2 = agents["n1"], agents["n2"]
    cp.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}})
    path = "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices"
    # Nobody holds the election yet: no agent writes slices, in any namespace.
    refused(n1.call("POST", path, slice_of("web-remote-1", "shop"), "application/json"), 422,
            "no params found for policy binding with `Deny` parameterNotFoundAction")
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
             "metadata": {"name": "meshctl-global-services", "namespace": "meshctl"},
             "spec": {"holderIdentity": "n2", "leaseDurationSeconds": 15}}
    leases = "/apis/coordination.k8s.io/v1/namespaces/meshctl/leases"
    refused(n1.call("POST", leases, lease, "application/json"), 403, "may name only itself as the holder, not n2")
    other = {**lease, "metadata": {"name": "something-else", "namespace": "meshctl"}}
    refused(n1.call("POST", leases, other, "application/json"), 403,
            "may write only the Lease meshctl-global-services")
    lease["spec"]["holderIdentity"] = "n1"
    assert n1.call("POST", leases, lease, "application/json").status_code == 201
    wait_until(lambda: n1.call("POST", path, slice_of("web-remote-1", "shop"), "application/json").status_code == 201,
               10, "the elected agent's slice accepted (the policy's params cache follows the Lease)")
    # The others may not, even into slices labelled meshctl's.
    refused(n2.call("POST", path, slice_of("web-remote-2", "shop"), "application/json"), 403,
            "meshctl's agent on n2 does not hold the Lease meshctl-global-services")
    # The elected one only writes slices labelled as meshctl's, before and after.
    refused(n1.call("POST", path, slice_of("web-x", "shop", managed_by="endpointslice-controller.k8s.io"),
                    "application/json"), 403, "writes only EndpointSlices labelled")
    theirs = cp.request("POST", path, slice_of("web-abcde", "shop", managed_by="endpointslice-controller.k8s.io"))
    theirs["endpoints"] = [{"addresses": ["10.43.9.9"]}]
    refused(n1.call("PUT", f"{path}/web-abcde", theirs, "application/json"), 403,
            "writes only EndpointSlices labelled")
    theirs["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] = "meshctl.io"  # relabelled to take it
    refused(n1.call("PUT", f"{path}/web-abcde", theirs, "application/json"), 403,
            "changes or deletes only EndpointSlices labelled")
    refused(n1.call("DELETE", f"{path}/web-abcde"), 403, "changes or deletes only EndpointSlices labelled")
    mine = cp.request("GET", f"{path}/web-remote-1")
    mine["metadata"]["labels"]["endpointslice.kubernetes.io/managed-by"] = "endpointslice-controller.k8s.io"
    refused(n1.call("PUT", f"{path}/web-remote-1", mine, "application/json"), 403,
            "writes only EndpointSlices labelled")
    assert n1.call("DELETE", f"{path}/web-remote-1").status_code == 200


def test_the_cache_writes_only_derived_services_their_slices_and_imports(cluster) -> None:
    """The cluster-mesh cache's own account (Multi-Cluster Services, docs/security.md): RBAC grants
    Services, EndpointSlices and ServiceImports everywhere; the policy meshctl-clustermesh-cache-mcs
    holds it to its own, and the agents' tokens gained no write of them."""
    cp, agents = cluster
    cache = As(cp, cp.create_token("meshctl-clustermesh-cache", "meshctl"))
    cp.request("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "mcs"}})
    svcs, slices = "/api/v1/namespaces/mcs/services", "/apis/discovery.k8s.io/v1/namespaces/mcs/endpointslices"
    imports = "/apis/multicluster.x-k8s.io/v1alpha1/namespaces/mcs/serviceimports"
    mine = {"app.kubernetes.io/managed-by": "mcs.meshctl.io", "multicluster.kubernetes.io/service-name": "web"}

    def service(name: str, labels: dict[str, str], **spec: Any) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "labels": labels},
                "spec": {"ports": [{"port": 7}], **spec}}

    def eps(name: str, service: str, managed_by: str = "mcs.meshctl.io") -> dict[str, Any]:
        return {**slice_of(name, "mcs", managed_by=managed_by),
                "metadata": {"name": name, "labels": {"kubernetes.io/service-name": service,
                                                      "endpointslice.kubernetes.io/managed-by": managed_by}}}

    assert cache.call("POST", svcs, service("derived-web", mine), "application/json").status_code == 201
    assert cache.call("POST", slices, eps("derived-web-c2-v4-0", "derived-web"), "application/json").status_code == 201
    imp = {"apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ServiceImport",
           "metadata": {"name": "web", "labels": {"app.kubernetes.io/managed-by": "mcs.meshctl.io"}},
           "spec": {"type": "ClusterSetIP", "ports": [{"port": 7}]}}
    assert cache.call("POST", imports, imp, "application/json").status_code == 201
    # A Service that selects Pods, takes an outside address, or is not named as derived: refused.
    refused(cache.call("POST", svcs, service("derived-x", mine, selector={"app": "web"}), "application/json"), 403,
            "writes only derived Services")
    refused(cache.call("POST", svcs, service("derived-y", mine, externalIPs=["192.0.2.9"]), "application/json"), 403,
            "writes only derived Services")
    refused(cache.call("POST", svcs, service("web", mine), "application/json"), 403, "writes only derived Services")
    # A user's Service and its slices are not the cache's to change, relabel or delete.
    user = cp.request("POST", svcs, service("shop", {}, selector={"app": "shop"}))
    refused(cache.call("DELETE", f"{svcs}/shop"), 403, "changes or deletes only services labelled")
    user["metadata"]["labels"] = mine
    refused(cache.call("PUT", f"{svcs}/shop", user, "application/json"), 403, "changes or deletes only services")
    refused(cache.call("POST", slices, eps("shop-c2-v4-0", "shop"), "application/json"), 403,
            "only EndpointSlices of derived Services")
    refused(cache.call("POST", slices, eps("derived-web-z", "derived-web", "meshctl.io"), "application/json"), 403,
            "writes only endpointslices labelled endpointslice.kubernetes.io/managed-by=mcs.meshctl.io")
    cp.request("POST", slices, eps("shop-abcde", "shop", "endpointslice-controller.k8s.io"))
    refused(cache.call("DELETE", f"{slices}/shop-abcde"), 403, "changes or deletes only endpointslices")
    # The agents' node tokens write none of these.
    n1 = agents["n1"]
    refused(n1.call("POST", imports, {**imp, "metadata": {**imp["metadata"], "name": "api"}}, "application/json"),
            403, "cannot create resource \"serviceimports\"")
    refused(n1.call("POST", svcs, service("derived-api", mine), "application/json"), 403,
            "cannot create resource \"services\"")


def test_a_token_without_its_node_is_refused(cluster) -> None:
    cp, _ = cluster
    unbound = As(cp, cp.create_token("meshctl", "meshctl"))
    refused(unbound.call("PATCH", "/api/v1/nodes/n1", {"metadata": {"annotations": {A.LAST_SEEN: "2"}}}), 403,
            "the agent's token names no node")


def test_the_agents_api_is_not_open_on_the_node(cluster) -> None:
    """The DaemonSet leaves --metrics-addr at its loopback default and opens only the TLS port
    whose /metrics asks the cluster (tests/agent/test_secure_metrics.py serves it)."""
    ds = Path(MANIFESTS / "04-daemonset.yaml").read_text()
    assert "- --metrics-addr" not in ds and "- --secure-metrics-addr=0.0.0.0:9737" in ds
