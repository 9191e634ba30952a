# SPDX-License-Identifier: Apache-2.0
"""Masquerade and forwarding: fixed iptables rules that reference ipsets holding the mesh's CIDRs.

Why ipset + iptables and not nftables sets: the mesh's CIDRs live in an ipset (pyroute2's
`IPSet`) referenced by a fixed rule, and only iptables' `-m set` match can reference one (through
either backend: iptables-nft keeps it as an `xt match set`). So the CIDRs live in kernel ipsets
(`hash:net`, one per IP family), updated in place member by member through netlink as the plan
changes, and the rules, which never mention a CIDR, are written once with iptables.

Which iptables: the one the host already uses, decided as kubernetes-sigs/iptables-wrappers does
(`choose_mode`): kubelet's `KUBE-IPTABLES-HINT` / `KUBE-KUBELET-CANARY` chain names it; else the
backend holding more rules wins; an empty host gets nft (the default of Debian 12, RHEL 9 and
Ubuntu 22.04). Rules a previous run left in the other backend are removed, so the host never
carries both. A plan change is then a few set-member adds/deletes: no
rule is rewritten, no chain is flushed, no packet meets a half-built rule set.

Per IP family `f` (4, 6), with P the prefix (`meshctl`):
  sets   P-pods<f>  the local pod CIDRs;  P-mesh<f>  every mesh CIDR (plus the local pod CIDRs)
  nat    chain P-NAT, jumped to from POSTROUTING (IPv6 only when asked, `masquerade6`: IPv6 pods
         usually hold routable or ULA addresses a cluster routes itself, and an IPv6 node
         masquerading them hides every pod behind one address for no gain):
           -m set --match-set P-pods<f> src -m set --match-set P-mesh<f> dst -j RETURN
           -m set --match-set P-pods<f> src -j MASQUERADE
  filter chain P-FWD, jumped to from FORWARD: accept between the forwarding interfaces (the
         private NIC, the WireGuard device, a pod bridge) and to/from local pods.
Pod traffic to the mesh keeps its source address; pod traffic leaving the mesh is masqueraded.

The applier remembers each set's members and the interface list the rules were last checked for,
so a later sync adds/deletes only the changed members without reading the sets (`ipset save`) or
the rules (`iptables-save`, twice) again. `forget()` drops that memory (the agent's periodic full
resync, which thus repairs drift); so does any failed change.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import re
import shutil
import socket
import subprocess
from collections.abc import Iterable, Sequence

from pyroute2 import IPSet
from pyroute2.netlink.exceptions import NetlinkError

from meshctl.errors import InputError, MeshError
from meshctl.mesh.model import IPNetwork, sort_key_net
from meshctl.node.shell import TIMED_OUT, sh

log = logging.getLogger(__name__)

_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,19}$")
RESTORE_OVER = 32  # more member changes than this go through one `ipset restore`
_FAMILIES = ((4, socket.AF_INET, "iptables"), (6, socket.AF_INET6, "ip6tables"))  # + "-legacy" / "-nft"
IPTABLES_MODES = ("nft", "legacy")
_HINT_CHAINS = (":KUBE-IPTABLES-HINT ", ":KUBE-KUBELET-CANARY ")
# The x_tables tables iptables-legacy has made in this thread's network namespace, per family
# binary (the file is missing while the kernel has no ip_tables / ip6_tables).
_LEGACY_TABLES = {"iptables": "/proc/thread-self/net/ip_tables_names",
                  "ip6tables": "/proc/thread-self/net/ip6_tables_names"}


def _holds_nothing(base: str, mode: str) -> bool:
    """Whether `mode` is legacy and iptables-legacy holds no table of this family here: its
    `-save` reads the tables this file lists and would print nothing, so it need not run (two
    processes per full resync on the nft hosts most nodes are, dear under emulation). The nft
    backend is always read."""
    if mode != "legacy":
        return False
    try:
        with open(_LEGACY_TABLES[base]) as f:
            return not f.read().split()
    except FileNotFoundError:
        return True


def choose_mode(saves: dict[str, str], own_prefix: str = "") -> tuple[str, str]:
    """(mode, why) from each backend's `*-save` output (`{"legacy": ..., "nft": ...}`), as
    iptables-wrappers decides: kubelet's hint chain first, then the backend with more rules (our own
    chains not counted, so a previous run cannot decide it), nft on a tie."""
    for mode in IPTABLES_MODES:
        if any(line.startswith(_HINT_CHAINS) for line in saves.get(mode, "").splitlines()):
            return mode, f"kubelet's hint chain is in iptables-{mode}"
    own = f" {own_prefix.upper()}-" if own_prefix else None
    counts = {mode: sum(1 for line in saves.get(mode, "").splitlines()
                        if line.startswith("-") and not (own and own in line + " "))
              for mode in IPTABLES_MODES}
    if counts["legacy"] > counts["nft"]:
        return "legacy", f"iptables-legacy holds {counts['legacy']} rules, iptables-nft {counts['nft']}"
    return "nft", f"iptables-nft holds {counts['nft']} rules, iptables-legacy {counts['legacy']}"


def detect_mode(own_prefix: str = "") -> tuple[str, str]:
    """`choose_mode` over this network namespace's rule sets (a missing binary reads as empty)."""
    saves = {}
    for mode in IPTABLES_MODES:
        text = []
        for fam in ("iptables", "ip6tables"):
            if _holds_nothing(fam, mode):
                continue
            try:
                p = sh([f"{fam}-{mode}-save"], check=False, timeout=10)
            except FileNotFoundError:
                continue
            if p.returncode != TIMED_OUT:  # a save cut short is no save
                text.append(p.stdout)
        saves[mode] = "".join(text)
    if not any(saves.values()) and not any(_has(f"iptables-{m}") for m in IPTABLES_MODES):
        raise MeshError("neither iptables-nft nor iptables-legacy is installed (Debian package iptables)")
    return choose_mode(saves, own_prefix)


def _has(binary: str) -> bool:
    return shutil.which(binary) is not None


def _ipt(binary: str, *args: str, check: bool = True, input: str | None = None, wait: bool = True
         ) -> subprocess.CompletedProcess[str]:
    """Run iptables / ip6tables of one backend (or their -restore/-save), with the xtables lock (-w)."""
    try:
        return sh([binary, *(["-w"] if wait else []), *args], check=check, input=input)
    except FileNotFoundError:
        raise MeshError(f"{binary} is not installed (Debian package iptables)") from None


def _split_default(n: IPNetwork) -> list[IPNetwork]:
    """hash:net holds prefixes of length 1..32 (1..128): a /0 becomes its two halves."""
    return list(n.subnets(1)) if n.prefixlen == 0 else [n]


def set_members(name: str) -> set[IPNetwork]:
    """The members of a hash:net set. Read with `ipset save` (parsed in C) rather than pyroute2's
    `IPSet.list`, whose Python parser is far slower on large sets; writes go through pyroute2. A
    missing set reads as empty."""
    p = sh(["ipset", "save", name], check=False)
    out: set[IPNetwork] = set()
    for line in p.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] == "add" and parts[1] == name:
            out.add(ipaddress.ip_network(parts[2], strict=False))
    return out


class NatApplier:
    """Keeps the sets' members equal to the plan's CIDRs and the fixed rules in place."""

    def __init__(self, prefix: str = "meshctl", mode: str | None = None, *, masquerade6: bool = False):
        if not _PREFIX.match(prefix):
            raise InputError("nat prefix", prefix, "is not a name of 1-20 letters, digits, '-' or '_'")
        if mode is not None and mode not in IPTABLES_MODES:
            raise InputError("iptables mode", mode, "is not nft or legacy")
        self.prefix = prefix
        self.masquerade6 = masquerade6  # IPv6 pod egress masqueraded too (off: left alone)
        # The iptables backend: given, or detected at the first sync (and then kept).
        self.mode = mode
        self.mode_reason = "given" if mode else ""
        self.nat_chain = f"{prefix.upper()}-NAT"
        self.fwd_chain = f"{prefix.upper()}-FWD"
        self._members: dict[str, set[IPNetwork]] = {}  # set name -> its members, as far as we know
        self._rules_for: tuple[str, ...] | None = None  # the forward interfaces the rules were checked for
        # The mesh CIDRs last synced and their members per version (see _split_mesh).
        self._split_memo: tuple[frozenset[IPNetwork], dict[int, set[IPNetwork]]] | None = None
        self._pending_split: tuple[frozenset[IPNetwork], dict[int, set[IPNetwork]]] | None = None

    def forget(self) -> None:
        """Drop what this object remembers: the next `sync` reads the sets and rules again."""
        self._members.clear()
        self._rules_for = None
        self._split_memo = None

    def set_name(self, kind: str, version: int) -> str:
        return f"{self.prefix}-{kind}{version}"

    # --- rules ---------------------------------------------------------------------------------

    def _rules(self, version: int, forward_ifs: Sequence[str]) -> tuple[list[str], list[str]]:
        """The chains' rules exactly as `iptables -S` prints them (so they compare as text)."""
        pods, mesh = self.set_name("pods", version), self.set_name("mesh", version)
        nat = [f"-A {self.nat_chain} -m set --match-set {pods} src -m set --match-set {mesh} dst -j RETURN"]
        if version == 4 or self.masquerade6:
            nat.append(f"-A {self.nat_chain} -m set --match-set {pods} src -j MASQUERADE")
        fwd = [f"-A {self.fwd_chain} -i {i} -o {o} -j ACCEPT" for i in forward_ifs for o in forward_ifs]
        fwd += [f"-A {self.fwd_chain} -i {i} -m set --match-set {pods} dst -j ACCEPT" for i in forward_ifs]
        fwd += [f"-A {self.fwd_chain} -o {o} -m set --match-set {pods} src -j ACCEPT" for o in forward_ifs]
        fwd.append(f"-A {self.fwd_chain} -m set --match-set {pods} src -m set --match-set {pods} dst -j ACCEPT")
        return nat, fwd

    @staticmethod
    def _saved(binary: str) -> dict[str, list[str]]:
        """table -> its `-A` lines, from one `iptables-*-save` (one process, not one per check)."""
        out: dict[str, list[str]] = {}
        rules: list[str] = []
        for line in _ipt(binary + "-save", wait=False).stdout.splitlines():
            if line.startswith("*"):
                rules = out.setdefault(line[1:], [])
            elif line.startswith("-A "):
                rules.append(line)
        return out

    def _ensure_rules(self, version: int, binary: str, forward_ifs: Sequence[str]) -> bool:
        nat, fwd = self._rules(version, forward_ifs)
        saved = self._saved(binary)
        restore: list[str] = []
        for table, chain, rules in (("nat", self.nat_chain, nat), ("filter", self.fwd_chain, fwd)):
            lines = saved.get(table, [])
            if [ln for ln in lines if ln.startswith(f"-A {chain} ")] != rules:
                # With --noflush, declaring a chain creates it or empties it; other chains stay.
                restore += [f"*{table}", f":{chain} - [0:0]", *rules, "COMMIT"]
        if restore:
            _ipt(binary + "-restore", "--noflush", input="\n".join(restore) + "\n")
        jumps = 0
        for table, hook, chain in (("nat", "POSTROUTING", self.nat_chain), ("filter", "FORWARD", self.fwd_chain)):
            if f"-A {hook} -j {chain}" not in saved.get(table, []):
                _ipt(binary, "-t", table, "-A", hook, "-j", chain)
                jumps += 1
        return bool(restore) or jumps > 0

    # --- sets ----------------------------------------------------------------------------------

    def _sync_set(self, ips: IPSet, name: str, family: int, want: set[IPNetwork]) -> bool:
        have = self._members.pop(name, None)
        if have is None:
            ips.create(name, stype="hash:net", family=family, exclusive=False)
            have = set_members(name)
        dels, adds = sorted(have - want, key=sort_key_net), sorted(want - have, key=sort_key_net)
        # Additions first (make before break): an address both the old and the new members cover
        # never leaves the set, so its traffic is never masqueraded while the mesh's CIDRs change.
        if len(dels) + len(adds) > RESTORE_OVER:
            # An agent's first fill: one `ipset restore` instead of one netlink request a member.
            lines = [f"add {name} {n}" for n in adds] + [f"del {name} {n}" for n in dels]
            sh(["ipset", "restore", "-exist"], input="\n".join(lines) + "\n", timeout=120)
        else:
            for n in adds:
                ips.add(name, str(n), family=family, etype="net")
            for n in dels:
                ips.delete(name, str(n), family=family, etype="net")
        if have != want:
            log.info("ipset %s: +%d -%d members", name, len(want - have), len(have - want))
        self._members[name] = want  # only once every change went through (a failure leaves it unknown)
        return have != want

    def sync(self, local_pod_cidrs: Iterable[IPNetwork], mesh_cidrs: Iterable[IPNetwork],
             forward_ifs: Sequence[str]) -> bool:
        """Set members to the given CIDRs (local pod CIDRs count as mesh too), rules in place.
        Returns True if anything changed."""
        pods = {s for n in local_pod_cidrs for s in _split_default(n)}
        split = self._split_mesh(mesh_cidrs if isinstance(mesh_cidrs, frozenset) else frozenset(mesh_cidrs))
        changed = False
        check_rules = self._rules_for != tuple(forward_ifs)
        self._rules_for = None
        if self.mode is None:
            self.mode, self.mode_reason = detect_mode(self.prefix)
            log.info("NAT through iptables-%s (%s)", self.mode, self.mode_reason)
        if check_rules:
            self._remove_rules([m for m in IPTABLES_MODES if m != self.mode])
        ips = IPSet()
        try:
            for version, family, base in _FAMILIES:
                binary = f"{base}-{self.mode}"
                changed |= self._sync_set(ips, self.set_name("pods", version), family,
                                          {n for n in pods if n.version == version})
                changed |= self._sync_set(ips, self.set_name("mesh", version), family,
                                          split[version] | {n for n in pods if n.version == version})
                if check_rules:
                    changed |= self._ensure_rules(version, binary, forward_ifs)
        except NetlinkError as e:
            self.forget()
            raise MeshError(f"ipset: {e.args[-1]}") from None
        except Exception:
            self.forget()
            raise
        finally:
            ips.close()
        self._rules_for = tuple(forward_ifs)
        self._split_memo = self._pending_split
        return changed

    def _split_mesh(self, mesh_in: frozenset[IPNetwork]) -> dict[int, set[IPNetwork]]:
        """The mesh CIDRs as set members per IP version (/0 as its halves). Derived from the last
        call's by difference (set operations on stored hashes, cheaper than rebuilding); the result
        is remembered by `sync` on success only."""
        last = self._split_memo
        self._split_memo = None
        if last is None:
            split: dict[int, set[IPNetwork]] = {4: set(), 6: set()}
            for n in mesh_in:
                for m in _split_default(n):
                    split[m.version].add(m)
        else:
            last_in, split = last[0], {v: set(members) for v, members in last[1].items()}
            for n in last_in - mesh_in:
                for m in _split_default(n):
                    # A half of a removed /0 may still be wanted on its own (or as a half of the other /0).
                    if m not in mesh_in and not (m.prefixlen == 1 and m.supernet() in mesh_in):
                        split[m.version].discard(m)
            for n in mesh_in - last_in:
                for m in _split_default(n):
                    split[m.version].add(m)
        self._pending_split = (mesh_in, split)
        return split

    def _remove_rules(self, modes: Sequence[str]) -> None:
        """Our jumps and chains out of the given backends (where they exist; a missing binary is fine)."""
        for _, _, base in _FAMILIES:
            for mode in modes:
                binary = f"{base}-{mode}"
                if _holds_nothing(base, mode) or not _has(binary):
                    continue
                saved = sh([f"{binary}-save"], check=False).stdout
                if f" {self.nat_chain}" not in saved and f" {self.fwd_chain}" not in saved:
                    continue
                log.info("removing meshctl's rules from %s", binary)
                for table, hook, chain in (("nat", "POSTROUTING", self.nat_chain),
                                           ("filter", "FORWARD", self.fwd_chain)):
                    while _ipt(binary, "-t", table, "-D", hook, "-j", chain, check=False).returncode == 0:
                        pass
                    _ipt(binary, "-t", table, "-F", chain, check=False)
                    _ipt(binary, "-t", table, "-X", chain, check=False)

    def cleanup(self) -> None:
        """Remove the jumps, the chains (from both iptables backends) and the sets (whatever exists)."""
        self.forget()
        self._remove_rules(IPTABLES_MODES)
        for version, _, _ in _FAMILIES:
            ips = IPSet()
            try:
                for kind in ("pods", "mesh"):
                    with contextlib.suppress(NetlinkError):
                        ips.destroy(self.set_name(kind, version))
            finally:
                ips.close()
