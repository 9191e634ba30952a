# SPDX-License-Identifier: Apache-2.0
"""The pieces of a lab node that every lab wires the same way, whatever the node runs in (a
namespace here, or a VM's root namespace): its pods' addresses and veths, and namespaces recorded
in the lab state as they are made."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence

from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.state import LabState, PodState
from meshctl.lab.rigs import netns
from meshctl.mesh.model import IPNetwork

Progress = Callable[[str], None]
POD_GW = "169.254.1.1"
POD_GW6 = "fe80::1"  # the IPv6 gateway of a pod: a link-local address of the node's end, as POD_GW is
PRIVATE_NIC = "priv"  # a lab node's private NIC (its internal address), in a namespace or a VM


def quiet(_: str) -> None:
    """A Progress that says nothing."""


def pod_ip(pod_cidr: IPNetwork, k: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address of pod `k` of a node (its pod CIDR's third address onwards)."""
    return pod_cidr.network_address + 2 + k


def pod_entry(pod_ns: str, pod_cidrs: Sequence[IPNetwork], k: int) -> PodState:
    """Pod `k` of a node as the state records it: namespace `pod_ns`, its address in the first of
    `pod_cidrs` (and in the node's IPv6 one, when that is another), host end `pod<k>`."""
    first = pod_cidrs[0]
    v6 = next((c for c in pod_cidrs[1:] if c.version == 6 and first.version == 4), None)
    return PodState(pod_ns, str(pod_ip(first, k)), f"pod{k}", str(pod_ip(v6, k)) if v6 is not None else None)


def add_ns(st: LabState, name: str) -> str:
    """Make namespace `name` and record it in the state (saved at once: `lab down` finds it)."""
    netns.add(name)
    st.namespaces.append(name)
    labstate.save(st)
    return name


def veth_pod(st: LabState, ns: str | None, pod: PodState) -> None:
    """The pod's namespace (recorded) and its veth: `pod.host_if` in `ns`, `eth0` in the pod."""
    add_ns(st, pod.netns)
    netns.veth(ns, pod.host_if, pod.netns, "eth0")


def route_pod(ns: str | None, pod: PodState, gateway: str, *, gateway_mac: str | None = None,
              proto: str | None = None) -> None:
    """A routed pod's addressing, as routed CNIs (Calico, Cilium, ptp) leave it: the pod's /32 on
    `eth0`, its default route via `gateway` on the link (with a permanent neighbour entry when the
    CNI answers for the gateway with a fixed MAC), and the host's /32 route to it (`proto` the
    CNI's routing protocol). The host route comes last, so the moment it exists the pod can be
    reached (what the agent's pod watcher keys on)."""
    netns.addr(pod.netns, "eth0", f"{pod.ip}/32")
    netns.run(pod.netns, ["ip", "route", "add", gateway, "dev", "eth0", "scope", "link"])
    netns.run(pod.netns, ["ip", "route", "add", "default", "via", gateway, "dev", "eth0"])
    if gateway_mac is not None:
        netns.run(pod.netns, ["ip", "neigh", "replace", gateway, "lladdr", gateway_mac, "dev", "eth0",
                              "nud", "permanent"])
    netns.run(ns, ["ip", "route", "add", f"{pod.ip}/32", "dev", pod.host_if, *(["proto", proto] if proto else [])])


def route_pod6(ns: str | None, pod: PodState, address: str) -> None:
    """A pod's IPv6 address, routed as route_pod routes IPv4: the /128 on `eth0` (no duplicate
    detection: it is the link's only user), its default route via POD_GW6 (held by the host end),
    and the host's /128 route to it."""
    netns.run(pod.netns, ["ip", "-6", "addr", "add", f"{address}/128", "dev", "eth0", "nodad"])
    netns.run(pod.netns, ["ip", "-6", "route", "add", "default", "via", POD_GW6, "dev", "eth0"])
    netns.run(ns, ["ip", "-6", "route", "add", f"{address}/128", "dev", pod.host_if])


def wire_pod(st: LabState, ns: str | None, pod_ns: str, pod_cidrs: Sequence[IPNetwork], k: int) -> PodState:
    """Pod `k` of the node in `ns` (None: this host, a VM node), in namespace `pod_ns`, wired the
    lab's own way: a routed veth whose host end `pod<k>` holds the gateway address (it answers ARP,
    and for IPv6 neighbour solicitations, on every pod veth); an address in each of the node's pod
    CIDRs (one per family)."""
    pod = pod_entry(pod_ns, pod_cidrs, k)
    veth_pod(st, ns, pod)
    v6 = pod.address(6)
    if v6 is not None:
        netns.run(ns, ["ip", "-6", "addr", "add", f"{POD_GW6}/64", "dev", pod.host_if, "nodad"])
        if pod.address(4) is None:  # an IPv6-only pod: its address is `ip`, routed the same way
            route_pod6(ns, pod, v6)
            return pod
    netns.addr(ns, pod.host_if, f"{POD_GW}/32")
    if v6 is not None:
        route_pod6(ns, pod, v6)
    route_pod(ns, pod, POD_GW)
    return pod
