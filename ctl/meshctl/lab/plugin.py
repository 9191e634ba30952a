# SPDX-License-Identifier: Apache-2.0
"""The lab as a plugin of `meshctl` (entry point group `meshctl.cli`): it registers the `lab`
commands by name (lab/cli.py is imported when one of them runs), finds lab nodes, lab etcds and
lab clusters for the shipped CLI's `--lab`, `--lab-node` and `--node` (cli.targets), and runs the
commands about a lab inside a VM there. Registering imports nothing of the lab's rooms but its
state file reader, so `meshctl --help` stays quick."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshctl.cli import targets
from meshctl.cli.targets import AgentTarget, EtcdTarget, PinTarget
from meshctl.errors import InputError, MeshError
from meshctl.lab.namespaces import state

if TYPE_CHECKING:
    from meshctl.cli import MeshctlGroup


class _Locator:
    """Lab nodes, lab etcds and lab clusters for the shipped CLI's flags (cli.targets.LabLocator)."""

    def agent(self, lab: str | None, node: str) -> AgentTarget:
        from meshctl.lab.rigs.waiting import agent_wait

        _, n = state.resolve(lab).lookup(node)  # what state.find_node reads, and the node's VM
        return AgentTarget(n.dial_netns, n.metrics_addr, agent_wait(n.vm))

    def pins(self, lab: str | None, node: str) -> PinTarget | None:
        found: list[tuple[str, PinTarget]] = []
        for name in [lab] if lab else state.labs_up():
            st = state.resolve(name)
            for c, n in st.nodes():
                # a VM node's pins are in its VM: the Forwarder runs the command there (inside,
                # the guest's one-node state has no VM and the node is the root namespace)
                if node in (n.name, f"{c.name}/{n.name}") and n.vm is None:
                    found.append((st.name, PinTarget(st.pin_root_of(c, n), n.netns, n.name)))
        if len(found) > 1:
            raise InputError("--node", node, f"is in several labs ({', '.join(f[0] for f in found)}): pass --lab")
        if not found and lab:
            raise MeshError(f"lab {lab} has no node {node}")
        return found[0][1] if found else None

    def etcd(self, lab: str | None, cluster: str | None) -> EtcdTarget:
        acc = state.etcd_access(lab, cluster)
        return EtcdTarget(tuple(acc.endpoints), acc.ca, acc.cert, acc.key, acc.netns, acc.user, acc.password_file)

    def clusters(self, lab: str | None) -> tuple[str, ...]:
        return tuple(c.name for c in state.resolve(lab).clusters)

    def nodes(self, lab: str | None) -> tuple[str, ...]:
        return tuple(f"{c.name}/{n.name}" for c, n in state.resolve(lab).nodes())

    def pods(self, lab: str | None) -> dict[str, str]:
        st = state.resolve(lab)
        out: dict[str, str] = {}
        for c, n in st.nodes():
            for p in n.pods:
                # A pod of a cluster with global ranges by its own address in its cluster (`explain`
                # finds it from another cluster's agent at its image).
                addr = f"{c.name}/{p.ip}" if c.mesh.get("global_cidrs") else p.ip
                out[p.netns] = out[p.netns.removeprefix(st.prefix)] = addr
        return out


class _Forwarder:
    """cli.targets.Forwarder: a lab in a VM (lab/vms/vmlab.py) runs the commands about it there;
    the VM rooms are imported when a command runs, not when it is only registered."""

    def forward(self, argv: list[str]) -> int | None:
        from meshctl.lab.vms.vmlab import Forwarder

        return Forwarder().forward(argv)


def register(main: MeshctlGroup) -> None:
    """The `meshctl.cli` plugin entry point: the `lab` commands, lab nodes and clusters, the forwarder."""
    main.add_lazy("lab", "meshctl.lab.cli:lab_group",
                  "A whole mesh on this machine: namespaces or VMs, etcd, one agent per node.")
    targets.register_lab(_Locator())
    targets.register_forwarder(_Forwarder())
