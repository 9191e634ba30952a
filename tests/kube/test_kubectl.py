# SPDX-License-Identifier: Apache-2.0
"""What a user does with this machine's kubectl to what meshctl ships, on a real kube-apiserver
(tests/kubernetes.py): `kubectl apply -k manifests/` as docs/kubernetes.md says (every object
stored as written, a second apply changes nothing, `delete -k` takes it all away), the manifests
upgraded by apply, the Peer CRD's printer columns, short name, `describe`, `explain` and field
validation, Node annotations and labels set by kubectl reaching the agent's reader, and a List of
a Service and an EndpointSlice (what an operator applies for a global service) accepted with
kubectl's own client-side validation, the EndpointSlice controller leaving that slice alone."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshctl.backends.kube import nodes as A
from meshctl.lab.rigs.kube_control_plane import SERVICE_CIDR
from meshctl.mesh.services import MANAGED_BY, MANAGED_BY_LABEL, SERVICE_NAME_LABEL
from tests.kubernetes import Api, start_control_plane

from .helpers import MANIFESTS, Running, create_node, node_obj, wait_for, wg_key
from .kubectl import Kubectl, table
from .test_backend import backend

pytestmark = pytest.mark.slow

PEER = {"apiVersion": "meshctl.io/v1alpha1", "kind": "Peer", "metadata": {"name": "laptop"},
        "spec": {"allowedIPs": ["10.5.0.1/32"], "publicKey": wg_key(7), "persistentKeepalive": 25}}


@pytest.fixture
def k(api: Api, tmp_path: Path) -> Kubectl:
    return Kubectl(api.kubeconfig, tmp_path)


def kustomized() -> list[dict]:
    """The objects `kubectl apply -k manifests/` creates, in kustomization order."""
    names = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    return [d for n in names for d in yaml.safe_load_all((MANIFESTS / n).read_text()) if d]


def contains(stored: Any, written: Any, where: str = "") -> None:
    """Everything `written` says is in `stored` (the server adds defaults, never changes a value)."""
    if isinstance(written, dict):
        assert isinstance(stored, dict), where
        for key, value in written.items():
            assert key in stored, f"{where}.{key} missing"
            contains(stored[key], value, f"{where}.{key}")
    elif isinstance(written, list):
        assert isinstance(stored, list) and len(stored) == len(written), where
        for i, (s, w) in enumerate(zip(stored, written, strict=True)):
            contains(s, w, f"{where}[{i}]")
    else:
        assert stored == written, f"{where}: {stored!r} != {written!r}"


def resource_of(doc: dict) -> str:
    group = doc["apiVersion"].rpartition("/")[0]
    return doc["kind"].lower() + (f".{group}" if group else "")


def where(doc: dict) -> list[str]:
    ns = doc["metadata"].get("namespace")
    return ["-n", ns] if ns else []


def test_apply_k_manifests_stores_every_kind_and_delete_k_removes_it(tmp_path: Path) -> None:
    """On a control plane with nothing of manifests/ yet, as a user's cluster is."""
    cp = start_control_plane(tmp_path / "kt-bare", manifests=())
    try:
        k = Kubectl(cp.admin_kubeconfig, tmp_path)
        out = k("apply", "-k", str(MANIFESTS))
        docs = kustomized()
        assert {"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
                "RoleBinding", "ConfigMap", "DaemonSet", "Deployment"} <= {d["kind"] for d in docs}
        assert out.count(" created") == len(docs), out
        if "admission-policy.yaml" not in yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]:
            policies = [d for d in yaml.safe_load_all((MANIFESTS / "admission-policy.yaml").read_text()) if d]
            applied = k("apply", "-f", str(MANIFESTS / "admission-policy.yaml"))
            assert applied.count(" created") == len(policies), applied
            docs += policies

        def versions() -> dict[str, Any]:
            """Each object's generation (status writes by controllers leave it), else resourceVersion."""
            out = {}
            for d in docs:
                m = k.json("get", resource_of(d), d["metadata"]["name"], *where(d))["metadata"]
                out[f"{d['kind']}/{d['metadata']['name']}"] = m.get("generation", m["resourceVersion"])
            return out

        for doc in docs:
            got = k.json("get", resource_of(doc), doc["metadata"]["name"], *where(doc))
            assert (got["apiVersion"], got["kind"]) == (doc["apiVersion"], doc["kind"])
            assert got["metadata"].get("namespace") == doc["metadata"].get("namespace")
            last = json.loads(got["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
            assert last["kind"] == doc["kind"]
            for key in ("spec", "data", "rules", "roleRef", "subjects"):
                if key in doc and doc["kind"] != "Namespace":  # a Namespace's spec is the server's
                    contains(got[key], doc[key], f"{doc['kind']}/{doc['metadata']['name']}.{key}")
            assert got["metadata"].get("labels", {}).items() >= doc["metadata"].get("labels", {}).items()
        # the DaemonSet listed in its namespace: no Node yet, so nothing desired
        rows = table(k("get", "daemonsets", "-n", "meshctl"))
        assert [(r["NAME"], r["DESIRED"], r["NODE SELECTOR"]) for r in rows] == [("meshctl", "0", "<none>")]
        # a second apply changes nothing (kubectl says so, and no object's generation moves)
        before = versions()
        again = k("apply", "-k", str(MANIFESTS))
        assert again.count(" unchanged") == len(kustomized()), again
        assert versions() == before
        # delete -k takes everything away (the namespace's objects with it, by the namespace controller)
        k("delete", "-k", str(MANIFESTS), "--wait=true", "--timeout=60s")
        for doc in kustomized():
            if doc["kind"] not in ("CustomResourceDefinition",):
                assert k.run("get", resource_of(doc), doc["metadata"]["name"], *where(doc), check=False).rc != 0, doc
        assert k.run("get", "peers", check=False).rc != 0  # the CRD went, and its resource with it
    finally:
        cp.stop()


def test_annotate_and_label_reach_the_agents_reader(api: Api, kclient, k: Kubectl) -> None:
    create_node(kclient, node_obj("a1", "10.42.1.0/24", key=1, ann={A.PREFIX + A.LOCATION: "a"}))
    be = backend(api)
    with Running(be):
        wait_for(lambda: [n.location for n in be.snapshot().nodes] == ["a"], what="a1 read")
        assert k("annotate", "--overwrite", "node", "a1", f"{A.PREFIX}{A.LOCATION}=b").strip() == "node/a1 annotated"
        assert k("label", "node", "a1", "topology.kubernetes.io/region=eu").strip() == "node/a1 labeled"
        obj = k.json("get", "node", "a1", "--show-managed-fields")
        assert obj["metadata"]["annotations"][A.PREFIX + A.LOCATION] == "b"
        assert obj["metadata"]["labels"]["topology.kubernetes.io/region"] == "eu"
        assert {m["manager"] for m in obj["metadata"]["managedFields"]} >= {"kubectl-annotate", "kubectl-label"}
        wait_for(lambda: [n.location for n in be.snapshot().nodes] == ["b"], what="the agent's reader sees b")
        k("annotate", "node", "a1", f"{A.PREFIX}{A.LOCATION}-")  # removed: the label decides now
        wait_for(lambda: [n.location for n in be.snapshot().nodes] == ["eu"], what="location from the label")
    assert "topology.kubernetes.io/region=eu" in k("get", "node", "a1", "--show-labels")


def test_get_describe_explain_and_delete_peers(k: Kubectl, tmp_path: Path) -> None:
    f = tmp_path / "peer.json"
    f.write_text(json.dumps(PEER))
    assert k("apply", "-f", str(f)).strip() == "peer.meshctl.io/laptop created"
    rows = table(k("get", "peers"))
    assert list(rows[0]) == ["NAME", "ALLOWED IPS", "KEEPALIVE", "AGE"]  # the CRD's printer columns
    assert (rows[0]["NAME"], rows[0]["ALLOWED IPS"], rows[0]["KEEPALIVE"]) == ("laptop", '["10.5.0.1/32"]', "25")
    assert table(k("get", "mpeer"))[0]["NAME"] == "laptop"  # the CRD's short name
    text = k("describe", "peer", "laptop")
    assert "Name:         laptop" in text and wg_key(7) in text and "Persistent Keepalive:" in text, text
    resources = k("api-resources", "--api-group", "meshctl.io")
    assert "peers" in resources and "mpeer" in resources and "Peer" in resources
    # the schema is there for kubectl explain (OpenAPI v3, published by the server from the CRD)
    assert "allowedIPs\t<[]string> -required-" in k("explain", "peer.spec")
    # a field dropped from the file goes on the next apply (a custom resource: kubectl's merge patch)
    peer = json.loads(json.dumps(PEER))
    del peer["spec"]["persistentKeepalive"]
    assert k("apply", "-f", "-", stdin=json.dumps(peer)).strip() == "peer.meshctl.io/laptop configured"
    assert "persistentKeepalive" not in k.json("get", "peer", "laptop")["spec"]
    assert k("delete", "-f", str(f)).strip() == 'peer.meshctl.io "laptop" deleted'
    assert k.run("get", "peer", "laptop", check=False).rc == 1


def test_unknown_peer_field_fails_validation(api: Api, k: Kubectl) -> None:
    bad = json.loads(json.dumps(PEER))
    bad["spec"]["foo"] = "bar"
    r = k.run("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert r.rc == 1
    assert 'Peer in version "v1alpha1" cannot be handled as a Peer: strict decoding error: unknown field ' \
           '"spec.foo"' in r.err, r.err
    assert k.run("get", "peer", "laptop", check=False).rc == 1  # nothing stored
    r = k.run("apply", "--server-side", "-f", "-", stdin=json.dumps(bad), check=False)
    assert r.rc == 1 and ".spec.foo: field not declared in schema" in r.err, r.err
    # --validate=false: the server prunes the field, as it does without strict validation
    k("apply", "--validate=false", "-f", "-", stdin=json.dumps(bad))
    assert "foo" not in k.json("get", "peer", "laptop")["spec"]
    # --validate=warn: stored without the field, and kubectl shows the server's warning
    bad["spec"]["persistentKeepalive"] = 5
    r = k.run("apply", "--validate=warn", "-f", "-", stdin=json.dumps(bad))
    assert 'Warning: unknown field "spec.foo"' in r.err, r.err
    got = k.json("get", "peer", "laptop")
    assert got["spec"]["persistentKeepalive"] == 5 and "foo" not in got["spec"]


def test_the_daemonset_upgrades_by_apply(k: Kubectl) -> None:
    """A new image and a dropped variable applied over the installed DaemonSet (a built-in kind:
    kubectl's strategic merge patch): the live object is the file's, its native sidecar kept."""
    ds = next(d for d in kustomized() if d["kind"] == "DaemonSet")
    ds["metadata"]["namespace"] = "default"  # beside the session's baseline, removed below
    try:
        assert k("apply", "-f", "-", stdin=json.dumps(ds)).strip() == "daemonset.apps/meshctl created"
        agent = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent")
        agent["image"] = "meshctl/meshctl:9.9.9"
        dropped = agent["env"].pop()
        assert k("apply", "-f", "-", stdin=json.dumps(ds)).strip() == "daemonset.apps/meshctl configured"
        live = k.json("get", "daemonset", "meshctl", "-n", "default")
    finally:
        k.run("delete", "daemonset", "meshctl", "-n", "default", "--ignore-not-found", check=False)
    live_agent = next(c for c in live["spec"]["template"]["spec"]["containers"] if c["name"] == "agent")
    assert live_agent["image"] == "meshctl/meshctl:9.9.9"
    assert [e["name"] for e in live_agent["env"]] == [e["name"] for e in agent["env"]]
    assert dropped["name"] not in [e["name"] for e in live_agent["env"]]
    contains(live["spec"]["template"]["spec"]["initContainers"], ds["spec"]["template"]["spec"]["initContainers"])
    assert live["metadata"]["generation"] == 2


def test_a_list_of_a_service_and_its_endpointslice_applies(api: Api, k: Kubectl) -> None:
    """What an operator applies by hand for a service whose endpoints live elsewhere: one List,
    checked by kubectl's client-side validation (the server's OpenAPI). The Service gets its
    ClusterIP from the cluster's range; the EndpointSlice controller makes its own slice for the
    selector and leaves the one managed by meshctl.io as written."""
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
           "spec": {"type": "ClusterIP", "selector": {"app": "web"}, "ports": [{"port": 80, "protocol": "TCP"}]}}
    eps = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "web-remote", "namespace": "default",
                        "labels": {SERVICE_NAME_LABEL: "web", MANAGED_BY_LABEL: MANAGED_BY}},
           "addressType": "IPv4", "endpoints": [{"addresses": ["10.43.1.5"], "conditions": {"ready": True}}],
           "ports": [{"port": 80, "protocol": "TCP"}]}
    out = k("apply", "-f", "-", stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [svc, eps]}))
    assert out.split() == ["service/web", "created", "endpointslice.discovery.k8s.io/web-remote", "created"], out
    ip = table(k("get", "svc", "web"))[0]["CLUSTER-IP"]
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(SERVICE_CIDR)
    assert table(k("get", "svc", "web"))[0]["PORT(S)"] == "80/TCP"

    def slices() -> dict[str, dict]:
        return {s["metadata"]["name"]: s for s in
                k.json("get", "endpointslices", "-l", f"{SERVICE_NAME_LABEL}=web")["items"]}

    # the controller's own slice for the selector (no Pod yet: no endpoints) ...
    ctrl = wait_for(lambda: [s for n, s in slices().items() if n != "web-remote"], timeout=30,
                    what="the EndpointSlice controller's slice")
    assert ctrl[0]["metadata"]["labels"][MANAGED_BY_LABEL] == "endpointslice-controller.k8s.io"
    assert not ctrl[0].get("endpoints")
    # ... beside the one applied, as written
    mine = slices()["web-remote"]
    assert [e["addresses"] for e in mine["endpoints"]] == [["10.43.1.5"]]
    assert mine["metadata"]["generation"] == 1
    row = table(k("get", "endpointslices", "web-remote"))[0]
    assert (row["ADDRESSTYPE"], row["PORTS"], row["ENDPOINTS"]) == ("IPv4", "80", "10.43.1.5")
