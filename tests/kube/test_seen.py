# SPDX-License-Identifier: Apache-2.0
"""Node summaries (agent.seen) through a real kube-apiserver (tests/kubernetes.py): each node's in a ConfigMap
of its own, labelled, outside the one ConfigMap agents watch; rewritten in place; read back by
`Source.seen()` as `graph --live --backend kubernetes` reads them; a summary naming another node
than its ConfigMap, or not JSON, is a warning and the rest stand."""

from __future__ import annotations

import json
import re
import time

import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap

from meshctl.backends.kube.backend import SEEN_LABEL, backend_from_options, seen_configmap
from meshctl.cli.plan import Source
from meshctl.errors import InputError
from meshctl.mesh.observed import NodeSeen, PeerSeen
from tests.kubernetes import Api


def source(api: Api) -> Source:
    return Source(None, None, api.kubeconfig, None, "", None, None, None, "default")


def test_summaries_live_in_a_configmap_per_node_and_a_forged_one_is_refused(
        api: Api, kclient: Client, capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    b1 = backend_from_options(api.kubeconfig, "n1")
    try:
        b1.publish_seen(NodeSeen("n1", "default", now, {"n2": PeerSeen("direct", "direct", 0.4, 0.0)}))
        b1.publish_seen(NodeSeen("n1", "default", now + 5, {"n2": PeerSeen("tunnel", "direct", 1.2, 0.0)}))
        with pytest.raises(InputError, match="seen.node: 'n2' is not this agent's node"):
            b1.publish_seen(NodeSeen("n2", "default", now))
    finally:
        b1.close()
    cm = kclient.get(ConfigMap, seen_configmap("n1"), namespace="meshctl")
    assert cm.metadata.labels == {SEEN_LABEL: "true"}
    assert json.loads(cm.data["seen"])["peers"]["n2"]["rung"] == "tunnel", "rewritten in place"
    # A ConfigMap named for n2 that says it is n1's, one that is not JSON, and one long stale.
    for name, text in (("n2", json.dumps(NodeSeen("n1", "default", now).to_json())), ("n3", "{oops"),
                       ("n4", json.dumps(NodeSeen("n4", "default", now - 3600).to_json()))):
        kclient.create(ConfigMap(metadata=ObjectMeta(name=seen_configmap(name), namespace="meshctl",
                                                     labels={SEEN_LABEL: "true"}), data={"seen": text}))
    seen = source(api).seen()
    assert set(seen) == {"n1"} and seen["n1"].peers["n2"] == PeerSeen("tunnel", "direct", 1.2, 0.0)
    assert seen["n1"].peers["n2"].fell_back
    err = capsys.readouterr().err.splitlines()
    assert "warning: kubernetes: configmap meshctl/meshctl-seen-n2: 'n1' names another node than its ConfigMap" in err
    assert "warning: kubernetes: configmap meshctl/meshctl-seen-n3: '{oops' is not JSON" in err
    # 3600 s and the seconds this test took on a busy machine
    assert any(re.match(r"warning: kubernetes: the summary of n4 is 36\d\d s old: left out", line) for line in err), err


def test_a_file_topology_has_no_summaries(tmp_path) -> None:
    f = tmp_path / "t.yaml"
    f.write_text("nodes: []\n")
    with pytest.raises(InputError, match="--live: 't.yaml' needs the summaries the agents publish"):
        Source(str(f), None, None, None, "", None, None, None, "default").seen()


def test_a_nodes_summary_and_report_go_with_its_node(api: Api, kclient: Client) -> None:
    """Both ConfigMaps an agent publishes are owned by its Node: the controller manager's garbage
    collector removes them when the Node is deleted (no agent is left to)."""
    from lightkube.resources.core_v1 import Node as KNode

    from meshctl.backends.kube.forwarding import forwarding_configmap
    from meshctl.mesh.leaders import ForwardingReport, Judged
    from tests.kube.helpers import create_node, node_obj, wait_for

    create_node(kclient, node_obj("n1", "10.42.1.0/24", key=1))
    b1 = backend_from_options(api.kubeconfig, "n1")
    try:
        assert b1.snapshot().nodes  # the backend holds its Node (its uid names the owner)
        b1.publish_seen(NodeSeen("n1", "default", time.time(), {}))
        b1.publish_forwarding(ForwardingReport("n1", "default", time.time(), {"n2": Judged("ok", 1.0)}))
    finally:
        b1.close()
    names = (seen_configmap("n1"), forwarding_configmap("n1"))
    for name in names:
        owners = kclient.get(ConfigMap, name, namespace="meshctl").metadata.ownerReferences or []
        assert [(o.kind, o.name) for o in owners] == [("Node", "n1")], name
    kclient.delete(KNode, "n1")

    def gone() -> bool:
        return not {c.metadata.name for c in kclient.list(ConfigMap, namespace="meshctl")} & set(names)

    wait_for(gone, timeout=60, what="the garbage collector removing n1's ConfigMaps")
