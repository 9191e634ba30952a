# SPDX-License-Identifier: Apache-2.0
"""The WireGuard device (`kilo0`) and its peers, applied by diffing desired against actual.

Two transports give the same view: the kernel module through pyroute2's generic netlink
(`mode == "kernel"`) and wireguard-go through its UAPI socket (`mode == "wireguard-go"`), used
where the kernel has no WireGuard (as on this project's development machine). Every change is a
per-peer update (`update_only`, `replace_allowed_ips`, `remove`), so changing one peer never
resets the handshake or endpoint of another.

Make before break: `ensure_device` and `stage_peers` add what the plan wants (a new address
beside the old one, new peers, allowed IPs added to the peer that gains them, which takes them
from the peer that held them in the same call); `retire_device` and `retire_peers` then remove
what it no longer wants (the old address, peers, allowed IPs no other peer took). The agent runs
every applier's stage before any retire, so an address that moves between peers is never held
by none.

Crossed handshakes: two nodes that add each other in the same instant (a mesh re-plan reaches
every agent at once) both start a handshake, each consumes the other's initiation as responder,
and neither then has a session it may send on until WireGuard retries 5 s later (REKEY_TIMEOUT;
wireguard-go logs "Failed to derive keypair ... handshakeZeroed"). So a peer added without a
handshake a moment after its stage (the agent waits up to HANDSHAKE_WAIT_S in its retire, and
looks again every RESCUE_S) is added anew (`rescue`): a new peer may start a handshake at once and
the other end answers it. The end with the lower public key does it first; the other end
HIGH_END_DELAY_S after its stage, and then each every RESCUE_S, so the two ends' new greetings
never cross. Both ends do it because one may not be able to: a node behind a NAT is called at the
endpoint its handshakes were seen from, which its NAT may have forgotten while the two had no
session (a location's leader that comes back), so only its own greeting opens the way; with the
lower end alone rescuing, such a pair waited for WireGuard's own retry, 5 s.

Crossed initiations can also end with a handshake at both ends and a session that works one way
only: one end sends on a key the other no longer holds and hears nothing back, which WireGuard
itself notices after 15 s of sending unanswered. So a watched peer with a handshake stays watched
until RESCUE_UNTIL_S after its add, and an end that has sent to it and heard nothing for UNHEARD_S
adds it anew too, once it has sent more than a greeting's worth unanswered (UNHEARD_BYTES; a
greeting is one 32-byte keepalive). A pair whose traffic runs one way only in its first seconds
(the other end answers by another path) looks the same, and pays one new handshake: nothing
arrives on the keys dropped, and what this end sends waits in WireGuard's queue for the new ones.
Measured with wireguard-go: 1 crossing in 25 ended one-way past 12 s; with the watch none of 40
did, the slowest answering both ways after 0.82 s (docs/node.md).

The object remembers what it last applied (the device's key, port and ifindex; each peer's
configuration as set), so a reconcile that changes one peer costs one peer's work, not a dump
and parse of every peer's allowed IPs. The memory is dropped by `forget()` (the agent calls it
on its periodic full resync, which thus repairs drift made behind its back), after any failed
change, and whenever the device's ifindex changes (wireguard-go restarted, device recreated).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from meshctl import defaults
from meshctl.datapath.links import ifindex_or_none
from meshctl.errors import MeshError
from meshctl.mesh.model import IPInterface, IPNetwork
from meshctl.mesh.plan import PeerPlan
from meshctl.node.discovery import interface_addresses, link_info, link_kind
from meshctl.node.sysctls import promote_secondaries
from meshctl.node.wireguard.genl import GenlClient
from meshctl.node.wireguard.psk import NO_KEY
from meshctl.node.wireguard.state import (
    DevicePeer,
    DeviceState,
    PeerOp,
    format_endpoint,
    handshake_fresh,
    sorted_nets,
)
from meshctl.node.wireguard.uapi import DEFAULT_RUN_DIR, UapiClient, running_pid, spawn, stop

__all__ = ["WireGuard", "PeerDiff", "PeerStatus", "resolve_endpoint"]

log = logging.getLogger(__name__)

RESCUE_S = 1.0  # a peer still without a handshake is added anew at most this often (crossed handshakes)
UNHEARD_S = 1.0  # a peer with a handshake that this end sends to and hears nothing from this long: added anew
# ... once this end has sent more than this to it unanswered: more than a greeting (one 32-byte
# keepalive), so a pair that greeted and then stayed idle is never taken for a one-way session
UNHEARD_BYTES = 256
RESCUE_UNTIL_S = 4.0  # ... until this long after it was added: WireGuard's own retry (5 s) is near
HIGH_END_DELAY_S = 0.6  # the higher-keyed end's first rescue: between the lower end's (~0.2 s, 1.2 s)
RESCUE_MAX = 32  # a stage that adds more peers than this (an agent's first start) watches none
HANDSHAKE_POLL_S = 0.02  # how often rescue(wait=...) reads the device for the handshakes it waits for


@dataclass
class PeerDiff:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.added or self.updated or self.removed)


@dataclass(frozen=True)
class PeerStatus:
    public_key: str
    endpoint: str | None
    allowed_ips: tuple[IPNetwork, ...]
    rx_bytes: int
    tx_bytes: int
    last_handshake: float | None  # epoch seconds, None before the first handshake
    persistent_keepalive: int = 0
    name: str | None = None  # the PeerPlan name, when this object synced the peer


def _netns_id() -> str:
    """This thread's network namespace, as the kernel names it (`net:[4026532281]`)."""
    return os.readlink("/proc/thread-self/ns/net")


def resolve_endpoint(endpoint: str) -> tuple[str, int] | None:
    """`host:port` / `[v6]:port` / `name:port` -> (ip, port); a DNS name is resolved here (IPv4
    first). None, with a warning, when it cannot be resolved: the peer then keeps whatever
    endpoint it has (or learns one when the other side calls)."""
    host, sep, port_text = endpoint.rpartition(":")
    if not sep or not port_text.isdigit():
        log.warning("peer endpoint %r is not host:port; left unset", endpoint)
        return None
    host, port = host.strip("[]"), int(port_text)
    try:
        return (str(ipaddress.ip_address(host)), port)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    except OSError as e:
        log.warning("peer endpoint %s does not resolve (%s); left unset", endpoint, e)
        return None
    infos.sort(key=lambda i: i[0] != socket.AF_INET)
    return (str(ipaddress.ip_address(infos[0][4][0])), port) if infos else None


@dataclass
class _PeerChanges:
    """What one peer sync sends to the device, and what the device holds once it is applied."""

    diff: PeerDiff = field(default_factory=PeerDiff)
    ops: list[PeerOp] = field(default_factory=list)
    # Sent after `ops`: keepalive on and off again, which starts a handshake with an added peer.
    kick: list[PeerOp] = field(default_factory=list)
    after: dict[str, DevicePeer | None] = field(default_factory=dict)  # None: removed
    # allowed IP -> the peer it is added to: the device takes it from any other peer that held it
    taken: dict[IPNetwork, str] = field(default_factory=dict)
    added: list[str] = field(default_factory=list)  # the public keys of the peers added

    def remove(self, pub: str, name: str) -> None:
        self.ops.append(PeerOp(pub, remove=True))
        self.after[pub] = None
        self.diff.removed.append(name)

    def add(self, change: _PeerChange) -> None:
        self._record(change)
        self.diff.added.append(change.name)
        self.added.append(change.peer.public_key)
        self.kick += change.kick

    def update(self, change: _PeerChange | None) -> None:
        if change is not None:
            self._record(change)
            self.diff.updated.append(change.name)

    def _record(self, change: _PeerChange) -> None:
        self.ops.append(change.op)
        self.after[change.peer.public_key] = change.peer
        self.taken.update(dict.fromkeys(change.gained, change.peer.public_key))


@dataclass(frozen=True)
class _PeerChange:
    """The change that adds or updates one peer, and what the device holds for it afterwards."""

    name: str
    op: PeerOp
    peer: DevicePeer
    gained: frozenset[IPNetwork]  # the allowed IPs the op adds to the peer
    kick: tuple[PeerOp, ...] = ()


def _by_public_key(peers: Sequence[PeerPlan]) -> dict[str, PeerPlan]:
    """`peers` by public key; a second peer with a key already taken is ignored, with a warning."""
    desired: dict[str, PeerPlan] = {}
    for p in peers:
        if p.public_key in desired:
            log.warning("peers %s and %s share a public key; %s ignored", desired[p.public_key].name, p.name,
                        p.name)
            continue
        desired[p.public_key] = p
    return desired


def _removed(known: Mapping[str, DevicePeer], desired: Mapping[str, PeerPlan]) -> list[str]:
    """The public keys the device holds that the plan no longer has."""
    return [pub for pub in known if pub not in desired]


def _psk_to_send(want: str | None, last_set: Mapping[str, str], pub: str) -> str | None:
    """The pre-shared key to send for `pub`: the wanted one when it differs from the one last set,
    NO_KEY to clear a key this object set and no longer wants, else None (nothing to send)."""
    if want is None and pub in last_set:
        return NO_KEY
    return want if want != last_set.get(pub) else None


def _added(pub: str, p: PeerPlan, ep: tuple[str, int] | None, psk: str | None) -> _PeerChange:
    """The change that adds peer `p`; with a known endpoint and no keepalive, a kick that turns
    the keepalive on (which sends one at once, starting a handshake) and off again."""
    allowed = frozenset(p.allowed_ips)
    op = PeerOp(pub, endpoint=ep, persistent_keepalive=p.persistent_keepalive,
                allowed_ips=sorted_nets(allowed), preshared_key=psk)
    kick: tuple[PeerOp, ...] = ()
    if ep is not None and not p.persistent_keepalive:
        kick = (PeerOp(pub, update_only=True, persistent_keepalive=1),
                PeerOp(pub, update_only=True, persistent_keepalive=0))
    return _PeerChange(p.name, op, DevicePeer(pub, ep, allowed, p.persistent_keepalive), allowed, kick)


def _endpoint_to_set(p: PeerPlan, have: DevicePeer, ep: tuple[str, int] | None,
                     last_set: tuple[str, int] | None) -> tuple[tuple[str, int] | None, bool]:
    """(the endpoint to set on a peer the device holds, or None; whether that depends on the
    endpoint its live handshakes come from).

    A peer that roamed away is not forced back unless the plan changed its endpoint: a full
    resync (which forgets everything else) never does it. A peer behind NAT keeps the endpoint
    its fresh handshakes came from over what it configured (never reachable from here), and over
    a discovered one this object did not see change (it just started: what it found works)."""
    if ep is None or ep == have.endpoint or ep == last_set:
        return None, False
    return ep, p.roaming and (not p.discovered or last_set is None)


def _roamed(have: DevicePeer, live: DevicePeer) -> DevicePeer | None:
    """`have` with the endpoint of the peer's fresh handshakes (`live`), or None when there is none."""
    if handshake_fresh(live.last_handshake) and live.endpoint is not None:
        return replace(have, endpoint=live.endpoint)
    return None


def _updated(pub: str, p: PeerPlan, have: DevicePeer, set_ep: tuple[str, int] | None,
             psk: str | None) -> _PeerChange | None:
    """The change that makes the held peer `have` match `p`, and what the device then holds;
    None when nothing differs. A new endpoint with a keepalive is called at once (`kick`)."""
    gained = frozenset(p.allowed_ips) - have.allowed_ips
    call_now = set_ep is not None and p.persistent_keepalive > 0
    ka = p.persistent_keepalive if call_now or p.persistent_keepalive != have.persistent_keepalive else None
    aips = sorted_nets(gained) if gained else None
    if set_ep is None and ka is None and aips is None and psk is None:
        return None
    # Allowed IPs are only added here (the ones the peer loses go in retire_peers, after every
    # other applier has staged): replacing the list would leave the peer without its kept ones
    # for the moment between the device's removal and its additions.
    op = PeerOp(pub, update_only=True, endpoint=set_ep, persistent_keepalive=ka,
                allowed_ips=aips, replace_allowed_ips=False, preshared_key=psk, kick=call_now)
    return _PeerChange(p.name, op, replace(have, endpoint=set_ep or have.endpoint,
                                           allowed_ips=have.allowed_ips | gained,
                                           persistent_keepalive=p.persistent_keepalive), gained)


def _moved(known: dict[str, DevicePeer], taken: Mapping[IPNetwork, str]) -> None:
    """Take from every peer in `known` the allowed IPs `taken` gave another peer (allowed IP -> its
    new peer): the device moves an allowed IP to the peer it is added to. One pass over `known`."""
    if not taken:
        return
    for pub, held in list(known.items()):
        lost = {n for n in held.allowed_ips & taken.keys() if taken[n] != pub}
        if lost:
            known[pub] = replace(held, allowed_ips=held.allowed_ips - lost)


def _shrunk(known: Mapping[str, DevicePeer], desired: Mapping[str, PeerPlan]) -> dict[str, DevicePeer]:
    """The peers that hold allowed IPs the plan no longer gives them, each as it is once its list
    is the plan's."""
    out: dict[str, DevicePeer] = {}
    for pub, p in desired.items():
        have = known.get(pub)
        want = frozenset(p.allowed_ips)
        if have is not None and have.allowed_ips - want:
            out[pub] = replace(have, allowed_ips=want)
    return out


_INTERFACES = (ipaddress.IPv4Interface, ipaddress.IPv6Interface)


class WireGuard:
    """One WireGuard device in the current network namespace.

    `run_dir` holds wireguard-go's UAPI socket, pid file and log; give each node its own when
    several share a machine (see uapi.py). `mode` is detected: an existing device's kind decides;
    for a new one the kernel's WireGuard is tried first (creating the link loads the module) and
    wireguard-go is the fallback. Pass `mode=` to force one.
    """

    def __init__(self, ifname: str = defaults.WG_INTERFACE, *, run_dir: str = DEFAULT_RUN_DIR, mode: str | None = None):
        self.ifname = ifname
        self.run_dir = Path(run_dir)
        self.sock_path = self.run_dir / f"{ifname}.sock"
        self.pidfile = self.run_dir / f"{ifname}.pid"
        # Written when this code creates the device: which link (namespace, ifindex) is meshctl's,
        # so cleanup never removes a device of the same name someone else made (Kilo's kilo0).
        self.mark_path = self.run_dir / f"{ifname}.link"
        self._names: dict[str, str] = {}  # public key -> PeerPlan name, for diffs and status
        self._set_endpoints: dict[str, tuple[str, int]] = {}  # what we last set, to let peers roam
        # What the device holds as far as we know (None: read it). `_known_dev` is
        # (ifindex, private key, listen port); `_known` the peers' configuration; `_applied` the
        # PeerPlan each peer was last synced from (an unchanged PeerPlan needs no work at all).
        self._known_dev: tuple[int, str, int] | None = None
        self._known: dict[str, DevicePeer] | None = None
        self._shown: dict[str, tuple[frozenset[IPNetwork], tuple[IPNetwork, ...]]] = {}  # show(allowed_ips=False)
        self._applied: dict[str, PeerPlan] = {}
        # The device's peer as `_known` held it when its `_applied` plan was recorded: while both
        # are the same objects, the peer holds exactly that plan's allowed IPs (no set to compare).
        self._applied_at: dict[str, DevicePeer] = {}
        self._psk: dict[str, str] = {}  # public key -> the pre-shared key last set (never logged)
        self._desired: dict[str, PeerPlan] = {}  # the last stage's peers: what retire_peers keeps
        # The last ensure_device's addresses, what retire_device keeps (empty: none; None: not staged)
        self._address: tuple[IPInterface, ...] | None = None
        self._added_at: dict[str, float] = {}  # public key -> when stage_peers added it (monotonic)
        self._watched: dict[str, float] = {}  # public key -> when rescue may add it anew (monotonic)
        self._high: set[str] = set()  # watched peers whose key is lower than ours (their due moved)
        # watched peers with a handshake: (since when, rx bytes, tx bytes) as first seen with it
        self._heard: dict[str, tuple[float, int, int]] = {}
        if mode is None:
            mode = self._detect_mode()
        if mode not in ("kernel", "wireguard-go"):
            raise MeshError(f"wireguard mode {mode!r} is not kernel or wireguard-go")
        self.mode = mode

    # --- device --------------------------------------------------------------------------------

    def _detect_mode(self) -> str:
        with IPRoute() as ipr:
            idx = ifindex_or_none(self.ifname)
            if idx is not None:
                return "kernel" if link_kind(link_info(ipr, idx)) == "wireguard" else "wireguard-go"
        # A new device: the kernel's when it can be had. The module is usually present but not
        # loaded until a wireguard link is created (which autoloads it), so /sys/module/wireguard
        # says nothing before that: _create tries the kernel and falls back to wireguard-go.
        return "kernel"

    def _client(self) -> UapiClient | GenlClient:
        return GenlClient(self.ifname) if self.mode == "kernel" else UapiClient(self.sock_path)

    def exists(self) -> bool:
        return ifindex_or_none(self.ifname) is not None

    def pid(self) -> int | None:
        """wireguard-go's pid (None in kernel mode or when it is not running)."""
        return running_pid(self.pidfile) if self.mode == "wireguard-go" else None

    def _create(self) -> None:
        if self.mode == "kernel":
            try:
                with IPRoute() as ipr:
                    ipr.link("add", ifname=self.ifname, kind="wireguard")
                log.info("created kernel wireguard device %s", self.ifname)
                return
            except NetlinkError as e:
                log.info("kernel wireguard unavailable (%s); using wireguard-go for %s", e, self.ifname)
                self.mode = "wireguard-go"
        pid = spawn(self.ifname, self.run_dir)
        log.info("started wireguard-go for %s (pid %d, socket %s)", self.ifname, pid, self.sock_path)

    def _ensure_running(self) -> bool:
        """Make the device exist and answer on its control channel; True if it was (re)made."""
        if self.mode == "kernel":
            if self.exists():
                return False
            self._create()
            return True
        client = UapiClient(self.sock_path)
        if self.exists():
            if client.reachable():
                return False
            pid = running_pid(self.pidfile)
            raise MeshError(f"{self.ifname} exists but its wireguard-go socket {self.sock_path} does not answer"
                            + (f" (pid {pid})" if pid else "") + "; remove the device or pass its run_dir")
        # A wireguard-go left without its device (or a stale pid file): stop it before starting anew.
        pid = running_pid(self.pidfile)
        if pid is not None:
            stop(pid)
        self._create()
        return True

    def ensure_device(self, private_key: str, listen_port: int,
                      address: IPInterface | Sequence[IPInterface] | None, mtu: int) -> bool:
        """Create/start the device if missing, set key/port/addresses/MTU only where they differ,
        bring it up. True if anything changed. `address`: one address, or one per IP family (the
        plan's `wireguard_ips`). A new address is added beside the old one, which `retire_device`
        removes (make before break); so does `address` None or empty (a node that stops leading
        its location must drop the location's WireGuard IPs).

        When this object last set the same key and port on the device that still has the same
        ifindex, the device's configuration is not read again (see `forget`)."""
        with IPRoute() as ipr:
            idx = ifindex_or_none(self.ifname)
            if idx is not None and self._known_dev == (idx, private_key, listen_port):
                return self._ensure_link(ipr, idx, address, mtu)
        self.forget()
        created = changed = self._ensure_running()
        client = self._client()
        st = client.get()
        key = private_key if st.private_key != private_key else None
        port = listen_port if st.listen_port != listen_port else None
        if key is not None or port is not None:
            client.set(private_key=key, listen_port=port)
            changed = True
            log.info("%s: set %s", self.ifname, " and ".join(
                n for n, v in (("private key", key), (f"listen port {listen_port}", port)) if v is not None))
        with IPRoute() as ipr:
            idx = ifindex_or_none(self.ifname)
            if idx is None:
                raise MeshError(f"{self.ifname} disappeared while being configured")
            if created:
                self._mark(idx)
            changed = self._ensure_link(ipr, idx, address, mtu) or changed
        # The peers just read are current: the peer sync that follows need not read them again.
        self._known_dev, self._known = (idx, private_key, listen_port), dict(st.peers)
        return changed

    def _ensure_link(self, ipr: IPRoute, idx: int, address: IPInterface | Sequence[IPInterface] | None,
                     mtu: int) -> bool:
        wanted = () if address is None else (address,) if isinstance(address, _INTERFACES) else tuple(address)
        changed = False
        link = link_info(ipr, idx)
        if link.get("IFLA_MTU") != mtu:
            ipr.link("set", index=idx, mtu=mtu)
            log.info("%s: mtu %s -> %d", self.ifname, link.get("IFLA_MTU"), mtu)
            changed = True
        have = interface_addresses(ipr, idx)
        self._address = wanted
        for a in (a for a in wanted if a not in have):
            # A new address beside the old (retire_device removes that): with promote_secondaries,
            # removing the old primary then keeps the new one, and with it the device's routes.
            if a.version == 4:
                try:
                    promote_secondaries(self.ifname)
                except MeshError as e:  # retire_device puts the new address back if it went too
                    log.warning("%s: %s", self.ifname, e)
            ipr.addr("add", index=idx, address=str(a.ip), prefixlen=a.network.prefixlen)
            log.info("%s: address %s", self.ifname, a)
            changed = True
        if not link["flags"] & 1:  # IFF_UP
            ipr.link("set", index=idx, state="up")
            changed = True
        return changed

    def _remove_addresses(self, ipr: IPRoute, idx: int, have: Sequence[IPInterface], keep: Sequence[IPInterface]
                          ) -> bool:
        """Remove every address in `have` but those in `keep`; True if any was."""
        changed = False
        for a in have:
            if a not in keep:
                ipr.addr("del", index=idx, address=str(a.ip), prefixlen=a.network.prefixlen)
                log.info("%s: removed address %s", self.ifname, a)
                changed = True
        return changed

    def retire_device(self) -> bool:
        """Remove the device's addresses other than the one the last `ensure_device` set (it is in
        place by now; with none, every address goes: a node that stops leading its location drops
        the location's WireGuard IP, and the kernel then drops the routes through the device).
        True if any was removed."""
        if self._address is None:
            return False
        keep = self._address
        with IPRoute() as ipr:
            idx = ifindex_or_none(self.ifname)
            if idx is None:
                return False
            removed = self._remove_addresses(ipr, idx, interface_addresses(ipr, idx), keep)
            left = interface_addresses(ipr, idx) if removed else ()
            for a in (a for a in keep if removed and a not in left):
                # promote_secondaries could not be set: the old primary took the new address along
                ipr.addr("add", index=idx, address=str(a.ip), prefixlen=a.network.prefixlen)
                log.warning("%s: address %s went with the old primary; added again", self.ifname, a)
            return removed

    def forget(self) -> None:
        """Drop what this object remembers of the device: the next `ensure_device`/`sync_peers`
        reads it again and repairs whatever was changed behind our back."""
        self._known_dev = None
        self._known = None
        self._applied.clear()
        self._applied_at.clear()
        self._psk.clear()
        self._added_at.clear()
        self._watched.clear()
        self._high.clear()
        self._heard.clear()

    def _mark(self, idx: int) -> None:
        """Record that the link `idx` of this namespace is one meshctl created."""
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.mark_path.write_text(f"{_netns_id()} {idx}\n")

    def created_here(self, idx: int) -> bool:
        """Whether link `idx` of this namespace is the one this code created (its mark matches)."""
        try:
            ns, _, text = self.mark_path.read_text().strip().partition(" ")
            return ns == _netns_id() and int(text) == idx
        except (OSError, ValueError):
            return False

    def delete(self, *, force: bool = False) -> str | None:
        """Remove the device if meshctl created it (or `force`) and stop the wireguard-go recorded
        in run_dir (ours by construction). Returns a line naming a device that was left because
        it is not ours, else None."""
        pid = running_pid(self.pidfile)
        if pid is not None:
            stop(pid)
        if pid is not None or self.mode == "wireguard-go":
            for p in (self.pidfile, self.sock_path):
                p.unlink(missing_ok=True)
        left = None
        with IPRoute() as ipr:
            idx = ifindex_or_none(self.ifname)
            if idx is not None and (force or self.created_here(idx)):
                ipr.link("del", index=idx)
            elif idx is not None:
                kind = link_kind(link_info(ipr, idx)) or "device"
                left = (f"{self.ifname} (a {kind}, ifindex {idx}) was not created by meshctl: left in place "
                        "(--force removes it)")
        if left is None:
            self.mark_path.unlink(missing_ok=True)
        self._names.clear()
        self._set_endpoints.clear()
        self.forget()
        return left

    # --- peers ---------------------------------------------------------------------------------

    def sync_peers(self, peers: Sequence[PeerPlan], preshared: Mapping[str, str] | None = None) -> PeerDiff:
        """Make the device's peers exactly `peers`: `stage_peers`, then `retire_peers`; one diff."""
        diff = self.stage_peers(peers, preshared)
        gone = self.retire_peers()
        diff.removed += gone.removed
        diff.updated += [n for n in gone.updated if n not in diff.updated]
        return diff

    def stage_peers(self, peers: Sequence[PeerPlan], preshared: Mapping[str, str] | None = None) -> PeerDiff:
        """Add the peers of `peers` the device lacks and update those that differ, touching only
        those; remove nothing (`retire_peers` does: peers the plan dropped, allowed IPs a peer
        lost that no other peer took).

        Compared with what this object last applied (read from the device only when it knows
        nothing: first use, after `forget` or a failed change), so a peer whose PeerPlan is the one
        it was last synced from costs nothing, and one changed peer is one UAPI/netlink request.
        `preshared` maps public keys to pre-shared keys (base64); a key is sent when it differs from
        the one this object last set (the device never reads keys back). Updates and adds go out
        in one device request."""
        preshared = preshared or {}
        client = self._client()
        if self._known is None:
            self._known = dict(client.get().peers)
            self._applied.clear()
            self._applied_at.clear()
        known = self._known
        desired = self._desired = _by_public_key(peers)
        changes = _PeerChanges()
        self._plan_desired(client, known, desired, preshared, changes)
        if changes.ops:
            self._send(client, changes)
        self._remember(known, desired, preshared, changes)
        # Watched for a handshake: the added peers with an endpoint to call, when a re-plan added a
        # few (an agent's first start adds every peer, and then no traffic waits on them).
        watch = [pub for pub in changes.added if pub in self._set_endpoints]
        if len(watch) <= RESCUE_MAX:
            now = time.monotonic()
            self._added_at.update(dict.fromkeys(watch, now))
            self._watched.update(dict.fromkeys(watch, now))
            self._high.difference_update(watch)
        return changes.diff

    def rescue_due(self, now: float) -> float | None:
        """When the next `rescue` has work (monotonic), None when no added peer is watched."""
        return min(self._watched.values()) if self._watched else None

    def rescue(self, own_public_key: str, *, wait: float = 0.0) -> list[str]:
        """Watch the peers `stage_peers` added until RESCUE_UNTIL_S after their add (waiting up to
        `wait` seconds now for each to have a handshake), and add anew each one that has none yet,
        or that this end has sent to and heard nothing from for UNHEARD_S (see `_unanswered`); at
        most once per RESCUE_S. The names of those added anew. The end whose public key is the
        higher starts HIGH_END_DELAY_S after its stage (see the module docstring)."""
        now = time.monotonic()
        for pub in list(self._added_at):
            if now - self._added_at[pub] > RESCUE_UNTIL_S:
                self._forget_watch(pub)
            elif own_public_key > pub and pub not in self._high and pub in self._watched:
                self._high.add(pub)
                self._watched[pub] = self._added_at[pub] + HIGH_END_DELAY_S
        if not self._watched:
            return []
        client = self._client()
        deadline = now + wait
        while True:
            live = client.get(allowed_ips=False).peers
            for pub in list(self._watched):
                peer = live.get(pub)
                if peer is None or pub not in self._applied:
                    self._forget_watch(pub)
                elif peer.last_handshake:
                    self._listen(pub, peer)
            if all(pub in self._heard for pub in self._watched) or time.monotonic() >= deadline:
                break
            time.sleep(HANDSHAKE_POLL_S)
        now = time.monotonic()
        again = [_added(pub, self._applied[pub], self._set_endpoints.get(pub), self._psk.get(pub))
                 for pub, at in self._watched.items() if now >= at and self._unanswered(pub, live[pub], now)]
        for pub, at in self._watched.items():
            if now >= at:  # each due peer is looked at again in RESCUE_S, until its watch ends
                self._watched[pub] = now + RESCUE_S
        if not again:
            return []
        try:
            client.set(peers=[op for c in again for op in (PeerOp(c.peer.public_key, remove=True), c.op)])
            client.set(peers=[k for c in again for k in c.kick])
        except Exception:
            self.forget()
            raise
        for c in again:
            self._heard.pop(c.peer.public_key, None)
        log.info("%s peers: added anew (no handshake yet, or unanswered after one: crossed handshakes?) %s",
                 self.ifname, [c.name for c in again])
        return [c.name for c in again]

    def _listen(self, pub: str, peer: DevicePeer) -> None:
        """A watched peer with a handshake: note when its rx bytes last moved (and this end's tx
        then), and make its next rescue due when it would have been silent for UNHEARD_S."""
        seen = self._heard.get(pub)
        if seen is None or peer.rx_bytes != seen[1]:
            now = time.monotonic()
            self._heard[pub] = (now, peer.rx_bytes, peer.tx_bytes)
            self._watched[pub] = max(self._watched[pub], now + UNHEARD_S)

    def _unanswered(self, pub: str, peer: DevicePeer, now: float) -> bool:
        """Whether a watched peer is to be added anew now: it has no handshake yet, or since its
        rx bytes last moved, UNHEARD_S ago or more, this end has sent it more than UNHEARD_BYTES
        (a session that carries one way only: see the module docstring)."""
        seen = self._heard.get(pub)
        if not peer.last_handshake or seen is None:
            return True
        return now - seen[0] >= UNHEARD_S and peer.tx_bytes > seen[2] + UNHEARD_BYTES

    def _forget_watch(self, pub: str) -> None:
        self._added_at.pop(pub, None)
        self._watched.pop(pub, None)
        self._high.discard(pub)
        self._heard.pop(pub, None)

    def retire_peers(self) -> PeerDiff:
        """Remove the peers the last `stage_peers` did not want, and the allowed IPs a wanted peer
        holds beyond its plan's, in one device request. A peer's list can only be replaced whole
        (neither wireguard-go nor the kernel's netlink before 6.15 removes one allowed IP), so a
        peer that loses some is given its whole list again; the IPs that moved to another peer
        were taken from it by the stage already."""
        known = self._known
        if known is None:  # forgotten since the stage: its next stage reads the device
            return PeerDiff()
        desired = self._desired
        changes = _PeerChanges()
        for pub in _removed(known, desired):
            changes.remove(pub, self._names.pop(pub, pub))
            self._set_endpoints.pop(pub, None)
        looked_at = {pub: p for pub, p in desired.items() if not self._holds_exactly(pub, p)}
        for pub, dp in _shrunk(known, looked_at).items():
            changes.ops.append(PeerOp(pub, update_only=True, allowed_ips=sorted_nets(dp.allowed_ips)))
            changes.after[pub] = dp
            changes.diff.updated.append(desired[pub].name)
        if changes.ops:
            self._send(self._client(), changes)
        self._remember(known, desired, None, changes)
        return changes.diff

    def _plan_desired(self, client: UapiClient | GenlClient, known: Mapping[str, DevicePeer],
                      desired: Mapping[str, PeerPlan], preshared: Mapping[str, str], changes: _PeerChanges) -> None:
        """Add to `changes` the adds and updates that make the device hold `desired`, resolving
        endpoints and reading roaming peers' live endpoints (once) where a change depends on them."""
        live: Mapping[str, DevicePeer] | None = None  # read once, when a roaming peer's endpoint is in question
        for pub, p in desired.items():
            self._names[pub] = p.name
            have = known.get(pub)
            psk = _psk_to_send(preshared.get(pub), self._psk, pub)
            if have is not None and self._applied.get(pub) == p and psk is None:
                continue
            ep = resolve_endpoint(p.endpoint) if p.endpoint else None
            if have is None:
                changes.add(_added(pub, p, ep, psk))
            else:
                set_ep, ask_live = _endpoint_to_set(p, have, ep, self._set_endpoints.get(pub))
                if ask_live:
                    if live is None:
                        live = client.get(allowed_ips=False).peers
                    roamed = _roamed(have, live.get(pub, have))
                    if roamed is not None:
                        set_ep, have = None, roamed
                changes.update(_updated(pub, p, have, set_ep, psk))
            if ep is not None:
                self._set_endpoints[pub] = ep

    def _send(self, client: UapiClient | GenlClient, changes: _PeerChanges) -> None:
        """Apply `changes` to the device; on any failure forget what is known of it and re-raise."""
        try:
            client.set(peers=changes.ops)
            # A peer added here may be one the other side still holds a session with (our
            # device, or our view of it, was new): that side would go on sending with keys we
            # no longer know until its rekey timeout. A handshake from us now replaces its
            # session at once.
            if changes.kick:
                client.set(peers=changes.kick)
        except Exception:
            self.forget()  # part of the change may have been applied: read the device next time
            raise
        diff = changes.diff
        log.info("%s peers: added %s, updated %s, removed %s", self.ifname,
                 diff.added or "-", diff.updated or "-", diff.removed or "-")

    def _remember(self, known: dict[str, DevicePeer], desired: Mapping[str, PeerPlan],
                  preshared: Mapping[str, str] | None, changes: _PeerChanges) -> None:
        """Record what the device holds once a stage's or retire's changes are applied (`preshared`
        None: no key was sent, the ones last set stand)."""
        for pub, dp in changes.after.items():
            if dp is None:
                known.pop(pub, None)
                self._applied.pop(pub, None)
                self._applied_at.pop(pub, None)
                self._psk.pop(pub, None)
            else:
                known[pub] = dp
        _moved(known, changes.taken)
        if preshared is not None:
            for pub in desired:
                if pub in preshared:
                    self._psk[pub] = preshared[pub]
                else:
                    self._psk.pop(pub, None)
        # A peer still holding allowed IPs it is to lose is not done until retire_peers
        for pub, p in desired.items():
            dp = known.get(pub)
            if dp is not None and not self._holds_exactly(pub, p) and dp.allowed_ips == frozenset(p.allowed_ips):
                self._applied[pub] = p
                self._applied_at[pub] = dp

    def _holds_exactly(self, pub: str, p: PeerPlan) -> bool:
        """The device's peer `pub` holds exactly `p`'s allowed IPs, as far as this object knows:
        `p` is the plan last recorded for it and the peer has not changed since (the identity rule,
        mesh.memo: 500 peers with 100,000 allowed IPs cost no set built or compared per pass)."""
        return self._applied.get(pub) is p and self._known is not None and \
            self._applied_at.get(pub) is self._known.get(pub)

    def state(self) -> DeviceState:
        return self._client().get()

    def show(self, *, allowed_ips: bool = True) -> list[PeerStatus]:
        """Live peer state read from the device. With `allowed_ips=False` the device's allowed-IP
        lists are not parsed (the costly part with thousands of them); each peer's allowed IPs
        are then the ones this object last set (empty if it set none)."""
        out = []
        known = self._known or {}
        # The sorted lists of what this object set, kept while the set is the same object (a leader's
        # status is read every second or two; sorting its 100,000 networks each time is not needed).
        shown, self._shown = self._shown, {}
        for pub, p in sorted(self._client().get(allowed_ips=allowed_ips).peers.items()):
            mine = None if allowed_ips else known.get(pub)
            if mine is None:
                nets = sorted_nets(p.allowed_ips if allowed_ips else frozenset())
            else:
                hit = shown.get(pub)
                if hit is None or hit[0] is not mine.allowed_ips:
                    hit = (mine.allowed_ips, sorted_nets(mine.allowed_ips))
                self._shown[pub] = hit
                nets = hit[1]
            out.append(PeerStatus(
                public_key=pub,
                endpoint=format_endpoint(p.endpoint) if p.endpoint else None,
                allowed_ips=nets, rx_bytes=p.rx_bytes, tx_bytes=p.tx_bytes,
                last_handshake=p.last_handshake, persistent_keepalive=p.persistent_keepalive,
                name=self._names.get(pub),
            ))
        return out
