# SPDX-License-Identifier: Apache-2.0
"""Writes the golden plan outputs: every topology under tests/plan/golden/*.yaml, every node, as
`meshctl plan -o json` prints it. Run once with a known-good tree (`python -m tests.plan.make_golden`);
tests/plan/test_golden.py compares the current code's output against these files byte for byte."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import yaml

from tests.plan.fixtures import CROSS_TWO_SUBNETS, KILO_CLASSIC, key

GOLDEN = Path(__file__).parent / "golden"
LABS = Path(__file__).resolve().parents[2] / "ctl" / "meshctl" / "lab" / "labs"


def write_topologies() -> None:
    """The worked fixtures under every granularity and fixed intra_subnet mode, and the default lab."""
    for name, doc in (("kilo-classic", KILO_CLASSIC), ("cross-two-subnets", CROSS_TWO_SUBNETS)):
        for gran in ("location", "full", "cross"):
            for intra in ("direct", "wireguard-private", "wireguard"):
                d = copy.deepcopy(doc)
                d["mesh"] = {**d.get("mesh", {}), "granularity": gran, "intra_subnet": intra}
                (GOLDEN / f"{name}.{gran}.{intra}.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    lab = yaml.safe_load((LABS / "default.yaml").read_text())
    lab.pop("lab", None)
    for i, n in enumerate(lab["nodes"], start=200):  # the lab's agents make keys; the file needs some
        n["public_key"] = key(i)
        n["endpoint"] = f"192.0.2.{i - 190}:51820"
    (GOLDEN / "lab-default.yaml").write_text(yaml.safe_dump(lab, sort_keys=False))


def plan_json(topology: Path, node: str) -> str:
    return subprocess.run([str(Path(sys.executable).parent / "meshctl"), "plan", "-f", str(topology), "--node", node,
                           "-o", "json"], check=True, capture_output=True, text=True).stdout


def main() -> None:
    GOLDEN.mkdir(exist_ok=True)
    write_topologies()
    for t in sorted(GOLDEN.glob("*.yaml")):
        for n in yaml.safe_load(t.read_text())["nodes"]:
            (GOLDEN / f"{t.stem}.{n['name']}.json").write_text(plan_json(t, n["name"]))


if __name__ == "__main__":
    main()
