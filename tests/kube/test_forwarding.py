# SPDX-License-Identifier: Apache-2.0
"""Forwarding reports on the Kubernetes backend (backends/kube/forwarding.py): each node's in a
ConfigMap `meshctl-forwarding-<node>`, labelled; every agent watches them, a changed verdict wakes
it and a heartbeat that only moves the report's time does not; they reach ClusterState.forwarding
and, through it, choose_leaders; a report that names another node than its ConfigMap, another
cluster, or is not one is a rejection and the others stand."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from meshctl.backends.kube import nodes as A
from meshctl.backends.kube.backend import backend_from_options, state_from_objects
from meshctl.backends.kube.forwarding import (
    FORWARDING_DATA_KEY,
    FORWARDING_LABEL,
    forwarding_configmap,
    heartbeat_only,
    reports_from_configmaps,
)
from meshctl.errors import InputError
from meshctl.mesh.leaders import ForwardingReport, Judged, choose_leaders
from meshctl.mesh.model import Cluster, MeshSettings

from .helpers import Running, create_node, node_obj, wait_for

C = "default"


def report(node: str, at: float, cluster: str = C, **verdicts: str) -> ForwardingReport:
    return ForwardingReport(node, cluster, at, {m: Judged(v, 1.0) for m, v in verdicts.items()})  # type: ignore[arg-type]


def cm(name: str, text: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "meshctl", "labels": {FORWARDING_LABEL: "true"}},
            "data": {FORWARDING_DATA_KEY: text}}


def cm_of(name: str, r: ForwardingReport) -> dict[str, Any]:
    return cm(name, json.dumps(r.to_json()))


# --- the pure part ------------------------------------------------------------------------------


@pytest.mark.parametrize(("obj", "node", "reason"), [
    (cm_of("meshctl-forwarding-a2", report("a2", 10.0, a1="bad")), "a2", None),
    (cm_of("meshctl-forwarding-a3", report("a2", 10.0, a1="bad")), "a3",
     "configmap meshctl/meshctl-forwarding-a3.node: 'a2' does not match its ConfigMap"),
    (cm_of("meshctl-forwarding-a2", report("a2", 10.0, cluster="other", a1="bad")), "a2",
     "configmap meshctl/meshctl-forwarding-a2.cluster: 'other' names another cluster than its ConfigMap"),
    (cm("meshctl-forwarding-a2", "{oops"), "a2", "configmap meshctl/meshctl-forwarding-a2: '{oops' is not JSON"),
    (cm("meshctl-forwarding-a2", json.dumps({"node": "a2", "cluster": C, "at": 1, "verdicts": {"a1": {
        "verdict": "gone", "since": 1}}})), "a2",
     "verdicts.a1: verdict must be one of ok, bad, recovering, not 'gone'"),
    (cm("meshctl-forwarding-a2", " " * 70_000), "a2", "is larger than a report may be (65536 bytes)"),
    (cm_of("meshctl-seen-a2", report("a2", 10.0, a1="bad")), "meshctl-seen-a2",
     "'meshctl-seen-a2' is not named meshctl-forwarding-<node>"),
])
def test_which_configmaps_are_reports(obj: dict[str, Any], node: str, reason: str | None) -> None:
    good = cm_of("meshctl-forwarding-b1", report("b1", 10.0, b2="ok"))
    reports, rejections = reports_from_configmaps([obj, good], C, "meshctl")
    assert reports["b1"] == report("b1", 10.0, b2="ok"), "one bad report never hides the others"
    if reason is None:
        assert reports[node] == report("a2", 10.0, a1="bad") and rejections == []
    else:
        assert node not in reports
        assert [r.name for r in rejections] == [f"forwarding/{node.removeprefix('meshctl-forwarding-')}"]
        assert reason in rejections[0].reason, rejections[0].reason


@pytest.mark.parametrize(("old", "new", "quiet"), [
    (report("a2", 10.0, a1="ok"), report("a2", 40.0, a1="ok"), True),  # a heartbeat
    (report("a2", 10.0, a1="ok"), report("a2", 11.0, a1="bad"), False),  # a changed verdict
    (None, report("a2", 10.0, a1="ok"), False),  # a new report
    (report("a2", 10.0, a1="ok"), report("a2", 40.0, a1="ok", a3="ok"), False),  # a member more
])
def test_only_a_heartbeat_is_quiet(old: ForwardingReport | None, new: ForwardingReport, quiet: bool) -> None:
    name = forwarding_configmap("a2")
    assert heartbeat_only(cm_of(name, old) if old else None, cm_of(name, new)) is quiet


def node(name: str, i: int, loc: str = "a") -> dict[str, Any]:
    return node_obj(name, f"10.42.{i}.0/24", key=i, internal=f"192.168.1.{i}/24", ann={A.PREFIX + A.LOCATION: loc},
                    endpoint=f"198.51.100.{i}:51820")


def test_the_state_carries_the_reports_and_they_choose_the_leaders() -> None:
    """Two members calling a1 bad move location a to a2 (mesh.leaders: at least two witnesses)."""
    now = time.time()
    nodes = [node("a1", 1), node("a2", 2), node("a3", 3)]
    reports = [cm_of(forwarding_configmap(n), report(n, now, a1="bad", **{o: "ok" for o in ("a2", "a3") if o != n}))
               for n in ("a2", "a3")]
    mesh = MeshSettings(granularity="location")
    st = state_from_objects(nodes, [], Cluster(), mesh, now=now, max_age=60, reports=reports)
    assert sorted(st.forwarding) == ["a2", "a3"] and not st.rejections
    assert choose_leaders(st.topology(), st.forwarding).locations["location:a"].leaders == ("a2",)
    # One witness alone moves nothing.
    st = state_from_objects(nodes, [], Cluster(), mesh, now=now, max_age=60, reports=reports[:1])
    assert choose_leaders(st.topology(), st.forwarding).locations["location:a"].leaders == ("a1",)


# --- on the real API server -----------------------------------------------------------------------


def test_reports_are_watched_a_changed_verdict_wakes_and_a_heartbeat_does_not(api, kclient) -> None:
    for i, name in enumerate(("a1", "a2", "a3"), 1):
        create_node(kclient, node(name, i))
    writer = backend_from_options(api.kubeconfig, "a2")
    # No periodic resync in the test's time: its wake would be counted as the heartbeat's.
    watcher = backend_from_options(api.kubeconfig, "a3", resync_seconds=3600)
    try:
        with pytest.raises(InputError, match="report.node: 'a3' is not this agent's node"):
            writer.publish_forwarding(report("a3", 1.0, a1="bad"))
        with Running(watcher) as run:
            wait_for(lambda: watcher.snapshot().ready and all(k.listed for k in watcher._kinds), what="listed")
            # The cluster's name is the backend's (the ConfigMap's, else `default`), whatever the report said.
            listed = run.changes
            writer.publish_forwarding(report("a2", 10.0, cluster="stale-name", a1="ok", a3="ok"))
            # Seen, and its wake counted: the cache holds a report a moment before the wake is called.
            wait_for(lambda: "a2" in watcher.snapshot().forwarding and run.changes > listed, what="a2's report seen")
            assert watcher.snapshot().forwarding["a2"] == report("a2", 10.0, a1="ok", a3="ok")
            obj = kclient.get(ConfigMap, forwarding_configmap("a2"), namespace="meshctl")
            assert obj.metadata.labels == {FORWARDING_LABEL: "true"}
            # A heartbeat is cached without waking the agent ...
            woke = run.changes
            writer.publish_forwarding(report("a2", 40.0, a1="ok", a3="ok"))
            wait_for(lambda: watcher.snapshot().forwarding["a2"].at == 40.0, what="the heartbeat cached")
            assert run.changes == woke
            # ... a changed verdict wakes it.
            t0 = time.monotonic()
            writer.publish_forwarding(report("a2", 41.0, a1="bad", a3="ok"))
            wait_for(lambda: run.changes > woke, timeout=5, what="the watcher woken", poll=0.005)
            print(f"a changed verdict woke the watcher {time.monotonic() - t0:.3f} s after the write")
            assert watcher.snapshot().forwarding["a2"].verdicts["a1"].verdict == "bad"
            # A report in a1's name under a3's ConfigMap (written with the operator's rights, as no
            # node's could) is a rejection; a2's stands.
            kclient.create(ConfigMap(metadata=ObjectMeta(name=forwarding_configmap("a3"), namespace="meshctl",
                                                         labels={FORWARDING_LABEL: "true"}),
                                     data={FORWARDING_DATA_KEY: json.dumps(report("a1", 41.0, a2="bad").to_json())}))
            wait_for(lambda: any(r.name == "forwarding/a3" for r in watcher.snapshot().rejections),
                     what="the forged report refused")
            assert set(watcher.snapshot().forwarding) == {"a2"}
            # The report goes when its ConfigMap does (an operator cleaning up a removed node).
            kclient.delete(ConfigMap, forwarding_configmap("a2"), namespace="meshctl")
            wait_for(lambda: "a2" not in watcher.snapshot().forwarding, what="a2's report gone")
    finally:
        writer.close()
