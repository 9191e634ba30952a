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

    The API: `cfg.kubeconfig` / `cfg.api_server` (flags), else $KUBECONFIG / $MESHCTL_API_SERVER,
    else in-cluster. The node's pod CIDR (waited for when the Node has none yet) and its user-set
    annotations (location, forced endpoint or internal address, leader, keepalive, location IPs)
    fill what the flags left unset, now and whenever the Node changes (kube.ownnode). The
    cluster's identity is the flags' when they differ from the defaults, else the ConfigMap's.
    With `cfg.kvstore_endpoints` the cluster's nodes are mirrored into that etcd (kube.kvstore).
    """
    import os

    from ..model import Cluster
    from .backend import DEFAULT_CONFIGMAP, DEFAULT_NAMESPACE
    from .nodes import REGION_LABEL
    from .ownnode import OwnNodeSettings, wait_for_pod_cidr

    extra = dict(getattr(cfg, "extra", {}) or {})
    flag_cluster = None
    if (cfg.cluster_name, cfg.cluster_id) != ("default", 1):
        flag_cluster = Cluster(cfg.cluster_name, cfg.cluster_id)
    be = backend_from_options(
        getattr(cfg, "kubeconfig", None) or extra.get("kubeconfig") or os.environ.get("KUBECONFIG"),
        getattr(cfg, "api_server", None) or extra.get("api_server") or os.environ.get("MESHCTL_API_SERVER"),
        cfg.node_name, getattr(cfg, "location_label", None) or extra.get("location_label", REGION_LABEL),
        float(cfg.resync_interval), cluster=flag_cluster,
        namespace=extra.get("namespace", DEFAULT_NAMESPACE), configmap=extra.get("configmap", DEFAULT_CONFIGMAP),
    )
    own = OwnNodeSettings(cfg, be.location_label)
    obj = be.own_object() if cfg.pod_cidr else wait_for_pod_cidr(be.own_object, cfg.node_name)
    own(obj, strict=True)
    be.on_own_node = own
    if flag_cluster is None:
        st = be.snapshot()
        if st.ready:  # the cluster mesh watcher needs the local identity (kube.backend reads the ConfigMap)
            cfg.cluster_name, cfg.cluster_id = st.cluster.name, st.cluster.id
    if getattr(cfg, "kvstore_endpoints", ()):
        from ..etcd import EtcdClient
        from .kvstore import KvstoreMirror

        client = EtcdClient(list(cfg.kvstore_endpoints), ca=cfg.kvstore_ca, cert=cfg.kvstore_cert, key=cfg.kvstore_key,
                            user=cfg.kvstore_user, password_file=cfg.kvstore_password_file)
        be.mirror = KvstoreMirror(client, cfg.node_name, lease_ttl=cfg.lease_ttl,
                                  full_sync_seconds=float(cfg.resync_interval))
    return be
