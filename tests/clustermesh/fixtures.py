# SPDX-License-Identifier: Apache-2.0
"""Two clusters: cluster1 (cpu location on 10.10.0.0/24, an edge node without a private network)
and cluster2 (GPU machines on two private segments, gpu-a sharing cluster1's 10.10.0.0/24)."""

from __future__ import annotations

from typing import Any

from tests.plan.fixtures import key

CLUSTER1: dict[str, Any] = {
    "cluster": {"name": "cluster1", "id": 1},
    "mesh": {"granularity": "location", "subnet": "10.4.0.0/16"},
    "nodes": [
        {"name": "c1", "location": "cpu", "internal_ip": "10.10.0.1/24", "endpoint": "203.0.113.1:51820",
         "pod_cidr": "10.42.1.0/24", "public_key": key(1)},
        {"name": "c2", "location": "cpu", "internal_ip": "10.10.0.2/24", "pod_cidr": "10.42.2.0/24",
         "public_key": key(2)},
        {"name": "e1", "location": "edge", "endpoint": "198.51.100.9:51820", "pod_cidr": "10.42.3.0/24",
         "public_key": key(3)},
    ],
}

CLUSTER2: dict[str, Any] = {
    "cluster": {"name": "cluster2", "id": 2},
    "mesh": {"granularity": "location", "subnet": "10.5.0.0/16"},
    "nodes": [
        {"name": "g1", "location": "gpu-a", "internal_ip": "10.10.0.11/24", "endpoint": "203.0.113.11:51820",
         "pod_cidr": "10.43.1.0/24", "public_key": key(11)},
        {"name": "g2", "location": "gpu-a", "internal_ip": "10.10.0.12/24", "pod_cidr": "10.43.2.0/24",
         "public_key": key(12)},
        {"name": "g3", "location": "gpu-b", "internal_ip": "10.20.0.13/24", "endpoint": "203.0.113.13:51820",
         "pod_cidr": "10.43.3.0/24", "public_key": key(13)},
        {"name": "g4", "location": "gpu-b", "internal_ip": "10.20.0.14/24", "pod_cidr": "10.43.4.0/24",
         "public_key": key(14)},
    ],
}

# The MCS ServiceExport CRD (multicluster.x-k8s.io/v1alpha1) as its project ships it, trimmed to
# what the API server needs to serve it.
SERVICE_EXPORT_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "serviceexports.multicluster.x-k8s.io"},
    "spec": {"group": "multicluster.x-k8s.io", "scope": "Namespaced",
             "names": {"kind": "ServiceExport", "plural": "serviceexports", "singular": "serviceexport"},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True,
                           "schema": {"openAPIV3Schema": {"type": "object",
                                                          "x-kubernetes-preserve-unknown-fields": True}}}]},
}
