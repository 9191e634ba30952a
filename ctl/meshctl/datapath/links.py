# SPDX-License-Identifier: Apache-2.0
"""Attach the programs to interfaces: tcx links pinned in bpffs (kernel >= 6.6), else clsact.

A pinned tcx link survives the agent (a restart changes nothing on the wire); removing the pin
detaches. Each link is pinned as `<pin_dir>/link-<hook>-<ifindex>`, so what is attached where is
read back from bpffs alone. Where tcx is missing the same programs go in as clsact
direct-action filters (tc's `object-pinned`), with a preference number of our own per hook.
"""

from __future__ import annotations

import errno
import json
import os
import re
import socket
import subprocess
import time
from dataclasses import dataclass

from meshctl.datapath import libbpf
from meshctl.errors import MeshError

# hook -> (program, direction)
HOOKS: dict[str, tuple[str, str]] = {
    "pod-in": ("from_pod", "ingress"),
    "pod-out": ("flow_egress", "egress"),
    "private-in": ("from_private", "ingress"),
    "private-out": ("flow_egress", "egress"),
    "tunnel-in": ("from_tunnel", "ingress"),
    "tunnel-out": ("tunnel_egress", "egress"),
}
_TCX = {"ingress": libbpf.BPF_TCX_INGRESS, "egress": libbpf.BPF_TCX_EGRESS}
# clsact fallback: one filter preference per hook, so ours are found and replaced without touching others.
_TC_PREF = {"pod-in": 0xC0D1, "pod-out": 0xC0D2, "private-in": 0xC0D3, "private-out": 0xC0D4, "tunnel-out": 0xC0D5,
            "tunnel-in": 0xC0D6}
_LINK_RE = re.compile(r"^link-([a-z]+-[a-z]+)-(\d+)$")


@dataclass(frozen=True)
class Attachment:
    hook: str
    ifindex: int
    ifname: str       # "" when the interface is gone (or not in this network namespace)
    prog_id: int
    kind: str         # "tcx" | "clsact"
    gone: bool = False  # the kernel says its device is gone (a tcx link then reads ifindex 0)


SIOCGIFMTU = 0x8921


def ifindex_or_none(name: str | None) -> int | None:
    """The index of interface `name` in the calling thread's network namespace; None without a
    name or without such an interface. The package's one interface-index lookup: a socket ioctl
    answers for the caller's namespace, where /sys would answer for the one it was mounted in."""
    if not name:
        return None
    try:
        return socket.if_nametoindex(name)
    except OSError:
        return None


def ifindex(name: str) -> int:
    """`ifindex_or_none`, or MeshError naming the interface."""
    idx = ifindex_or_none(name)
    if idx is None:
        raise _no_such(name)
    return idx


def _no_such(name: str) -> MeshError:
    return MeshError(f"interface {name!r} does not exist in this network namespace")


def mtu(name: str) -> int:
    """The MTU of interface `name` in the current netns (SIOCGIFMTU), or MeshError naming it."""
    import fcntl
    import struct

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            ifr = fcntl.ioctl(s, SIOCGIFMTU, struct.pack("16si12x", name.encode(), 0))
    except OSError:
        raise _no_such(name) from None
    return int(struct.unpack("16si12x", ifr)[1])


def ifname(index: int) -> str:
    try:
        return socket.if_indextoname(index)
    except OSError:
        return ""


def link_path(pin_dir: str, hook: str, index: int) -> str:
    return f"{pin_dir}/link-{hook}-{index}"


def pinned_links(pin_dir: str) -> list[Attachment]:
    out = []
    try:
        names = os.listdir(pin_dir)
    except FileNotFoundError:
        return []
    for n in sorted(names):
        m = _LINK_RE.match(n)
        if not m:
            continue
        fd = libbpf.obj_get(f"{pin_dir}/{n}")
        try:
            info = libbpf.link_info(fd)
        finally:
            os.close(fd)
        idx = int(m.group(2))
        # A link whose device is gone reads ifindex 0 (defunct). Whether it is gone is the kernel's
        # answer, not a name lookup: from another namespace the device has no name here.
        gone = info.ifindex != idx
        out.append(Attachment(m.group(1), idx, "" if gone else ifname(idx), info.prog_id, "tcx", gone))
    return out


def attach_tcx(pin_dir: str, hook: str, index: int, prog_fd: int, prog_id: int) -> bool:
    """Make `hook` on `index` run `prog_fd`. True when something changed. Raises OSError
    (EINVAL/ENOTSUP...) where the kernel has no tcx."""
    path = link_path(pin_dir, hook, index)
    if os.path.exists(path):
        fd = libbpf.obj_get(path)
        try:
            info = libbpf.link_info(fd)
            if info.ifindex == index:
                if info.prog_id == prog_id:
                    return False
                libbpf.link_update(fd, prog_fd)
                return True
        finally:
            os.close(fd)
        libbpf.unpin(path)  # defunct: the device was removed and the index reused
    fd = create_link(prog_fd, index, _TCX[HOOKS[hook][1]])
    try:
        libbpf.obj_pin(fd, path)
    finally:
        os.close(fd)
    return True


# An unpinned link is released only when bpffs frees the pin's inode, after an RCU grace period:
# attaching the same program to the same hook right after a detach meets EEXIST until then.
_RELEASE_WAIT_S = 2.0


def create_link(prog_fd: int, index: int, attach_type: int) -> int:
    """libbpf's link_create, waiting out the release of a link to the same program just detached."""
    deadline = time.monotonic() + _RELEASE_WAIT_S
    while True:
        try:
            return libbpf.link_create(prog_fd, index, attach_type)
        except OSError as e:
            if e.errno != errno.EEXIST or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def detach_tcx(pin_dir: str, hook: str, index: int) -> None:
    libbpf.unpin(link_path(pin_dir, hook, index))


def detach_all(pin_dir: str) -> None:
    """Every tcx link pinned under `pin_dir` detached; programs and maps stay pinned (attaching
    again needs no compile)."""
    for a in pinned_links(pin_dir):
        detach_tcx(pin_dir, a.hook, a.ifindex)


def tcx_unsupported(e: OSError) -> bool:
    return e.errno in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, 524)


def _tc(args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(["tc", *args], capture_output=True, text=True)
    if check and p.returncode != 0:
        raise MeshError(f"tc {' '.join(args)}: {p.stderr.strip()}")
    return p


def attach_clsact(hook: str, dev: str, prog_path: str) -> None:
    _tc(["qdisc", "replace", "dev", dev, "clsact"])
    _tc(["filter", "replace", "dev", dev, HOOKS[hook][1], "pref", str(_TC_PREF[hook]), "handle", "1",
         "bpf", "direct-action", "object-pinned", prog_path])


def detach_clsact(hook: str, dev: str) -> None:
    _tc(["filter", "del", "dev", dev, HOOKS[hook][1], "pref", str(_TC_PREF[hook])], check=False)


def clsact_links() -> list[Attachment]:
    """Every filter of ours (by its preference number) on the clsact qdiscs of this netns, with the
    program it runs: what pinned_links() is for tcx, read from the kernel (tc) instead of bpffs."""
    p = _tc(["-j", "qdisc", "show"], check=False)
    try:
        devs = sorted({q["dev"] for q in json.loads(p.stdout or "[]") if q.get("kind") == "clsact"})
    except (ValueError, KeyError, TypeError):
        return []
    by_pref = {(HOOKS[h][1], pref): h for h, pref in _TC_PREF.items()}
    out = []
    for dev in devs:
        for direction in ("ingress", "egress"):
            p = _tc(["-j", "filter", "show", "dev", dev, direction], check=False)
            try:
                filters = json.loads(p.stdout or "[]")
            except ValueError:
                continue
            for f in filters:
                hook = by_pref.get((direction, f.get("pref")))
                prog = (f.get("options") or {}).get("prog") or {}
                if hook and f.get("kind") == "bpf" and "id" in prog:
                    out.append(Attachment(hook, ifindex(dev), dev, int(prog["id"]), "clsact"))
    return out


def clsact_attached(dev: str) -> list[str]:
    """Hooks of ours installed as clsact filters on `dev`."""
    out = []
    for hook, (_, direction) in HOOKS.items():
        p = _tc(["filter", "show", "dev", dev, direction, "pref", str(_TC_PREF[hook])], check=False)
        if p.returncode == 0 and "bpf" in p.stdout:
            out.append(hook)
    return out
