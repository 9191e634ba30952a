# SPDX-License-Identifier: Apache-2.0
"""The page in a real browser against running namespace labs: it loads without a console error and
shows every node of the lab; a click on a node lists its peers with the rung each pair uses; a
click on a pair shows its `explain`; the search box finds a pod address; and a pair whose subnet
turns into a blackhole turns from its rung's colour to the fallback's (dashed) within 10 s, without
a reload. The default lab's picture is kept for docs/ui.md."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from meshctl.ui.view import RUNG_COLOURS
from tests.waiting import wait_for

from .conftest import lab_doc, lab_up, picture
from .helpers import browser, served

pytestmark = [pytest.mark.root, pytest.mark.slow]

# issue 20's goal is 10 s from a blackhole to the page showing the fallback (printed below); a loaded
# 2-CPU machine gets this long before the test calls the fallback missing
FALLBACK_WAIT_S = 60.0
# A pair on each fabric (tests/paths/test_lab_fabrics.py names the rung each must take).
PAIRS = (("l1", "l2"), ("v1", "v2"), ("u1", "u2"), ("h1", "h2"), ("k1", "k2"), ("l1", "v1"))


def agent_rung(st: Any, a: str, b: str) -> str | None:
    """The rung node a's agent says it uses to b now (its /status), the truth the page must show."""
    from meshctl.lab.namespaces import check as labcheck
    from tests.lab.conftest import node_of

    s = labcheck.agent_status(node_of(st, a), timeout=1.0) or {}
    return (s.get("paths") or {}).get(b)


# One test each: a lab is down again before the next comes up (one lab at a time).
@pytest.fixture
def fabrics_lab() -> Iterator[Any]:
    yield from lab_up(lab_doc("fabrics", path_hold_seconds=5))


@pytest.fixture
def default_lab() -> Iterator[Any]:
    yield from lab_up(lab_doc("default"))


def now_in_panel(page: Any, peer: str) -> str:
    """The `now` cell of the open node's row for `peer`."""
    out: str = page.page.eval_on_selector(f'#peers tr[data-peer="{peer}"]', "r => r.cells[1].innerText")
    return out


def lab_nodes(st: Any) -> set[str]:
    return {n.name for _, n in st.nodes()}


def test_the_fabrics_lab_live_then_a_blackholed_pair_falls_back_within_10_s(fabrics_lab: Any, tmp_path: Path) -> None:
    from meshctl.lab.namespaces import fabric

    st = fabrics_lab
    with served("--lab", st.name) as ui, browser(ui.url) as page:
        assert page.nodes() == lab_nodes(st)
        # every pair in the colour of the rung both its agents say they use (from their summaries)
        def settled() -> bool:
            for a, b in PAIRS:
                r = agent_rung(st, a, b)
                if r is None or agent_rung(st, b, a) != r or (page.edge(a, b) or {}).get("stroke") != RUNG_COLOURS[r]:
                    return False
            return agent_rung(st, "l1", "l2") == "direct"

        assert wait_for(settled, 90, 0.5), {k: (agent_rung(st, *k), page.edge(*k)) for k in PAIRS}
        assert page.edge("l1", "l2") == {"stroke": RUNG_COLOURS["direct"], "dash": None, "rung": "direct",
                                         "fell_back": "false"}
        # a click on a node: its record and every peer with the rung in use now
        page.page.click('g.node[data-node="v1"]')
        page.page.wait_for_selector('#peers tr[data-peer="v2"] .chip')
        rows = page.page.eval_on_selector_all("#peers tr[data-peer]", "rs => rs.map(r => [r.dataset.peer, "
                                              "r.cells[1].innerText])")
        assert dict(rows) == {n: agent_rung(st, "v1", n) for n in lab_nodes(st) - {"v1"}}, rows
        # a click on a pair: what `meshctl explain` says of it
        page.page.click('path.hit[data-hit="n:l1|n:l2"]', force=True)
        text = page.page.wait_for_selector("#explain", timeout=15000).inner_text()
        assert text.startswith("l1 -> l2: 1 hop(s)") and "rung direct" in text, text
        # the search box: a pod address finds its node
        pod = next(n for _, n in st.nodes() if n.name == "u2").pods[0].ip
        page.page.fill("#q", pod)
        page.page.press("#q", "Enter")
        page.page.wait_for_selector('g.node.found[data-node="u2"]')
        assert page.page.inner_text("#panel h2") == "u2"
        # the blackhole: l1-l2 leave direct for the tunnel, dashed (it fell back), without a reload
        page.page.click("#fit")  # the search centred u2: the whole map again
        page.page.click('g.node[data-node="l1"]')
        page.page.wait_for_selector('#peers tr[data-peer="l2"] .chip')
        assert now_in_panel(page, "l2") == "direct"
        version = page.page.get_attribute("body", "data-version")
        t0 = time.monotonic()
        fabric.change(st, "10.30.1.0/24", "blackhole")
        try:
            moved = wait_for(lambda: page.edge("l1", "l2") == {"stroke": RUNG_COLOURS["tunnel"], "dash": "7 5",
                                                                "rung": "tunnel", "fell_back": "true"},
                             FALLBACK_WAIT_S, 0.1)
            took = time.monotonic() - t0
            assert moved, (took, page.edge("l1", "l2"))
            print(f"the page shows l1-l2 on the tunnel, dashed, {took:.1f} s after the blackhole")
            assert page.page.get_attribute("body", "data-version") != version
            # the open node's panel follows the map: its row for l2 says tunnel now, with no click
            assert wait_for(lambda: now_in_panel(page, "l2") == "tunnel", 30, 0.1), now_in_panel(page, "l2")
            page.page.click("#fit")
            page.page.screenshot(path=str(picture("ui-fabrics-fallback.png", tmp_path)))
            assert page.edge("u1", "u2")["stroke"] == RUNG_COLOURS[agent_rung(st, "u1", "u2")], "another subnet"
        finally:
            fabric.change(st, "10.30.1.0/24", "l2")
        assert wait_for(lambda: (page.edge("l1", "l2") or {}).get("rung") == "direct", 30, 0.5)
        assert page.errors() == [], page.console
        assert page.elsewhere(ui.url) == []


def test_the_default_lab_page_and_its_picture(default_lab: Any, tmp_path: Path) -> None:
    st = default_lab
    with served("--lab", st.name) as ui, browser(ui.url, 1400, 820) as page:
        assert page.nodes() == lab_nodes(st)
        assert wait_for(lambda: page.page.locator("path.edge.unseen").count() == 0
                        and page.page.locator("path.edge").count() > 0, 60, 0.5), "pairs the agents do not report"
        # location granularity: the members reach their leader directly, the leaders each other by WireGuard
        assert page.edge("a1", "a2")["stroke"] == RUNG_COLOURS["direct"]
        assert page.edge("a1", "b1")["stroke"] == RUNG_COLOURS["tunnel"]
        page.page.click('g.node[data-node="a1"]')
        page.page.wait_for_selector('#peers tr[data-peer="b1"] .chip')
        peers = page.page.eval_on_selector_all("#peers tr[data-peer]", "rs => rs.map(r => r.dataset.peer)")
        assert sorted(peers) == ["a2", "b1", "b2", "c1"]
        page.page.wait_for_timeout(300)
        page.page.screenshot(path=str(picture("ui-default-lab.png", tmp_path)))
        assert page.errors() == [], page.console
