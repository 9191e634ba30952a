# SPDX-License-Identifier: Apache-2.0
"""A TCP relay from 127.0.0.1 of the host into an address inside a lab namespace.

A lab's API server listens on the lab's public segment, inside a namespace the host has no route
to (the lab never touches the host's interfaces or routes). The host's kubectl reaches it through
this relay: it listens on 127.0.0.1 in the host's namespace and opens each onward connection
inside the lab's namespace (etcd.nsconn), copying bytes both ways; TLS passes through untouched,
so the client still checks the API server's own certificate (127.0.0.1 is among its names).

`python -m meshctl.lab.rigs.tcp_forward --netns NS --to IP:PORT --port-file FILE` writes the port
it listens on to FILE once it listens, and runs until SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import socket
import sys
import threading
from pathlib import Path

from meshctl.etcd.nsconn import ns_create_connection


def pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


def _serve(conn: socket.socket, ns: str, to: tuple[str, int]) -> None:
    try:
        up = ns_create_connection(ns, to, timeout=10)
    except OSError:
        conn.close()
        return
    up.settimeout(None)
    t = threading.Thread(target=pipe, args=(up, conn), daemon=True)
    t.start()
    pipe(conn, up)
    t.join()
    conn.close()
    up.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m meshctl.lab.rigs.tcp_forward")
    ap.add_argument("--netns", required=True, help="the namespace the target is in")
    ap.add_argument("--to", required=True, help="IP:PORT inside that namespace")
    ap.add_argument("--listen", default="127.0.0.1:0", help="where to listen on the host (port 0: any)")
    ap.add_argument("--port-file", required=True, type=Path, help="the port listened on is written here")
    a = ap.parse_args(argv)
    host, _, port = a.to.rpartition(":")
    to = (host.strip("[]"), int(port))
    lhost, _, lport = a.listen.rpartition(":")
    srv = socket.create_server((lhost, int(lport)))
    tmp = a.port_file.with_suffix(".tmp")
    tmp.write_text(str(srv.getsockname()[1]))
    tmp.replace(a.port_file)
    signal.signal(signal.SIGTERM, lambda *_: srv.close())
    while True:
        try:
            conn, _ = srv.accept()
        except OSError:
            return 0
        threading.Thread(target=_serve, args=(conn, a.netns, to), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
