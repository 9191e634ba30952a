# SPDX-License-Identifier: Apache-2.0
"""Kubernetes: the node backend (annotations, Peer resources, the mesh ConfigMap) and the kvstore
mirror. `backend_from_options` is what the agent's wiring (agent.kube_backend) calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshctl import defaults

if TYPE_CHECKING:
    from meshctl.backends.kube.backend import KubeBackend


def backend_from_options(kubeconfig: str | None, node_name: str,
                         location_label: str = defaults.REGION_LABEL, resync_seconds: float = 30.0,
                         **kw: Any) -> KubeBackend:
    """See `meshctl.backends.kube.backend.backend_from_options` (imported lazily: lightkube loads only
    when the Kubernetes backend is chosen)."""
    from meshctl.backends.kube.backend import backend_from_options as make

    return make(kubeconfig, node_name, location_label, resync_seconds, **kw)
