# SPDX-License-Identifier: Apache-2.0
"""The eBPF fast path of one node, as the agent drives it.

    dp = Datapath.open("a1")                 # load, or reopen what a previous agent pinned
    dp.attach("eth1", "kilo0", ["veth-p1"],  # idempotent; pods, private4/6 as node.discovery reads them
              pods=discovery.pod_routes(["veth-p1"]), private4=discovery.private_ipv4("eth1"),
              private6=None)
    dp.sync(plan.fastpath, "eth1")           # diff against the pinned LPM map
    dp.counters(); dp.entries(); dp.close()  # close leaves everything pinned and running

Everything works on the current network namespace (the agent runs inside the node's). The
kernel's routes stay the source of truth: with the programs unloaded, or where they cannot load
(`mode == "kernel-routes"`, `reason` says why), traffic takes the same paths through the kernel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from meshctl import defaults
from meshctl.datapath import layout, links
from meshctl.datapath.maps import FilterStats, RouteCacheStats, SyncStats, Table
from meshctl.datapath.status import DatapathStatus
from meshctl.errors import MeshError
from meshctl.mesh.model import IPAddress, IPNetwork
from meshctl.mesh.plan import FastPathEntry

if TYPE_CHECKING:
    from meshctl.datapath.loader import Loaded
    from meshctl.datapath.maps import NodeMaps

__all__ = ["Datapath", "FilterStats", "SyncStats"]

log = logging.getLogger("meshctl.datapath")


class Datapath:
    """One node's fast path: its pinned programs, maps and links (see the module docstring)."""

    _warned: set[str] = set()

    def __init__(self, node: str, pin_root: str, mode: str, reason: str, loaded: Loaded | None = None) -> None:
        self.node = node
        self.pin_root = pin_root
        self.pin_dir = f"{pin_root}/{node}"
        self.mode = mode
        self.reason = reason
        self._loaded = loaded
        self._tc_fallback = False
        self._routes_written: Table | None = None
        # Staged and not yet retired: the LPM keys the plan dropped and the table once they go.
        self._retiring: tuple[list[bytes], Table] | None = None

    # --- lifecycle ------------------------------------------------------------------------

    @classmethod
    def open(cls, node: str, *, pin_root: str = defaults.PIN_ROOT, enabled: bool = True,
             why_off: str = "") -> Datapath:
        """Load the programs or reopen the pinned ones (an agent restart drops no packet). Never
        raises for a missing bcc, headers or helper: then mode is "kernel-routes" and reason says
        why (logged once at WARNING). enabled=False removes whatever a previous agent left
        attached for this node, so turning the fast path off really turns it off; `why_off` is then
        the reason status gives (default "disabled")."""
        if not node or "/" in node or node in (".", ".."):
            from meshctl.errors import InputError

            raise InputError("node", node, "is not a node name usable as a pin directory")
        dp = cls._open(node, pin_root, enabled, why_off)
        record_outcome(dp.pin_dir, dp.objects)
        return dp

    @classmethod
    def _open(cls, node: str, pin_root: str, enabled: bool, why_off: str) -> Datapath:
        if not enabled:
            try:
                cls.unload(node, pin_root=pin_root)
            except (OSError, MeshError) as e:
                log.warning("datapath: could not remove the pinned fast path of %s: %s", node, e)
            return cls._fallback(node, pin_root, why_off or "disabled")
        try:
            from meshctl.datapath import features, loader

            loader.ensure_bpffs(pin_root)
            missing = features.probe().missing()
            if missing:
                return cls._fallback(node, pin_root, f"this kernel lacks {', '.join(missing)}")
            loaded = loader.load(f"{pin_root}/{node}")
        except (ImportError, OSError, MeshError) as e:
            return cls._fallback(node, pin_root, str(e) or type(e).__name__)
        dp = cls(node, pin_root, "ebpf", "", loaded)
        dp._tc_fallback = not features.probe().tcx
        if loaded.compiled:  # the programs the links ran may have recorded flows without their slots
            loaded.maps.flowfilter.turn_off()
        loaded.maps.route_changed()  # a cache left off (gen 0: maps older than it, another machine) turns on
        try:
            dp._refresh_links()
        except (OSError, MeshError) as e:  # the old programs keep running: still a working node
            log.warning("datapath: could not switch the links of %s to the new programs: %s", node, e)
        else:  # every link runs these programs now, which set the slot of each flow they record
            try:
                dp.rebuild_flow_filter()
            except OSError as e:  # the filter stays as it was: off after new programs, else whole
                log.warning("datapath: could not rebuild the flow filter of %s: %s", node, e)
        if loaded.compiled:
            log.info("datapath: %s loaded (%s) and pinned under %s", node, loaded.objects, dp.pin_dir)
        return dp

    @classmethod
    def pinned(cls, node: str, *, pin_root: str = defaults.PIN_ROOT) -> Datapath:
        """Open what an agent pinned for `node` without compiling, loading or attaching anything
        (`maps dump`, `datapath status`, tests). MeshError when nothing usable is pinned."""
        from meshctl.datapath import loader

        try:
            loaded = loader.reopen(f"{pin_root}/{node}")
        except OSError as e:
            raise MeshError(f"cannot open the pinned datapath of {node}: {e}") from None
        dp = cls(node, pin_root, "ebpf", "", loaded)
        dp._tc_fallback = _clsact_in_use(dp.pin_dir)
        return dp

    @classmethod
    def _fallback(cls, node: str, pin_root: str, reason: str) -> Datapath:
        if reason not in cls._warned:
            cls._warned.add(reason)
            log.warning("datapath: kernel-routes (%s): pod traffic takes the kernel's routes, no eBPF fast path",
                        reason)
        return cls(node, pin_root, "kernel-routes", reason)

    @property
    def objects(self) -> str:
        """Which of the three outcomes this node has: where its programs came from (loader.
        OBJECT_SOURCES: shipped, compiled (bcc), compiled (bcc, cached); "pinned" when a loader that
        kept no record pinned them), or "kernel routes: <reason>"."""
        if self._loaded is None:
            return f"kernel routes: {self.reason}"
        return self._loaded.objects or "pinned"

    def close(self) -> None:
        """Release our file descriptors; programs, links and maps stay pinned and running."""
        if self._loaded is not None:
            self._loaded.close()
            self._loaded = None

    def __enter__(self) -> Datapath:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def unload(node: str, *, pin_root: str = defaults.PIN_ROOT) -> None:
        """Detach everything of this node (links, clsact filters in this netns) and unpin its maps."""
        from meshctl.datapath import loader

        pin_dir = f"{pin_root}/{node}"
        with contextlib.suppress(FileNotFoundError):
            outcome_path(pin_dir).unlink()
        links.detach_all(pin_dir)
        if _clsact_in_use(pin_dir):
            for a in links.clsact_links():
                links.detach_clsact(a.hook, a.ifname)
        if os.path.isdir(pin_dir):
            loader.remove_maps_and_progs(pin_dir)
            for n in os.listdir(pin_dir):
                path = f"{pin_dir}/{n}"
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    os.unlink(path)
            os.rmdir(pin_dir)

    # --- attach ---------------------------------------------------------------------------

    def _refresh_links(self) -> None:
        """Switch pinned links to the programs just loaded (after a new source or a migration)."""
        assert self._loaded is not None
        from meshctl.datapath.loader import prog_path

        for a in links.pinned_links(self.pin_dir):
            prog = links.HOOKS[a.hook][0]
            if a.gone:
                links.detach_tcx(self.pin_dir, a.hook, a.ifindex)
            elif a.prog_id != self._loaded.prog_ids[prog]:
                links.attach_tcx(self.pin_dir, a.hook, a.ifindex, self._loaded.progs[prog], self._loaded.prog_ids[prog])
        if self._tc_fallback or _clsact_in_use(self.pin_dir):
            self._tc_fallback = True  # a restarted agent keeps to clsact where the last one had to
            self._loaded.maps.config_set(layout.CFG_CLSACT, 1)  # kept across a map migration too
            for a in links.clsact_links():
                prog = links.HOOKS[a.hook][0]
                if a.prog_id != self._loaded.prog_ids[prog]:
                    links.attach_clsact(a.hook, a.ifname, prog_path(self.pin_dir, prog))

    @property
    def clsact(self) -> bool:
        """Whether the programs are attached as clsact filters (no tcx before 6.6) rather than tcx links."""
        return self._tc_fallback

    def attach(self, private_if: str, tunnel_if: str | None, pod_ifs: Iterable[str], *,
               pods: Mapping[IPAddress, int], private4: IPAddress | None,
               private6: IPAddress | None = None) -> int:
        """Idempotent: from_pod (+ egress tracking) on each pod veth, from_private (+ egress
        tracking) on the private NIC, from_tunnel and tunnel_egress (global ranges' translation) on
        tunnel_if; detach pod veths no longer
        listed; make the local-pod map `pods` (pod address -> host veth ifindex); record
        `private4` and `private6`, the private NIC's IPv4 and IPv6 addresses (either may be None),
        as the ones encapsulated packets must be addressed to (over an IPv4 or an IPv6 underlay).

        The caller reads `pods`, `private4` and `private6` from this namespace
        (node.discovery.pod_routes, private_ipv4, and the node's IPv6 internal address): the
        node's appliers build on the datapath's wire format, so the datapath takes what it needs
        of the node as values and never imports node/.

        Returns how many hooks it attached, switched or detached: a hook already running its
        program is left alone, tcx link or clsact filter (the filters are read once per call, so a
        resync on a kernel without tcx runs `tc` only to read them, not to replace each one)."""
        if self._loaded is None:
            return 0
        self._loaded.maps.config_set(layout.CFG_PRIVATE4, layout.config_addr(private4))
        hi, lo = layout.config_addr6(private6)
        self._loaded.maps.config_set(layout.CFG_PRIVATE6, hi)
        self._loaded.maps.config_set(layout.CFG_PRIVATE6 + 1, lo)
        self._loaded.maps.config_set(layout.CFG_PRIVATE_MTU, links.mtu(private_if))
        pod_ifs = list(dict.fromkeys(pod_ifs))
        want: dict[tuple[str, int], str] = {}
        priv = links.ifindex(private_if)
        want[("private-in", priv)] = private_if
        want[("private-out", priv)] = private_if
        if tunnel_if:
            tunnel = links.ifindex_or_none(tunnel_if)
            if tunnel is not None:
                want[("tunnel-in", tunnel)] = tunnel_if
                want[("tunnel-out", tunnel)] = tunnel_if
            else:
                log.info("datapath: tunnel device %s not there yet", tunnel_if)
        for name in pod_ifs:
            idx = links.ifindex_or_none(name)
            if idx is None:
                continue  # the pod went away between listing and attaching
            want[("pod-in", idx)] = name
            want[("pod-out", idx)] = name
        fell_back = self._tc_fallback
        filters = links.clsact_links() if self._tc_fallback else []
        running = {(a.hook, a.ifindex): a.prog_id for a in filters}
        changed = sum(self._attach_one(hook, idx, name, running) for (hook, idx), name in want.items())
        # What ran before this call, unless it fell back to clsact just now (then read anew)
        found = self.attachments() if self._tc_fallback != fell_back else links.pinned_links(self.pin_dir) + filters
        for a in found:
            if (a.hook, a.ifindex) not in want:
                if a.kind == "tcx":
                    links.detach_tcx(self.pin_dir, a.hook, a.ifindex)
                else:
                    links.detach_clsact(a.hook, a.ifname)
                changed += 1
        self._loaded.maps.pods.sync({layout.pod_key(ip): layout.pod_value(idx) for ip, idx in pods.items()})
        return changed

    def _attach_one(self, hook: str, idx: int, name: str, filters: Mapping[tuple[str, int], int]) -> bool:
        """Make `hook` on `name` (ifindex `idx`) run its program; True when something changed.
        `filters`: the program id each clsact filter of ours runs, by (hook, ifindex)."""
        assert self._loaded is not None
        prog = links.HOOKS[hook][0]
        if not self._tc_fallback:
            try:
                return links.attach_tcx(self.pin_dir, hook, idx, self._loaded.progs[prog],
                                        self._loaded.prog_ids[prog])
            except OSError as e:
                if not links.tcx_unsupported(e):
                    raise MeshError(f"attach {prog} to {name}: {e}") from None
                log.warning("datapath: tcx links unavailable (%s): using clsact filters", e)
                self._tc_fallback = True
        if filters.get((hook, idx)) == self._loaded.prog_ids[prog]:
            return False
        from meshctl.datapath.loader import prog_path

        self._loaded.maps.config_set(layout.CFG_CLSACT, 1)  # so unload knows to look for filters
        links.attach_clsact(hook, name, prog_path(self.pin_dir, prog))
        return True

    def attachments(self) -> list[links.Attachment]:
        """Where the programs run: pinned tcx links, and the clsact filters of the fallback."""
        if self.mode != "ebpf":
            return []
        out = links.pinned_links(self.pin_dir)
        if self._tc_fallback:
            out += links.clsact_links()
        return out

    # --- maps -----------------------------------------------------------------------------

    def sync(self, entries: Sequence[FastPathEntry], private_if: str) -> SyncStats:
        """Diff the plan's entries against the pinned LPM map; change only what differs (`stage`,
        then `retire`)."""
        stats = self.stage(entries, private_if)
        self.retire()
        return stats

    def stage(self, entries: Sequence[FastPathEntry], private_if: str,
              global_cidrs: Sequence[tuple[IPNetwork, IPNetwork]] = ()) -> SyncStats:
        """Write the plan's entries that the LPM map lacks or holds otherwise; the entries the plan
        no longer has stay until `retire` (make before break: the kernel routes that take over
        their traffic are staged first). The stats count those as deleted already.
        `global_cidrs` (NodePlan.global_cidrs) fill the xlate map first, so no entry asks for a
        translation the map cannot answer; without them translation is switched off before the
        map empties."""
        if self._loaded is None:
            return SyncStats(0, 0, 0)
        self.set_global_ranges(global_cidrs)
        desired = Table(*layout.route_rows(entries, links.ifindex(private_if)))
        routes = self._loaded.maps.routes
        # The first sync after open diffs against the pinned map itself (nothing to diff when it is
        # empty); later ones against what this agent wrote (reading a large map back costs more
        # than the whole diff). Until stale keys are retired the map holds more than it wrote:
        # `_routes_written` is None then.
        stats, table = routes.sync_table(desired, self._routes_written, retire=False)
        if stats.added or stats.changed:
            self._loaded.maps.route_changed()
        self._retiring, self._routes_written = ((routes.stale, table), None) if routes.stale else (None, table)
        return stats

    def set_global_ranges(self, global_cidrs: Sequence[tuple[IPNetwork, IPNetwork]]) -> None:
        """The xlate map and its switch (config MC_CFG_XLATE) for this cluster's global ranges:
        entries in before the switch turns on, the switch off before entries go."""
        if self._loaded is None:
            return
        maps = self._loaded.maps
        if not global_cidrs:
            maps.config_set(layout.CFG_XLATE, 0)
        maps.xlate.sync(layout.xlate_table(global_cidrs))  # every slot: an array keeps them all
        if global_cidrs:
            maps.config_set(layout.CFG_XLATE, 1)

    def translating(self, tunnel_if: str | None) -> bool:
        """Whether the programs translate this node's global ranges: loaded, the ranges in their map
        (config MC_CFG_XLATE), and hooked on the tunnel device where there is one."""
        if self._loaded is None or self._loaded.maps.config_get(layout.CFG_XLATE) != 1:
            return False
        idx = links.ifindex_or_none(tunnel_if)
        return idx is None or any(a.hook == "tunnel-in" and a.ifindex == idx for a in self.attachments())

    def global_ranges(self) -> list[dict]:
        """The xlate map as `maps dump` prints it: each family's pod range and global range."""
        if self._loaded is None:
            return []
        rows = [layout.decode_xlate(k, v) for k, v in sorted(self._loaded.maps.xlate.items().items())]
        return [{"pod_range": str(pod), "global_range": str(glob)} for pod, glob in filter(None, rows)]

    def retire(self) -> int:
        """Delete the entries the last `stage` left for it; how many."""
        if self._loaded is None or self._retiring is None:
            return 0
        stale, table = self._retiring
        self._loaded.maps.routes.delete(stale)
        self._loaded.maps.route_changed()
        self._retiring, self._routes_written = None, table
        return len(stale)

    def rebuild_flow_filter(self) -> FilterStats:
        """Rebuild the flow filter from the flow LRUs' live keys (maps.FlowFilter.rebuild), so the
        slots of flows they evicted stop costing an LRU lookup; the agent does it once per resync
        interval. Also turns a filter that is off (programs just replaced) on."""
        if self._loaded is None:
            return FilterStats(0, 0)
        return self._loaded.maps.rebuild_flowfilter()

    def counters(self) -> dict[str, tuple[int, int]]:
        """action -> (packets, bytes), summed over CPUs; {} in kernel-routes mode."""
        return self._loaded.maps.counters() if self._loaded is not None else {}

    def route_cache(self) -> RouteCacheStats | None:
        """The route cache read now (maps.NodeMaps.route_cache_stats); None in kernel-routes mode."""
        return self._loaded.maps.route_cache_stats() if self._loaded is not None else None

    def entries(self) -> list[dict]:
        """The LPM map as `maps dump` prints it: prefix, action, nexthop, ifname, and for an
        encapsulated entry its encapsulation (vxlan, ipip) and outer addresses."""
        if self._loaded is None:
            return []
        from meshctl.mesh.model import sort_key_net

        out = [layout.decode_route(k, v) for k, v in self._loaded.maps.routes.items().items()]
        out.sort(key=lambda r: sort_key_net(r.entry.prefix))
        rows = []
        for r in out:
            e = r.entry
            rows.append({"prefix": str(e.prefix), "action": e.action, "nexthop": str(e.nexthop) if e.nexthop else None,
                         "ifname": links.ifname(r.ifindex) if r.ifindex else None,
                         "encap": e.encap.kind if e.encap else None,
                         "outer_src": str(e.encap.local) if e.encap else None,
                         "outer_dst": str(e.encap.remote) if e.encap else None,
                         **({"translate": True} if e.translate else {})})
        return rows

    def pod_addresses(self) -> list[IPAddress]:
        """The local-pod map's addresses (no interface names: they need the node's namespace)."""
        if self._loaded is None:
            return []
        return sorted((layout.decode_pod(k, v)[0] for k, v in self._loaded.maps.pods.items().items()),
                      key=lambda ip: (ip.version, int(ip)))

    def pods(self) -> list[dict]:
        """The local-pod map: pod address and the host veth bpf_redirect_peer sends it to."""
        if self._loaded is None:
            return []
        rows = sorted((layout.decode_pod(k, v) for k, v in self._loaded.maps.pods.items().items()),
                      key=lambda r: (r[0].version, int(r[0])))
        return [{"ip": str(ip), "ifindex": idx, "ifname": links.ifname(idx)} for ip, idx in rows]

    def flows(self) -> list[dict]:
        """Reply tuples of flows that left through the kernel (the flow LRU)."""
        if self._loaded is None:
            return []
        maps = self._loaded.maps
        return [layout.decode_flow(k) for m in (maps.flows4, maps.flows6) for k in m.items()]

    def status_block(self, *, synced: bool | None = None, reason: str | None = None,
                     counters: bool = True) -> DatapathStatus:
        """The fast path's status block, the one builder of it (the agent's /status `datapath`, and
        `meshctl datapath status`): mode and why (`reason` in place of the datapath's own), the
        counters read now (with `counters`), whether the maps hold a plan (`synced`, the agent's
        to say), where the objects came from; with the eBPF datapath also how the programs hook in,
        which helpers they do without on this kernel and the route cache's fills."""
        from meshctl.datapath.objcache import refusals

        got: dict[str, tuple[int, int]] = {}
        if counters:
            try:
                got = self.counters()
            except Exception as e:  # noqa: BLE001 - status must always answer
                log.debug("datapath counters: %s", e)
        why = self.reason if reason is None else reason
        if self.mode != "ebpf":
            return DatapathStatus(self.mode, why, got, synced, objects=self.objects, objects_refused=refusals())
        from meshctl.datapath.features import probe

        try:
            rc = self.route_cache()
        except OSError as e:
            rc = None
            log.debug("datapath route cache: %s", e)
        return DatapathStatus(self.mode, why, got, synced, "clsact" if self._tc_fallback else "tcx",
                              tuple(probe().fallbacks()), self.objects, refusals(), rc.fills if rc else None)

    def status(self) -> dict:
        """What `meshctl datapath status` shows: the status block (status_block) with the pinned
        objects' details."""
        block = self.status_block(counters=False)
        out: dict = {"node": self.node, "mode": block.mode, "reason": block.reason, "pin_dir": self.pin_dir,
                     "objects": block.objects, "objects_refused": block.objects_refused}
        with contextlib.suppress(OSError):
            from meshctl.datapath.features import probe

            out["features"] = probe().as_dict()
        if self._loaded is not None:
            maps = self._loaded.maps
            out.update(
                layout=maps.config_get(layout.CFG_LAYOUT),
                attach=block.attach,
                compiled=self._loaded.compiled,
                programs={p: i for p, i in self._loaded.prog_ids.items()},
                links=[{"hook": a.hook, "ifindex": a.ifindex, "ifname": a.ifname, "prog_id": a.prog_id,
                        "kind": a.kind} for a in self.attachments()],
                private4=_str_or_none(layout.addr_from_config(maps.config_get(layout.CFG_PRIVATE4))),
                private6=_str_or_none(layout.addr6_from_config(maps.config_get(layout.CFG_PRIVATE6),
                                                               maps.config_get(layout.CFG_PRIVATE6 + 1))),
                routes=len(maps.routes.items()),
                pods=len(maps.pods.items()),
                flows=len(maps.flows4.items()) + len(maps.flows6.items()),
                flow_filter={"on": maps.flowfilter.active != 0, "slots_set": maps.flowfilter.filled(),
                             "slots": layout.FLOWFILTER_SLOTS},
                route_cache=dataclasses.asdict(maps.route_cache_stats()),
            )
        return out

    @property
    def maps(self) -> NodeMaps | None:
        """The open NodeMaps (tests, benchmarks); None in kernel-routes mode."""
        return self._loaded.maps if self._loaded is not None else None

    @property
    def programs(self) -> dict[str, int]:
        """Program name -> fd (tests, benchmarks: BPF_PROG_TEST_RUN)."""
        return dict(self._loaded.progs) if self._loaded is not None else {}


def outcome_path(pin_dir: str) -> Path:
    """The file recording the datapath outcome of the node pinned at `pin_dir` (DATAPATH_RUN_DIR)."""
    return defaults.DATAPATH_RUN_DIR / (pin_dir.strip("/").replace("/", "_") + ".json")


def record_outcome(pin_dir: str, objects: str) -> None:
    """Record `objects` (Datapath.objects) for `datapath status`; best effort (a read-only /run)."""
    path = outcome_path(pin_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"objects": objects}))
        os.replace(tmp, path)
    except OSError as e:
        log.debug("datapath: cannot record the outcome at %s: %s", path, e)


def recorded_outcome(pin_dir: str) -> str | None:
    """What record_outcome wrote for `pin_dir`, None when nothing (or nothing readable)."""
    try:
        doc = json.loads(outcome_path(pin_dir).read_text())
    except (OSError, ValueError):
        return None
    return doc.get("objects") if isinstance(doc, dict) else None


def _str_or_none(x: object | None) -> str | None:
    return None if x is None else str(x)


def _clsact_in_use(pin_dir: str) -> bool:
    """Whether this node's programs run as clsact filters: recorded by the loader, or the kernel has
    no tcx (so nothing else could have attached them)."""
    from meshctl.datapath import features, loader

    try:
        no_tcx = not features.probe().tcx
    except OSError:
        no_tcx = False
    return no_tcx or loader.used_clsact(pin_dir)
