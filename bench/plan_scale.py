# SPDX-License-Identifier: Apache-2.0
"""Plan of one node in a large topology, for each granularity.

Baseline: the same plan at 1,000 nodes; growth from 1k to 10k should be about 10x (linear).
Target (issue 2): under 1 s at 10,000 nodes in 100 locations.

    .venv/bin/python bench/plan_scale.py
"""

from __future__ import annotations

import base64
import statistics
import sys
import time

sys.path.insert(0, "ctl")

import ipaddress  # noqa: E402

from meshctl.mesh.model import Endpoint, MeshSettings, Node, Topology
from meshctl.mesh.plan import plan_node
from meshctl.process import gc_paused


def make_topology(n: int, locations: int, granularity: str) -> Topology:
    """n nodes spread over `locations`; each location is one private /16; every node has a
    public endpoint; pod CIDRs are /24s of 10.128.0.0/9... laid out so none overlap."""
    nodes = []
    for i in range(n):
        loc = i % locations
        idx = i // locations
        nodes.append(Node(
            name=f"node-{i:05d}",
            location=f"loc-{loc:03d}",
            internal_ip=ipaddress.ip_interface(f"172.{16 + loc // 256}.{loc % 256}.{idx + 1}/24")
            if idx < 250 else ipaddress.ip_interface(f"192.168.{loc}.{idx - 249}/24"),
            endpoint=Endpoint(f"198.{18 + i // 65536}.{(i // 256) % 256}.{i % 256}", 51820),
            pod_cidrs=(ipaddress.ip_network(f"10.{128 + i // 256}.{i % 256}.0/24"),),
            public_key=base64.b64encode(i.to_bytes(32, "big")).decode(),
        ))
    return Topology(mesh=MeshSettings(granularity=granularity), nodes=tuple(nodes))


def timed(topo: Topology, name: str, repeat: int = 5) -> float:
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        with gc_paused():  # as the agent and the CLI run a plan
            plan_node(topo, name)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def main() -> None:
    sizes = [1000, 2000, 5000, 10000]
    print(f"{'granularity':<12}" + "".join(f"{s:>10}" for s in sizes) + f"{'10k/1k':>10}  target <1 s at 10k")
    worst = 0.0
    for gran in ("location", "full", "cross"):
        row = []
        for s in sizes:
            topo = make_topology(s, 100, gran)
            row.append(timed(topo, "node-00001"))
        worst = max(worst, row[-1])
        print(f"{gran:<12}" + "".join(f"{t * 1000:>8.1f}ms" for t in row) + f"{row[-1] / row[0]:>9.1f}x")
    print(f"worst at 10,000 nodes: {worst:.3f} s ({'meets' if worst < 1 else 'MISSES'} the 1 s target; "
          f"linear growth would be 10x)")


if __name__ == "__main__":
    main()
