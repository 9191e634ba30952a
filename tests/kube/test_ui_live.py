# SPDX-License-Identifier: Apache-2.0
"""`meshctl ui --backend kubernetes`: the page's map is live from the summaries the agents write
into the API (one ConfigMap a node), read through a real kube-apiserver (tests/kubernetes.py): a pair is on the
rung its node reports, and the page turns it red by itself once the node reports no path."""

from __future__ import annotations

import json
import time
from typing import Any

from lightkube import Client

from meshctl.backends.kube.backend import backend_from_options
from meshctl.mesh.observed import NodeSeen, PeerSeen
from meshctl.ui.view import NO_PATH_COLOUR, RUNG_COLOURS
from tests.kubernetes import Api
from tests.ui.helpers import browser, served
from tests.waiting import wait_for

from .test_cli_live import fill


def publish(api: Api, node: str, peers: dict[str, PeerSeen]) -> None:
    b = backend_from_options(api.kubeconfig, node)
    try:
        b.publish_seen(NodeSeen(node, "default", time.time(), peers))
    finally:
        b.close()


def pair(doc: dict[str, Any], a: str, b: str) -> dict[str, Any]:
    return next(p for p in doc["model"]["pairs"] if {p["a"], p["b"]} == {a, b})


def test_the_map_is_live_from_the_kubernetes_backend(api: Api, kclient: Client) -> None:
    fill(kclient)
    with served("--kubeconfig", api.kubeconfig) as ui:
        meta = ui.json("/api/meta")
        assert (meta["backend"], meta["live"], meta["explain"]) == ("kubernetes", True, None)
        doc = ui.json("/api/graph")
        leader = next(p for p in doc["model"]["pairs"] if "n3" in (p["a"], p["b"]) and p["rung"] == "tunnel")
        other = leader["a"] if leader["b"] == "n3" else leader["b"]
        assert not leader["seen"], "no summary yet: the plan's rung"
        publish(api, other, {"n3": PeerSeen("tunnel", "tunnel", 0.9, 0.0)})
        assert wait_for(lambda: pair(ui.json("/api/graph"), other, "n3")["seen"], 10, 0.2)
        with browser(ui.url) as page:
            assert wait_for(lambda: (page.edge(other, "n3") or {}).get("stroke") == RUNG_COLOURS["tunnel"], 10, 0.2)
            publish(api, other, {"n3": PeerSeen(None, "tunnel")})
            assert wait_for(lambda: pair(ui.json("/api/graph"), other, "n3")["rung"] is None, 10, 0.2)
            # the page turns the pair red by itself
            assert wait_for(lambda: (page.edge(other, "n3") or {}).get("stroke") == NO_PATH_COLOUR, 10, 0.2)
            assert page.edge(other, "n3")["rung"] == "none" and page.errors() == []
            # closed, location fsn stands for its pairs: a pair inside it without a path reddens its box
            page.page.click("#collapse-all")
            assert page.page.locator("g.loc.broken").count() == 0
            publish(api, "n2", {"n1": PeerSeen(None, "direct")})
            assert wait_for(lambda: page.page.locator("g.loc.broken").count() == 1, 10, 0.2)
            assert page.page.get_attribute("g.loc.broken", "data-loc").endswith("/fsn")
            assert "1 no path" in page.page.text_content("g.loc.broken")
        node = ui.json(f"/api/node?name={other}")
        assert {p["peer"]: p["here"] for p in node["peers"]}["n3"] == {"rung": None, "first": "tunnel",
                                                                       "fell_back": False}
        assert json.loads(ui.get("/api/graph")[2])["error"] is None
