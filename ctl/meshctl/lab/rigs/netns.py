# SPDX-License-Identifier: Apache-2.0
"""Network-namespace primitives for the lab, the tests and the benchmarks.

Everything made here carries a caller-chosen prefix so cleanup can find it, and nothing here
touches the root namespace's own interfaces, addresses or routes: veth pairs are created inside
a namespace and their ends moved to other namespaces, never left in the root namespace. A
namespace of None means "here": only the lab's VM guests (lab/vms/vmnodes.py) pass it, where the
root namespace is the VM node's own.

`ip netns exec` remounts /sys and hides /sys/fs/bpf (pinned maps), so commands that need the
pinned objects run through `nsenter --net=/run/netns/NAME` instead (`run(..., keep_sys=True)`).
"""

from __future__ import annotations

import json

from meshctl.datapath import links
from meshctl.node.shell import NETNS_DIR, exec_prefix, pid_alive, run, sh
from meshctl.setns import in_netns

__all__ = ["NETNS_DIR", "exec_prefix", "pid_alive", "run", "sh"]  # the lab's toolbox includes the shell helpers









def exists(ns: str) -> bool:
    return (NETNS_DIR / ns).exists()


def add(ns: str) -> None:
    if not exists(ns):
        sh(["ip", "netns", "add", ns])
    run(ns, ["ip", "link", "set", "lo", "up"])


def delete(ns: str) -> None:
    """Delete a namespace (its veth ends go with it). Quiet if it is already gone."""
    if exists(ns):
        sh(["ip", "netns", "del", ns], check=False)


def list_prefixed(prefix: str) -> list[str]:
    if not NETNS_DIR.exists():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(prefix))


def veth(ns_a: str | None, name_a: str, ns_b: str, name_b: str, *, mtu: int | None = None) -> None:
    """A veth pair from `ns_a/name_a` to `ns_b/name_b`, both up. Created inside `ns_a`."""
    run(ns_a, ["ip", "link", "add", name_a, "type", "veth", "peer", "name", name_b, "netns", ns_b])
    for ns, name in ((ns_a, name_a), (ns_b, name_b)):
        if mtu:
            run(ns, ["ip", "link", "set", name, "mtu", str(mtu)])
        run(ns, ["ip", "link", "set", name, "up"])


def link_ready(ns: str | None, name: str) -> bool:
    """Whether frames sent on `ns/name` now leave it: up, with its carrier and its queueing
    discipline attached. Until the kernel's link watch has run (deferred work, late on a loaded
    machine), a new veth's qdisc is `noop`, which drops every frame."""
    link: dict[str, object] = json.loads(run(ns, ["ip", "-j", "link", "show", name]).stdout)[0]
    return link.get("operstate") == "UP" and link.get("qdisc") != "noop"


def bridge(ns: str | None, name: str) -> None:
    run(ns, ["ip", "link", "add", name, "type", "bridge"])
    run(ns, ["ip", "link", "set", name, "up"])


def enslave(ns: str | None, port: str, br: str) -> None:
    run(ns, ["ip", "link", "set", port, "master", br])


def addr(ns: str | None, dev: str, cidr: str) -> None:
    run(ns, ["ip", "addr", "add", cidr, "dev", dev])


def sysctl(ns: str | None, key: str, value: str) -> None:
    run(ns, ["sysctl", "-qw", f"{key}={value}"])


def ifindex(ns: str | None, dev: str) -> int:
    """The ifindex of `dev` inside `ns` (None: here), or MeshError naming it."""
    return in_netns(ns, lambda: links.ifindex(dev))


