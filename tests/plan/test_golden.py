# SPDX-License-Identifier: Apache-2.0
"""`meshctl plan -o json` for every node of every golden topology is byte-identical to the output
recorded with a known-good tree (tests/plan/make_golden.py wrote them): regrouping the package or
adding path rungs must not change any plan of the fixed intra_subnet modes."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from meshctl.cli import main

from .make_golden import GOLDEN

CASES = [(t, n["name"]) for t in sorted(GOLDEN.glob("*.yaml")) for n in yaml.safe_load(t.read_text())["nodes"]]


@pytest.mark.parametrize("topology, node", CASES, ids=[f"{t.stem}:{n}" for t, n in CASES])
def test_plan_json_is_unchanged(topology, node) -> None:
    r = CliRunner().invoke(main, ["plan", "-f", str(topology), "--node", node, "-o", "json"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout == (GOLDEN / f"{topology.stem}.{node}.json").read_text()


def test_every_golden_topology_has_outputs() -> None:
    assert len(CASES) == 77  # 18 fixture variants x 4 nodes + the default lab's 5
