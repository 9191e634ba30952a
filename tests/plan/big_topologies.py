# SPDX-License-Identifier: Apache-2.0
"""Generated topologies of the size the graph must stay readable at (issue 20): `locations`
locations of `per_location` nodes each, every location one private /24 of its own (10.100.0.0/24
up), pod CIDRs from 10.200.0.0/16 up, public endpoints, and a granularity.
`python -m tests.plan.big_topologies DIR` writes the 50- and 500-node ones as topology files (the
docs' pictures are drawn from them)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from tests.plan.fixtures import key

# (locations, nodes per location): 50 and 500 nodes.
SIZES: dict[int, tuple[int, int]] = {50: (5, 10), 500: (10, 50)}


def big_topology(locations: int, per_location: int, granularity: str = "cross") -> dict[str, Any]:
    """The topology document (as a user writes the YAML) of `locations` x `per_location` nodes."""
    nodes = []
    for loc in range(locations):
        for i in range(per_location):
            n = loc * per_location + i
            nodes.append({"name": f"n{loc}-{i:02d}", "location": f"loc{loc}",
                          "internal_ip": f"10.{100 + loc}.0.{i + 1}/24",
                          "endpoint": f"{20 + loc // 250}.{loc % 250}.{i // 250}.{i % 250 + 1}:51820",
                          "pod_cidr": f"10.{200 + n // 256}.{n % 256}.0/24",
                          "public_key": key(1000 + n)})
    return {"cluster": {"name": f"big{locations * per_location}", "id": 1},
            "mesh": {"granularity": granularity, "intra_subnet": "direct"}, "nodes": nodes}


def sized(total: int, granularity: str = "cross") -> dict[str, Any]:
    return big_topology(*SIZES[total], granularity=granularity)


def main(out: str) -> None:
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    for total in SIZES:
        for gran in ("cross", "location"):
            (d / f"big-{total}-{gran}.yaml").write_text(yaml.safe_dump(sized(total, gran), sort_keys=False))


if __name__ == "__main__":
    main(sys.argv[1])
