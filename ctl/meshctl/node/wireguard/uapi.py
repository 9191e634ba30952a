# SPDX-License-Identifier: Apache-2.0
"""wireguard-go: starting it detached with a private UAPI directory, and its UAPI text protocol.

wireguard-go always puts its control socket at /var/run/wireguard/IFNAME.sock, and that directory
is shared by every network namespace, so two lab nodes that both call their device `kilo0`
would collide. Each instance is therefore started in a mount namespace of its own where the
caller's `run_dir` is bind-mounted on /var/run/wireguard; the socket then appears in `run_dir`
for us and the process keeps running in the current network namespace, in its own session, so it
outlives the agent that started it (traffic keeps flowing while the agent restarts).

The protocol (https://www.wireguard.com/xplatform/): `get=1\\n\\n` answers `key=value` lines;
`set=1\\n...\\n\\n` takes them; keys are hex; each answer ends with `errno=N`.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

from meshctl.errors import MeshError
from meshctl.node.prefixes import parse_prefix
from meshctl.node.wireguard.state import DevicePeer, DeviceState, PeerOp, format_endpoint, parse_endpoint

_ALLOWED_IP_LINES = re.compile(r"^allowed_ip=.*\n", re.MULTILINE)

DEFAULT_RUN_DIR = "/var/run/wireguard"
_SPAWN_SCRIPT = 'mkdir -p /var/run/wireguard && mount --bind "$1" /var/run/wireguard && exec wireguard-go -f "$2"'


def _hex(key_b64: str) -> str:
    return base64.b64decode(key_b64).hex()


def _b64(key_hex: str) -> str:
    return base64.b64encode(bytes.fromhex(key_hex)).decode()


class UapiClient:
    """Talks to one wireguard-go instance through `<run_dir>/<ifname>.sock`."""

    def __init__(self, sock_path: Path, timeout: float = 5.0):
        self.sock_path = sock_path
        self.timeout = timeout

    def _call(self, request: str, *, skip: re.Pattern[str] | None = None) -> list[tuple[str, str]]:
        """The answer's key=value pairs; `skip` removes matching lines before they are split (a
        device of 500 peers answers with 100,000 allowed-IP lines)."""
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(self.timeout)
                s.connect(str(self.sock_path))
                s.sendall(request.encode())
                chunks: list[bytes] = []
                tail = b""  # the answer's last two bytes so far: it ends with an empty line
                while tail != b"\n\n":
                    chunk = s.recv(1 << 20)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    tail = (tail + chunk)[-2:]
        except OSError as e:
            raise MeshError(f"wireguard-go socket {self.sock_path}: {e.strerror or e}") from None
        text = b"".join(chunks).decode()
        if skip is not None:
            text = skip.sub("", text)
        pairs = [tuple(line.split("=", 1)) for line in text.splitlines() if "=" in line]
        errno = next((v for k, v in pairs if k == "errno"), None)
        if errno != "0":
            # Never echo the request: it may carry the private key.
            raise MeshError(f"wireguard-go {self.sock_path}: {request.split(chr(10), 1)[0]} failed, errno={errno}")
        return [(k, v) for k, v in pairs if k != "errno"]

    def reachable(self) -> bool:
        try:
            self._call("get=1\n\n")
        except MeshError:
            return False
        return True

    def get(self, *, allowed_ips: bool = True) -> DeviceState:
        """The device's state; `allowed_ips=False` skips parsing the allowed-IP lines (thousands
        of them on a location leader), for callers that only want counters and endpoints."""
        st = DeviceState()
        cur: dict | None = None

        def flush() -> None:
            if cur is not None:
                st.peers[cur["public_key"]] = DevicePeer(
                    public_key=cur["public_key"], endpoint=cur.get("endpoint"),
                    allowed_ips=frozenset(cur["allowed"]), persistent_keepalive=cur.get("keepalive", 0),
                    rx_bytes=cur.get("rx", 0), tx_bytes=cur.get("tx", 0), last_handshake=cur.get("hs"),
                )

        for k, v in self._call("get=1\n\n", skip=None if allowed_ips else _ALLOWED_IP_LINES):
            if k == "private_key":
                st.private_key = _b64(v)
            elif k == "listen_port":
                st.listen_port = int(v)
            elif k == "public_key":
                flush()
                cur = {"public_key": _b64(v), "allowed": set()}
            elif cur is None:
                continue
            elif k == "endpoint":
                cur["endpoint"] = parse_endpoint(v)
            elif k == "allowed_ip":
                if allowed_ips:
                    cur["allowed"].add(parse_prefix(v))
            elif k == "persistent_keepalive_interval":
                cur["keepalive"] = int(v)
            elif k == "rx_bytes":
                cur["rx"] = int(v)
            elif k == "tx_bytes":
                cur["tx"] = int(v)
            elif k == "last_handshake_time_sec" and int(v):
                cur["hs"] = float(v)
            elif k == "last_handshake_time_nsec" and cur.get("hs"):
                cur["hs"] += int(v) / 1e9
        flush()
        return st

    def set(self, *, private_key: str | None = None, listen_port: int | None = None,
            peers: list[PeerOp] = ()) -> None:  # type: ignore[assignment]
        lines = ["set=1"]
        if private_key is not None:
            lines.append(f"private_key={_hex(private_key)}")
        if listen_port is not None:
            lines.append(f"listen_port={listen_port}")
        for op in peers:
            lines.append(f"public_key={_hex(op.public_key)}")
            if op.remove:
                lines.append("remove=true")
                continue
            if op.update_only:
                lines.append("update_only=true")
            if op.endpoint is not None:
                lines.append(f"endpoint={format_endpoint(op.endpoint)}")
            if op.persistent_keepalive is not None:
                if op.kick and op.persistent_keepalive:
                    lines.append("persistent_keepalive_interval=0")
                lines.append(f"persistent_keepalive_interval={op.persistent_keepalive}")
            if op.preshared_key is not None:
                lines.append(f"preshared_key={_hex(op.preshared_key)}")
            if op.allowed_ips is not None:
                if op.replace_allowed_ips:
                    lines.append("replace_allowed_ips=true")
                lines.extend(f"allowed_ip={n}" for n in op.allowed_ips)
        if len(lines) > 1:
            self._call("\n".join(lines) + "\n\n")


# --- the process -------------------------------------------------------------------------------


def _proc_state(pid: int) -> tuple[str, str] | None:
    """(comm, state letter) of a live process, None if it is gone."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return comm, stat.rsplit(")", 1)[1].split()[0]


# Children started by this process, kept so they are reaped (and Popen does not warn) when they end.
_children: dict[int, subprocess.Popen[bytes]] = {}


def _reap(pid: int) -> None:
    """Collect the exit status if the process is our child (else it is init's business)."""
    child = _children.get(pid)
    if child is not None:
        if child.poll() is not None:
            del _children[pid]
        return
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def running_pid(pidfile: Path) -> int | None:
    """The pid in `pidfile` if that process is a live wireguard-go (not a zombie, not a reused pid)."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None
    _reap(pid)
    st = _proc_state(pid)
    if st is None or st[1] == "Z" or not st[0].startswith("wireguard-go"):
        return None
    return pid


def spawn(ifname: str, run_dir: Path, *, wait: float = 5.0) -> int:
    """Start wireguard-go for `ifname` in the current network namespace with its UAPI socket in
    `run_dir`; return its pid once the socket answers. The process is in its own session with
    stdio on `<run_dir>/<ifname>.log`, so it survives the caller."""
    run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    sock = run_dir / f"{ifname}.sock"
    if os.path.realpath(run_dir) == os.path.realpath(DEFAULT_RUN_DIR):
        argv = ["wireguard-go", "-f", ifname]
    else:
        # unshare execs sh, sh execs wireguard-go: the pid we get is wireguard-go's own.
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _SPAWN_SCRIPT, "sh",
                str(run_dir), ifname]
    log_path = run_dir / f"{ifname}.log"
    with open(log_path, "ab") as log:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True)
        except FileNotFoundError as e:
            raise MeshError(f"cannot start wireguard-go: {e.filename} is not installed") from None
    _children[proc.pid] = proc
    (run_dir / f"{ifname}.pid").write_text(f"{proc.pid}\n")
    client = UapiClient(sock, timeout=1.0)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = log_path.read_text(errors="replace").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
            raise MeshError(f"wireguard-go {ifname} exited at start: {tail[0]}")
        if sock.exists() and client.reachable():
            return proc.pid
        time.sleep(0.02)
    stop(proc.pid)
    raise MeshError(f"wireguard-go {ifname}: no UAPI socket at {sock} after {wait:.0f} s")


def stop(pid: int, timeout: float = 5.0) -> None:
    """SIGTERM (wireguard-go then removes its device and socket), SIGKILL if it lingers."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 2.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(pid)
            st = _proc_state(pid)
            if st is None or st[1] == "Z":
                _reap(pid)
                return
            time.sleep(0.02)
