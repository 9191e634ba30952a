# SPDX-License-Identifier: Apache-2.0
"""This machine's real kubectl against the in-process API server, so the server is held to a real
client rather than to the project's own: discovery (aggregated), OpenAPI v3 and server-side field
validation, table output, client-side apply (strategic merge for built-in kinds, merge patch for
Peers, the last-applied annotation), server-side apply with field managers and conflicts,
annotate, label, describe and delete, over every kind manifests/ holds."""

from __future__ import annotations

import json

import pytest
import yaml

from meshctl.backends.kube import nodes as A
from meshctl.lab.rigs.kube_apiserver import ApiServer, load_manifests

from .helpers import MANIFESTS, Running, node_obj, wait_for, wg_key
from .kubectl import Kubectl, table
from .test_backend import backend

PEER = {"apiVersion": "meshctl.io/v1alpha1", "kind": "Peer", "metadata": {"name": "laptop"},
        "spec": {"allowedIPs": ["10.5.0.1/32"], "publicKey": wg_key(7), "persistentKeepalive": 25}}


@pytest.fixture
def bare():
    """A server with nothing of manifests/ in it yet."""
    srv = ApiServer("127.0.0.1", 0).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def k(api, tmp_path) -> Kubectl:
    return Kubectl(api.url, tmp_path)


def kustomized() -> list[dict]:
    """The objects `kubectl apply -k manifests/` creates, in kustomization order."""
    names = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())["resources"]
    return [d for n in names for d in yaml.safe_load_all((MANIFESTS / n).read_text()) if d]


def stored(api: ApiServer, doc: dict) -> dict:
    rt = api.store.by_kind(doc["apiVersion"], doc["kind"])
    assert rt is not None, f"{doc['kind']} is not served"
    return api.store.get(rt, doc["metadata"].get("namespace", "") if rt.namespaced else "", doc["metadata"]["name"])


def node_with_status(name: str, ip: str, **kw) -> dict:
    obj = node_obj(name, "10.42.1.0/24", **kw)
    obj["status"] = {"addresses": [{"type": "InternalIP", "address": ip}, {"type": "Hostname", "address": name}],
                     "nodeInfo": {"kubeletVersion": "v1.31.4", "osImage": "Debian GNU/Linux 12 (bookworm)",
                                  "kernelVersion": "6.18.0", "containerRuntimeVersion": "containerd://1.7.24"},
                     "conditions": [{"type": "Ready", "status": "True"}]}
    return obj


def test_apply_k_manifests_stores_every_kind_and_get_reads_each(bare, tmp_path):
    k = Kubectl(bare.url, tmp_path)
    out = k("apply", "-k", str(MANIFESTS))
    docs = kustomized()
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role",
            "RoleBinding", "ConfigMap", "DaemonSet"} <= kinds
    assert out.count(" created") == len(docs), out
    policies = [d for d in yaml.safe_load_all((MANIFESTS / "admission-policy.yaml").read_text()) if d]
    assert k("apply", "-f", str(MANIFESTS / "admission-policy.yaml")).count(" created") == len(policies)
    for doc in docs + policies:
        group = doc["apiVersion"].rpartition("/")[0]
        resource = doc["kind"].lower() + (f".{group}" if group else "")
        ns = doc["metadata"].get("namespace")
        got = k.json("get", resource, doc["metadata"]["name"], *(["-n", ns] if ns else []))
        assert (got["apiVersion"], got["kind"], got["metadata"]["name"]) == (doc["apiVersion"], doc["kind"],
                                                                             doc["metadata"]["name"])
        assert got["metadata"].get("namespace") == ns  # namespaced kinds where they were put, others nowhere
        obj = stored(bare, doc)
        assert json.loads(obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])[
            "kind"] == doc["kind"]
        for key in ("spec", "data", "rules", "roleRef", "subjects"):
            if key in doc and doc["kind"] != "Namespace":  # a Namespace's spec is the server's
                assert obj[key] == doc[key], (doc["kind"], key)
        assert obj["metadata"].get("labels", {}).items() >= doc["metadata"].get("labels", {}).items()
    # the DaemonSet listed in its namespace with the server's columns
    rows = table(k("get", "daemonsets", "-n", "meshctl"))
    assert [(r["NAME"], r["DESIRED"], r["NODE SELECTOR"]) for r in rows] == [("meshctl", "0", "<none>")]
    # a second apply changes nothing (kubectl says so, the server's resourceVersion stays)
    rv = bare.store.rv
    again = k("apply", "-k", str(MANIFESTS))
    assert again.count(" unchanged") == len(docs), again
    assert bare.store.rv == rv
    # delete -k takes everything away (the namespace's objects with it)
    k("delete", "-k", str(MANIFESTS))
    wait_for(lambda: all(bare.store.by_kind(d["apiVersion"], d["kind"]) is None or
                         not bare.store.list(bare.store.by_kind(d["apiVersion"], d["kind"]), None)[1]
                         for d in docs if d["kind"] not in ("Namespace",)), what="manifests deleted")
    assert k.run("get", "peers", check=False).rc != 0  # the CRD went, and its resource with it


def test_get_nodes_wide_has_the_servers_columns(api, k):
    load = api.store.create
    nodes = api.store.by_kind("v1", "Node")
    load(nodes, "", node_with_status("a1", "192.168.10.1", labels={"node-role.kubernetes.io/control-plane": ""}))
    load(nodes, "", node_with_status("b1", "192.168.20.1"))
    rows = table(k("get", "nodes", "-o", "wide"))
    assert list(rows[0]) == ["NAME", "STATUS", "ROLES", "AGE", "VERSION", "INTERNAL-IP", "EXTERNAL-IP", "OS-IMAGE",
                             "KERNEL-VERSION", "CONTAINER-RUNTIME"]
    a1, b1 = rows
    assert (a1["NAME"], a1["STATUS"], a1["ROLES"], a1["VERSION"], a1["INTERNAL-IP"], a1["EXTERNAL-IP"]) == \
        ("a1", "Ready", "control-plane", "v1.31.4", "192.168.10.1", "<none>")
    assert (b1["ROLES"], b1["INTERNAL-IP"], b1["OS-IMAGE"], b1["KERNEL-VERSION"], b1["CONTAINER-RUNTIME"]) == \
        ("<none>", "192.168.20.1", "Debian GNU/Linux 12 (bookworm)", "6.18.0", "containerd://1.7.24")
    assert a1["AGE"].endswith("s")
    assert list(table(k("get", "nodes"))[0]) == ["NAME", "STATUS", "ROLES", "AGE", "VERSION"]  # no -o wide
    assert table(k("get", "no", "b1"))[0]["NAME"] == "b1"  # short name from discovery


def test_annotate_and_label_reach_the_store_and_the_agents_reader(api, k):
    api.store.create(api.store.by_kind("v1", "Node"), "",
                     node_obj("a1", "10.42.1.0/24", key=1, ann={A.PREFIX + A.LOCATION: "a"}))
    be = backend(api)
    with Running(be):
        wait_for(lambda: [n.location for n in be.snapshot().nodes] == ["a"], what="a1 read")
        assert k("annotate", "--overwrite", "node", "a1", f"{A.PREFIX}{A.LOCATION}=b").strip() == "node/a1 annotated"
        assert k("label", "node", "a1", "topology.kubernetes.io/region=eu").strip() == "node/a1 labeled"
        obj = api.store.get(api.store.by_kind("v1", "Node"), "", "a1")
        assert obj["metadata"]["annotations"][A.PREFIX + A.LOCATION] == "b"
        assert obj["metadata"]["labels"]["topology.kubernetes.io/region"] == "eu"
        assert {m["manager"] for m in obj["metadata"]["managedFields"]} >= {"kubectl-annotate", "kubectl-label"}
        wait_for(lambda: [n.location for n in be.snapshot().nodes] == ["b"], what="the agent's reader sees b")
        k("annotate", "node", "a1", f"{A.PREFIX}{A.LOCATION}-")  # removed: the label decides now
        wait_for(lambda: [n.location for n in be.snapshot().nodes] == ["eu"], what="location from the label")
    out = k("get", "node", "a1", "--show-labels")
    assert "topology.kubernetes.io/region=eu" in out


def test_get_and_describe_peers(api, k):
    assert "created" in k("apply", "-f", "-", stdin=json.dumps(PEER))
    rows = table(k("get", "peers"))
    assert list(rows[0]) == ["NAME", "ALLOWED IPS", "KEEPALIVE", "AGE"]  # the CRD's printer columns
    assert (rows[0]["NAME"], rows[0]["ALLOWED IPS"], rows[0]["KEEPALIVE"]) == ("laptop", '["10.5.0.1/32"]', "25")
    assert table(k("get", "mpeer"))[0]["NAME"] == "laptop"  # the CRD's short name
    text = k("describe", "peer", "laptop")
    assert "Name:         laptop" in text and f"Public Key:            {wg_key(7)}" in text
    assert "Persistent Keepalive:  25" in text
    resources = k("api-resources", "--api-group", "meshctl.io")
    assert "peers" in resources and "mpeer" in resources and "Peer" in resources


def test_client_side_apply_twice_then_after_an_edit(api, k, tmp_path):
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c1", "namespace": "default"},
          "data": {"a": "1", "b": "2"}}
    f = tmp_path / "cm.yaml"
    f.write_text(yaml.safe_dump(cm))
    assert k("apply", "-f", str(f)).strip() == "configmap/c1 created"
    assert k("apply", "-f", str(f)).strip() == "configmap/c1 unchanged"
    cm["data"] = {"a": "3"}  # b removed from the file: last-applied says it was ours, so it goes
    f.write_text(yaml.safe_dump(cm))
    assert k("apply", "-f", str(f)).strip() == "configmap/c1 configured"
    assert api.store.get(api.store.by_kind("v1", "ConfigMap"), "default", "c1")["data"] == {"a": "3"}
    # a Peer (custom resource: kubectl sends a merge patch)
    peer = json.loads(json.dumps(PEER))
    k("apply", "-f", "-", stdin=json.dumps(peer))
    del peer["spec"]["persistentKeepalive"]
    assert k("apply", "-f", "-", stdin=json.dumps(peer)).strip() == "peer.meshctl.io/laptop configured"
    got = api.store.get(api.store.by_kind("meshctl.io/v1alpha1", "Peer"), "", "laptop")
    assert "persistentKeepalive" not in got["spec"]
    # a DaemonSet (built-in: kubectl sends a strategic merge patch with $setElementOrder/$retainKeys)
    ds = next(d for d in kustomized() if d["kind"] == "DaemonSet")
    k("apply", "-f", "-", stdin=json.dumps(ds))
    agent = next(c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent")
    agent["image"] = "meshctl/meshctl:9.9.9"
    dropped = agent["env"].pop()
    assert k("apply", "-f", "-", stdin=json.dumps(ds)).strip() == "daemonset.apps/meshctl configured"
    live = api.store.get(api.store.by_kind("apps/v1", "DaemonSet"), "meshctl", "meshctl")
    live_agent = next(c for c in live["spec"]["template"]["spec"]["containers"] if c["name"] == "agent")
    assert live_agent["image"] == "meshctl/meshctl:9.9.9"
    assert [e["name"] for e in live_agent["env"]] == [e["name"] for e in agent["env"]]
    assert dropped["name"] not in [e["name"] for e in live_agent["env"]]
    assert live["spec"]["template"]["spec"]["initContainers"] == ds["spec"]["template"]["spec"]["initContainers"]


def test_server_side_apply_owns_conflicts_and_forces(api, k, tmp_path):
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "s1", "namespace": "default"},
          "data": {"a": "1", "b": "2"}}
    assert k("apply", "--server-side", "-f", "-", stdin=json.dumps(cm)).strip() == "configmap/s1 serverside-applied"
    rt = api.store.by_kind("v1", "ConfigMap")
    obj = api.store.get(rt, "default", "s1")
    (entry,) = obj["metadata"]["managedFields"]
    assert (entry["manager"], entry["operation"]) == ("kubectl", "Apply")
    assert entry["fieldsV1"]["f:data"].keys() >= {"f:a", "f:b"}
    # another manager changing a field kubectl owns: a conflict, until forced
    other = {**cm, "data": {"a": "9"}}
    r = k.run("apply", "--server-side", "--field-manager", "ops", "-f", "-", stdin=json.dumps(other), check=False)
    assert r.rc != 0 and 'conflict with "kubectl"' in r.err and ".data.a" in r.err
    assert api.store.get(rt, "default", "s1")["data"] == {"a": "1", "b": "2"}
    k("apply", "--server-side", "--field-manager", "ops", "--force-conflicts", "-f", "-", stdin=json.dumps(other))
    assert api.store.get(rt, "default", "s1")["data"] == {"a": "9", "b": "2"}
    # kubectl applies again without b: b was only kubectl's, so it goes; a is ops' now and stays
    k("apply", "--server-side", "-f", "-", stdin=json.dumps({**cm, "data": {}}))
    assert api.store.get(rt, "default", "s1")["data"] == {"a": "9"}
    # the same apply once more writes nothing
    rv = api.store.rv
    k("apply", "--server-side", "--field-manager", "ops", "-f", "-", stdin=json.dumps(other))
    assert api.store.rv == rv


def test_unknown_peer_field_fails_validation_like_kube_apiserver(api, k):
    bad = json.loads(json.dumps(PEER))
    bad["spec"]["foo"] = "bar"
    r = k.run("apply", "-f", "-", stdin=json.dumps(bad), check=False)
    assert r.rc == 1
    assert 'Peer in version "v1alpha1" cannot be handled as a Peer: strict decoding error: unknown field ' \
           '"spec.foo"' in r.err, r.err
    assert not api.store.list(api.store.by_kind("meshctl.io/v1alpha1", "Peer"), None)[1]
    r = k.run("apply", "--server-side", "-f", "-", stdin=json.dumps(bad), check=False)
    assert r.rc == 1 and ".spec.foo: field not declared in schema" in r.err, r.err
    # --validate=false: the server prunes the field, as it does without strict validation
    k("apply", "--validate=false", "-f", "-", stdin=json.dumps(bad))
    got = api.store.get(api.store.by_kind("meshctl.io/v1alpha1", "Peer"), "", "laptop")
    assert "foo" not in got["spec"]
    # --validate=warn: stored without the field, and kubectl shows the server's warning
    bad["spec"]["persistentKeepalive"] = 5
    r = k.run("apply", "--validate=warn", "-f", "-", stdin=json.dumps(bad))
    assert 'Warning: unknown field "spec.foo"' in r.err, r.err
    got = api.store.get(api.store.by_kind("meshctl.io/v1alpha1", "Peer"), "", "laptop")
    assert got["spec"]["persistentKeepalive"] == 5 and "foo" not in got["spec"]
    # the schema is there for kubectl explain (OpenAPI v3)
    assert "allowedIPs\t<[]string> -required-" in k("explain", "peer.spec")


def test_delete_by_name_and_by_file(api, k, tmp_path):
    f = tmp_path / "peer.json"
    f.write_text(json.dumps(PEER))
    k("apply", "-f", str(f))
    assert k("delete", "-f", str(f)).strip() == 'peer.meshctl.io "laptop" deleted'
    rt = api.store.by_kind("meshctl.io/v1alpha1", "Peer")
    assert not api.store.list(rt, None)[1]
    k("create", "configmap", "gone", "--from-literal=x=1")
    assert k("delete", "configmap", "gone").strip() == 'configmap "gone" deleted'
    r = k.run("delete", "configmap", "gone", check=False)
    assert r.rc == 1 and 'configmaps "gone" not found' in r.err


def test_services_endpointslices_and_leases_are_served(api, k):
    svc = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "default"},
           "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.10", "selector": {"app": "web"},
                    "ports": [{"port": 80, "protocol": "TCP"}]}}
    eps = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "web-1", "namespace": "default", "labels": {"kubernetes.io/service-name": "web"}},
           "addressType": "IPv4", "endpoints": [{"addresses": ["10.42.1.5"]}], "ports": [{"port": 80}]}
    lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l", "namespace": "default"},
             "spec": {"holderIdentity": "a1"}}
    for doc in (svc, eps, lease):
        k("apply", "-f", "-", stdin=json.dumps(doc))
    assert table(k("get", "svc", "web"))[0]["PORT(S)"] == "80/TCP"
    row = table(k("get", "endpointslices", "-l", "kubernetes.io/service-name=web"))[0]
    assert (row["NAME"], row["ADDRESSTYPE"], row["PORTS"], row["ENDPOINTS"]) == ("web-1", "IPv4", "80", "10.42.1.5")
    assert table(k("get", "leases"))[0]["HOLDER"] == "a1"
    assert api.store.get(api.store.by_kind("discovery.k8s.io/v1", "EndpointSlice"), "default", "web-1")[
        "endpoints"] == eps["endpoints"]


def test_manifest_loader_and_kubectl_agree(bare, tmp_path):
    """What the tests' loader creates is what kubectl sees: the CRD loaded directly is served."""
    load_manifests(bare.store, [str(MANIFESTS / "01-crd-peers.yaml")])
    k = Kubectl(bare.url, tmp_path)
    assert "peers" in k("api-resources", "--api-group", "meshctl.io")


def test_server_dry_run_and_diff_store_nothing(api, k):
    rt = api.store.by_kind("meshctl.io/v1alpha1", "Peer")
    assert k("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(PEER)).strip() == \
        "peer.meshctl.io/laptop created (server dry run)"
    assert not api.store.list(rt, None)[1]
    k("apply", "-f", "-", stdin=json.dumps(PEER))
    rv = api.store.rv
    changed = json.loads(json.dumps(PEER))
    changed["spec"]["persistentKeepalive"] = 99
    r = k.run("diff", "-f", "-", stdin=json.dumps(changed), check=False)
    assert r.rc == 1 and "-  persistentKeepalive: 25" in r.out and "+  persistentKeepalive: 99" in r.out, r.out + r.err
    # server-side: the field is kubectl-client-side-apply's, a conflict (as on a real cluster) unless forced
    r = k.run("diff", "--server-side", "-f", "-", stdin=json.dumps(changed), check=False)
    assert r.rc > 1 and 'conflict with "kubectl-client-side-apply"' in r.err, r.err
    r = k.run("diff", "--server-side", "--force-conflicts", "-f", "-", stdin=json.dumps(changed), check=False)
    assert r.rc == 1 and "+  persistentKeepalive: 99" in r.out, r.out + r.err
    k("delete", "--dry-run=server", "peer", "laptop")
    assert api.store.rv == rv and api.store.get(rt, "", "laptop")["spec"]["persistentKeepalive"] == 25


def test_crd_change_keeps_its_objects_and_discovery_follows(api, k):
    k("apply", "-f", "-", stdin=json.dumps(PEER))
    crd = yaml.safe_load((MANIFESTS / "01-crd-peers.yaml").read_text())
    crd["spec"]["names"]["shortNames"] = ["mp2"]
    crd["spec"]["names"]["categories"] = ["meshctl"]
    k("apply", "-f", "-", stdin=json.dumps(crd))
    assert table(k("get", "mp2"))[0]["NAME"] == "laptop"  # the new short name, the Peer still there
    assert table(k("get", "meshctl"))[0]["NAME"] == "laptop"  # the category (one kind: plain names)
    assert k.run("get", "mpeer", check=False).rc != 0


@pytest.mark.parametrize(("doc", "field"), [
    pytest.param({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "t", "namespace": "default"},
                  "datta": {"a": "1"}}, "datta", id="configmap-typo"),
    pytest.param({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "t", "namespace": "default"},
                  "spec": {}, "sepc": {}}, "sepc", id="daemonset-typo"),
])
def test_unknown_top_level_field_of_a_builtin_kind_fails(api, k, doc, field):
    r = k.run("apply", "-f", "-", stdin=json.dumps(doc), check=False)
    assert r.rc == 1 and (f'{doc["kind"]} in version "v1" cannot be handled as a {doc["kind"]}: strict decoding '
                          f'error: unknown field "{field}"') in r.err, r.err
    k("apply", "--validate=false", "-f", "-", stdin=json.dumps(doc))  # dropped, as the decoder drops it
    rt = api.store.by_kind(doc["apiVersion"], doc["kind"])
    assert field not in api.store.get(rt, "default", "t")
