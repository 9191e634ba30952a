# SPDX-License-Identifier: Apache-2.0
"""The in-process API server's semantics, over raw HTTP: what the backend relies on must behave as
kube-apiserver does (resourceVersion, watch resume and 410, patches, conflicts, paging)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import httpx2 as httpx
import pytest

from meshctl.lab.rigs.kube_apiserver import ApiFailure, json_patch, merge_patch, strategic_merge

from .helpers import ROOT, wait_for

MERGE = {"Content-Type": "application/merge-patch+json"}


@pytest.fixture
def http(api):
    with httpx.Client(base_url=api.url, timeout=10, trust_env=False) as c:
        yield c


def mk(http, name, ann=None):
    r = http.post("/api/v1/nodes", json={"metadata": {"name": name, "annotations": ann or {}}})
    assert r.status_code == 201, r.text
    return r.json()


def watch_lines(http, params, n, timeout=5.0):
    """The first `n` events of a watch (or fewer if the stream ends)."""
    out = []
    with http.stream("GET", "/api/v1/nodes", params={"watch": "true", **params}, timeout=timeout) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                out.append(json.loads(line))
            if len(out) >= n:
                break
    return out


def test_resource_versions_and_noop_patch(api, http):
    a = mk(http, "a1", {"x": "1"})
    rv = int(a["metadata"]["resourceVersion"])
    assert a["metadata"]["uid"] and a["metadata"]["creationTimestamp"].endswith("Z")
    r = http.patch("/api/v1/nodes/a1", json={"metadata": {"annotations": {"y": "2"}}}, headers=MERGE)
    assert int(r.json()["metadata"]["resourceVersion"]) == rv + 1
    same = http.patch("/api/v1/nodes/a1", json={"metadata": {"annotations": {"y": "2"}}}, headers=MERGE)
    assert int(same.json()["metadata"]["resourceVersion"]) == rv + 1  # nothing changed, no new version
    lst = http.get("/api/v1/nodes").json()
    assert lst["kind"] == "NodeList" and lst["metadata"]["resourceVersion"] == str(rv + 1)
    assert http.post("/api/v1/nodes", json={"metadata": {"name": "a1"}}).status_code == 409


def test_conflict_on_stale_resource_version(api, http):
    a = mk(http, "a1")
    old_rv = a["metadata"]["resourceVersion"]
    http.patch("/api/v1/nodes/a1", json={"metadata": {"labels": {"l": "1"}}}, headers=MERGE)
    r = http.patch("/api/v1/nodes/a1", json={"metadata": {"resourceVersion": old_rv, "labels": {"l": "2"}}},
                   headers=MERGE)
    assert r.status_code == 409 and r.json()["reason"] == "Conflict"
    a["metadata"]["labels"] = {"l": "3"}
    assert http.put("/api/v1/nodes/a1", json=a).status_code == 409  # PUT with the stale version too
    cur = http.get("/api/v1/nodes/a1").json()
    cur["metadata"]["labels"] = {"l": "3"}
    assert http.put("/api/v1/nodes/a1", json=cur).json()["metadata"]["labels"] == {"l": "3"}


def test_merge_patch():
    base = {"metadata": {"annotations": {"a": "1", "b": "2"}, "labels": {"k": "v"}}, "spec": {"taints": [1, 2]}}
    assert merge_patch(base, {"metadata": {"annotations": {"a": None, "c": "3"}}})["metadata"] == {
        "annotations": {"b": "2", "c": "3"}, "labels": {"k": "v"}}
    assert merge_patch(base, {"spec": {"taints": [3]}})["spec"]["taints"] == [3]  # lists replace
    assert base["metadata"]["annotations"] == {"a": "1", "b": "2"}  # inputs untouched


def test_patch_over_http_kinds_and_errors(api, http):
    mk(http, "a1", {"a": "1"})
    r = http.patch("/api/v1/nodes/a1", json={"metadata": {"annotations": {"a": None, "b": "2"}}}, headers=MERGE)
    assert r.json()["metadata"]["annotations"] == {"b": "2"}
    for kind in ("application/x-yaml", "text/plain"):  # not patch kinds kube-apiserver knows
        r = http.patch("/api/v1/nodes/a1", content=b"{}", headers={"Content-Type": kind})
        assert r.status_code == 415 and r.headers["content-type"] == "application/json", kind
    assert http.get("/api/v1/nodes/a1").json()["metadata"]["annotations"] == {"b": "2"}
    assert http.patch("/api/v1/nodes/zz", json={}, headers=MERGE).status_code == 404
    assert http.get("/apis/nope.io/v1/things").status_code == 404


def test_watch_from_zero_lists_then_follows(api, http):
    mk(http, "a1")
    mk(http, "a2")
    got: list = []
    t = threading.Thread(target=lambda: got.extend(watch_lines(http, {}, 4)))
    t.start()
    wait_for(lambda: sum(1 for r in api.requests if "watch" in r[1] or r[0] == "GET") >= 1, what="watch open")
    time.sleep(0.2)
    http.patch("/api/v1/nodes/a1", json={"metadata": {"labels": {"x": "1"}}}, headers=MERGE)
    http.delete("/api/v1/nodes/a2")
    t.join(5)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in got] == [
        ("ADDED", "a1"), ("ADDED", "a2"), ("MODIFIED", "a1"), ("DELETED", "a2")]
    assert int(got[3]["object"]["metadata"]["resourceVersion"]) > int(got[2]["object"]["metadata"]["resourceVersion"])


def test_watch_resumes_after_a_version_and_410_when_compacted(api, http):
    a = mk(http, "a1")
    rv1 = a["metadata"]["resourceVersion"]
    mk(http, "a2")
    http.delete("/api/v1/nodes/a1")
    evs = watch_lines(http, {"resourceVersion": rv1, "timeoutSeconds": "1"}, 10)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in evs] == [("ADDED", "a2"), ("DELETED", "a1")]
    api.store.compact()
    evs = watch_lines(http, {"resourceVersion": rv1}, 10)
    assert evs[0]["type"] == "ERROR" and evs[0]["object"]["code"] == 410
    # the current version is still fine after compaction
    cur = http.get("/api/v1/nodes").json()["metadata"]["resourceVersion"]
    assert watch_lines(http, {"resourceVersion": cur, "timeoutSeconds": "1"}, 10) == []


def test_watch_selectors_and_namespaces(api, http):
    http.post("/api/v1/namespaces/meshctl/configmaps", json={"metadata": {"name": "meshctl"}, "data": {"a": "1"}})
    http.post("/api/v1/namespaces/meshctl/configmaps", json={"metadata": {"name": "other"}})
    r = http.get("/api/v1/namespaces/meshctl/configmaps", params={"fieldSelector": "metadata.name=meshctl"})
    assert [o["metadata"]["name"] for o in r.json()["items"]] == ["meshctl"]
    assert http.post("/api/v1/namespaces/nope/configmaps", json={"metadata": {"name": "x"}}).status_code == 404
    mk(http, "a1")
    http.patch("/api/v1/nodes/a1", json={"metadata": {"labels": {"role": "edge"}}}, headers=MERGE)
    mk(http, "a2")
    r = http.get("/api/v1/nodes", params={"labelSelector": "role=edge"})
    assert [o["metadata"]["name"] for o in r.json()["items"]] == ["a1"]


def test_list_pages_with_continue(api, http):
    for i in range(5):
        mk(http, f"n{i}")
    names, cont = [], None
    while True:
        params = {"limit": "2", **({"continue": cont} if cont else {})}
        page = http.get("/api/v1/nodes", params=params).json()
        names += [o["metadata"]["name"] for o in page["items"]]
        cont = page["metadata"].get("continue")
        if not cont:
            break
    assert names == [f"n{i}" for i in range(5)]


def test_crd_registers_its_resource(api, http):
    # 01-crd-peers.yaml was created through the store by the fixture: Peers are served now
    r = http.post("/apis/meshctl.io/v1alpha1/peers", json={"metadata": {"name": "p"}, "spec": {
        "publicKey": "A" * 43 + "=", "allowedIPs": ["10.5.0.1/32"]}})
    assert r.status_code == 201 and r.json()["kind"] == "Peer"
    # ... and validated against its schema, as kube-apiserver does
    r = http.post("/apis/meshctl.io/v1alpha1/peers", json={"metadata": {"name": "q"}, "spec": {}})
    assert r.status_code == 422 and r.json()["message"] == \
        'Peer.meshctl.io "q" is invalid: [spec.allowedIPs: Required value, spec.publicKey: Required value]'
    assert http.get("/apis/meshctl.io/v1alpha1/namespaces/x/peers").status_code == 404  # cluster-scoped


def test_runs_as_a_module_and_writes_a_kubeconfig(tmp_path):
    kc = tmp_path / "kubeconfig"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "ctl")}
    p = subprocess.Popen([sys.executable, "-m", "meshctl.lab.rigs.kube_apiserver", "--listen", "127.0.0.1:0",
                          "--kubeconfig", str(kc), "--load", str(ROOT / "manifests")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = p.stdout.readline()
        assert line.startswith("apiserver: serving http://127.0.0.1:"), line + p.stderr.read()
        url = line.split()[-1]
        assert json.loads(kc.read_text())["clusters"][0]["cluster"]["server"] == url
        with httpx.Client(base_url=url, trust_env=False) as c:
            assert c.get("/healthz").text == "ok"
            cm = c.get("/api/v1/namespaces/meshctl/configmaps/meshctl").json()
            assert cm["data"]["granularity"] == "location"
            assert c.get("/apis/meshctl.io/v1alpha1/peers").status_code == 200
    finally:
        p.terminate()
        assert p.wait(10) == 0


SMP_CASES = [
    pytest.param({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}},
                 {"spec": {"containers": [{"name": "b", "image": "z"}]}},
                 {"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "z"}]}},
                 id="merge-key-list-merges-by-name"),
    pytest.param({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}},
                 {"spec": {"containers": [{"name": "a", "$patch": "delete"}]}},
                 {"spec": {"containers": [{"name": "b"}]}}, id="patch-delete-removes-an-element"),
    pytest.param({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}},
                 {"spec": {"$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
                           "containers": [{"name": "a", "image": "q"}]}},
                 {"spec": {"containers": [{"name": "b"}, {"name": "a", "image": "q"}]}}, id="set-element-order"),
    pytest.param({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}}},
                 {"spec": {"strategy": {"$retainKeys": ["type"], "type": "OnDelete"}}},
                 {"spec": {"strategy": {"type": "OnDelete"}}}, id="retain-keys-drops-the-others"),
    pytest.param({"metadata": {"finalizers": ["a", "b"]}}, {"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}},
                 {"metadata": {"finalizers": ["b"]}}, id="delete-from-primitive-list"),
    pytest.param({"spec": {"tolerations": [{"key": "a"}]}}, {"spec": {"tolerations": [{"key": "b"}]}},
                 {"spec": {"tolerations": [{"key": "b"}]}}, id="list-without-merge-key-replaces"),
    pytest.param({"spec": {"ports": [{"port": 80, "name": "h"}]}}, {"spec": {"ports": [{"port": 443, "name": "s"}]}},
                 {"spec": {"ports": [{"port": 80, "name": "h"}, {"port": 443, "name": "s"}]}},
                 id="service-ports-merge-by-port"),
]


@pytest.mark.parametrize(("base", "patch", "want"), SMP_CASES)
def test_strategic_merge_patch(base, patch, want):
    kind = "Service" if "ports" in patch.get("spec", {}) else "DaemonSet"
    assert strategic_merge(base, patch, kind) == want


JSON_PATCH_CASES = [
    pytest.param([{"op": "add", "path": "/a/c", "value": 3}], {"a": {"b": 1, "c": 3}}, id="add"),
    pytest.param([{"op": "remove", "path": "/a/b"}], {"a": {}}, id="remove"),
    pytest.param([{"op": "replace", "path": "/l/0", "value": 9}], {"a": {"b": 1}, "l": [9, 2]}, id="replace-in-list"),
    pytest.param([{"op": "move", "from": "/a/b", "path": "/m"}], {"a": {}, "m": 1}, id="move"),
    pytest.param([{"op": "add", "path": "/l/-", "value": 3}], {"a": {"b": 1}, "l": [1, 2, 3]}, id="append"),
]


@pytest.mark.parametrize(("ops", "want"), JSON_PATCH_CASES)
def test_json_patch(ops, want):
    base = {"a": {"b": 1}, "l": [1, 2]}
    if "l" not in want:
        base.pop("l")
    assert json_patch(base, ops) == want


def test_json_patch_test_op_and_missing_path_fail():
    with pytest.raises(ApiFailure) as e:
        json_patch({"a": 1}, [{"op": "test", "path": "/a", "value": 2}])
    assert e.value.code == 422
    with pytest.raises(ApiFailure):
        json_patch({"a": 1}, [{"op": "remove", "path": "/zz"}])
