# SPDX-License-Identifier: Apache-2.0
"""A plain etcd (no TLS) alone in a network namespace of the test's own, reached from that
namespace at HOST:2379: what the CLI tests that read a live store need."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from meshctl.lab.rigs import netns
from meshctl.lab.rigs.etcd_process import EtcdServer
from tests.names import unique

HOST = "10.99.0.1"


@contextmanager
def plain_etcd(prefix: str) -> Iterator[EtcdServer]:
    """An etcd in a new namespace named `prefix` + a unique suffix; both gone on exit."""
    ns = unique(prefix)
    d = Path(f"/run/meshctl-test/{ns}")
    netns.add(ns)
    try:
        netns.run(ns, ["ip", "link", "set", "lo", "up"])
        netns.run(ns, ["ip", "addr", "add", f"{HOST}/32", "dev", "lo"])
        srv = EtcdServer("t", d / "data", host=HOST, netns=ns, log_file=d / "etcd.log")
        srv.start()
        try:
            yield srv
        finally:
            srv.stop()
    finally:
        netns.delete(ns)
        shutil.rmtree(d, ignore_errors=True)
