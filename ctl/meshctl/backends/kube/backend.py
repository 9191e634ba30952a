# SPDX-License-Identifier: Apache-2.0
"""The Kubernetes backend (`meshctl agent --backend kubernetes`): Nodes, Peer resources and the
mesh ConfigMap through the API server, with lightkube as the client.

- `publish` merge-patches the agent's own Node annotations (never a full update, so it cannot
  undo a concurrent change by someone else) and refreshes last-seen;
- `run` keeps a cache by list + watch per kind: it resumes a broken watch from the last
  resourceVersion it saw and relists only on 410 Gone;
- `snapshot` turns the cache into a `ClusterState` with the pure `state_from_objects`: nodes in
  admission order (creationTimestamp, then name), a malformed annotation rejecting only its
  node, and nodes whose last-seen is older than twice the resync period left out as not ready.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lightkube import ApiError, Client, KubeConfig
from lightkube.generic_resource import create_global_resource
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import ConfigMap, Secret
from lightkube.resources.core_v1 import Node as KNode
from lightkube.types import PatchType

from meshctl import defaults
from meshctl.backends.base import BackendStatus, ClusterState
from meshctl.backends.kube.cni_ipam import CNI_KINDS, PodCidrs, pod_cidrs_for
from meshctl.backends.kube.errors import describe, install_hooks, is_kubernetes_answer, status_of
from meshctl.backends.kube.flannel import FLANNEL_PREFIX, parse_flannel
from meshctl.backends.kube.forwarding import (
    FORWARDING_DATA_KEY,
    FORWARDING_LABEL,
    forwarding_configmap,
    heartbeat_only,
    reports_from_configmaps,
)
from meshctl.backends.kube.informer import FAILURES, Informer, Obj, as_dict, errors_of, follow_all, slim
from meshctl.backends.kube.nodes import KILO_PREFIX, PREFIX, own_annotations, parse_kube_node, pending_reason
from meshctl.backends.kube.peers import KILO_PEERS, MESHCTL_PEERS, PeerResource, parse_peer_object
from meshctl.errors import MISSING, InputError, MeshError
from meshctl.mesh import fields, records
from meshctl.mesh.admit import Rejection
from meshctl.mesh.leaders import ForwardingReport
from meshctl.mesh.model import Cluster, IPNetwork, MeshSettings, Node
from meshctl.mesh.observed import MAX_SEEN_BYTES, NodeSeen, summary_of
from meshctl.node.flannel import FlannelLease

if TYPE_CHECKING:
    from meshctl.backends.kube.authn import DelegatedAuth
    from meshctl.backends.kube.kvstore import KvstoreMirror

log = logging.getLogger("meshctl.kube")
# The agent configures logging and gets these lines; a one-shot command (plan, graph, mesh get)
# configures none and reports the same failures and rejections in its own `error:`/`warning:`
# lines, so without a handler of ours Python's last-resort handler would print each twice.
log.addHandler(logging.NullHandler())

DEFAULT_NAMESPACE = "meshctl"
DEFAULT_CONFIGMAP = "meshctl"
# ConfigMap data keys: the mesh settings of records.MESH_FIELDS plus the cluster's identity, and
# AGENT_ENV_KEYS, which only the DaemonSet reads (into the agent's environment) and the mesh
# settings ignore.
CLUSTER_KEYS = ("cluster_name", "cluster_id")
AGENT_ENV_KEYS = ("private_interface", "internal_cidr", "cni", "fastpath", "masquerade6")
# The agent-environment keys that hold true or false.
BOOLEAN_ENV_KEYS = ("fastpath", "masquerade6")
# Node summaries (agent.seen): one ConfigMap per node, labelled, the JSON under one data key.
SEEN_CONFIGMAP_PREFIX = "meshctl-seen-"
SEEN_LABEL = "meshctl.io/seen"
SEEN_DATA_KEY = "seen"
# The watched kind of the forwarding reports' ConfigMaps (backends.kube.forwarding), as errors name it.
FORWARDING_KIND = "forwarding reports"


def seen_configmap(node: str) -> str:
    return f"{SEEN_CONFIGMAP_PREFIX}{node}"


def settings_from_configmap(data: Mapping[str, str] | None, where: str = "configmap") -> tuple[Cluster, MeshSettings]:
    """Cluster identity and mesh settings from a ConfigMap's data (all values are strings). The
    agent-environment keys are not mesh settings; the true-or-false ones are still checked here,
    so a bad value is named on every agent and not only where the agent process starts."""
    for key in BOOLEAN_ENV_KEYS:
        value = (data or {}).get(key, "")
        if value != "":
            fields.boolean(value, f"{where}.{key}")
    data = {k: v for k, v in (data or {}).items() if k not in AGENT_ENV_KEYS}
    cname = data.pop("cluster_name", None)
    cid = data.pop("cluster_id", None)
    ident: dict[str, str | int] = {}
    if cname is not None:
        ident["name"] = cname
    if cid is not None:
        ident["id"] = fields.cluster_id(cid, f"{where}.cluster_id")
    cluster = records.parse_cluster(ident,
                                     where)
    return cluster, records.parse_mesh(data, where)


def state_from_objects(
    nodes: Iterable[Mapping[str, Any]],
    peers: Iterable[Mapping[str, Any]],
    cluster: Cluster,
    mesh: MeshSettings,
    *,
    now: float,
    max_age: float,
    location_label: str = defaults.REGION_LABEL,
    own_name: str = "",
    flannel: bool = False,
    pod_cidrs: PodCidrs | None = None,
    reports: Iterable[Mapping[str, Any]] = (),
    namespace: str = DEFAULT_NAMESPACE,
) -> ClusterState:
    """The pure part of `snapshot`: Kubernetes objects in, a ClusterState out. Never raises for a
    bad object: it becomes a Rejection naming node (or peer), annotation and value. With `flannel`
    (`--cni flannel`) flannel's annotations are read too: a Node whose flannel annotation does not
    parse is rejected alone, and `flannel` maps node names to their FlannelLease.
    `pod_cidrs` (`--cni calico|cilium`) gives each node's pod CIDRs from its CNI's IPAM instead of
    `spec.podCIDR`; its rejections (a block claimed twice, an overlapping CiliumNode) are counted
    with the rest, and a node without CIDRs there is pending. `reports` are the forwarding
    reports' ConfigMaps (backends.kube.forwarding) of `namespace`: each one that is not a report of
    the node it is named for, in `cluster`, is a rejection."""
    parsed: list[tuple[str, str, Node]] = []
    leases: dict[str, FlannelLease] = {}
    rejections: list[Rejection] = list(pod_cidrs.rejections) if pod_cidrs is not None else []
    pending: dict[str, str] = {}  # node -> what it still lacks
    stale: list[str] = []
    for obj in nodes:
        name = str((obj.get("metadata") or {}).get("name", ""))
        try:
            kn = parse_kube_node(obj, location_label=location_label, default_port=mesh.port,
                                 pod_cidrs=pod_cidrs.by_node.get(name, ()) if pod_cidrs is not None else None)
            lease = parse_flannel(name, (obj.get("metadata") or {}).get("annotations") or {}) if flannel else None
        except InputError as e:
            rejections.append(Rejection(name, str(e)))
            continue
        if kn is None:
            pending[name] = pending_reason(obj, pod_cidrs.by_node.get(name, ()) if pod_cidrs is not None else None)
        elif name != own_name and now - kn.last_seen > max_age:
            stale.append(name)
        else:
            parsed.append((kn.created, name, kn.node))
            if lease is not None:
                leases[kn.node.name] = lease
    parsed.sort(key=lambda t: (t[0], t[1]))
    out_peers = []
    for obj in sorted(peers, key=lambda o: (str(o.get("apiVersion", "")) != MESHCTL_PEERS.api_version,
                                             str((o.get("metadata") or {}).get("name", "")))):
        try:
            out_peers.append(parse_peer_object(obj))
        except InputError as e:
            rejections.append(Rejection(str((obj.get("metadata") or {}).get("name", "")), str(e)))
    # A Peer under both Kilo's and meshctl's group: meshctl's wins (sorted first).
    seen: set[str] = set()
    unique_peers = []
    for p in out_peers:
        if p.name not in seen:
            seen.add(p.name)
            unique_peers.append(p)
    forwarding, refused = reports_from_configmaps(reports, cluster.name, namespace)
    rejections += refused
    return ClusterState(
        cluster=cluster, mesh=mesh, nodes=tuple(n for _, _, n in parsed), peers=tuple(unique_peers),
        rejections=tuple(rejections), pending=pending, stale=tuple(stale), flannel=leases, forwarding=forwarding,
    )


def _without_status(obj: Obj) -> Obj:
    """What the cache keeps of a Node: all that a reader looks at. Dropped besides `managedFields`
    (8 kB of a typical Node, informer.slim): its `status` (6 kB: conditions, images, addresses),
    which nothing here reads; at 5,000 Nodes they were 90 MB of an agent's memory
    (docs/benchmarks.md, "Kubernetes backend at scale")."""
    obj = slim(obj)
    obj.pop("status", None)
    return obj


# The Node annotations anything here reads: meshctl's, Kilo's (user-set ones) and flannel's.
READ_ANNOTATIONS = (PREFIX, KILO_PREFIX, FLANNEL_PREFIX)


def _version(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def _node_view(obj: Obj) -> tuple[Any, ...]:
    """The parts of a cached Node that parse_kube_node, pending_reason and parse_flannel read."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    ann = {k: v for k, v in (meta.get("annotations") or {}).items() if k.startswith(READ_ANNOTATIONS)}
    return (meta.get("name"), meta.get("creationTimestamp"), meta.get("labels") or {}, ann,
            spec.get("podCIDR"), spec.get("podCIDRs"))


def unread_change(old: Obj | None, new: Obj) -> bool:
    """A Node modified only where nothing here reads (its status, taints, other components'
    annotations such as the TTL controller's): cached, waking no agent. In a cluster of 5,000
    Nodes the kubelets' status reports alone are some 17 Node updates a second. The echo of this
    agent's own write (the version its answer already stored) still wakes it, as any event did."""
    if old is None or _version(old) == _version(new):
        return False
    return _node_view(old) == _node_view(new)


class KubeBackend:
    """backend.Backend over the Kubernetes API. See the module docstring for the semantics.

    `mesh`/`cluster` given (from flags) win over the ConfigMap; without them the ConfigMap
    `namespace/configmap` is read and watched, and defaults apply while it does not exist.
    The agent should call `publish` at least once per resync period: other agents leave it out
    of their plans once its last-seen is older than twice that.
    """

    def __init__(self, config: KubeConfig, node_name: str, *, location_label: str = defaults.REGION_LABEL,
                 resync_seconds: float = 30.0, namespace: str = DEFAULT_NAMESPACE,
                 configmap: str = DEFAULT_CONFIGMAP, mesh: MeshSettings | None = None,
                 cluster: Cluster | None = None, peer_resources: Iterable[PeerResource] = (MESHCTL_PEERS, KILO_PEERS),
                 registry: Any = None, watch_timeout: int = 300, clock: Callable[[], float] = time.time,
                 cni: str = "keep") -> None:
        self.config = config
        self.node_name = fields.node_name(node_name, "--node")
        self.location_label = location_label
        self.resync_seconds = resync_seconds
        self.namespace = namespace
        self.configmap = configmap
        self.flag_mesh = mesh
        self.flag_cluster = cluster
        self.watch_timeout = watch_timeout
        self.clock = clock
        current = config.get()
        self.server = current.cluster.server if current is not None else "?"
        self._lock = threading.Lock()
        self._client = self.client()
        self.stats = {"relists": 0, "resumes": 0, "gone": 0, "errors": 0}

        def kind(name: str, resource: Any, **kw: Any) -> Informer:
            return Informer(name, resource, server=self.server, stats=self.stats, lock=self._lock,
                            retry_missing=resync_seconds, watch_timeout=watch_timeout, **kw)

        self._kinds: list[Informer] = [kind("nodes", KNode, slim=_without_status, quiet=unread_change)]
        for pr in peer_resources:
            res = create_global_resource(pr.group, pr.version, pr.kind, pr.plural)
            self._kinds.append(kind(f"{pr.plural}.{pr.group}", res, optional=True))
        # --cni calico|cilium: the CNI's IPAM objects, watched like the rest (a block that moves is
        # seen within one watch event); not Peers, so kept apart by name.
        self.cni = cni
        self._cni_kinds = frozenset(ck.name for ck in CNI_KINDS.get(cni, ()))
        for ck in CNI_KINDS.get(cni, ()):
            self._kinds.append(kind(ck.name, create_global_resource(ck.group, ck.version, ck.kind, ck.plural),
                                    optional=True))
        if mesh is None or cluster is None:
            self._kinds.append(kind("configmap", ConfigMap, namespace=namespace, fields={"metadata.name": configmap}))
        # The nodes' forwarding reports (backends.kube.forwarding), watched: a changed verdict wakes
        # every agent; a heartbeat that only moves a report's time is cached without waking it.
        self._kinds.append(kind(FORWARDING_KIND, ConfigMap, namespace=namespace, labels={FORWARDING_LABEL: "true"},
                                quiet=heartbeat_only))
        # Called (on the reconcile thread, from snapshot) with this node's pod CIDRs from its CNI's
        # IPAM whenever they changed (--cni calico|cilium): how its own record follows a moved block.
        self.on_own_pod_cidrs: Callable[[tuple[IPNetwork, ...]], object] | None = None
        self._own_cidrs: tuple[IPNetwork, ...] | None = None
        self.pod_cidrs: PodCidrs | None = None  # the last snapshot's, for status and tests
        self._last_good: ClusterState | None = None
        self._logged: set[str] = set()
        self._metrics = _Metrics(registry) if registry is not None else None
        self._published: Node | None = None
        # Called (on the reconcile thread, from snapshot) with this node's object whenever it
        # changed: how run-time changes of its user annotations reach the agent's own record.
        self.on_own_node: Callable[[Mapping[str, Any]], object] | None = None
        self._own_rv: str | None = None
        # --kvstore: mirrors every snapshot into an etcd for the cluster mesh (kube.kvstore).
        self.mirror: KvstoreMirror | None = None

    def read_secret(self, name: str, key: str) -> bytes:
        """One key of a Secret in the agent's namespace (node.wireguard.psk.SecretSource): for
        peers' pre-shared keys. The value is returned, never logged."""
        try:
            obj = self._client.get(Secret, name, namespace=self.namespace)
        except FAILURES as e:
            raise MeshError(describe(e, self.server, f"reading secret {self.namespace}/{name}")) from None
        data = obj.data or {}
        if key not in data:
            raise MeshError(f"secret {self.namespace}/{name} has no key {key!r}")
        try:
            return base64.b64decode(data[key], validate=True)
        except ValueError:
            raise MeshError(f"secret {self.namespace}/{name} key {key!r} is not base64") from None

    def write_settings(self, data: Mapping[str, str]) -> None:
        """Merge `data` (ConfigMap keys, string values) into the mesh ConfigMap, creating it when
        absent (`meshctl mesh set`): keys not in `data` are kept as they are."""
        self._merge_configmap(self.configmap, data)

    def publish_seen(self, seen: NodeSeen) -> None:
        """This node's summary (agent.seen.SeenStore) into the ConfigMap `meshctl-seen-<node>` of
        the agent's namespace: outside the one ConfigMap agents watch, so no agent wakes for
        another's summary; owned by the Node, so it goes when the Node goes. Which node may write
        which summary is manifests/admission-policy.yaml's to enforce; readers check the name."""
        if seen.node != self.node_name:
            raise InputError("seen.node", seen.node, f"is not this agent's node ({self.node_name})")
        self._merge_configmap(seen_configmap(seen.node), {SEEN_DATA_KEY: json.dumps(seen.to_json(), sort_keys=True)},
                              labels={SEEN_LABEL: "true"}, own=True)

    def publish_forwarding(self, report: ForwardingReport) -> None:
        """This node's forwarding report (agent.leadership.ForwardingStore) into the ConfigMap
        `meshctl-forwarding-<node>` of the agent's namespace, which every agent watches, under the
        cluster's name as this backend reads it now (readers refuse another cluster's). Which node
        may write which report is manifests/admission-policy.yaml's to enforce; readers check the
        name. It counts while this node is admitted (its last-seen fresh); owned by the Node, it
        goes when the Node goes."""
        if report.node != self.node_name:
            raise InputError("report.node", report.node, f"is not this agent's node ({self.node_name})")
        cluster = self._settings()[0].name
        if report.cluster != cluster:
            report = replace(report, cluster=cluster)
        self._merge_configmap(forwarding_configmap(report.node),
                              {FORWARDING_DATA_KEY: json.dumps(report.to_json(), sort_keys=True)},
                              labels={FORWARDING_LABEL: "true"}, own=True)

    def read_seen(self) -> tuple[dict[str, NodeSeen], list[str]]:
        """Every node's summary in the agent's namespace, by node, and a line per summary refused
        (not JSON, too large, or naming another node than its ConfigMap)."""
        try:
            items = list(self._client.list(ConfigMap, namespace=self.namespace, labels={SEEN_LABEL: "true"}))
        except FAILURES as e:
            raise MeshError(describe(e, self.server, f"listing configmaps of {self.namespace}")) from None
        seen: dict[str, NodeSeen] = {}
        refused: list[str] = []
        for cm in items:
            name = (cm.metadata.name if cm.metadata else None) or ""
            where = f"configmap {self.namespace}/{name}"
            text = (cm.data or {}).get(SEEN_DATA_KEY, "")
            try:
                if not name.startswith(SEEN_CONFIGMAP_PREFIX):
                    raise InputError(where, name, f"is not named {SEEN_CONFIGMAP_PREFIX}<node>")
                if len(text) > MAX_SEEN_BYTES:
                    raise InputError(where, f"{len(text)} bytes", f"is larger than a summary may be ({MAX_SEEN_BYTES})")
                try:
                    doc = json.loads(text)
                except ValueError:
                    raise InputError(where, text[:40], "is not JSON") from None
                node = name.removeprefix(SEEN_CONFIGMAP_PREFIX)
                s = summary_of(doc, where, node, "its ConfigMap")
            except (InputError, MeshError) as e:
                refused.append(str(e))
                continue
            seen[node] = s
        return seen, refused

    def _merge_configmap(self, name: str, data: Mapping[str, str], labels: Mapping[str, str] | None = None,
                         *, own: bool = False) -> None:
        """Merge `data` (and `labels`) into ConfigMap `name` of the agent's namespace, creating it
        when absent; with `own`, created owned by this agent's Node, so the garbage collector
        removes it with the Node (a node's summary and forwarding report)."""
        where = f"writing configmap {self.namespace}/{name}"
        patch: Obj = {"data": dict(data)}
        if labels:
            patch["metadata"] = {"labels": dict(labels)}
        try:
            try:
                self._client.patch(ConfigMap, name, patch, namespace=self.namespace, patch_type=PatchType.MERGE)
            except ApiError as e:
                if e.status.code != 404:
                    raise
                owners = self._own_owner() if own else None
                self._client.create(ConfigMap(metadata=ObjectMeta(name=name, namespace=self.namespace,
                                                                  labels=dict(labels or {}), ownerReferences=owners),
                                              data=dict(data)))
        except FAILURES as e:
            raise MeshError(describe(e, self.server, where)) from None

    def _own_owner(self) -> list[OwnerReference] | None:
        """This agent's Node as the owner of what it publishes (None until the Node is cached)."""
        with self._lock:
            own = self._kinds[0].objects.get(("", self.node_name))
        uid = ((own or {}).get("metadata") or {}).get("uid")
        if not uid:
            return None
        return [OwnerReference(apiVersion="v1", kind="Node", name=self.node_name, uid=str(uid))]

    # --- the Backend protocol ---------------------------------------------------------------

    def publish(self, node: Node) -> None:
        """Merge-patch this node's agent annotations (key, endpoint, addresses, last-seen,
        granularity) onto its Node; the answer updates the cache at once."""
        if node.name != self.node_name:
            raise InputError("node.name", node.name, f"is not this agent's node ({self.node_name})")
        gran = self._settings()[1].granularity
        patch = {"metadata": {"annotations": own_annotations(node, gran, self.clock())}}
        try:
            obj = self._client.patch(KNode, node.name, patch, patch_type=PatchType.MERGE)
        except FAILURES as e:
            if status_of(e) == 404 and is_kubernetes_answer(e):
                raise MeshError(f"node {node.name!r} does not exist in the kubernetes API {self.server}") from None
            raise MeshError(describe(e, self.server, f"patching node {node.name}")) from None
        self._kinds[0].store(_without_status(as_dict(obj)))
        self._published = node

    def snapshot(self) -> ClusterState:
        """The current view from the cache (listed now if `run` has not listed yet); when the
        API is unreachable, the last good view with ready=False and the reason."""
        for k in self._kinds:
            k.list_now(self._client)  # unless `run` has listed it
        error = errors_of(self._kinds)
        with self._lock:
            nodes = list(self._kinds[0].objects.values())
            peers = [o for k in self._kinds[1:] if k.resource is not ConfigMap and k.name not in self._cni_kinds
                     for o in k.objects.values()]
            reports = [o for k in self._kinds if k.name == FORWARDING_KIND for o in k.objects.values()]
            cni_objects = {k.name: list(k.objects.values()) for k in self._kinds if k.name in self._cni_kinds}
            revision = max((int(k.rv) for k in self._kinds if k.rv and k.rv.isdigit()), default=0)
            own = self._kinds[0].objects.get(("", self.node_name))
        if own is not None and self.on_own_node is not None:
            rv = str((own.get("metadata") or {}).get("resourceVersion") or "")
            if rv != self._own_rv:
                self._own_rv = rv
                self.on_own_node(own)
        try:
            cluster, mesh = self._settings()
        except InputError as e:
            return self._offer(self._not_ready(str(e)))
        if error:
            return self._offer(self._not_ready(error))
        pod_cidrs = pod_cidrs_for(self.cni, cni_objects)
        self.pod_cidrs = pod_cidrs
        if pod_cidrs is not None:
            mine = pod_cidrs.by_node.get(self.node_name, ())
            if mine != self._own_cidrs and self.on_own_pod_cidrs is not None:
                self._own_cidrs = mine
                self.on_own_pod_cidrs(mine)
        state = state_from_objects(nodes, peers, cluster, mesh, now=self.clock(), max_age=2 * self.resync_seconds,
                                   location_label=self.location_label, own_name=self.node_name,
                                   flannel=self.cni == "flannel", pod_cidrs=pod_cidrs, reports=reports,
                                   namespace=self.namespace)
        state = replace(state, revision=revision)
        self._report(state)
        self._last_good = state
        return self._offer(state)

    def run(self, stop: threading.Event, changed: Callable[[], None]) -> None:
        """List + watch every kind until `stop`; `changed()` after each event, after a relist,
        on losing and regaining the API, and every resync period (readiness ages)."""
        mirror = None
        if self.mirror is not None:
            mirror = threading.Thread(target=self.mirror.run, args=(stop,), name="kvstore", daemon=True)
            mirror.start()
        try:
            asyncio.run(self._run(stop, changed))
        finally:
            if mirror is not None:
                assert self.mirror is not None  # started above
                self.mirror.offer(self._last_good or self._not_ready("stopping"))  # wake it to see `stop`
                mirror.join(timeout=5)

    def status(self) -> BackendStatus:
        """`kvstore`: this cluster's nodes as mirrored into the cluster-mesh etcd (--kvstore)."""
        return BackendStatus(kvstore=self.mirror.status() if self.mirror is not None else None)

    def close(self) -> None:
        """Close the API connection; with --kvstore, give up the writer key at once so another
        agent takes over (the mirrored records stay)."""
        if self.mirror is not None:
            self.mirror.release()
        self._client._client._client.close()  # lightkube keeps the httpx client there

    # --- helpers for the agent ----------------------------------------------------------------

    def client(self) -> Client:
        """A new client of the same API server and credentials (for another thread's reads)."""
        c = Client(self.config, trust_env=False, field_manager="meshctl")
        install_hooks(c)
        return c

    def metrics_auth(self) -> DelegatedAuth:
        """Who may read the agent's /metrics, asked of this cluster (agent.secure_metrics)."""
        from meshctl.backends.kube.authn import DelegatedAuth

        return DelegatedAuth(self.client(), self.server)

    def describe(self, e: BaseException, doing: str) -> str:
        """`e` as one line naming this backend's server (errors.describe)."""
        return describe(e, self.server, doing)

    def own_object(self) -> Obj:
        """This agent's Node object, read now (for its pod CIDR and labels)."""
        try:
            return as_dict(self._client.get(KNode, self.node_name))
        except FAILURES as e:
            if status_of(e) == 404 and is_kubernetes_answer(e):
                raise MeshError(f"node {self.node_name!r} does not exist in the kubernetes API {self.server}") from None
            raise MeshError(describe(e, self.server, f"reading node {self.node_name}")) from None

    # --- internals ------------------------------------------------------------------------------

    def _settings(self) -> tuple[Cluster, MeshSettings]:
        cm = None
        for k in self._kinds:
            if k.name == "configmap":
                with self._lock:
                    cm = next(iter(k.objects.values()), None)
        from_cm = settings_from_configmap((cm or {}).get("data"),
                                          f"configmap {self.namespace}/{self.configmap}") \
            if cm is not None else (Cluster(), MeshSettings())
        return self.flag_cluster or from_cm[0], self.flag_mesh or from_cm[1]

    def _offer(self, state: ClusterState) -> ClusterState:
        if self.mirror is not None:
            self.mirror.offer(state)
        return state

    def _not_ready(self, reason: str) -> ClusterState:
        if self._last_good is not None:
            return replace(self._last_good, ready=False, reason=reason)
        return ClusterState(self.flag_cluster or Cluster(), self.flag_mesh or MeshSettings(), ready=False,
                            reason=reason)

    def _report(self, state: ClusterState) -> None:
        for r in state.rejections:
            if r.reason not in self._logged:
                log.warning("rejected %s", r.reason)
        self._logged = {r.reason for r in state.rejections}
        if self._metrics is not None:
            self._metrics.update(state, self.stats)

    def _refresh(self) -> None:
        """Re-publish the last record so its last-seen stays fresh (the agent publishes only
        when its record changes)."""
        if self._published is None:
            return
        try:
            self.publish(self._published)
        except MeshError as e:
            log.warning("refreshing last-seen: %s", e)

    async def _run(self, stop: threading.Event, changed: Callable[[], None]) -> None:
        for k in self._kinds:
            k.on_change = changed
        last = time.monotonic()

        async def resync() -> None:
            nonlocal last
            if time.monotonic() - last >= self.resync_seconds:
                last = time.monotonic()
                await asyncio.to_thread(self._refresh)
                changed()

        await follow_all(self.config, self._kinds, stop, beside=resync)


class _Metrics:
    """Rejected records and watch health, on the agent's registry."""

    def __init__(self, registry: Any) -> None:
        from prometheus_client import Gauge

        self.rejected = Gauge("meshctl_kube_rejected_records", "Nodes and Peers rejected for a malformed field",
                              registry=registry)
        self.stale = Gauge("meshctl_kube_stale_nodes", "Nodes left out because their last-seen is too old",
                           registry=registry)
        self.events = Gauge("meshctl_kube_watch_stats", "Relists, resumes, 410s and errors of the watches",
                            ["what"], registry=registry)

    def update(self, state: ClusterState, stats: Mapping[str, int]) -> None:
        self.rejected.set(len(state.rejections))
        self.stale.set(len(state.stale))
        for k, v in stats.items():
            self.events.labels(k).set(v)


# Where kubeconfigs are found, in kubectl's order after --kubeconfig: $KUBECONFIG when set (kubectl
# then reads nothing else), else ~/.kube/config; in a pod, the service account. k3s keeps its own
# at K3S_KUBECONFIG, which only root reads and kubectl does not look at: errors name it.
DEFAULT_KUBECONFIG = "~/.kube/config"
K3S_KUBECONFIG = "/etc/rancher/k3s/k3s.yaml"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SERVICE_ENV = ("KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")  # the API server, as a pod finds it


def find_kubeconfig(flag: str | None, env: Mapping[str, str]) -> Path | None:
    """The kubeconfig file to read, as kubectl picks it: `--kubeconfig`, else the first file of
    `$KUBECONFIG` (a colon-separated list) that exists, else ~/.kube/config if it exists; None
    when there is none (in a pod: use the service account). kubectl merges every file of
    $KUBECONFIG; one file is enough here (a context spread over several files is not read)."""
    if flag:
        if not Path(flag).expanduser().is_file():
            raise InputError("--kubeconfig", flag, "is not a file")
        return Path(flag).expanduser()
    listed = env.get("KUBECONFIG", "")
    if listed:
        for part in listed.split(os.pathsep):
            if part and Path(part).expanduser().is_file():
                return Path(part).expanduser()
        raise InputError("--kubeconfig", MISSING, f"is not given and $KUBECONFIG ({listed}) names no file that "
                         f"exists; on k3s: --kubeconfig {K3S_KUBECONFIG}")
    default = Path(DEFAULT_KUBECONFIG).expanduser()
    return default if default.is_file() else None


def kubeconfig_for(kubeconfig: str | None, env: Mapping[str, str] | None = None) -> KubeConfig:
    """The kubeconfig `find_kubeconfig` picks, else the in-cluster service account as a pod has
    it (the token, CA and namespace the kubelet mounts at SERVICE_ACCOUNT_DIR, the API server in
    SERVICE_ENV; lightkube re-reads the token file on a 401, so a rotated token is taken up);
    none of them is one line naming where it looked."""
    env = os.environ if env is None else env
    path = find_kubeconfig(kubeconfig, env)
    if path is None and not Path(SERVICE_ACCOUNT_DIR, "token").is_file():
        raise InputError("--kubeconfig", MISSING, f"is not given, $KUBECONFIG is not set, there is no "
                         f"{DEFAULT_KUBECONFIG} and this is not a pod; on k3s: --kubeconfig {K3S_KUBECONFIG}")
    unset = [k for k in SERVICE_ENV if not env.get(k)]
    if path is None and unset:
        raise MeshError(f"service account {SERVICE_ACCOUNT_DIR}: ${' and $'.join(unset)} not set (the kubelet "
                        "sets them in every container of a pod); outside a pod pass --kubeconfig")
    try:
        if path is not None:
            return KubeConfig.from_file(path)
        return KubeConfig.from_service_account(SERVICE_ACCOUNT_DIR)
    except Exception as e:  # lightkube raises ConfigError, OSError or YAML errors here
        raise MeshError(f"kubeconfig {path or SERVICE_ACCOUNT_DIR}: {e}") from None


def backend_from_options(kubeconfig: str | None, node_name: str,
                         location_label: str = defaults.REGION_LABEL, resync_seconds: float = 30.0, *,
                         namespace: str = DEFAULT_NAMESPACE, configmap: str = DEFAULT_CONFIGMAP,
                         mesh: MeshSettings | None = None, cluster: Cluster | None = None,
                         registry: Any = None, **extra: Any) -> KubeBackend:
    """What `meshctl agent --backend kubernetes` calls; `extra` goes to KubeBackend (clock,
    peer_resources, watch_timeout)."""
    if resync_seconds <= 0:
        raise InputError("--resync", resync_seconds, "must be > 0")
    return KubeBackend(kubeconfig_for(kubeconfig), node_name, location_label=location_label,
                       resync_seconds=resync_seconds, namespace=namespace, configmap=configmap, mesh=mesh,
                       cluster=cluster, registry=registry, **extra)
