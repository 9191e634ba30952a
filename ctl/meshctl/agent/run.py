# SPDX-License-Identifier: Apache-2.0
"""Wiring for `meshctl agent`: the backend the flags ask for, the cluster-mesh watcher, signals."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from meshctl.agent import memory
from meshctl.agent.config import AgentConfig, FlagSettings, Wiring
from meshctl.agent.lifecycle import Agent
from meshctl.agent.loop import RemoteSource
from meshctl.backends.base import Backend
from meshctl.backends.file import FileBackend
from meshctl.errors import MeshError
from meshctl.etcd import EtcdClient
from meshctl.mesh.model import Cluster

log = logging.getLogger("meshctl.agent")


def etcd_client(cfg: AgentConfig) -> EtcdClient:
    return EtcdClient(list(cfg.etcd_endpoints), ca=cfg.etcd_ca, cert=cfg.etcd_cert, key=cfg.etcd_key,
                      user=cfg.etcd_user, password_file=cfg.etcd_password_file)


def own_etcd_client(cfg: AgentConfig) -> EtcdClient:
    """A client of this cluster's own etcd, where the cluster-mesh cache mirrors the remote
    clusters: the backend's with --backend etcd, the kvstore's (--kvstore-*) with kubernetes."""
    if cfg.backend == "kubernetes":
        from meshctl.agent.kube_backend import kvstore_client

        return kvstore_client(cfg)
    return etcd_client(cfg)


def build_backend(cfg: AgentConfig) -> Wiring[Backend]:
    """The backend named by --backend (kubernetes is imported only when asked for), with the config
    and own settings the agent runs with (agent.config.Wiring)."""
    cluster = Cluster(cfg.cluster_name, cfg.cluster_id)
    if cfg.backend == "etcd":
        from meshctl.backends.etcd import EtcdBackend

        return Wiring(EtcdBackend(etcd_client(cfg), cluster, lease_ttl=cfg.lease_ttl,
                                  lease_file=cfg.state_dir / f"lease-{cfg.cluster_name}", lapse_grace=cfg.lapse_grace,
                                  lapsing_file=cfg.state_dir / f"lapsing-{cfg.cluster_name}.json"),
                      cfg, FlagSettings(cfg))
    if cfg.backend == "file":
        assert cfg.topology_file
        return Wiring(FileBackend(cfg.topology_file), cfg, FlagSettings(cfg))
    try:
        from meshctl.agent.kube_backend import make_backend
    except ImportError as e:
        raise MeshError(f"the kubernetes backend is not available: {e}") from None
    kube = make_backend(cfg)
    return Wiring(kube.backend, kube.cfg, kube.own)


def resolve_private_interface(cfg: AgentConfig) -> AgentConfig:
    """`cfg`, with --private-interface filled when it was not given: the NIC that holds the address
    --internal-cidr or --force-internal-ip names (the first family's) becomes the private one:
    private routes and the fast path need a device, and a DaemonSet passes one cluster-wide CIDR
    rather than per-node interface names."""
    if cfg.private_interface or not (cfg.internal_cidr or cfg.force_internal_ip):
        return cfg
    from pyroute2 import IPRoute

    from meshctl.node.discovery import discover_internal_ips, interface_addresses

    found = cfg.force_internal_ip or discover_internal_ips(None, cfg.internal_cidr, ())
    if not found:
        log.warning("no address inside --internal-cidr %s on this node: no private interface",
                    ",".join(map(str, cfg.internal_cidr)))
        return cfg
    want = found[0]
    with IPRoute() as ipr:
        for link in ipr.get_links():
            if any(a.ip == want.ip for a in interface_addresses(ipr, link["index"])):
                log.info("private interface %s (it holds %s)", link.get("ifname"), want.ip)
                return dataclasses.replace(cfg, private_interface=link.get("ifname"))
    log.warning("no interface holds %s: no private interface", want.ip)
    return cfg


def remotes_factory(cfg: AgentConfig, backend: Backend | None = None
                    ) -> Callable[[Callable[[], None]], RemoteSource] | None:
    """A function that makes the cluster-mesh watcher once the agent can be woken, or None. With
    the Kubernetes backend and a kvstore, global services run beside it (agent.global_services)."""
    directory = cfg.clustermesh_dir
    if directory is None:
        return None

    def make(wake: Callable[[], None]) -> RemoteSource:
        from meshctl.backends.clustermesh import RemoteClusters
        from meshctl.backends.clustermesh_cache import CacheUse

        cache = CacheUse(cfg.cluster_name, lambda: own_etcd_client(cfg)) if cfg.clustermesh_cache else None
        kicks: list[Callable[[], None]] = []

        def changed() -> None:  # a remote view changed: the pass, and the global-services step
            wake()
            for kick in kicks:
                kick()

        rc = RemoteClusters(directory, Cluster(cfg.cluster_name, cfg.cluster_id), changed=changed,
                            cache_dir=cfg.state_dir / "clustermesh", cache=cache, lapse_grace=cfg.lapse_grace)
        if cfg.backend == "kubernetes" and cfg.kvstore_endpoints:
            from meshctl.agent.kube_backend import with_global_services
            from meshctl.backends.kube.backend import KubeBackend

            if isinstance(backend, KubeBackend):
                mesh = with_global_services(cfg, backend, rc)
                kicks.append(mesh.services.kick)
                mesh.services.report_changed = wake  # its status block is taken at a pass
                return mesh
        return rc

    return make


def run_agent(cfg: AgentConfig) -> None:
    """Run until SIGTERM/SIGINT; leave the node's network state in place on the way out."""
    memory.cap_arenas()  # before any thread starts (agent/memory.py)
    wiring = build_backend(cfg)
    backend, cfg = wiring.backend, wiring.cfg
    if cfg.backend != "file":  # a topology file names its own cluster; nothing is published
        from meshctl.agent.identity import check_identity
        from meshctl.backends.etcd import EtcdBackend, cluster_key

        check_identity(cfg.state_dir, Cluster(cfg.cluster_name, cfg.cluster_id),
                       backend.client if isinstance(backend, EtcdBackend) else None, cluster_key(cfg.cluster_name))
    cfg = resolve_private_interface(cfg)
    agent = Agent(cfg, backend, remotes_factory=remotes_factory(cfg, backend), own=wiring.own)
    done = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping (routes, WireGuard and maps stay)", signum)
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    agent.start()
    log.info("agent %s up; status on http://%s/status", cfg.node_name, cfg.metrics_addr)
    trimmed = time.monotonic()
    while not done.wait(1.0):
        if time.monotonic() - trimmed >= cfg.resync_interval:  # after the full pass's large buffers
            memory.trim()
            trimmed = time.monotonic()
    t0 = time.monotonic()
    agent.stop()
    log.info("stopped in %.2f s", time.monotonic() - t0)
    logging.shutdown()
    # Leave now: library threads (netlink, HTTP) must not hold the exit while another agent waits
    # to take over this node.
    os._exit(0)
