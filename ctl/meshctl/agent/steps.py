"""The steps of one reconcile pass: each drives one applier of the node room (or the datapath)
towards the plan, behind one protocol, so the loop holds a list of steps and times each.

A step says what its result depends on (`inputs`); the loop skips a step whose inputs equal
those of its last success, and on every full pass (and after a failure) makes it `forget` what
it remembers of the kernel, so drift made behind the agent's back is repaired. A step may
disturb another's kernel state (a WireGuard device made anew loses its routes): `sync` returns
the names of those steps, which then forget and run in the same pass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

from meshctl.agent.config import AgentConfig
from meshctl.datapath import Datapath
from meshctl.errors import MeshError
from meshctl.mesh.model import ENCAP_KINDS, IPNetwork, Node, Topology
from meshctl.mesh.plan import NodePlan
from meshctl.node import cni, discovery, nat, routes, sysctls, tunnels, wireguard
from meshctl.node.wireguard.psk import SecretSource, read_key

log = logging.getLogger("meshctl.agent")

PODS_SETTLE_S = 10.0  # after pod interfaces change, re-read pod routes for this long ...
PODS_SETTLE_STEP_S = 2.0  # ... every this often

NOTHING: frozenset[str] = frozenset()


@dataclass(frozen=True)
class PassInput:
    """What one pass hands every step: the admitted view, this node's plan and why the pass runs.

    `timer_pass`: the loop's own tick started the pass (not a change); `settle_pass`: the pass
    only re-reads pod routes while pod interfaces settle."""

    plan: NodePlan
    topo: Topology
    me: Node
    mesh_cidrs: frozenset[IPNetwork]
    pod_ifs: tuple[str, ...]
    timer_pass: bool = False
    settle_pass: bool = False


class Step(Protocol):
    """One applier as the loop sees it."""

    @property
    def name(self) -> str:
        """The part's name in errors, metrics and `steps_ms`."""
        ...

    def inputs(self, p: PassInput) -> Hashable | None:
        """What the result depends on; None: run on every pass."""
        ...

    def sync(self, p: PassInput) -> frozenset[str]:
        """Make the node match `p`; return the names of steps whose kernel state this disturbed."""
        ...

    def forget(self) -> None:
        """Drop what the step remembers of the kernel, so its next sync reads the kernel again."""
        ...


class WireGuardStep:
    """The WireGuard device (`cfg.wg_interface`) with the plan's address and peers."""

    name = "wireguard"

    def __init__(self, cfg: AgentConfig, private_key: str, secrets: SecretSource | None = None) -> None:
        self.cfg = cfg
        self._private_key = private_key
        self._secrets = secrets
        self.device: wireguard.WireGuard | None = None

    def inputs(self, p: PassInput) -> Hashable:
        return (p.plan.peers, p.plan.wireguard_ip, p.topo.mesh.port, self.cfg.private_interface)

    def sync(self, p: PassInput) -> frozenset[str]:
        if self.device is None:
            self.device = wireguard.WireGuard(ifname=self.cfg.wg_interface, run_dir=str(self.cfg.wg_run_dir))
        mtu = discovery.wg_mtu(self.cfg.private_interface)
        remade = self.device.ensure_device(self._private_key, p.topo.mesh.port, p.plan.wireguard_ip, mtu)
        # Pre-shared keys are read on every run of the step (a full pass at the latest: a rotated
        # Secret reaches the device within the resync interval). A peer whose key cannot be read
        # stays out, the others are synced, and the step then fails naming it.
        keys: dict[str, str] = {}
        unreadable: list[str] = []
        for peer in p.plan.peers:
            if peer.preshared_key is not None:
                try:
                    keys[peer.public_key] = read_key(peer.preshared_key, self._secrets)
                except MeshError as e:
                    unreadable.append(f"peer {peer.name}: {e}")
        peers = [x for x in p.plan.peers if x.preshared_key is None or x.public_key in keys]
        self.device.sync_peers(peers, keys)
        if unreadable:
            raise MeshError("; ".join(unreadable))
        # A device made anew or re-addressed has lost its routes (the kernel flushes them without
        # telling anyone): the route step must read the kernel again.
        return frozenset({RoutesStep.name}) if remade else NOTHING

    def forget(self) -> None:
        if self.device is not None:
            self.device.forget()


class CniStep:
    """`--cni install`: the node's CNI config from its pod CIDR and the WireGuard MTU (node.cni);
    with `--cni keep`, a warning when Kilo's config is still installed."""

    name = "cni"

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.warning: str | None = None

    def inputs(self, p: PassInput) -> Hashable:
        return (p.me.pod_cidr, discovery.wg_mtu(self.cfg.private_interface))

    def sync(self, p: PassInput) -> frozenset[str]:
        if self.cfg.cni == "install":
            cni.install(self.cfg.cni_conf_dir, p.me.pod_cidr, discovery.wg_mtu(self.cfg.private_interface))
        else:
            self.warning = cni.leftover_warning(self.cfg.cni_conf_dir)
            if self.warning:
                log.warning("cni: %s", self.warning)
        return NOTHING

    def forget(self) -> None:
        pass


class RoutesStep:
    """The plan's routes, tagged with the project's protocol number."""

    name = "routes"

    def __init__(self, cfg: AgentConfig) -> None:
        self.applier = routes.RouteApplier(cfg.private_interface, cfg.wg_interface)
        self._skipped = False

    def inputs(self, p: PassInput) -> Hashable | None:
        # A route another owner held last time (a tunnel route on its way out) is tried again on
        # the next pass, not only at the next full resync.
        return None if self._skipped else p.plan.routes

    def sync(self, p: PassInput) -> frozenset[str]:
        self._skipped = bool(self.applier.sync(p.plan.routes).skipped)
        return NOTHING

    def forget(self) -> None:
        self.applier.forget()


class SysctlsStep:
    """Forwarding and rp_filter settings; set once per agent run (they are read back only then)."""

    name = "sysctls"

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self._done = False

    def inputs(self, p: PassInput) -> None:
        return None

    def sync(self, p: PassInput) -> frozenset[str]:
        if not self._done:
            sysctls.ensure_sysctls(self.cfg.private_interface, self.cfg.wg_interface)
            self._done = True
        return NOTHING

    def forget(self) -> None:
        pass


class NatStep:
    """Masquerade for traffic leaving the mesh, forwarding between the mesh's interfaces."""

    name = "nat"

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.applier = nat.NatApplier(cfg.nat_prefix)

    def inputs(self, p: PassInput) -> Hashable:
        return (p.me.pod_cidr, p.mesh_cidrs, p.pod_ifs)

    def sync(self, p: PassInput) -> frozenset[str]:
        forward = [i for i in (self.cfg.private_interface, self.cfg.wg_interface) if i] + list(p.pod_ifs)
        self.applier.sync([p.me.pod_cidr], p.mesh_cidrs, forward)
        return NOTHING

    def forget(self) -> None:
        self.applier.forget()


class TunnelsStep:
    """The kernel fallback of encapsulated rungs: tunnel devices, fdb/neighbour entries and routes
    for the fast-path entries that carry an encapsulation (node/tunnels.py). Also says which
    encapsulations this node's kernel can carry (the path prober asks)."""

    name = "tunnels"

    def __init__(self, cfg: AgentConfig) -> None:
        self.applier = tunnels.TunnelApplier(cfg.private_interface) if cfg.private_interface else None

    def available(self, kind: str) -> bool:
        return self.applier is not None and self.applier.available(kind)

    def inputs(self, p: PassInput) -> Hashable:
        return tuple(e for e in p.plan.fastpath if e.encap is not None)

    def sync(self, p: PassInput) -> frozenset[str]:
        if self.applier is not None:
            self.applier.sync(p.plan.fastpath)
        return NOTHING

    def forget(self) -> None:
        if self.applier is not None:
            self.applier.forget()


class DatapathStep:
    """The fast path: programs attached to the private NIC and pod interfaces, the plan in its maps.

    The datapath is loaded off the loop (compiling takes about a second, and a joining node must be
    reachable through kernel routes before that): until `datapath` is set, the step does nothing.
    A CNI adds a pod's route a moment after its veth, so for PODS_SETTLE_S after the pod
    interfaces change the loop passes again every PODS_SETTLE_STEP_S and the step re-reads them."""

    name = "datapath"

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.datapath: Datapath | None = None
        self.synced = False  # the maps hold a plan (until then an ebpf datapath passes all to the kernel)
        self.settle_until = 0.0
        self._attached: tuple[str, ...] | None = None

    @property
    def attached(self) -> tuple[str, ...]:
        """The pod interfaces the programs are attached to now."""
        return self._attached or ()

    def settling(self, pod_ifs: tuple[str, ...], settle_pass: bool) -> bool:
        return settle_pass or pod_ifs != self._attached

    def inputs(self, p: PassInput) -> Hashable | None:
        if self.settling(p.pod_ifs, p.settle_pass):
            return None
        return (p.plan.fastpath, p.pod_ifs, self.datapath is not None)

    def sync(self, p: PassInput) -> frozenset[str]:
        dp = self.datapath
        if dp is None or not self.cfg.private_interface:
            return NOTHING
        if self._attached != p.pod_ifs:
            self.settle_until = time.monotonic() + PODS_SETTLE_S
        if self._attached != p.pod_ifs or p.timer_pass or p.settle_pass:
            dp.attach(self.cfg.private_interface, self.cfg.wg_interface, list(p.pod_ifs))  # re-reads pod routes
            self._attached = p.pod_ifs
        dp.sync(p.plan.fastpath, self.cfg.private_interface)
        self.synced = True
        return NOTHING

    def available(self, kind: str) -> bool:
        """The loaded eBPF fast path encapsulates (VXLAN, IP-in-IP) and decapsulates itself."""
        return self.datapath is not None and self.datapath.mode == "ebpf" and kind in ENCAP_KINDS

    def forget(self) -> None:
        pass
