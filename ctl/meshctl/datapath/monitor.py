# SPDX-License-Identifier: Apache-2.0
"""Packet events of one node's fast path (`meshctl monitor`): claim a monitor slot, set its
in-kernel filter and rate, read its ring buffer, count what it lost.

The slot design and the map layouts are in bpf/meshctl_maps.h ("Monitor"); the tables of hooks,
event types and reasons are read from that header (layout.header_defines), so the C defines them
once. Pure parts (filters to slot bytes, events to dicts and lines) are functions; `Session` is the
shell that holds the slot, the maps and the ring.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import os
import socket
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from meshctl.datapath import layout, libbpf
from meshctl.datapath.maps import Map
from meshctl.errors import InputError, MeshError
from meshctl.mesh.model import IPNetwork, Path, path_of

DEFAULT_RATE = 1000  # events per second a monitor lets through (`--rate`; 0: unlimited)

HOOKS = {v: name.lower() for name, (v, _) in layout.header_defines("MC_HOOK_").items()}
# Event types as the kernel tells them (bit numbers of a slot's mask); MC_T_COUNT is not a type.
KERNEL_TYPES = {name.lower(): v for name, (v, _) in layout.header_defines("MC_T_").items() if name != "COUNT"}
TYPE_NAMES = {v: k for k, v in KERNEL_TYPES.items()}
# `relay` is a tunnel event whose destination the plan reaches through a relay: the kernel selects
# tunnel events, the owners (the agent's node list) narrow them.
RELAY: str = Path.RELAY.value
TYPES = ("all", *(t for k in KERNEL_TYPES for t in ((k, RELAY) if k == "tunnel" else (k,))))  # relay after tunnel
REASONS = {v: (name.lower(), text) for name, (v, text) in layout.header_defines("MC_R_").items()}
XLATED = {name: v for name, (v, _) in layout.header_defines("MC_XLATED_").items()}  # SRC, DST, INNER
PROTOCOLS = {socket.IPPROTO_TCP: "tcp", socket.IPPROTO_UDP: "udp", socket.IPPROTO_ICMP: "icmp",
             socket.IPPROTO_ICMPV6: "icmpv6", socket.IPPROTO_SCTP: "sctp"}
LOCK_DIR = "monitor"  # <pin dir>/monitor: its lock guards the gate; slot<i> below it, one per slot


@dataclass(frozen=True)
class Filter:
    """What one monitor asks the kernel for."""

    src: IPNetwork | None
    dst: IPNetwork | None
    type: str
    rate: int


def parse_filter(src: str | None, dst: str | None, type_: str, rate: str) -> Filter:
    """The monitor's flags, checked; InputError naming the flag and the value."""
    def net(flag: str, v: str | None) -> IPNetwork | None:
        if v is None:
            return None
        try:
            return ipaddress.ip_network(v, strict=False)
        except ValueError:
            raise InputError(flag, v, "is not an address or CIDR") from None

    if type_ not in TYPES:
        raise InputError("--type", type_, f"is not one of {'|'.join(TYPES)}")
    try:
        r = int(rate)
    except ValueError:
        raise InputError("--rate", rate, "is not a whole number of events per second") from None
    if r < 0:
        raise InputError("--rate", rate, "is below 0 (0 means unlimited)")
    f = Filter(net("--from", src), net("--to", dst), type_, r)
    if f.src is not None and f.dst is not None and f.src.version != f.dst.version:
        raise InputError("--to", dst, f"is IPv{f.dst.version} but --from is IPv{f.src.version}")
    return f


def type_mask(type_: str) -> int:
    """The kernel's mask of event types for `--type`."""
    if type_ == "all":
        return (1 << len(KERNEL_TYPES)) - 1
    return 1 << KERNEL_TYPES["tunnel" if type_ == RELAY else type_]


def _prefix(net: IPNetwork | None) -> tuple[int, int, bytes]:
    if net is None:
        return 0, 0, b""
    return (layout.FAMILY_V4 if net.version == 4 else layout.FAMILY_V6), net.prefixlen, net.network_address.packed


def slot_value(f: Filter) -> bytes:
    """mc_mon_slot for a filter, its bucket full (one second's events: the virtual clock at 0)."""
    cost = 10**9 // f.rate if f.rate else 0
    return layout.MON_SLOT.pack(type_mask(f.type), 0, cost, 0, 0, *_prefix(f.src), *_prefix(f.dst))


def _addr(family: int, raw: bytes) -> str:
    if family == layout.FAMILY_V4:
        return str(ipaddress.IPv4Address(raw[:4]))
    if family == layout.FAMILY_V6:
        return str(ipaddress.IPv6Address(raw))
    return ""


def _rung(action: str | None, encap: str | None) -> str | None:
    """The entry's rung as the plan names it (FastPathEntry.rung)."""
    return None if action is None else action if encap is None else f"{action}+{encap}"


def decode_event(raw: bytes) -> dict[str, Any]:
    """One mc_event as plain values (names resolved from the header's tables; owners, interface
    names and wall time are the caller's: see `describe`)."""
    (ts, ifindex, length, out_ifindex, mtu, hook, outcome, type_, reason, fam, proto, action, encap, nh_fam,
     decap, outer_fam, xlated, sport, dport, saddr, daddr, nh, osrc, odst, xsrc, xdst) = \
        layout.EVENT.unpack(raw[:layout.EVENT.size])
    encap_name = layout.ENCAP_NAMES.get(encap) if encap else None
    outer = encap_name is not None and (action == layout.ACTIONS["direct"] or decap)
    return {
        "ts_ns": ts, "ifindex": ifindex, "hook": HOOKS.get(hook, str(hook)),
        "direction": "egress" if HOOKS.get(hook, "").endswith("egress") else "ingress",
        "src": _addr(fam, saddr), "dst": _addr(fam, daddr),
        "proto": PROTOCOLS.get(proto, str(proto)) if fam else None,
        "sport": int.from_bytes(sport, "big") if proto in (6, 17, 132) else None,
        "dport": int.from_bytes(dport, "big") if proto in (6, 17, 132) else None,
        "len": length, "type": TYPE_NAMES.get(type_, str(type_)),
        "decision": layout.COUNTERS[outcome] if outcome < len(layout.COUNTERS) else str(outcome),
        "action": layout.ACTION_NAMES.get(action) if action else None,
        "rung": _rung(layout.ACTION_NAMES.get(action) if action else None, encap_name if action else None),
        "encap": encap_name, "decapsulated": bool(decap),
        "outer_src": _addr(outer_fam, osrc) if outer else None,
        "outer_dst": _addr(outer_fam, odst) if outer else None,
        "nexthop": _addr(nh_fam, nh) or None, "out_ifindex": out_ifindex or None,
        "reason": REASONS[reason][0] if reason in REASONS and reason else None,
        "reason_text": REASONS[reason][1] if reason in REASONS and reason else None,
        "mtu": mtu or None,
        # Global ranges (docs/clustermesh.md): the address the program rewrote each end to (the
        # source's global image leaving the cluster, the local pod of a global destination arriving),
        # and whether an ICMP error's quoted packet was translated too.
        "src_translated": _addr(fam, xsrc) if xlated & XLATED["SRC"] else None,
        "dst_translated": _addr(fam, xdst) if xlated & XLATED["DST"] else None,
        "quoted_translated": bool(xlated & XLATED["INNER"]),
    }


@dataclass(frozen=True)
class Owner:
    """Who holds an address: `cluster/node` for a pod CIDR or a node address, and the path the
    monitored node takes to that node (`relay` for one reached through a relay)."""

    name: str
    path: Path


def owners_from_node_list(rows: list[dict[str, Any]]) -> list[tuple[IPNetwork, Owner]]:
    """(prefix, owner) pairs from `node list` rows (the agent's plan), longest prefixes first."""
    out: list[tuple[IPNetwork, Owner]] = []
    for r in rows:
        owner = Owner(f"{r.get('cluster') or 'default'}/{r.get('name')}",
                      path_of(r.get("path") or Path.NONE, f"node_list {r.get('name')}: path"))
        for c in r.get("pod_cidrs") or ():
            with contextlib.suppress(ValueError):
                out.append((ipaddress.ip_network(str(c), strict=False), owner))
        with contextlib.suppress(ValueError):
            ip = ipaddress.ip_interface(str(r.get("internal_ip"))).ip
            out.append((ipaddress.ip_network(ip), owner))
    return sorted(out, key=lambda p: -p[0].prefixlen)


def owner_of(owners: list[tuple[IPNetwork, Owner]], addr: str) -> Owner | None:
    if not addr:
        return None
    a = ipaddress.ip_address(addr)
    return next((o for net, o in owners if a.version == net.version and a in net), None)


def describe(ev: dict[str, Any], node: str, ifnames: Mapping[int, str], owners: list[tuple[IPNetwork, Owner]],
             clock_offset_ns: int) -> dict[str, Any]:
    """The event as `monitor -o json` prints it: wall time, node, interface names, owners, and
    `relay` for a tunnel event whose destination is reached through a relay."""
    src_o = owner_of(owners, ev.get("src_translated") or ev["src"])
    dst_o = owner_of(owners, ev["dst"]) or owner_of(owners, ev.get("dst_translated") or "")
    out = dict(ev)
    out["time"] = (ev["ts_ns"] + clock_offset_ns) / 1e9
    out["node"] = node
    out["interface"] = ifnames.get(ev["ifindex"], "")
    out["out_interface"] = ifnames.get(ev["out_ifindex"] or 0) or None
    out["src_owner"] = src_o.name if src_o else None
    out["dst_owner"] = dst_o.name if dst_o else None
    if ev["type"] == "tunnel" and dst_o is not None and dst_o.path == Path.RELAY:
        out["type"] = RELAY
    return out


def text_line(e: dict[str, Any]) -> str:
    """One event as one line (`monitor -o text`)."""
    def end(addr: str, port: int | None, owner: str | None, translated: str | None = None) -> str:
        a = f"[{addr}]" if ":" in addr and port is not None else addr
        as_ = f" as {translated}" if translated else ""  # both forms of a translated address
        return f"{a}{f':{port}' if port is not None else ''}{as_}{f' ({owner})' if owner else ''}"

    t = time.strftime("%H:%M:%S", time.localtime(e["time"])) + f".{int(e['time'] * 1e6) % 1000000:06d}"
    parts = [t, e["node"], f"{e['interface'] or e['ifindex']} {e['direction']}/{e['hook']}"]
    if e["src"]:
        parts.append(f"{end(e['src'], e['sport'], e['src_owner'], e.get('src_translated'))} > "
                     f"{end(e['dst'], e['dport'], e['dst_owner'], e.get('dst_translated'))}")
    if e.get("quoted_translated"):
        parts.append("quoted packet translated")
    parts += [e["proto"] or "non-ip", f"len {e['len']}", e["type"].upper(), e["decision"]]
    if e["encap"]:
        parts.append(f"{e['encap']} {e['outer_src']} > {e['outer_dst']}")
    if e["nexthop"]:
        parts.append(f"via {e['nexthop']}")
    if e["out_ifindex"]:
        parts.append(f"to {e['out_interface'] or e['out_ifindex']}")
    if e["reason"]:
        parts.append(f"reason {e['reason']}" + (f" (mtu {e['mtu']})" if e["mtu"] else ""))
    return " ".join(parts)


def wanted(e: dict[str, Any], type_: str) -> bool:
    """The one filter the kernel cannot apply: `relay` (it sees tunnel events only)."""
    return type_ != RELAY or e["type"] == RELAY


def clock_offset_ns() -> int:
    """Wall time minus CLOCK_MONOTONIC (what bpf_ktime_get_ns counts)."""
    return time.time_ns() - time.clock_gettime_ns(time.CLOCK_MONOTONIC)


# --- the shell ---------------------------------------------------------------------------------


def _lock(path: str, blocking: bool) -> int | None:
    """An fd holding flock(LOCK_EX) on the directory `path`, or None when someone else holds it."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    fd = _lock(path, blocking=True)
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


class Session:
    """One claimed monitor slot of the node pinned at `pin_dir`: events() reads it; close()
    (also on an exception or Ctrl-C) frees the slot and turns the event path off when no other
    monitor is left. A process that dies frees its slot with its lock; the next monitor that starts
    or ends clears its bit of the gate."""

    def __init__(self, pin_dir: str, flt: Filter) -> None:
        self.pin_dir = pin_dir
        missing = [n for n in ("config", *layout.MONITOR_MAPS) if not os.path.exists(f"{pin_dir}/{n}")]
        if "config" in missing:
            raise MeshError(f"the fast path is off here: nothing is pinned under {pin_dir}")
        if missing:
            raise MeshError(f"the programs pinned under {pin_dir} have no monitor maps ({', '.join(missing)}): "
                            "they are older than this meshctl; restart the node's agent")
        self._lockdir = f"{pin_dir}/{LOCK_DIR}"
        self._ncpu = libbpf.possible_cpus()
        self._fds: list[int] = []
        self._lock_fd: int | None = None
        self._maps: list[Map] = []
        self.ring: libbpf.RingBuffer | None = None
        try:
            self._open(flt)
        except BaseException:
            self.close()
            raise

    def _open(self, flt: Filter) -> None:
        self.config = self._map("config")
        self.slots_map = self._map("mon_slots")
        self.lost_map = self._map("mon_lost")
        self.slot, self._lock_fd = self._claim()
        libbpf.update(self.slots_map.fd, layout.U32.pack(self.slot), slot_value(flt))
        zero = bytes(8 * self._ncpu)
        for kind in range(layout.MON_LOST_KINDS):
            libbpf.update(self.lost_map.fd, layout.U32.pack(self._lost_key(kind)), zero)
        ring_fd = libbpf.obj_get(f"{self.pin_dir}/mon_ring{self.slot}")
        self._fds.append(ring_fd)
        self.ring = libbpf.RingBuffer(ring_fd)
        self.ring.poll(0)  # what a previous holder of the slot left unread
        self._set_gate()

    def _map(self, name: str) -> Map:
        m = Map(f"{self.pin_dir}/{name}", name)
        self._maps.append(m)
        return m

    def _claim(self) -> tuple[int, int]:
        os.makedirs(self._lockdir, exist_ok=True)
        for i in range(layout.MON_SLOTS):
            path = f"{self._lockdir}/slot{i}"
            os.makedirs(path, exist_ok=True)
            fd = _lock(path, blocking=False)
            if fd is not None:
                return i, fd
        raise MeshError(f"all {layout.MON_SLOTS} monitor slots of {self.pin_dir} are in use")

    def _held(self) -> int:
        """The gate's mask: the slots whose lock some process (this one included) holds."""
        mask = 0
        for i in range(layout.MON_SLOTS):
            path = f"{self._lockdir}/slot{i}"
            if not os.path.isdir(path):
                continue
            fd = _lock(path, blocking=False)
            if fd is None:
                mask |= 1 << i
            else:
                os.close(fd)
        return mask

    def _set_gate(self) -> None:
        with _locked(self._lockdir):
            libbpf.update(self.config.fd, layout.U32.pack(layout.CFG_MONITOR),
                          layout.CONFIG_VALUE.pack(self._held()))

    def _lost_key(self, kind: int) -> int:
        return self.slot * layout.MON_LOST_KINDS + kind

    def lost(self) -> dict[str, int]:
        """Events this slot's filter matched and lost: to the rate limit, to a full ring buffer."""
        out = {}
        for name, kind in (("rate", layout.MON_LOST_RATE), ("buffer", layout.MON_LOST_BUFFER)):
            raw = libbpf.lookup(self.lost_map.fd, layout.U32.pack(self._lost_key(kind)), 8 * self._ncpu) or b""
            out[name] = sum(int.from_bytes(raw[i:i + 8], "little") for i in range(0, len(raw), 8))
        return out

    def poll(self, timeout_ms: int) -> list[bytes]:
        return self.ring.poll(timeout_ms) if self.ring is not None else []

    def stop(self) -> list[bytes]:
        """Free the slot (the gate drops its bit) and return what was still in its ring."""
        if self._lock_fd is None:
            return []
        os.close(self._lock_fd)
        self._lock_fd = None
        with contextlib.suppress(OSError):
            self._set_gate()
        return self.poll(0)

    def close(self) -> None:
        self.stop()
        if self.ring is not None:
            self.ring.close()
            self.ring = None
        for fd in self._fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds = []
        for m in self._maps:
            m.close()
        self._maps = []


def interface_names() -> dict[int, str]:
    """ifindex -> name in this network namespace."""
    try:
        return dict(socket.if_nameindex())
    except OSError as e:
        if e.errno == errno.ENOSYS:
            return {}
        raise
