# SPDX-License-Identifier: Apache-2.0
"""`meshctl clustermesh`: the cluster-mesh cache (`meshctl clustermesh cache`)."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import click

from meshctl import defaults
from meshctl.cli.options import endpoint_list, etcd_options, flag, log_level_option
from meshctl.errors import InputError
from meshctl.mesh import fields


@click.group("clustermesh")
def clustermesh_group() -> None:
    """The cluster mesh's cache of remote clusters (one per cluster, in its etcd)."""


@clustermesh_group.command("cache")
@etcd_options
@click.option("--cluster-id", default=1, type=int, callback=flag(fields.cluster_id), show_default=True,
              help="This cluster's number in the cluster mesh, as its agents' --cluster-id.")
@click.option("--clustermesh-dir", required=True, type=click.Path(path_type=Path),
              help="One file per remote cluster, as the agents' --clustermesh-dir (the cache's credentials).")
@click.option("--state-dir", default=str(defaults.STATE_DIR), type=click.Path(path_type=Path), show_default=True,
              help="Where each remote cluster's last good view is saved.")
@click.option("--lapse-grace", default=defaults.LAPSE_GRACE_S, type=float, show_default=True,
              help="Seconds a remote node whose record's lease ran out stays mirrored (its agent restarting), "
              "as the agents' --lapse-grace.")
@click.option("--mcs", is_flag=True,
              help="Also run the Multi-Cluster Services controller (ServiceExport -> a ServiceImport in every cluster, "
              "KEP-1645) and the clusterset.local DNS server; needs the Kubernetes API (--kubeconfig, or the pod's "
              "service account).")
@click.option("--kubeconfig", default=None,
              help="With --mcs: the kubeconfig of this cluster's API server (default: $KUBECONFIG, ~/.kube/config, "
              "else the pod's service account).")
@click.option("--dns-addr", default=defaults.CLUSTERSET_DNS_ADDR, show_default=True,
              help="With --mcs: where the clusterset.local DNS server listens (UDP and TCP), HOST:PORT.")
@log_level_option()
def cache_cmd(**kw: Any) -> None:
    """Watch each remote cluster's etcd once and mirror the admitted records into this cluster's
    etcd (under /meshctl-cache/<cluster>/), for agents started with --clustermesh-cache; with
    --mcs, serve the Multi-Cluster Services API and clusterset.local names too."""
    logging.basicConfig(level=kw["log_level"].upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    endpoints = endpoint_list(kw["etcd_endpoints"])
    if not endpoints:
        raise InputError("--etcd-endpoints", "", "is required")
    if bool(kw["etcd_user"]) != bool(kw["etcd_password_file"]):
        raise InputError("--etcd-user", kw["etcd_user"] or "", "and --etcd-password-file go together")
    if kw["lapse_grace"] < 0:
        raise InputError("--lapse-grace", kw["lapse_grace"], "must be >= 0")
    from meshctl.backends.clustermesh_mirror import ClusterMeshCache
    from meshctl.etcd import EtcdClient
    from meshctl.mesh.model import Cluster

    def connect() -> EtcdClient:
        return EtcdClient(list(endpoints), ca=kw["etcd_ca"], cert=kw["etcd_cert"], key=kw["etcd_key"],
                          user=kw["etcd_user"], password_file=kw["etcd_password_file"])

    cache = ClusterMeshCache(connect, Cluster(kw["cluster_name"], kw["cluster_id"]), kw["clustermesh_dir"],
                             kw["state_dir"], lapse_grace=kw["lapse_grace"])
    stop = threading.Event()
    dns = _start_mcs(kw, cache, connect, stop) if kw["mcs"] else None

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    logging.getLogger("meshctl.clustermesh.cache").info("cache of %s up", kw["cluster_name"])
    try:
        cache.run(stop)
    finally:
        if dns is not None:
            dns.stop()


def _start_mcs(kw: dict[str, Any], cache: Any, connect: Any, stop: threading.Event) -> Any:
    """The Multi-Cluster Services controller in its own thread, beside the cache whose admitted
    remote clusters it reads, and the DNS server it feeds; the server, to stop on the way out."""
    from lightkube import Client

    from meshctl.agent.config import parse_addr
    from meshctl.backends.clusterset_dns import ClusterSetDns
    from meshctl.backends.kube.backend import kubeconfig_for
    from meshctl.backends.kube.mcs import KubeMcsApi
    from meshctl.backends.kube.mcs_controller import McsController

    host, port = parse_addr(kw["dns_addr"], "--dns-addr")
    api = KubeMcsApi(Client(kubeconfig_for(kw["kubeconfig"]), field_manager="meshctl-mcs"))
    try:
        dns = ClusterSetDns(host, port)
    except OSError as e:
        raise InputError("--dns-addr", kw["dns_addr"], f"cannot be listened on: {e.strerror or e}") from None
    controller = McsController(kw["cluster_name"], api, connect(), cache.remotes, lambda: cache.admitted,
                               dns.set_zone)
    cache.on_pass = controller.kick
    dns.start()
    threading.Thread(target=controller.run, args=(stop,), name="mcs", daemon=True).start()
    return dns

