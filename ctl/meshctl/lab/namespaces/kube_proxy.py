# SPDX-License-Identifier: Apache-2.0
"""kube-proxy's part, reproduced for the Kubernetes lab, where no kube-proxy runs: a lab cluster's
Service ClusterIPs DNATed to the ready endpoints of their EndpointSlices in every node namespace
of that cluster, as kube-proxy's nftables mode does it (a random pick over per-endpoint chains,
the target port taken from the slice's port of the Service port's name), in a table of its own,
`ip meshctl-lab-kube-proxy`. A pod's connection to a ClusterIP is then DNATed on its node and
routed by the mesh like any pod-to-pod packet; conntrack undoes it on the reply.

No watch: `sync` programs what the API server holds now (the tests call it once the slices they
wait for are there). IPv4 only. Named so wherever it is used: it stands in for kube-proxy, it is
not meshctl's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from meshctl.lab.namespaces import kube_api
from meshctl.lab.namespaces.state import ClusterState
from meshctl.lab.rigs import netns

TABLE = "meshctl-lab-kube-proxy"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def ruleset(services: Sequence[dict[str, Any]], slices: Sequence[dict[str, Any]]) -> str:
    """The table for these Services and slices (nft -f input, replacing the table whole)."""
    rules: list[str] = []
    chains: list[str] = []
    for svc in sorted(services, key=lambda s: (s["metadata"]["namespace"], s["metadata"]["name"])):
        meta, spec = svc["metadata"], svc.get("spec") or {}
        vip = spec.get("clusterIP")
        if not vip or vip == "None" or ":" in vip:
            continue
        mine = [s for s in slices if s["metadata"]["namespace"] == meta["namespace"]
                and (s["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL) == meta["name"]
                and s.get("addressType") == "IPv4"]
        for p in spec.get("ports") or ():
            proto = str(p.get("protocol") or "TCP").lower()
            targets = []
            for s in mine:
                port = next((q["port"] for q in s.get("ports") or () if (q.get("name") or "") == (p.get("name") or "")),
                            None)
                if port is None:
                    continue
                targets += [(a, port) for e in s.get("endpoints") or ()
                            if (e.get("conditions") or {}).get("ready") is not False for a in e.get("addresses") or ()]
            if not targets:
                continue
            picks = []
            for k, (addr, port) in enumerate(sorted(set(targets))):
                chain = f"ep-{len(chains)}"
                chains.append(f"  chain {chain} {{\n    meta l4proto {proto} dnat to {addr}:{port}\n  }}")
                picks.append(f"{k} : goto {chain}")
            rules.append(f"    ip daddr {vip} {proto} dport {p['port']} numgen random mod {len(picks)} "
                         f"vmap {{ {', '.join(picks)} }}")
    body = "\n".join(rules)
    return (f"table ip {TABLE} {{}}\ndelete table ip {TABLE}\ntable ip {TABLE} {{\n"
            + "".join(f"{c}\n" for c in chains)
            + f"  chain services {{\n{body}\n  }}\n"
            + "  chain prerouting {\n    type nat hook prerouting priority -100;\n    jump services\n  }\n"
            + "  chain output {\n    type nat hook output priority -100;\n    jump services\n  }\n}\n")


def sync(cluster: ClusterState) -> str:
    """Program every node namespace of `cluster` with its Services as its API server holds them
    now; the ruleset written."""
    assert cluster.kube is not None, f"cluster {cluster.name} is not a Kubernetes lab cluster"
    services = kube_api.request(cluster.kube, "GET", "/api/v1/services")["items"]
    slices = kube_api.request(cluster.kube, "GET", "/apis/discovery.k8s.io/v1/endpointslices")["items"]
    text = ruleset(services, slices)
    for n in cluster.nodes:
        if n.netns is not None:
            netns.run(n.netns, ["nft", "-f", "-"], input=text)
    return text
