# SPDX-License-Identifier: Apache-2.0
"""The pinned maps of one node: open, check against the layout, read, and sync by diff.

A sync compares the desired (key -> value) bytes with what the map holds and writes only the
difference, in batches where the kernel has them (it does for hash and LPM trie maps here), so a
plan change that touches one entry makes one map update and a packet in flight never sees a
half-written table.

Make before break: new and changed entries are written before stale ones are deleted (each key's
update is atomic in the kernel), so an address both the old and the new content cover always
matches an entry: one whose /24 gives way to a /16 meets the /24 until the /16 is in. Only a map
too full to take the additions first deletes first. The stale keys can also be left for a later
`delete` (`retire=False`): the datapath deletes them once the kernel routes that take over
their traffic are in place. A whole table (the routes map) is synced from a Table: into an empty map it
goes as one batch with no diff at all, and against the table last written a resync that changes
nothing costs one comparison of two lists.

The flow filter (FlowFilter) is read and written through a shared mapping, not by the syscalls.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

from meshctl.datapath import layout, libbpf
from meshctl.errors import MeshError


@dataclass(frozen=True)
class SyncStats:
    added: int
    changed: int
    deleted: int

    @property
    def total(self) -> int:
        return self.added + self.changed + self.deleted


@dataclass(frozen=True)
class Table:
    """A map's whole content: key i -> value i, in the order they are written; a key listed twice
    keeps its last value, as in a dict."""

    keys: list[bytes]
    values: list[bytes]

    @cached_property
    def pairs(self) -> dict[bytes, bytes]:
        return dict(zip(self.keys, self.values, strict=True))

    def distinct(self) -> Table:
        """The same content with every key listed once (this table when none repeats)."""
        pairs = self.pairs
        return self if len(pairs) == len(self.keys) else Table(list(pairs), list(pairs.values()))


class Map:
    """One pinned map, checked against the sizes the layout expects."""

    def __init__(self, path: str, name: str) -> None:
        self.path = path
        self.name = name
        self.fd = libbpf.obj_get(path)
        info = libbpf.map_info(self.fd)
        self.key_size, self.value_size, self.max_entries = info.key_size, info.value_size, info.max_entries
        self.stale: list[bytes] = []  # the keys the last sync with retire=False left in the map
        want = layout.MAP_SIZES[name]
        if (self.key_size, self.value_size) != want:
            os.close(self.fd)
            raise MeshError(f"{path}: key/value sizes {self.key_size}/{self.value_size} differ from the "
                            f"layout's {want[0]}/{want[1]} (an older agent's maps: run `meshctl datapath unload`)")

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def empty(self) -> bool:
        """Whether the map holds nothing: one get_next_key, no read of the entries."""
        return libbpf.empty(self.fd, self.key_size)

    def items(self) -> dict[bytes, bytes]:
        if self.empty():  # spares lookup_batch's buffers (sized for a full map) on an empty one
            return {}
        try:
            pairs = libbpf.lookup_batch(self.fd, self.key_size, self.value_size, self.max_entries)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOTSUP, 524):  # 524: ENOTSUPP (kernel-internal)
                raise
            pairs = []
            for k in libbpf.keys(self.fd, self.key_size):
                v = libbpf.lookup(self.fd, k, self.value_size)
                if v is not None:
                    pairs.append((k, v))
        return dict(pairs)

    def sync(self, desired: Mapping[bytes, bytes], current: Mapping[bytes, bytes] | None = None,
             *, retire: bool = True) -> SyncStats:
        """Make the map hold exactly `desired`, writing only what differs from `current` (what the
        map holds: read from the kernel unless the caller knows it): updates first, then the
        deletions; with `retire=False` the stale keys stay (`stale` names them)."""
        if current is None:
            current = self.items()
        if current:
            put = dict(desired.items() - current.items())
            gone = list(current.keys() - desired.keys())
            added = len(put.keys() - current.keys())
        else:
            put, gone, added = dict(desired), [], len(desired)
        if len(current) + added > self.max_entries:  # no room for the additions: the stale go first
            self.delete(gone)
            gone, retire = [], True
        self._update(list(put), list(put.values()))
        self.stale = [] if retire else gone
        if retire:
            self.delete(gone)
        return SyncStats(added, len(put) - added, len(gone))

    def sync_table(self, desired: Table, written: Table | None = None, *,
                   retire: bool = True) -> tuple[SyncStats, Table]:
        """Make the map hold exactly `desired`, as sync() does; returns the stats and the table now
        in the map, every key once: pass it as `written` to the next sync_table (None: read the
        map). The same keys in the same order as `written` (a plan whose paths changed, or none)
        writes the changed values alone, found by comparing the two value lists; into an empty map
        `desired` goes as one batch with no diff (its dict is built only when a later sync needs it).
        With `retire=False` the keys `desired` lacks stay in the map (`stale` names them) for a
        later `delete`; the returned table is `desired` all the same."""
        self.stale = []
        if written is not None and desired.keys == written.keys:  # so desired's keys are distinct too
            if desired.values == written.values:
                return SyncStats(0, 0, 0), written
            changed = [i for i, (new, old) in enumerate(zip(desired.values, written.values, strict=True)) if new != old]
            self._update([desired.keys[i] for i in changed], [desired.values[i] for i in changed])
            return SyncStats(0, len(changed), 0), desired
        if written is None and self.empty():
            if len(set(desired.keys)) != len(desired.keys):  # a set: cheaper than the dict, built only if needed
                desired = desired.distinct()
            self._update(desired.keys, desired.values)
            return SyncStats(len(desired.keys), 0, 0), desired
        desired = desired.distinct()
        return self.sync(desired.pairs, written.pairs if written is not None else None, retire=retire), desired

    def _update(self, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        if not keys:
            return
        try:
            libbpf.update_batch(self.fd, b"".join(keys), b"".join(values), len(keys))
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOTSUP, 524):
                raise
            for k, v in zip(keys, values, strict=True):
                libbpf.update(self.fd, k, v)

    def delete(self, keys: Sequence[bytes]) -> None:
        """Delete `keys` (a key already gone is no error)."""
        if not keys:
            return
        try:
            libbpf.delete_batch(self.fd, b"".join(keys), len(keys))
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOTSUP, 524, errno.ENOENT):
                raise
            for k in keys:
                libbpf.delete(self.fd, k)


@dataclass(frozen=True)
class RouteCacheStats:
    """The route cache (meshctl_maps.h, route_cache) over every CPU: the generation (0: off), the
    slots holding an entry of it (what the next packet to those destinations takes without a trie
    walk), the slots there are, and the fills ever made (trie walks that found an entry; against
    the packets of the direct, tunnel and local outcomes, how often the cache missed)."""

    generation: int
    held: int
    slots: int
    fills: int


class Entries(Protocol):
    """What a flow filter rebuild reads of a flow LRU (a Map)."""

    def items(self) -> Mapping[bytes, bytes]: ...


@dataclass(frozen=True)
class FilterStats:
    """A flow filter rebuild: the LRUs' live tuples and the slots they set in the new half."""

    flows: int
    slots: int


# Machines whose stores other CPUs see in program order (x86's total store order). The rebuild's
# last store (`active`) must not be seen before the slots it publishes, and Python issues no
# fence: on a weakly ordered CPU (arm64) a program could read the new half before its slots are
# visible and send a tracked flow's reply past the kernel. There the filter stays off.
STORE_ORDERED_MACHINES = ("x86_64", "amd64", "i386", "i686")


class FlowFilter:
    """The flow filter (meshctl_maps.h, flowfilter) through a shared mapping of its one element:
    byte stores, as the programs make, so a rebuild never overwrites a slot they set meanwhile
    (a whole-element update through the syscall would). Only on STORE_ORDERED_MACHINES; elsewhere
    `rebuild` leaves it off and every tuple takes the LRU lookup."""

    def __init__(self, m: Map, machine: str | None = None) -> None:
        self.enabled = (machine or platform.machine()).lower() in STORE_ORDERED_MACHINES
        self.map = m
        self._mm = mmap.mmap(m.fd, layout.FLOWFILTER_VALUE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        # routes_gen as one aligned 32-bit word: a store the programs never see half made.
        self._gen: ctypes.c_uint32 | None = ctypes.c_uint32.from_buffer(self._mm, layout.FLOWFILTER_ROUTES_GEN)

    def close(self) -> None:
        self._gen = None  # the mapping cannot close while a ctypes view of it lives
        self._mm.close()

    @property
    def routes_gen(self) -> int:
        """The route cache's generation (meshctl_maps.h, route_cache); 0: the cache is off."""
        assert self._gen is not None, "closed"
        return self._gen.value

    def retire_route_cache(self) -> None:
        """Retire every CPU's route cache slots: the next generation (never 0, which is off). Call it
        after every write to the routes map; the programs fill slots again from the trie. Where
        stores may be seen out of order (not `enabled`) the cache stays off."""
        assert self._gen is not None, "closed"
        self._gen.value = ((self._gen.value + 1) & 0xFFFFFFFF or 1) if self.enabled else 0

    @property
    def active(self) -> int:
        """0: off (the programs look every tuple up in the LRUs); 1 or 2: half 0 or 1 is read."""
        return self._mm[0]

    def turn_off(self) -> None:
        """Every tuple to the LRU lookup until the next rebuild (programs just replaced: the flows
        the ones before recorded may have no slot)."""
        self._mm[0] = 0

    def _half(self, active: int) -> int:
        return layout.FLOWFILTER_HEAD + (active - 1) * layout.FLOWFILTER_SLOTS

    def may_hold(self, key: bytes) -> bool:
        """What the programs conclude for flow LRU key `key`: False when the filter proves the
        LRUs lack it."""
        active = self.active
        return active == 0 or self._mm[self._half(active) + layout.flow_slot(key)] != 0

    def filled(self) -> int:
        """How many slots of the half the programs read are set (0 when off)."""
        active = self.active
        if active == 0:
            return 0
        base = self._half(active)
        return layout.FLOWFILTER_SLOTS - self._mm[base:base + layout.FLOWFILTER_SLOTS].count(0)

    def rebuild(self, *lrus: Entries) -> FilterStats:
        """The other half made from the live keys of `lrus` (the flow LRUs), then switched to: slots
        of flows the LRUs have evicted since the last rebuild are clear from here on. In this order:
        the half is zeroed, then the keys are read, then their slots set, then `active` switched
        (one byte store; the programs read the half it names). A flow the programs record meanwhile
        sets its slot in both halves after its LRU insert: before the zeroing it is among the keys
        read, after it its own slot stays. Two rebuilds must lie further apart than one program
        run (the agent makes one per resync interval): a program that read `active` just before
        the switch still reads the old half, which only the next rebuild zeroes. Where stores may
        be seen out of order (not `enabled`), the filter is left off and no slot is set."""
        if not self.enabled:
            self._mm[0] = 0
            return FilterStats(0, 0)
        nxt = 2 if self.active == 1 else 1
        base = self._half(nxt)
        self._mm[base:base + layout.FLOWFILTER_SLOTS] = bytes(layout.FLOWFILTER_SLOTS)
        keys = [k for m in lrus for k in m.items()]
        slots = {layout.flow_slot(k) for k in keys}
        for slot in slots:
            self._mm[base + slot] = 1
        self._mm[0] = nxt
        return FilterStats(len(keys), len(slots))


class NodeMaps:
    """All maps pinned for one node, under `pin_dir`."""

    NAMES = ("routes", "pods", "flows4", "flows6", "flowfilter", "route_cache", "counters", "config", "xlate")

    def __init__(self, pin_dir: str) -> None:
        self.pin_dir = pin_dir
        opened: dict[str, Map] = {}
        try:
            for n in self.NAMES:
                opened[n] = Map(f"{pin_dir}/{n}", n)
        except BaseException:
            for m in opened.values():
                m.close()
            raise
        self.routes, self.pods = opened["routes"], opened["pods"]
        self.flows4, self.flows6 = opened["flows4"], opened["flows6"]
        self.counters_map, self.config = opened["counters"], opened["config"]
        self.route_cache = opened["route_cache"]
        self.xlate = opened["xlate"]
        self._all = list(opened.values())
        try:
            self.flowfilter = FlowFilter(opened["flowfilter"])
        except BaseException:
            self._close_maps()
            raise
        self._ncpu = libbpf.possible_cpus()

    def _close_maps(self) -> None:
        for m in self._all:
            m.close()

    def close(self) -> None:
        self.flowfilter.close()
        self._close_maps()

    def rebuild_flowfilter(self) -> FilterStats:
        """FlowFilter.rebuild from both flow LRUs."""
        return self.flowfilter.rebuild(self.flows4, self.flows6)

    def route_changed(self) -> None:
        """After a write to the routes map: every CPU's route cache slots retired at once."""
        self.flowfilter.retire_route_cache()

    def sync_routes(self, desired: Mapping[bytes, bytes]) -> SyncStats:
        """Make the routes map hold exactly `desired` (Map.sync), then retire the route cache: a
        write beside Datapath.stage (a test's, a bench's) that skipped the retire would leave a
        CPU's slot answering for a destination with the entry it held before."""
        stats = self.routes.sync(desired)
        self.route_changed()
        return stats

    def route_cache_stats(self) -> RouteCacheStats:
        """The route cache read now, every CPU's slots summed: one batch read of the whole map where
        the kernel has it (the agent reads this once per pass; a node of 128 CPUs has 32,768 slots),
        and of each slot only its generation and fills."""
        m = self.route_cache
        per_slot = (m.value_size + 7) // 8 * 8 * self._ncpu
        try:
            raw = b"".join(v for _, v in libbpf.lookup_batch(m.fd, m.key_size, per_slot, m.max_entries))
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOTSUP, 524):
                raise
            raw = b"".join(v for i in range(m.max_entries) for v in self._per_cpu(m, i))
        gen = self.flowfilter.routes_gen
        rows = list(layout.ROUTE_CACHE_GEN_FILLS.iter_unpack(raw))
        held = sum(1 for g, _ in rows if g == gen) if gen else 0  # a filled slot's gen is never 0
        return RouteCacheStats(gen, held, layout.ROUTE_CACHE_SLOTS * self._ncpu, sum(f for _, f in rows))

    def _per_cpu(self, m: Map, index: int) -> list[bytes]:
        """Element `index` of per-CPU array `m`, one value per possible CPU."""
        stride = (m.value_size + 7) // 8 * 8
        raw = libbpf.lookup(m.fd, layout.U32.pack(index), stride * self._ncpu) or b""
        return [raw[cpu * stride:cpu * stride + m.value_size] for cpu in range(len(raw) // stride)]

    def config_get(self, slot: int) -> int:
        v = libbpf.lookup(self.config.fd, layout.U32.pack(slot), layout.CONFIG_VALUE.size)
        return layout.CONFIG_VALUE.unpack(v)[0] if v else 0

    def config_set(self, slot: int, value: int) -> None:
        libbpf.update(self.config.fd, layout.U32.pack(slot), layout.CONFIG_VALUE.pack(value))

    def counters(self) -> dict[str, tuple[int, int]]:
        """Per-action (packets, bytes) summed over every CPU."""
        out: dict[str, tuple[int, int]] = {}
        for slot, name in enumerate(layout.COUNTERS):
            per_cpu = [layout.COUNTER.unpack(v) for v in self._per_cpu(self.counters_map, slot)]
            out[name] = (sum(p for p, _ in per_cpu), sum(b for _, b in per_cpu))
        return out
