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
@log_level_option()
def cache_cmd(**kw: Any) -> None:
    """Watch each remote cluster's etcd once and mirror the admitted records into this cluster's
    etcd (under /meshctl-cache/<cluster>/), for agents started with --clustermesh-cache."""
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

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    logging.getLogger("meshctl.clustermesh.cache").info("cache of %s up", kw["cluster_name"])
    cache.run(stop)

