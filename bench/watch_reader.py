# SPDX-License-Identifier: Apache-2.0
"""The etcd watch stream reader on a huge record: a real etcd (mTLS, in a namespace of its own)
holds a 1.4 MB value; a watch from before it delivers it as one ~1.9 MB JSON line. Timed side by
side, same stream, same run:

    baseline: requests' Response.iter_lines() (what the client used before; 512-byte chunks,
              each joined to the pending part of the line and split again: quadratic)
    now:      etcd.client.stream_lines(iter_content(64 KiB)) (each chunk searched once: linear)

plus the whole EtcdBackend path: from the put of the huge record to a node record put right
behind it showing up in the backend's snapshot.

    .venv/bin/python bench/watch_reader.py [--sizes 100000,400000,1400000] [--prefix mwb]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from meshctl.backends.etcd import EtcdBackend, node_key, write_topology
from meshctl.etcd.client import READ_CHUNK, EtcdClient, prefix_end, stream_lines
from meshctl.lab.rigs import netns, pki
from meshctl.lab.rigs.etcd_process import EtcdServer
from meshctl.lab.rigs.waiting import wait_for
from meshctl.mesh.model import Cluster, MeshSettings

ADDR = "10.99.7.1"


def watch_lines(c: EtcdClient, key: str, rev: int, reader: Callable[[object], Iterator[bytes]]) -> float:
    """Seconds to read the first event line of a watch on `key` from revision `rev`."""
    import base64

    body = {"create_request": {"key": base64.b64encode(key.encode()).decode(), "range_end": prefix_end(key),
                               "start_revision": str(rev)}}
    r = c._post("/v3/watch", body, stream=True, timeout=(5, 60))
    try:
        t0 = time.perf_counter()
        for line in reader(r):
            if b'"events"' in line:
                json.loads(line)
                return time.perf_counter() - t0
    finally:
        r.close()
    raise RuntimeError("no event line")


def old_reader(r: object) -> Iterator[bytes]:
    return r.iter_lines()  # type: ignore[attr-defined,no-any-return]


def new_reader(r: object) -> Iterator[bytes]:
    return stream_lines(r.iter_content(chunk_size=READ_CHUNK))  # type: ignore[attr-defined]


def join_behind(srv: EtcdServer, cert: pki.CertFiles, size: int) -> float:
    """Seconds from putting a `size`-byte record to seeing a node put right behind it in the backend."""
    import base64

    from meshctl.mesh import records
    from meshctl.mesh.model import Node

    c = srv.client(cert)
    b = EtcdBackend(srv.client(cert), Cluster("bench", 1), lease_ttl=5)
    stop = threading.Event()
    t = threading.Thread(target=b.run, args=(stop, lambda: None), daemon=True)
    t.start()
    try:
        wait_for(lambda: b.snapshot().ready)
        import ipaddress

        n = Node("joiner", ipaddress.ip_network("10.42.7.0/24"), base64.b64encode(b"k" * 32).decode())
        t0 = time.perf_counter()
        if size:
            c.put(node_key("bench", "huge"), b"{" + b" " * size + b"}")
        c.put(node_key("bench", "joiner"), json.dumps(records.node_to_record(n)))
        assert wait_for(lambda: b.snapshot().nodes, timeout=120, step=0.001)
        return time.perf_counter() - t0
    finally:
        stop.set()
        b.close()
        t.join(3)
        c.delete("/meshctl/bench/nodes/", prefix=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100000,400000,1400000")
    ap.add_argument("--prefix", default="mwb")
    a = ap.parse_args()
    ns = f"{a.prefix}{os.getpid() % 10000}"
    d = Path(tempfile.mkdtemp(prefix=f"{ns}-"))
    netns.add(ns)
    try:
        netns.run(ns, ["ip", "link", "set", "lo", "up"])
        netns.run(ns, ["ip", "addr", "add", f"{ADDR}/32", "dev", "lo"])
        ca = pki.make_ca(d / "pki")
        server = pki.make_cert(ca, d / "pki", "etcd", server=True, hosts=(ADDR,))
        cert = pki.make_cert(ca, d / "pki", "client")
        srv = EtcdServer("b", d / "data", host=ADDR, netns=ns, tls=server, log_file=d / "etcd.log")
        srv.start(client_tls=cert)
        try:
            c = srv.client(cert)
            c.timeout = 60
            write_topology(c, Cluster("bench", 1), MeshSettings())
            print(f"{'value size':>12} {'iter_lines':>12} {'stream_lines':>13} {'ratio':>8}   (median of 3)")
            for size in (int(s) for s in a.sizes.split(",")):
                rev = c.put("/bench/huge", b"x" * size)
                old = statistics.median(watch_lines(c, "/bench/", rev, old_reader) for _ in range(3))
                new = statistics.median(watch_lines(c, "/bench/", rev, new_reader) for _ in range(3))
                print(f"{size:>12,} {old * 1000:>10.1f}ms {new * 1000:>11.1f}ms {old / new:>7.0f}x")
            base = statistics.median(join_behind(srv, cert, 0) for _ in range(3))
            behind = statistics.median(join_behind(srv, cert, 1_400_000) for _ in range(3))
            print(f"backend: a node record seen {base * 1000:.1f} ms after its put; behind a 1.4 MB record "
                  f"{behind * 1000:.1f} ms ({behind / base:.1f}x)")
        finally:
            srv.stop()
    finally:
        netns.delete(ns)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
