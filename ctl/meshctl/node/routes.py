# SPDX-License-Identifier: Apache-2.0
"""The plan's routes in the kernel, tagged with the project's protocol number.

Only routes carrying `proto` (RT_PROTO unless told) are ever changed or removed, so a
route someone else put in the same table survives, and `flush` takes exactly what the agent
made. Unchanged routes are not touched (no flapping under traffic); a changed one is replaced in
one netlink call. A route that cannot be installed (its device is missing, its gateway is not
reachable, a foreign route holds its destination) is skipped with a logged reason: one bad
route never stops the others.

Reading and writing go through one raw rtnetlink socket (node/rtnl.py): the dump asks the kernel
for our table and protocol only, and the changes of a pass go a few hundred per `sendmsg`, each
acknowledged on its own, so a renumbered remote cluster (10,000 routes replaced) costs one
socket's round trips instead of a subprocess, and a refused route is still skipped alone with
the kernel's reason.

Make before break: `stage` adds and replaces (a route that moves to another device or gateway
is one RTM_NEWROUTE with NLM_F_REPLACE, never a delete and an add), `retire` then deletes what
the staged plan no longer has; `sync` is both in that order. The agent stages every applier
before it retires any (agent/step_runner.py), so a destination whose route is replaced by a
broader one (or by a fast-path entry) is never without one. A destination the encapsulation
applier routes (a pair leaving an encapsulated rung: proto RT_PROTO_ENCAP, node/encap.py) is taken
over by a replace, as the encapsulation applier takes one over from this applier, and so is a destination
handed to `take_over` (flannel's route to a node meshctl routes itself, node/flannel.py); any
other owner's route is left alone.

The applier remembers the routes it knows to be in the kernel after each sync (the dump, then
its own changes), so a later sync diffs the plan against that memory: one route added is one
netlink request, not a dump and parse of every route. A plan Route object it installed last time
is unchanged by identity (the identity rule: mesh.memo), so a sync
of 100,000 routes looks only at the few new objects. After `forget` the next sync dumps the
kernel and compares it with the dropped memory: only destinations where the two differ (a route
deleted or changed by hand) are diffed against the plan again. The memory is dropped by `forget()` (the
agent's periodic full resync, which thus repairs routes changed behind its back), after any
change that fails, and when a device's ifindex, up-state or addresses changed: the kernel
flushes the routes of a device that goes down or loses its last address without a netlink
notification (kilo0 does when the node's WireGuard address moves).
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from meshctl.datapath.links import ifindex_or_none
from meshctl.mesh.model import IPNetwork, network_of, sort_key_net
from meshctl.mesh.plan import Route
from meshctl.node import rtnl
from meshctl.node.discovery import MAIN_TABLE, RT_SCOPE_UNIVERSE, interface_addresses, link_info
from meshctl.node.encap import RT_PROTO_ENCAP

# Routes the agent installs carry this protocol number so it removes only its own.
RT_PROTO = 0x6D  # 109, unassigned in /etc/iproute2/rt_protos

log = logging.getLogger(__name__)

RT_SCOPE_LINK = 253
_FAMILIES = {4: socket.AF_INET, 6: socket.AF_INET6}


@dataclass
class RouteDiff:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "dst: reason"

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)


@dataclass(frozen=True, slots=True)
class _Want:
    dev: str
    gateway: str | None
    onlink: bool

    @property
    def scope(self) -> int:
        """A route through a gateway reaches the universe; one without is on the device's link."""
        return RT_SCOPE_UNIVERSE if self.gateway else RT_SCOPE_LINK


@dataclass(frozen=True, slots=True)
class _Have:
    want: _Want
    scope: int
    metric: int | None


def _dev_state(ipr: IPRoute, idx: int | None) -> tuple[Any, ...] | None:
    """What the kernel's routes through a device depend on: its index, whether it is up, its
    addresses (a device going down or losing its last address loses its routes silently)."""
    if idx is None:
        return None
    try:
        return (idx, bool(link_info(ipr, idx)["flags"] & 1), tuple(interface_addresses(ipr, idx)))
    except NetlinkError:  # gone meanwhile
        return (idx, None)


def _same(a: Route | None, b: Route | None) -> bool:
    """The same route (a dataclass `==` would also compare `dst`, which the caller matched already)."""
    return a is not None and b is not None and a.dev == b.dev and a.via == b.via


def _desired(by_dst: Mapping[IPNetwork, Route], synced: Mapping[IPNetwork, Route],
             devs: Mapping[str, tuple[str | None, int | None]]
             ) -> tuple[dict[IPNetwork, _Want], int, list[tuple[IPNetwork, str]]]:
    """(the kernel form of each plan route that needs a look, how many are exactly as last
    synced, the (destination, reason) of each that cannot be installed: no device, or a
    gateway of the other IP version off WireGuard, but for an IPv4 route's IPv6 gateway)."""
    desired: dict[IPNetwork, _Want] = {}
    unchanged = 0
    skips: list[tuple[IPNetwork, str]] = []
    for dst, r in by_dst.items():
        if _same(synced.get(dst), r):
            unchanged += 1
            continue
        name, oif = devs[r.dev]
        if oif is None or name is None:
            skips.append((dst, f"{r.dev} device {name or '(none)'} is missing"))
            continue
        via = r.via
        if via is not None and via.version != dst.version:
            if r.dev == "wireguard":
                # WireGuard is layer 3 and picks the peer by allowed IPs: a pod CIDR routed via a
                # peer's WireGuard address of the other family goes to the device alone.
                via = None
            elif dst.version == 6:  # IPv4 routes may have IPv6 gateways (RFC 5549), not the reverse
                skips.append((dst, f"gateway {via} is of another IP version"))
                continue
        desired[dst] = _Want(name, str(via) if via is not None else None, r.dev == "wireguard" and via is not None)
    return desired, unchanged, skips


def _removals(have: Mapping[IPNetwork, _Have], synced: Mapping[IPNetwork, Route], routes: Sequence[Route],
              desired: Mapping[IPNetwork, _Want], unchanged: int, fresh: Mapping[IPNetwork, Route]
              ) -> list[IPNetwork]:
    """Our routes in the kernel that the plan no longer has, in address order. When every one is
    accounted for (unchanged or desired) there is nothing to look for. Otherwise, while every route
    we hold was installed from a plan Route (`synced`; after a full read the kernel may hold more),
    only the installed Routes the plan no longer hands out are looked at (by identity, not by
    hashing 100,000 destinations); `fresh`: the plan's Routes that are not installed ones."""
    if unchanged + sum(1 for d in desired if d in have) == len(have):
        return []
    if len(have) != len(synced):
        by_dst = {r.dst: r for r in routes}
        candidates = [d for d in have if not _same(synced.get(d), by_dst.get(d))]
    else:
        in_plan = {id(r) for r in routes}
        candidates = [d for d, r in synced.items() if id(r) not in in_plan and not _same(r, fresh.get(d))]
    return sorted((d for d in candidates if d not in desired), key=sort_key_net)


def _still_synced(have: Mapping[IPNetwork, _Have], devs: tuple[Any, Any],
                  believed: tuple[Mapping[IPNetwork, _Have], tuple[Any, Any] | None, dict[IPNetwork, Route]] | None
                  ) -> dict[IPNetwork, Route]:
    """The installed plan routes of a dropped memory that the kernel (`have`, dumped now) still
    holds as that memory said: only the rest need a look. Nothing when the devices changed
    since (the kernel flushes a device's routes without telling anyone)."""
    if believed is None or believed[1] != devs:
        return {}
    known, _, synced = believed
    drifted = {d for d, h in have.items() if (k := known.get(d)) is None or k.want != h.want or k.scope != h.scope}
    drifted.update(d for d in known if d not in have)
    return {d: r for d, r in synced.items() if d not in drifted}


def _writes(have: Mapping[IPNetwork, _Have], desired: Mapping[IPNetwork, _Want]) -> list[tuple[IPNetwork, _Want]]:
    """The desired routes the kernel does not hold as wanted, in address order."""
    return sorted(((dst, want) for dst, want in desired.items()
                   if (h := have.get(dst)) is None or h.want != want), key=lambda kv: sort_key_net(kv[0]))


def _remember(have: dict[IPNetwork, _Have], synced: dict[IPNetwork, Route], done: Mapping[IPNetwork, _Want | None],
              desired: Mapping[IPNetwork, _Want], by_dst: Mapping[IPNetwork, Route]) -> None:
    """Update the memory after a fully applied sync: the kernel now holds `done`'s changes, and
    each desired route was installed from its plan Route."""
    for dst, change in done.items():
        if change is None:
            have.pop(dst, None)
            synced.pop(dst, None)
        else:
            have[dst] = _Have(change, change.scope, None)
    for dst in desired:
        synced[dst] = by_dst[dst]


class RouteApplier:
    """Keeps the routes of `table` that carry `proto` equal to the plan's."""

    def __init__(self, private_if: str | None, wg_if: str, *, proto: int = RT_PROTO, table: int = MAIN_TABLE):
        self.private_if = private_if
        self.wg_if = wg_if
        self.proto = proto
        self.table = table
        # Our routes as the kernel holds them, as far as we know (None: dump them), and the
        # (private, wireguard) ifindexes that memory is valid for.
        self._known: dict[IPNetwork, _Have] | None = None
        self._known_devs: tuple[Any, Any] | None = None
        # The plan's Route each of those was installed from: an identical Route next time needs no
        # work at all (not even building its netlink form).
        self._synced: dict[IPNetwork, Route] = {}
        # The memory `forget` dropped: the next dump is checked against it, and only the
        # destinations where the kernel differs from it are looked at again.
        self._believed: tuple[dict[IPNetwork, _Have], tuple[Any, Any] | None, dict[IPNetwork, Route]] | None = None
        # The destinations the last stage found the plan no longer has: retire deletes them.
        self._retiring: list[IPNetwork] = []
        # Destinations whose route of another owner a write replaces (take_over).
        self._takeover: frozenset[IPNetwork] = frozenset()

    def take_over(self, dsts: frozenset[IPNetwork]) -> None:
        """From now on a plan route to one of `dsts` replaces another owner's route there (in one
        call, never a gap): flannel's routes to the nodes meshctl routes (`--cni flannel`)."""
        self._takeover = dsts

    def forget(self) -> None:
        """Drop the memory of the kernel's routes: the next `sync` dumps them again and compares
        each with what this memory said (a route changed or deleted behind our back is put back;
        the others are not looked at again)."""
        if self._known is not None:
            self._believed = (self._known, self._known_devs, self._synced)
        self._known = None
        self._known_devs = None
        self._synced = {}
        self._retiring = []

    def _ours(self) -> dict[IPNetwork, _Have]:
        """Our unicast routes, as the kernel holds them: one dump per family, filtered by the
        kernel (table and protocol), read in place."""
        out: dict[IPNetwork, _Have] = {}
        # 100,000 routes have a few hundred distinct forms (a gateway per remote segment): one
        # object each.
        forms: dict[tuple[Any, ...], _Have] = {}
        names: dict[int, str] = {}
        with rtnl.Rtnl() as nl:
            for version, family in _FAMILIES.items():
                for data, off, length in nl.dump(family, table=self.table, proto=self.proto, rtype=rtnl.RTN_UNICAST):
                    _, plen, _, _, _, _, scope, _, flags = rtnl.RTMSG.unpack_from(data, off + rtnl.NLMSG.size)
                    a = rtnl.attributes(data, off, length)
                    oif = rtnl.U32.unpack(a[rtnl.RTA_OIF])[0] if rtnl.RTA_OIF in a else 0
                    if oif not in names:
                        names[oif] = _ifname(oif)
                    gateway = None
                    if rtnl.RTA_GATEWAY in a:
                        gateway = socket.inet_ntop(family, a[rtnl.RTA_GATEWAY])
                    elif rtnl.RTA_VIA in a:  # an IPv4 route through an IPv6 next hop
                        via = a[rtnl.RTA_VIA]
                        gateway = socket.inet_ntop(int.from_bytes(via[:2], "little"), via[2:])
                    metric = rtnl.U32.unpack(a[rtnl.RTA_PRIORITY])[0] if rtnl.RTA_PRIORITY in a else None
                    form = (names[oif], gateway, bool(flags & rtnl.RTNH_F_ONLINK), scope, metric)
                    have = forms.get(form)
                    if have is None:
                        have = forms[form] = _Have(_Want(*form[:3]), scope, metric)
                    out[network_of(version, int.from_bytes(a.get(rtnl.RTA_DST, b""), "big"), plen)] = have
        return out

    def _write_form(self, version: int, want: _Want, oif: int, replace: bool) -> rtnl.RouteForm:
        """The netlink request that installs `want` (replace, or add: refused where a route of
        another owner is), but for its destination."""
        gateway = None
        if want.gateway:
            gw_family = socket.AF_INET6 if ":" in want.gateway else socket.AF_INET
            gateway = (gw_family, socket.inet_pton(gw_family, want.gateway))
        how = rtnl.NLM_F_REPLACE if replace else rtnl.NLM_F_EXCL
        return rtnl.RouteForm(rtnl.RTM_NEWROUTE, rtnl.NLM_F_CREATE | how,
                              family=_FAMILIES[version], table=self.table, proto=self.proto, scope=want.scope,
                              rtm_flags=rtnl.RTNH_F_ONLINK if want.onlink else 0, oif=oif, gateway=gateway)

    def _writes_of(self, writes: Sequence[tuple[IPNetwork, _Want]], have: Mapping[IPNetwork, _Have],
                   index: Mapping[str, int | None], replace: bool | None = None) -> list[bytes]:
        """The requests of `writes`: a replace where we have a route (`have`; or as `replace` says),
        an add elsewhere; one form built per (version, want, replace)."""
        forms: dict[tuple[int, _Want, bool], rtnl.RouteForm] = {}
        out = []
        for dst, want in writes:
            key = (dst.version, want, dst in have if replace is None else replace)
            form = forms.get(key)
            if form is None:
                form = forms[key] = self._write_form(dst.version, want, index[want.dev] or 0, key[2])
            out.append(form.message(dst.network_address.packed, dst.prefixlen))
        return out

    def _delete(self, dst: IPNetwork, have: _Have, index: dict[str, int | None]) -> bytes:
        """The netlink request that deletes our route at `dst`: its own scope, metric and device
        (the kernel matches them on delete)."""
        if have.want.dev not in index:
            index[have.want.dev] = ifindex_or_none(have.want.dev) if have.want.dev else None
        return rtnl.RouteForm(rtnl.RTM_DELROUTE, 0, family=_FAMILIES[dst.version], table=self.table, proto=self.proto,
                              scope=have.scope, rtype=0, oif=index[have.want.dev], priority=have.metric
                              ).message(dst.network_address.packed, dst.prefixlen)

    def sync(self, routes: Sequence[Route]) -> RouteDiff:
        """Make our routes equal the plan's: `stage`, then `retire`; one diff of both."""
        diff = self.stage(routes)
        gone = self.retire()
        diff.removed += gone.removed
        return diff

    def stage(self, routes: Sequence[Route]) -> RouteDiff:
        """Add and replace what differs from the plan, skipping a destination another owner holds;
        remove nothing (`retire` does, afterwards). The writes go through one netlink socket
        (node/rtnl.py), however many."""
        diff = RouteDiff()
        devs = {"private": (self.private_if, ifindex_or_none(self.private_if)),
                "wireguard": (self.wg_if, ifindex_or_none(self.wg_if))}
        index: dict[str, int | None] = {name: oif for name, oif in devs.values() if name}
        with IPRoute() as ipr:
            dev_ids = (_dev_state(ipr, devs["private"][1]), _dev_state(ipr, devs["wireguard"][1]))
        if self._known is None or self._known_devs != dev_ids:
            believed = self._believed if self._known is None else (self._known, self._known_devs, self._synced)
            self._known, self._known_devs = self._ours(), dev_ids
            self._synced = _still_synced(self._known, dev_ids, believed)
            self._believed = None
        have, synced = self._known, self._synced
        # A Route object installed last time is unchanged by identity (plans reuse the Route
        # objects of what did not change): only the others are looked at, one by one.
        installed = {id(r) for r in synced.values()}
        fresh = {r.dst: r for r in routes if id(r) not in installed}
        desired, unchanged, skips = _desired(fresh, synced, devs)
        unchanged += len(routes) - len(fresh)
        for dst, r in fresh.items():  # equal to what was installed: remember this object next time
            if dst not in desired and _same(synced.get(dst), r):
                synced[dst] = r
        for dst, reason in skips:
            self._skip(diff, dst, reason)
        self._retiring = _removals(have, synced, routes, desired, unchanged, fresh)
        writes = _writes(have, desired)
        done: dict[IPNetwork, _Want | None] = {}  # what changed in the kernel
        failed_any = self._apply([], writes, have, index, diff, done)
        if failed_any:
            self.forget()  # the kernel said no somewhere: read it again next time
        else:
            _remember(have, synced, done, desired, fresh)
        if diff:
            log.info("routes: added %d, changed %d", len(diff.added), len(diff.changed))
        return diff

    def retire(self) -> RouteDiff:
        """Delete our routes that the last `stage` found the plan no longer has (none after a
        failed stage: the memory is gone, and the next stage finds them again)."""
        diff = RouteDiff()
        removes, self._retiring = self._retiring, []
        if not removes or self._known is None:
            return diff
        have = self._known
        done: dict[IPNetwork, _Want | None] = {}  # None = removed
        failed_any = self._apply(removes, [], have, {}, diff, done)
        if failed_any:
            self.forget()
        else:
            _remember(have, self._synced, done, {}, {})
        if diff:
            log.info("routes: removed %d", len(diff.removed))
        return diff

    def _apply(self, removes: list[IPNetwork], writes: list[tuple[IPNetwork, _Want]],
               have: Mapping[IPNetwork, _Have], index: dict[str, int | None], diff: RouteDiff,
               done: dict[IPNetwork, _Want | None]) -> bool:
        """Apply the changes through one netlink socket, recording in `diff` and `done` what the
        kernel did; a write it refuses is skipped with its reason, a delete it refuses logged.
        True if any failed. An add refused because a route is there already (EEXIST) is sent
        again as a replace when that route is the encapsulation applier's or one handed to `take_over`
        (one call, never a gap); any other owner's route stays."""
        n = len(removes)
        msgs = [self._delete(dst, have[dst], index) for dst in removes]
        msgs += self._writes_of(writes, have, index)
        with rtnl.Rtnl() as nl:
            refused = nl.apply(msgs)
            held = [i for i, why in refused.items()
                    if i >= n and why.errno == errno.EEXIST and writes[i - n][0] not in have]
            if held:
                encapsulated = self._encap_routes(nl)
                again = [i for i in held if writes[i - n][0] in self._takeover or writes[i - n][0] in encapsulated]
                retried = nl.apply(self._writes_of([writes[i - n] for i in again], have, index, replace=True))
                for k, i in enumerate(again):
                    if k in retried:
                        refused[i] = retried[k]
                    else:
                        del refused[i]
        for i, dst in enumerate(removes):
            if i in refused:
                log.warning("route %s: delete failed: %s", dst, refused[i])
                continue
            diff.removed.append(str(dst))
            done[dst] = None
        for i, (dst, want) in enumerate(writes, start=n):
            why = refused.get(i)
            if why is not None:
                self._skip(diff, dst, "a route of another owner holds it" if why.errno == errno.EEXIST else str(why))
                continue
            (diff.changed if dst in have else diff.added).append(str(dst))
            done[dst] = want
        return bool(refused)

    def _encap_routes(self, nl: rtnl.Rtnl) -> set[IPNetwork]:
        """The destinations of our table the encapsulation applier routes (proto RT_PROTO_ENCAP)."""
        out: set[IPNetwork] = set()
        for version, family in _FAMILIES.items():
            for data, off, length in nl.dump(family, table=self.table, proto=RT_PROTO_ENCAP):
                plen = rtnl.RTMSG.unpack_from(data, off + rtnl.NLMSG.size)[1]
                dst = rtnl.attributes(data, off, length).get(rtnl.RTA_DST, b"")
                out.add(network_of(version, int.from_bytes(dst, "big"), plen))
        return out

    @staticmethod
    def _skip(diff: RouteDiff, dst: IPNetwork, reason: str) -> None:
        log.warning("route %s skipped: %s", dst, reason)
        diff.skipped.append(f"{dst}: {reason}")

    def flush(self) -> int:
        """Delete every route of `table` carrying `proto`; return how many."""
        self.forget()
        have = self._ours()
        diff = RouteDiff()
        self._apply(sorted(have, key=sort_key_net), [], have, {}, diff, {})
        return len(diff.removed)


def _ifname(index: int) -> str:
    """The name of the device of `index` in this namespace ('' for none, or one gone meanwhile)."""
    if not index:
        return ""
    try:
        return socket.if_indextoname(index)
    except OSError:
        return ""
