# SPDX-License-Identifier: Apache-2.0
"""`python -m meshctl.lab.rigs.kube_apiserver --listen ADDR`: the server standalone, with manifests
loaded at start and kubeconfigs written for its clients. With `--netns NS` the `--listen` socket is
made inside network namespace NS (the process stays where it was started), and `--host-listen`
serves the same store from the process's own namespace too: the lab's server is reachable by the
agents in their namespaces and by the host's kubectl (`meshctl lab kubeconfig`)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from pathlib import Path

from meshctl.setns import in_netns

from .http import ApiServer
from .store import Store, load_manifests
from .types import JSON


def kubeconfig(url: str) -> JSON:
    """A kubeconfig for a client of this server (no credentials: it has no authentication)."""
    return {
        "apiVersion": "v1", "kind": "Config", "current-context": "meshctl-test",
        "clusters": [{"name": "meshctl-test", "cluster": {"server": url}}],
        "users": [{"name": "meshctl-test", "user": {}}],
        "contexts": [{"name": "meshctl-test", "context": {"cluster": "meshctl-test", "user": "meshctl-test"}}],
    }


def write_kubeconfig(path: str, url: str) -> None:
    """Whole or not at all: the lab polls for the file and reads it the moment it exists (a
    partly written one failed its JSON parse on a loaded machine)."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(kubeconfig(url)))
    os.replace(tmp, path)


def parse_listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit():
        raise SystemExit(f"error: --listen: {text!r} is not host:port")
    return host, int(port)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m meshctl.lab.rigs.kube_apiserver",
                                 description="An in-process Kubernetes API server for tests and the lab.")
    ap.add_argument("--listen", default="127.0.0.1:0", help="host:port to bind (port 0: any)")
    ap.add_argument("--load", action="append", default=[], help="YAML manifests to create at start")
    ap.add_argument("--kubeconfig", help="write a kubeconfig for clients here")
    ap.add_argument("--netns", help="make the --listen socket in this network namespace (a name or a path)")
    ap.add_argument("--host-listen", help="also serve on host:port in the process's own network namespace")
    ap.add_argument("--host-kubeconfig", help="write a kubeconfig for the --host-listen address here")
    ap.add_argument("--history", type=int, default=1000, help="watch events kept for resuming")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    host, port = parse_listen(args.listen)
    store = Store(history=args.history)
    servers = [in_netns(args.netns, lambda: ApiServer(host, port, store=store, verbose=args.verbose))]
    if args.host_listen:
        hhost, hport = parse_listen(args.host_listen)
        servers.append(ApiServer(hhost, hport, store=store, verbose=args.verbose))
    load_manifests(store, args.load)
    if args.host_kubeconfig and args.host_listen:
        write_kubeconfig(args.host_kubeconfig, servers[1].url)
    if args.kubeconfig:
        write_kubeconfig(args.kubeconfig, servers[0].url)
    print(f"apiserver: serving {' and '.join(s.url for s in servers)}", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    for s in servers:
        s.start()
    done.wait()
    for s in servers:
        s.stop()
