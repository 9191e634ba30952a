# SPDX-License-Identifier: Apache-2.0
"""The agent's Kubernetes wiring: the backend from its flags (`make_backend`), and its own node
settings from its Node object, kept current while the agent runs (`OwnNodeSettings`).

With `--backend kubernetes` the node's location, forced endpoint or internal address, leader
preference, keepalive and location IPs are annotations people set (`kubectl annotate`), and the pod
CIDR is the Node's `spec.podCIDRs` (or `spec.podCIDR`). `OwnNodeSettings` holds them as the node's
`NodeSettings` for every field the flags left unset, at start and again whenever the Node changes
(the backend calls it from `snapshot`, on the reconcile thread, right before the agent builds its
own record from `current()`), so an annotation changed at run time reaches the plan without a
restart. Flags always win. The AgentConfig itself is never changed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Any

from meshctl.agent.config import AgentConfig, NodeSettings, Wiring
from meshctl.agent.global_services import MeshWithServices, MirroredRemotes
from meshctl.backends.kube import backend_from_options
from meshctl.backends.kube.backend import DEFAULT_CONFIGMAP, DEFAULT_NAMESPACE, KubeBackend
from meshctl.backends.kube.cni_ipam import CNI_KINDS
from meshctl.backends.kube.nodes import has_pod_cidr, settings_for_agent
from meshctl.defaults import REGION_LABEL
from meshctl.errors import InputError, MeshError
from meshctl.etcd import EtcdClient
from meshctl.mesh.model import Cluster, IPNetwork

log = logging.getLogger("meshctl.kube")

# NodeSettings fields a Node can supply (what nodes.settings_for_agent returns).
FIELDS = tuple(f.name for f in dataclasses.fields(NodeSettings))


class OwnNodeSettings:
    """This node's settings (`current`): the flags', with a Node object's applied (`__call__`) to
    the FIELDS the flags left unset."""

    def __init__(self, cfg: AgentConfig, location_label: str = REGION_LABEL, *, skip: tuple[str, ...] = ()) -> None:
        self.location_label = location_label
        self.settings = NodeSettings.of(cfg)
        # `skip`: fields another source owns (the pod CIDR with --cni calico|cilium: OwnPodCidrs).
        self.flagged = frozenset(k for k in FIELDS if getattr(self.settings, k) or k in skip)
        self.defaults = {f.name: _default(f) for f in dataclasses.fields(NodeSettings)}
        self._bad: str | None = None

    def current(self) -> NodeSettings:
        return self.settings

    def __call__(self, obj: Mapping[str, Any], *, strict: bool = False) -> list[str]:
        """Apply; returns the fields that changed. A malformed annotation keeps the previous values
        (logged once); with `strict` (at start) it raises the InputError instead."""
        try:
            got = settings_for_agent(obj, self.location_label)
        except InputError as e:
            if strict:
                raise
            if str(e) != self._bad:
                log.warning("own node: %s; keeping the previous settings", e)
                self._bad = str(e)
            return []
        self._bad = None
        changed = []
        for k in FIELDS:
            if k in self.flagged:
                continue
            new = got.get(k, self.defaults[k])
            if k == "pod_cidrs" and not new:
                continue  # pod CIDRs never go away under a running agent
            old = getattr(self.settings, k)
            if old != new:
                self.settings = dataclasses.replace(self.settings, **{k: new})
                changed.append(k)
                if not strict:
                    log.info("own node: %s %r -> %r (from its annotations)", k, _show(old), _show(new))
        return changed


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _show(v: Any) -> Any:
    return [str(x) for x in v] if isinstance(v, tuple) else (str(v) if v is not None else None)


def wait_for_pod_cidr(read: Any, name: str, timeout: float = 120.0, poll: float = 2.0) -> Mapping[str, Any]:
    """The Node object once it has a `spec.podCIDRs` or `spec.podCIDR` (the controller manager
    allocates them shortly after the node registers; the DaemonSet's pod may start first).
    MeshError after `timeout`."""
    deadline = time.monotonic() + timeout
    next_log = 0.0
    while True:
        obj: Mapping[str, Any] = read()
        if has_pod_cidr(obj):
            return obj
        now = time.monotonic()
        if now >= deadline:
            raise MeshError(f"node {name!r} has no spec.podCIDR after {timeout:.0f} s (is the controller manager "
                            "allocating node CIDRs, e.g. --allocate-node-cidrs / --pod-network-cidr?); "
                            "or pass --pod-cidr")
        if now >= next_log:
            log.info("waiting for node %s's spec.podCIDR", name)
            next_log = now + 10
        time.sleep(poll)


class OwnPodCidrs:
    """`--cni calico|cilium`: this node's pod CIDRs as its CNI's IPAM gives them (the backend calls
    it from `snapshot` whenever they change), into `own`'s settings. A node whose CNI takes its
    last block keeps the previous CIDR: a pod CIDR never goes away under a running agent."""

    def __init__(self, own: OwnNodeSettings, cni: str) -> None:
        self.own = own
        self.cni = cni
        self.cidrs: tuple[IPNetwork, ...] = ()

    def __call__(self, cidrs: tuple[IPNetwork, ...]) -> None:
        # The backend calls only when they changed.
        if not cidrs:
            log.warning("own node: its CNI's IPAM gives it no pod CIDR now; keeping %s",
                        ",".join(str(c) for c in self.own.settings.pod_cidrs))
            return
        log.info("own node: pod CIDRs %s (from %s's IPAM)", ",".join(str(c) for c in cidrs), self.cni)
        self.cidrs = cidrs
        # Every block is the node's: each one is routed and gets its fast-path entry.
        self.own.settings = dataclasses.replace(self.own.settings, pod_cidrs=cidrs)


def wait_for_own_pod_cidrs(be: KubeBackend, own: OwnPodCidrs, name: str, timeout: float = 120.0,
                           poll: float = 0.5) -> None:
    """Until the CNI's IPAM has given this node a pod CIDR (Calico claims a block with the node's
    first pod; a CiliumNode gets its podCIDRs from the operator). MeshError after `timeout`."""
    deadline = time.monotonic() + timeout
    while not own.cidrs:
        be.snapshot()
        if own.cidrs:
            return
        if time.monotonic() >= deadline:
            raise MeshError(f"node {name!r} has no pod CIDR in {be.cni}'s IPAM after {timeout:.0f} s "
                            "(docs/kubernetes.md: Calico and Cilium)")
        time.sleep(poll)


def make_backend(cfg: AgentConfig) -> Wiring[KubeBackend]:
    """What `agent.run.build_backend` calls for `--backend kubernetes`, with an AgentConfig: the
    backend, the config with the cluster's identity it found, and the node's settings source.

    The API: `cfg.kubeconfig` (--kubeconfig), else the first file of $KUBECONFIG that exists, else
    ~/.kube/config, else in-cluster (the DaemonSet's service account). The node's pod CIDR
    (waited for when the Node has none yet) and its user-set annotations (location, forced
    endpoint or internal address, leader, keepalive, location IPs) fill what the flags left unset,
    now and whenever the Node changes (OwnNodeSettings below). The cluster's identity is the
    flags' when they differ from the defaults, else the ConfigMap's.
    With `cfg.kvstore_endpoints` the cluster's nodes are mirrored into that etcd (backends.kube.kvstore).
    """

    flag_cluster = None
    if (cfg.cluster_name, cfg.cluster_id) != ("default", 1):
        flag_cluster = Cluster(cfg.cluster_name, cfg.cluster_id)
    be = backend_from_options(
        cfg.kubeconfig,  # else $KUBECONFIG, as kubectl reads it (kubeconfig_for)
        cfg.node_name, cfg.location_label or REGION_LABEL,
        float(cfg.resync_interval), cluster=flag_cluster,
        namespace=DEFAULT_NAMESPACE, configmap=DEFAULT_CONFIGMAP,
        cni=cfg.cni,
    )
    ipam = cfg.cni in CNI_KINDS
    own = OwnNodeSettings(cfg, be.location_label, skip=("pod_cidrs",) if ipam else ())
    obj = be.own_object() if cfg.pod_cidrs or ipam else wait_for_pod_cidr(be.own_object, cfg.node_name)
    own(obj, strict=True)
    be.on_own_node = own
    if ipam:
        own_cidrs = OwnPodCidrs(own, cfg.cni)
        be.on_own_pod_cidrs = own_cidrs
        wait_for_own_pod_cidrs(be, own_cidrs, cfg.node_name)
    if flag_cluster is None:
        st = be.snapshot()
        if st.ready:  # the cluster mesh watcher needs the local identity (backends.kube.backend reads the ConfigMap)
            cfg = dataclasses.replace(cfg, cluster_name=st.cluster.name, cluster_id=st.cluster.id)
    if cfg.kvstore_endpoints:
        from meshctl.backends.kube.kvstore import KvstoreMirror

        be.mirror = KvstoreMirror(kvstore_client(cfg), cfg.node_name, lease_ttl=cfg.lease_ttl,
                                  full_sync_seconds=float(cfg.resync_interval))
    return Wiring(be, cfg, own)


def kvstore_client(cfg: AgentConfig) -> EtcdClient:
    """A client of the cluster's own etcd as the kvstore identity (--kvstore-*)."""
    return EtcdClient(list(cfg.kvstore_endpoints), ca=cfg.kvstore_ca, cert=cfg.kvstore_cert, key=cfg.kvstore_key,
                      user=cfg.kvstore_user, password_file=cfg.kvstore_password_file)


def with_global_services(cfg: AgentConfig, be: KubeBackend, remotes: MirroredRemotes) -> MeshWithServices:
    """The cluster-mesh watcher with the global-services step beside it (agent.global_services):
    this agent is one candidate of the cluster's Lease; the elected one follows the cluster's
    Services and EndpointSlices by informers, publishes to the cluster's etcd (the kvstore identity
    may write its prefix) and writes the EndpointSlices; the others follow its status record there."""
    from meshctl.agent.global_services import GlobalServices
    from meshctl.backends.kube.services import KubeServiceApi, LeaseElector, ServiceCache

    api = KubeServiceApi(be.client())
    elector = LeaseElector(api, cfg.node_name, be.namespace)
    return MeshWithServices(remotes, GlobalServices(lambda: cfg.cluster_name, api, elector, kvstore_client(cfg),
                                                    remotes, ServiceCache(be.config)))
