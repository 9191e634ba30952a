# SPDX-License-Identifier: Apache-2.0
"""The agent's settings: one frozen dataclass, filled from command-line flags (cli.agent) or by
the lab, and never changed while the agent runs. What the backend learns at run time about this
node (its pod CIDRs and annotations under `--backend kubernetes`) is not written into it: it is a
`NodeSettings` value that an `OwnSettings` source hands the pass (the flags' own for etcd and file
backends: `FlagSettings`).

Parsing goes through meshctl.mesh.fields so a bad flag reads like a bad record:
`--pod-cidr: '10.42.1.0/33' is not a CIDR`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from meshctl import defaults
from meshctl.backends.base import Backend
from meshctl.backends.kube.cni_ipam import CNI_KINDS
from meshctl.errors import InputError
from meshctl.mesh import fields
from meshctl.mesh.model import IPInterface, IPNetwork
from meshctl.node.cni import CNI_MODES, FASTPATH_OFF

# The CNI modes that read the CNI's state from the Kubernetes API, and why they need its backend.
KUBE_ONLY_CNI = {
    "flannel": "needs --backend kubernetes (it reads flannel's Node annotations)",
    **{cni: "reads pod CIDRs from the CNI's objects in the Kubernetes API: it needs --backend kubernetes"
       for cni in CNI_KINDS},
}


@dataclass(frozen=True)
class AgentConfig:
    node_name: str
    pod_cidrs: tuple[IPNetwork, ...] = ()  # with --backend kubernetes: the Node's spec.podCIDRs
    location: str = ""
    private_interface: str | None = None
    # One per IP family each (`--internal-cidr`, `--force-internal-ip`, `--endpoint` comma-separated).
    internal_cidr: tuple[IPNetwork, ...] = ()
    force_internal_ip: tuple[IPInterface, ...] = ()
    endpoint: str | None = None  # host[:port] items, parsed by discovery (the default port is the mesh's)
    public_interface: str | None = None
    leader: bool = False
    persistent_keepalive: int = 0
    allowed_location_ips: tuple[IPNetwork, ...] = ()
    state_dir: Path = defaults.STATE_DIR
    wg_interface: str = defaults.WG_INTERFACE
    wg_run_dir: Path = defaults.WG_RUN_DIR
    pod_interfaces: str | None = None
    cni: str = "keep"  # one of node.cni.CNI_MODES
    cni_conf_dir: Path = Path("/etc/cni/net.d")
    metrics_addr: str = defaults.METRICS_ADDR
    secure_metrics_addr: str = ""  # off; agent.secure_metrics
    backend: str = "etcd"
    etcd_endpoints: tuple[str, ...] = ()
    etcd_ca: str | None = None
    etcd_cert: str | None = None
    etcd_key: str | None = None
    etcd_user: str | None = None
    etcd_password_file: str | None = None
    topology_file: str | None = None
    cluster_name: str = "default"
    cluster_id: int = 1
    clustermesh_dir: Path | None = None
    clustermesh_cache: bool = False  # read remote clusters from the cache in this cluster's etcd when healthy
    fastpath: bool = True
    bpf_pin_root: str = defaults.PIN_ROOT
    lease_ttl: int = 10
    lapse_grace: float = defaults.LAPSE_GRACE_S
    nat_prefix: str = "meshctl"
    masquerade6: bool = False  # IPv6 pod egress leaving the mesh masqueraded too (IPv4's always is)
    resync_interval: float = 30.0
    path_hold: float = 10.0  # a private rung that delivers again is used only after this many seconds
    # Probe whether the other members of this node's location forward, and publish the verdicts
    # (agent/leadership.py); off: this node reports nothing (the others' reports still count).
    forwarding_probes: bool = True

    direct_wait: float = 20.0  # seconds a NATed peer may take to handshake before it is reported unreached
    # --backend kubernetes: how to reach the API (else $KUBECONFIG, else in-cluster) and which
    # Node label names the location when no location annotation does.
    kubeconfig: str | None = None
    location_label: str = defaults.REGION_LABEL
    # --backend kubernetes: mirror the cluster's nodes into this etcd for the cluster mesh.
    kvstore_endpoints: tuple[str, ...] = ()
    kvstore_ca: str | None = None
    kvstore_cert: str | None = None
    kvstore_key: str | None = None
    kvstore_user: str | None = None
    kvstore_password_file: str | None = None

    def check(self) -> AgentConfig:
        """Cross-field checks the flag parsers cannot do one by one."""
        if self.backend not in ("etcd", "file", "kubernetes"):
            raise InputError("--backend", self.backend, "is not one of etcd, file, kubernetes")
        if self.backend == "etcd" and not self.etcd_endpoints:
            raise InputError("--etcd-endpoints", "", "is required with --backend etcd")
        if self.backend == "file" and not self.topology_file:
            raise InputError("-f", "", "is required with --backend file")
        if bool(self.etcd_cert) != bool(self.etcd_key):
            raise InputError("--etcd-cert", self.etcd_cert or "", "and --etcd-key go together")
        if bool(self.etcd_user) != bool(self.etcd_password_file):
            raise InputError("--etcd-user", self.etcd_user or "", "and --etcd-password-file go together")
        if self.clustermesh_cache and self.clustermesh_dir is None:
            raise InputError("--clustermesh-cache", True, "needs --clustermesh-dir (the fallback)")
        if self.clustermesh_cache and not (self.backend == "etcd" or self.kvstore_endpoints):
            raise InputError("--clustermesh-cache", True, "reads the cache in this cluster's etcd: it needs --backend "
                             "etcd, or --backend kubernetes with --kvstore-endpoints")
        if bool(self.kvstore_user) != bool(self.kvstore_password_file):
            raise InputError("--kvstore-user", self.kvstore_user or "", "and --kvstore-password-file go together")
        if not self.pod_cidrs and self.backend != "kubernetes":
            raise InputError("--pod-cidr", "", f"is required with --backend {self.backend}")
        if self.kvstore_endpoints and self.backend != "kubernetes":
            raise InputError("--kvstore-endpoints", ",".join(self.kvstore_endpoints),
                             "is for --backend kubernetes (the etcd backend's records are already in etcd)")
        if bool(self.kvstore_cert) != bool(self.kvstore_key):
            raise InputError("--kvstore-cert", self.kvstore_cert or "", "and --kvstore-key go together")
        if self.cni not in CNI_MODES:
            raise InputError("--cni", self.cni, f"is not one of {', '.join(CNI_MODES)}")
        if self.cni in KUBE_ONLY_CNI and self.backend != "kubernetes":
            raise InputError("--cni", self.cni, KUBE_ONLY_CNI[self.cni])
        if self.resync_interval <= 0:
            raise InputError("--resync-seconds", self.resync_interval, "must be > 0")
        if not 0 <= self.path_hold <= 3600:
            raise InputError("--path-hold-seconds", self.path_hold, "is not seconds in 0..3600")
        if self.lapse_grace < 0:
            raise InputError("--lapse-grace", self.lapse_grace, "must be >= 0")

        if self.direct_wait <= 0:
            raise InputError("--direct-wait-seconds", self.direct_wait, "must be > 0")
        if self.lease_ttl < 2:
            raise InputError("--lease-ttl", self.lease_ttl, "is below 2 seconds")
        parse_addr(self.metrics_addr, "--metrics-addr")
        if self.secure_metrics_addr:
            parse_addr(self.secure_metrics_addr, "--secure-metrics-addr")
        return self


@dataclass(frozen=True)
class NodeSettings:
    """What this node's own record says of it beyond discovery: its pod CIDRs, location, forced
    endpoint and internal addresses, leader preference, keepalive and location IPs. The flags give
    them (`of`); under `--backend kubernetes` the Node's spec and annotations fill what the flags
    left unset, and may change while the agent runs (agent.kube_backend.OwnNodeSettings)."""

    pod_cidrs: tuple[IPNetwork, ...] = ()
    location: str = ""
    endpoint: str | None = None
    force_internal_ip: tuple[IPInterface, ...] = ()
    leader: bool = False
    persistent_keepalive: int = 0
    allowed_location_ips: tuple[IPNetwork, ...] = ()

    @classmethod
    def of(cls, cfg: AgentConfig) -> NodeSettings:
        """The flags' settings."""
        return cls(cfg.pod_cidrs, cfg.location, cfg.endpoint, cfg.force_internal_ip, cfg.leader,
                   cfg.persistent_keepalive, cfg.allowed_location_ips)


class OwnSettings(Protocol):
    """Where a pass reads this node's settings: the flags, or the flags with what the backend
    learned of the node since (called on the loop's thread, after the backend's snapshot)."""

    def current(self) -> NodeSettings: ...


class FlagSettings:
    """The flags' settings, the same on every pass (etcd and file backends)."""

    def __init__(self, cfg: AgentConfig) -> None:
        self._settings = NodeSettings.of(cfg)

    def current(self) -> NodeSettings:
        return self._settings


B = TypeVar("B", bound=Backend)


@dataclass(frozen=True)
class Wiring(Generic[B]):
    """A backend as `meshctl agent` builds it (agent.run.build_backend), with the config the agent
    runs with (the flags, with what the backend settled at start: the cluster's identity from its
    ConfigMap) and where each pass reads this node's settings."""

    backend: B
    cfg: AgentConfig
    own: OwnSettings


def fastpath_off(cfg: AgentConfig) -> str | None:
    """Why the fast path does not load on this node (`disabled`: --no-fastpath; a CNI whose tc
    programs it must not chain with: node.cni.FASTPATH_OFF), None when it loads."""
    if not cfg.fastpath:
        return "disabled"
    return FASTPATH_OFF.get(cfg.cni)


def parse_addr(value: str, path: str) -> tuple[str, int]:
    """`host:port` for a listening socket; `[v6]:port` for IPv6."""
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise InputError(path, value, "is not host:port")
    return host.strip("[]"), fields.port(port, path)
