# SPDX-License-Identifier: Apache-2.0
"""The pieces of a lab node that every lab wires the same way, whatever the node runs in (a
namespace here, or a VM's root namespace): its pods' addresses and veths, and namespaces recorded
in the lab state as they are made."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable

from meshctl.lab.namespaces import state as labstate
from meshctl.lab.namespaces.state import LabState, PodState
from meshctl.lab.rigs import netns
from meshctl.mesh.model import IPNetwork

Progress = Callable[[str], None]
POD_GW = "169.254.1.1"
PRIVATE_NIC = "priv"  # a lab node's private NIC (its internal address), in a namespace or a VM


def quiet(_: str) -> None:
    """A Progress that says nothing."""


def pod_ip(pod_cidr: IPNetwork, k: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address of pod `k` of a node (its pod CIDR's third address onwards)."""
    return pod_cidr.network_address + 2 + k


def pod_entry(pod_ns: str, pod_cidr: IPNetwork, k: int) -> PodState:
    """Pod `k` of a node as the state records it: namespace `pod_ns`, its address, host end `pod<k>`."""
    return PodState(pod_ns, str(pod_ip(pod_cidr, k)), f"pod{k}")


def add_ns(st: LabState, name: str) -> str:
    """Make namespace `name` and record it in the state (saved at once: `lab down` finds it)."""
    netns.add(name)
    st.namespaces.append(name)
    labstate.save(st)
    return name


def wire_pod(st: LabState, ns: str | None, pod_ns: str, pod_cidr: IPNetwork, k: int) -> PodState:
    """Pod `k` of the node in `ns` (None: this host, a VM node), in namespace `pod_ns`, wired as a
    routed CNI (Calico, ptp) does: a veth whose host end `pod<k>` holds the gateway address and a /32
    route to the pod's address. The route comes last, so the moment it exists the pod can be reached
    (what the agent's pod watcher keys on)."""
    pod = pod_entry(pod_ns, pod_cidr, k)
    add_ns(st, pod.netns)
    netns.veth(ns, pod.host_if, pod.netns, "eth0")
    netns.addr(ns, pod.host_if, f"{POD_GW}/32")  # the pod's gateway answers ARP on every pod veth
    netns.addr(pod.netns, "eth0", f"{pod.ip}/32")
    netns.run(pod.netns, ["ip", "route", "add", POD_GW, "dev", "eth0", "scope", "link"])
    netns.run(pod.netns, ["ip", "route", "add", "default", "via", POD_GW, "dev", "eth0"])
    netns.run(ns, ["ip", "route", "add", f"{pod.ip}/32", "dev", pod.host_if])
    return pod
