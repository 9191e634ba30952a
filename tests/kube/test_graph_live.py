# SPDX-License-Identifier: Apache-2.0
"""`meshctl graph --live --backend kubernetes` through a real kube-apiserver (tests/kubernetes.py): the nodes'
published summaries (agent.seen's ConfigMaps) put each pair on the rung its ends see, a fallen-back
pair dashed and one without a path red; a pair no end reports keeps its plan's rung."""

from __future__ import annotations

import time

from click.testing import CliRunner
from lightkube import Client

from meshctl.backends.kube.backend import backend_from_options
from meshctl.cli import main
from meshctl.mesh.graph import NO_PATH_ATTRS
from meshctl.mesh.observed import NodeSeen, PeerSeen
from tests.kubernetes import Api

from .test_cli_live import fill


def publish(api: Api, node: str, **peers: PeerSeen) -> None:
    be = backend_from_options(api.kubeconfig, node)
    try:
        be.publish_seen(NodeSeen(node, "default", time.time(), peers))
    finally:
        be.close()


def test_graph_live_draws_what_the_nodes_publish(api: Api, kclient: Client) -> None:
    fill(kclient)
    base = ["graph", "--kubeconfig", api.kubeconfig, "--level", "node"]
    planned = CliRunner().invoke(main, [*base, "-o", "text"])
    assert planned.exit_code == 0, planned.output
    assert "n1 -- n2: 1 direct" in planned.stdout and "n1 -- n3: 1 wireguard" in planned.stdout
    publish(api, "n1", n2=PeerSeen("direct+vxlan", first="direct"), n3=PeerSeen(None, first="tunnel"))
    publish(api, "n3", n1=PeerSeen("tunnel", first="tunnel"))
    r = CliRunner().invoke(main, [*base, "--live", "-o", "text"])
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0].endswith("every node (live)")
    assert "n1 -- n2: 1 direct+vxlan fell back" in lines
    assert "n1 -- n3: 1 no path" in lines  # the ends disagree: the costlier
    assert "n1 -- peer:laptop: 1 wireguard" in lines  # nobody reports it: the plan's rung
    dot = CliRunner().invoke(main, [*base, "--live"]).stdout
    assert f'"n1" -> "n3" [{NO_PATH_ATTRS}];' in dot
    assert '"n1" -> "n2" [style=dashed, color=darkgreen, label="vxlan"];' in dot
