"""Kubernetes: the node backend (annotations, Peer resources, the mesh ConfigMap) and an in-process
API server for tests and the lab. `backend_from_options` is what the agent calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .backend import KubeBackend


def backend_from_options(kubeconfig: str | None, api_server: str | None, node_name: str,
                         location_label: str = "topology.kubernetes.io/region", resync_seconds: float = 30.0,
                         **kw: Any) -> KubeBackend:
    """See `meshctl.kube.backend.backend_from_options` (imported lazily: lightkube loads only
    when the Kubernetes backend is chosen)."""
    from .backend import backend_from_options as make

    return make(kubeconfig, api_server, node_name, location_label, resync_seconds, **kw)


def make_backend(cfg: Any) -> KubeBackend:
    """What `agent.run.build_backend` calls for `--backend kubernetes`, with an AgentConfig.

    Kubernetes-only options come from `cfg.extra` (`kubeconfig`, `api_server`, `location_label`,
    `namespace`, `configmap`), else from $KUBECONFIG and $MESHCTL_API_SERVER, else in-cluster.
    The node's user-set annotations (location, forced endpoint or
    internal address, leader, keepalive, location IPs) fill what the flags left unset, so the
    agent's own record agrees with what the other agents read from its Node.
    """
    import os

    from .backend import DEFAULT_CONFIGMAP, DEFAULT_NAMESPACE
    from .nodes import REGION_LABEL, settings_for_agent

    extra = dict(getattr(cfg, "extra", {}) or {})
    be = backend_from_options(
        extra.get("kubeconfig") or os.environ.get("KUBECONFIG"),
        extra.get("api_server") or os.environ.get("MESHCTL_API_SERVER"), cfg.node_name,
        extra.get("location_label", REGION_LABEL), float(cfg.resync_interval),
        namespace=extra.get("namespace", DEFAULT_NAMESPACE), configmap=extra.get("configmap", DEFAULT_CONFIGMAP),
    )
    for k, v in settings_for_agent(be.own_object(), be.location_label).items():
        if not getattr(cfg, k, None):
            setattr(cfg, k, v)
    return be
