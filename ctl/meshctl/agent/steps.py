# SPDX-License-Identifier: Apache-2.0
"""The steps of one reconcile pass: each drives one applier of the node room (or the datapath)
towards the plan, behind one protocol, so the loop holds a list of steps and times each.

A step says what its result depends on (`inputs`); the loop skips a step whose inputs equal
those of its last success, and on every full pass (and after a failure) makes it `forget` what
it remembers of the kernel, so drift made behind the agent's back is repaired. A step may
disturb another's kernel state (a WireGuard device made anew loses its routes): `sync` returns
the names of those steps, which then forget and run in the same pass.

Make before break: `sync` only adds and replaces; what the plan no longer wants goes in `retire`,
which the runner calls on the steps that synced, in reverse order, once every step has synced. A
retire may disturb another step too (kilo0 losing its last address loses its routes): the steps
it names forget, sync and retire again in the same pass.

Each step declares what it puts in place (`provides`: kernel state, by the names below) and what
must be in place before its sync (`needs`); the runner derives the order from them and checks it
at start (step_runner.step_order). What other parts of the agent use of a step (the WireGuard
device's peers, the encapsulations this node carries) a step declares as the typed interfaces it
serves (`serves`: LivePeers, EncapCarrier), and the agent reaches it only through them
(StepRunner.serving).

The loop reads nothing else of a step: what a step shows in the agent's status it returns from
`status()` (a StepReport: one field per status block, the runner joins the steps' reports), and a
step that needs a pass although nothing changed says so through `wants_pass`. What a step needs
from outside the pass is handed to it by a typed method (the datapath step's `use`), never
assigned to it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Protocol

from meshctl.agent.config import AgentConfig, fastpath_off
from meshctl.agent.status import CniStatus
from meshctl.datapath import Datapath, links
from meshctl.datapath.status import DatapathStatus
from meshctl.errors import MeshError
from meshctl.mesh.model import ENCAP_KINDS, IPNetwork, Node, Topology
from meshctl.mesh.plan import NodePlan
from meshctl.node import cni, discovery, encap, flannel, global_ranges, masquerade, routes, sysctls, wireguard
from meshctl.node.keys import public_key
from meshctl.node.wireguard.psk import SecretSource, read_key

log = logging.getLogger("meshctl.agent")

PODS_SETTLE_S = 10.0  # after pod interfaces change, re-read pod routes for this long ...
PODS_SETTLE_STEP_S = 2.0  # ... every this often
HANDSHAKE_WAIT_S = 0.2  # how long a pass that added WireGuard peers waits for their handshakes

NOTHING: frozenset[str] = frozenset()

# What steps put in place and need, by name (Step.provides, Step.needs).
WIREGUARD_DEVICE = "wireguard device"  # kilo0 with its addresses and peers
ENCAP_ROUTES = "encapsulation routes"  # the kernel fallback's devices and routes (proto 110)
FLANNEL_ROUTES = "flannel's routes"  # written back where meshctl hands a node to flannel
KERNEL_ROUTES = "kernel routes"  # the plan's routes (proto 109)
FAST_PATH = "fast path"  # the programs attached, the plan (and the global ranges) in their maps


class LivePeers(Protocol):
    """What the WireGuard device says of its peers now (the handshakes the loop observes, the
    counters in the status)."""

    def peers_now(self) -> list[wireguard.PeerStatus] | None:
        """The device's peers now, without allowed IPs; None before the device exists."""
        ...


class EncapCarrier(Protocol):
    """Something that carries encapsulated entries on this node (the eBPF fast path, or the
    encapsulation devices of the kernel fallback)."""

    def available(self, kind: str, underlay: int = 4) -> bool:
        """Whether this node can send and receive `kind` ("vxlan", "ipip") over an underlay of IP
        version `underlay` (the family of the private addresses)."""
        ...


class LoadedDatapath:
    """The fast path, loaded off the loop (compiling takes a while): empty until the loader puts
    the opened Datapath in (`put`); the datapath step reads it on every pass."""

    def __init__(self) -> None:
        self._datapath: Datapath | None = None
        self.opened_at = 0.0  # monotonic

    def put(self, datapath: Datapath, at: float | None = None) -> None:
        self.opened_at = time.monotonic() if at is None else at
        self._datapath = datapath

    def get(self) -> Datapath | None:
        return self._datapath


@dataclass(frozen=True)
class StepReport:
    """What steps show in the agent's status, one field per block (None, or empty: the step has
    nothing of it): the WireGuard device's implementation (kernel | wireguard-go; None before it
    exists), the fast path's block and the pod interfaces whose traffic it carries now (those its
    programs are attached to, when the eBPF datapath is loaded), the CNI block. Each block comes
    from one step; `join` puts two steps' reports together."""

    wireguard_mode: str | None = None
    datapath: DatapathStatus | None = None
    carrying: tuple[str, ...] = ()
    cni: CniStatus | None = None

    def join(self, other: StepReport) -> StepReport:
        """This report's blocks, and `other`'s where this one has none."""
        return StepReport(self.wireguard_mode or other.wireguard_mode, self.datapath or other.datapath,
                          self.carrying or other.carrying, self.cni or other.cni)


NOTHING_SHOWN = StepReport()


@dataclass(frozen=True)
class PassInput:
    """What one pass hands every step: the admitted view, this node's plan and why the pass runs.

    `timer_pass`: the loop's own tick started the pass (not a change); `settle_pass`: the pass
    only re-reads pod routes while pod interfaces settle. `flannel` (`--cni flannel`): what the
    plan and flannel's leases give flannel to keep and meshctl to take over (node.flannel.plan_flannel)."""

    plan: NodePlan
    topo: Topology
    me: Node
    mesh_cidrs: frozenset[IPNetwork]
    pod_ifs: tuple[str, ...]
    timer_pass: bool = False
    settle_pass: bool = False
    flannel: flannel.FlannelPlan | None = None


class Step(Protocol):
    """One applier as the loop sees it."""

    @property
    def name(self) -> str:
        """The part's name in errors, metrics and `steps_ms`."""
        ...

    @property
    def provides(self) -> frozenset[str]:
        """What its sync puts in place for other steps (WIREGUARD_DEVICE, ...)."""
        ...

    @property
    def needs(self) -> frozenset[str]:
        """What must be in place before its sync: it runs after the steps that provide it."""
        ...

    @property
    def serves(self) -> tuple[type, ...]:
        """The typed interfaces other parts of the agent reach it through (LivePeers, EncapCarrier)."""
        ...

    def inputs(self, p: PassInput) -> Hashable | None:
        """What the result depends on; None: run on every pass."""
        ...

    def sync(self, p: PassInput) -> frozenset[str]:
        """Put in place what `p` wants (add, replace), removing nothing it may still carry traffic
        over; return the names of steps whose kernel state this disturbed."""
        ...

    def retire(self, p: PassInput) -> frozenset[str]:
        """Remove what the last `sync` found `p` no longer wants (every step's new state is in
        place by now); return the names of steps whose kernel state this disturbed."""
        ...

    def forget(self) -> None:
        """Drop what the step remembers of the kernel, so its next sync reads the kernel again."""
        ...

    def wants_pass(self, now: float, last_pass: float) -> bool:
        """The step needs a pass at `now` (monotonic) although nothing changed since `last_pass`;
        such a pass is a settle pass (PassInput.settle_pass)."""
        ...

    def status(self) -> StepReport:
        """What the step shows in the agent's status, read now (on the loop's thread)."""
        ...


class Quiet:
    """The part of a step with nothing to show, no pass of its own to ask for, nothing it serves."""

    serves: tuple[type, ...] = ()

    def wants_pass(self, now: float, last_pass: float) -> bool:
        return False

    def status(self) -> StepReport:
        return NOTHING_SHOWN


class Additive:
    """The part of a step with nothing to retire: its sync removes nothing another step's new
    state may still lean on (sysctls and the CNI config only add; the NAT sets add every member
    before they delete one)."""

    def retire(self, p: PassInput) -> frozenset[str]:
        return NOTHING


class WireGuardStep:
    """The WireGuard device (`cfg.wg_interface`) with the plan's addresses (one per WireGuard
    subnet) and peers. It also answers what the device says of its peers now (`peers_now`, the
    LivePeers protocol). A peer it added that has no handshake a moment later (crossed handshakes)
    it adds anew on a pass of its own (wireguard.WireGuard.rescue)."""

    name = "wireguard"
    provides = frozenset({WIREGUARD_DEVICE})
    needs = NOTHING
    serves = (LivePeers,)

    def __init__(self, cfg: AgentConfig, private_key: str, secrets: SecretSource | None = None) -> None:
        self.cfg = cfg
        self._private_key = private_key
        self._public_key = public_key(private_key)
        self._secrets = secrets
        self._device: wireguard.WireGuard | None = None

    def _rescue_at(self) -> float | None:
        return self._device.rescue_due(time.monotonic()) if self._device is not None else None

    def inputs(self, p: PassInput) -> Hashable | None:
        if self._rescue_at() is not None:
            return None  # added peers still watched: run on every pass until rescue is done
        return (p.plan.peers, p.plan.device_addresses, p.topo.mesh.port, self.cfg.private_interface)

    def wants_pass(self, now: float, last_pass: float) -> bool:
        at = self._rescue_at()
        return at is not None and now >= at and last_pass < at

    def sync(self, p: PassInput) -> frozenset[str]:
        if self._device is None:
            self._device = wireguard.WireGuard(ifname=self.cfg.wg_interface, run_dir=str(self.cfg.wg_run_dir))
        device = self._device
        mtu = discovery.wg_mtu(self.cfg.private_interface)
        remade = device.ensure_device(self._private_key, p.topo.mesh.port, p.plan.device_addresses, mtu)
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
        device.stage_peers(peers, keys)
        if unreadable:
            raise MeshError("; ".join(unreadable))
        # A device made anew or re-addressed has lost its routes (the kernel flushes them without
        # telling anyone): the route step must read the kernel again.
        return frozenset({RoutesStep.name}) if remade else NOTHING

    def retire(self, p: PassInput) -> frozenset[str]:
        """Peers and allowed IPs the plan dropped, then the old address (the new one is in). After
        an address went the route step reads the kernel again: a device left with no address has
        lost its routes (and one whose new address went with the old primary lost them for a
        moment)."""
        if self._device is None:
            return NOTHING
        self._device.retire_peers()
        disturbed = frozenset({RoutesStep.name}) if self._device.retire_device() else NOTHING
        # Last of every retire: the peers added this pass have had their handshakes started
        self._device.rescue(self._public_key, wait=HANDSHAKE_WAIT_S)
        return disturbed

    def forget(self) -> None:
        if self._device is not None:
            self._device.forget()

    def peers_now(self) -> list[wireguard.PeerStatus] | None:
        """The device's peers as WireGuard reports them now (without allowed IPs, which are not
        needed here and cost the most to read); None before the device exists."""
        return self._device.show(allowed_ips=False) if self._device is not None else None

    def status(self) -> StepReport:
        return StepReport(wireguard_mode=self._device.mode if self._device is not None else None)


class CniStep(Quiet, Additive):
    """`--cni install`: the node's CNI config from its pod CIDR and the WireGuard MTU (node.cni);
    with `--cni keep`, a warning when Kilo's config is still installed."""

    name = "cni"
    provides = NOTHING
    needs = NOTHING

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self._warning: str | None = None

    def inputs(self, p: PassInput) -> Hashable:
        return (p.me.pod_cidrs, discovery.wg_mtu(self.cfg.private_interface))

    def sync(self, p: PassInput) -> frozenset[str]:
        if self.cfg.cni == "install":
            # host-local ranges of every pod CIDR, a range set per family (node/cni.py)
            cni.install(self.cfg.cni_conf_dir, p.me.pod_cidrs, discovery.wg_mtu(self.cfg.private_interface))
        else:
            self._warning = cni.leftover_warning(self.cfg.cni_conf_dir)
            if self._warning:
                log.warning("cni: %s", self._warning)
        return NOTHING

    def forget(self) -> None:
        pass

    def status(self) -> StepReport:
        return StepReport(cni=CniStatus(self.cfg.cni, self._warning or None))


class RoutesStep(Quiet):
    """The plan's routes, tagged with the project's protocol number."""

    name = "routes"
    provides = frozenset({KERNEL_ROUTES})
    # A pair leaving an encapsulated rung frees its pod CIDR's fallback route before the direct one
    # goes in (the other way, the fallback's route replaces it); flannel's routes written back, or
    # rewritten by flannel, are read again in the same pass.
    needs = frozenset({WIREGUARD_DEVICE, ENCAP_ROUTES, FLANNEL_ROUTES})

    def __init__(self, cfg: AgentConfig) -> None:
        self.applier = routes.RouteApplier(cfg.private_interface, cfg.wg_interface)
        self._skipped = False

    def inputs(self, p: PassInput) -> Hashable | None:
        # A route another owner held last time (an encapsulation route on its way out) is tried again on
        # the next pass, not only at the next full resync.
        return None if self._skipped else (p.plan.routes, p.flannel.takeover if p.flannel is not None else None)

    def sync(self, p: PassInput) -> frozenset[str]:
        if p.flannel is not None:  # flannel's routes to the nodes meshctl routes are replaced
            self.applier.take_over(p.flannel.takeover)
        self._skipped = bool(self.applier.stage(p.plan.routes).skipped)
        return NOTHING

    def retire(self, p: PassInput) -> frozenset[str]:
        self.applier.retire()
        return NOTHING

    def forget(self) -> None:
        self.applier.forget()


class FlannelStep(Additive):
    """`--cni flannel` (node/flannel.py): flannel's routes to the nodes it carries written back
    where they are missing or meshctl's (a live change of granularity). The route step takes over
    flannel's routes to the nodes meshctl routes (PassInput.flannel's `takeover`); flannel re-adds
    those on its own resync: `wants_pass` looks every CHECK_S and the pass makes the route step
    replace them again."""

    name = "flannel"
    provides = frozenset({FLANNEL_ROUTES})
    needs = NOTHING
    serves: tuple[type, ...] = ()
    CHECK_S = 1.0

    def __init__(self, cfg: AgentConfig) -> None:
        self.enabled = cfg.cni == "flannel"
        self.applier = flannel.FlannelApplier(str(routes.RT_PROTO))
        self._takeover: frozenset[IPNetwork] = frozenset()
        self._checked = 0.0

    def inputs(self, p: PassInput) -> Hashable | None:
        return None if self.enabled else ()  # reads flannel's routes on every pass

    def sync(self, p: PassInput) -> frozenset[str]:
        fp = p.flannel
        if not self.enabled or fp is None:
            return NOTHING
        self._takeover = fp.takeover
        disturbed = NOTHING
        if again := self.applier.rewritten(fp.takeover):
            log.info("flannel: its routes to %s in place of meshctl's: replacing them", ", ".join(map(str, again)))
            disturbed = frozenset({RoutesStep.name})
        if self.applier.restore(fp):
            disturbed = frozenset({RoutesStep.name})  # our routes there are gone: read them again
        return disturbed

    def forget(self) -> None:
        pass

    def wants_pass(self, now: float, last_pass: float) -> bool:
        if not self._takeover or now - self._checked < self.CHECK_S:
            return False
        self._checked = now
        return bool(self.applier.rewritten(self._takeover))

    def status(self) -> StepReport:
        return NOTHING_SHOWN


class SysctlsStep(Quiet, Additive):
    """Forwarding and rp_filter settings; set once per agent run (they are read back only then),
    and again when the mesh first carries IPv6 (a pod CIDR of that family): IPv6 forwarding."""

    name = "sysctls"
    provides = NOTHING
    needs = frozenset({WIREGUARD_DEVICE})  # rp_filter of the WireGuard device: set once it exists

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self._done: bool | None = None  # set with IPv6 forwarding (True) or without (False)

    def inputs(self, p: PassInput) -> None:
        return None

    def sync(self, p: PassInput) -> frozenset[str]:
        ipv6 = any(c.version == 6 for c in p.mesh_cidrs)
        if self._done is None or (ipv6 and not self._done):
            sysctls.ensure_sysctls(self.cfg.private_interface, self.cfg.wg_interface, ipv6=ipv6)
            self._done = ipv6
        return NOTHING

    def forget(self) -> None:
        pass


class NatStep(Quiet, Additive):
    """Masquerade for traffic leaving the mesh, forwarding between the mesh's interfaces."""

    name = "nat"
    provides = NOTHING
    needs = NOTHING

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.applier = masquerade.NatApplier(cfg.nat_prefix, masquerade6=cfg.masquerade6)

    def inputs(self, p: PassInput) -> Hashable:
        return (p.me.pod_cidrs, p.mesh_cidrs, p.pod_ifs)

    def sync(self, p: PassInput) -> frozenset[str]:
        forward = [i for i in (self.cfg.private_interface, self.cfg.wg_interface) if i] + list(p.pod_ifs)
        self.applier.sync(p.me.pod_cidrs, p.mesh_cidrs, forward)
        return NOTHING

    def forget(self) -> None:
        self.applier.forget()


class EncapStep(Quiet):
    """The kernel fallback of encapsulated rungs: encapsulation devices, fdb/neighbour entries and
    routes for the fast-path entries that carry an encapsulation (node/encap.py). Also says which
    encapsulations this node's kernel can carry (the path prober asks)."""

    name = "encap"
    provides = frozenset({ENCAP_ROUTES})
    needs = NOTHING
    serves = (EncapCarrier,)

    def __init__(self, cfg: AgentConfig) -> None:
        self.applier = encap.EncapApplier(cfg.private_interface) if cfg.private_interface else None

    def available(self, kind: str, underlay: int = 4) -> bool:
        return self.applier is not None and self.applier.available(kind, underlay)

    def inputs(self, p: PassInput) -> Hashable:
        return tuple(e for e in p.plan.fastpath if e.encap is not None)

    def sync(self, p: PassInput) -> frozenset[str]:
        if self.applier is not None:
            self.applier.stage(p.plan.fastpath)
        return NOTHING

    def retire(self, p: PassInput) -> frozenset[str]:
        if self.applier is not None:
            self.applier.retire()
        return NOTHING

    def forget(self) -> None:
        if self.applier is not None:
            self.applier.forget()


class GlobalRangesStep(Quiet, Additive):
    """The kernel fallback of global ranges (node/global_ranges.py): nftables rewrites the addresses
    where the fast path does not translate them, and nothing where it does (Datapath.translating).
    After the datapath step (FAST_PATH), so a node whose programs take over has them translating
    before the rules go (the two never translate an address twice: a translated address lies outside
    what either rewrites)."""

    name = "global-ranges"
    provides = NOTHING
    needs = frozenset({FAST_PATH})

    def __init__(self, cfg: AgentConfig, loaded: LoadedDatapath) -> None:
        self.cfg = cfg
        self._loaded = loaded
        self.applier = global_ranges.TranslationApplier()

    def _fast_path_translates(self, p: PassInput) -> bool:
        dp = self._loaded.get()
        return bool(p.plan.global_cidrs) and dp is not None and bool(self.cfg.private_interface) \
            and dp.translating(self.cfg.wg_interface)

    def inputs(self, p: PassInput) -> Hashable:
        leaving = tuple(e.prefix for e in p.plan.fastpath if e.translate)
        return (p.plan.global_cidrs, leaving, self._fast_path_translates(p))

    def sync(self, p: PassInput) -> frozenset[str]:
        if not p.plan.global_cidrs or self._fast_path_translates(p):
            self.applier.clear()
        else:
            self.applier.sync(p.plan.global_cidrs, [e.prefix for e in p.plan.fastpath if e.translate])
        return NOTHING

    def forget(self) -> None:
        self.applier.forget()


# The datapath's reason in status on a node with no private NIC: the programs are loaded but attach
# nowhere, since every peer of such a node is reached through WireGuard (nothing to steer).
IDLE_NO_PRIVATE = "idle: no private interface, every peer goes through WireGuard"


class DatapathStep:
    """The fast path: programs attached to the private NIC and pod interfaces, the plan in its maps.

    The datapath is loaded off the loop (compiling takes a while, and a joining node must be
    reachable through kernel routes before that) into `loaded`; until it is there the step does
    nothing. A CNI adds a pod's route a moment after its veth, so for PODS_SETTLE_S after the
    pod interfaces change the step asks for a pass every PODS_SETTLE_STEP_S and re-reads them."""

    name = "datapath"
    provides = frozenset({FAST_PATH})
    needs = frozenset({KERNEL_ROUTES})  # its stale entries go (retire) once the routes that take over are in
    serves = (EncapCarrier,)

    def __init__(self, cfg: AgentConfig, loaded: LoadedDatapath) -> None:
        self.cfg = cfg
        self._loaded = loaded
        self._synced = False  # the maps hold a plan (until then an ebpf datapath passes all to the kernel)
        self._settle_until = 0.0
        self._attached: tuple[str, ...] | None = None
        self._tunnel: int | None = None  # the tunnel device's ifindex when the programs were last attached
        self._filter_rebuilt: float | None = None  # when the flow filter was last rebuilt (monotonic)

    @property
    def _datapath(self) -> Datapath | None:
        """The loaded datapath: the first pass that finds it attaches it and fills its maps
        (Datapath.open built its flow filter; the step rebuilds it once per resync interval)."""
        return self._loaded.get()

    def _settling(self, pod_ifs: tuple[str, ...], settle_pass: bool) -> bool:
        return settle_pass or pod_ifs != self._attached

    def inputs(self, p: PassInput) -> Hashable | None:
        if self._settling(p.pod_ifs, p.settle_pass):
            return None
        return (p.plan.fastpath, p.plan.global_cidrs, p.pod_ifs, self._datapath is not None)

    def sync(self, p: PassInput) -> frozenset[str]:
        dp = self._datapath
        if dp is None or not self.cfg.private_interface:
            return NOTHING
        if self._attached != p.pod_ifs:
            self._settle_until = time.monotonic() + PODS_SETTLE_S
        if self._attached != p.pod_ifs or p.timer_pass or p.settle_pass or not self._tunnel_hooked():
            dp.attach(self.cfg.private_interface, self.cfg.wg_interface, p.pod_ifs,
                      pods=discovery.pod_routes(p.pod_ifs), private4=discovery.private_ipv4(self.cfg.private_interface),
                      private6=discovery.private_ipv6(self.cfg.private_interface))
            self._attached = p.pod_ifs
            self._tunnel = links.ifindex_or_none(self.cfg.wg_interface)
        dp.stage(p.plan.fastpath, self.cfg.private_interface, p.plan.global_cidrs)
        self._synced = True
        now = time.monotonic()
        if self._filter_rebuilt is None:
            self._filter_rebuilt = self._loaded.opened_at
        if now - self._filter_rebuilt >= self.cfg.resync_interval:  # evicted flows' filter slots cleared
            dp.rebuild_flow_filter()
            self._filter_rebuilt = now
        return NOTHING

    def _tunnel_hooked(self) -> bool:
        """The tunnel device, where there is one, is the one the last attach hooked (it may come up,
        or be made anew, after the programs)."""
        idx = links.ifindex_or_none(self.cfg.wg_interface)
        return idx is None or idx == self._tunnel

    def retire(self, p: PassInput) -> frozenset[str]:
        """The entries the plan dropped: their traffic's kernel routes are in place by now."""
        if self._datapath is not None:
            self._datapath.retire()
        return NOTHING

    def available(self, kind: str, underlay: int = 4) -> bool:
        """The loaded eBPF fast path encapsulates (VXLAN, IP-in-IP) and decapsulates itself, over
        either underlay family."""
        return self._datapath is not None and self._datapath.mode == "ebpf" and kind in ENCAP_KINDS

    def forget(self) -> None:
        pass

    def wants_pass(self, now: float, last_pass: float) -> bool:
        return now < self._settle_until and now - last_pass >= PODS_SETTLE_STEP_S

    def status(self) -> StepReport:
        """The mode and counters read now; the pod interfaces carried when the eBPF datapath runs."""
        dp = self._datapath
        if dp is None:
            return StepReport(datapath=DatapathStatus(None, fastpath_off(self.cfg) or "loading"))
        if dp.mode != "ebpf":
            return StepReport(datapath=dp.status_block(synced=self._synced))
        reason = None if self.cfg.private_interface else IDLE_NO_PRIVATE
        return StepReport(datapath=dp.status_block(synced=self._synced, reason=reason), carrying=self._attached or ())
