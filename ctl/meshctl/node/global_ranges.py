# SPDX-License-Identifier: Apache-2.0
"""The kernel fallback of global ranges (mesh.global_cidrs, docs/clustermesh.md): where the fast path
does not run, nftables rewrites the same addresses its programs do, stateless, in one table of its own.

    table inet meshctl-global
      set leaving4 / leaving6   the other clusters' prefixes a packet leaves the cluster for at this
                                node (the plan's fast-path entries with `translate`)
      chain arriving  prerouting, before conntrack (raw - 10):
          ip daddr <global range> ip daddr set ip daddr & <host mask> | <pod range>
      chain leaving   postrouting, after masquerade's decision (srcnat + 10):
          ip saddr <pod range> ip daddr @leaving4 ip saddr set ip saddr & <host mask> | <global range>

An image keeps the host bits, so `& host mask | other prefix` is the whole translation, and nftables
updates the IPv4 header checksum and the TCP/UDP/ICMPv6 one over the pseudo-header with each rewrite
(a first fragment's covers the datagram; a later fragment has none). Measured on this kernel (6.18,
nft 1.0.6): ping, TCP, fragmented UDP through such a router, both families. Both hooks sit outside
conntrack's view of the translation, so conntrack (kube-proxy, policies) sees the cluster's own
addresses in both directions, as on a fast-path node. What it cannot do: rewrite the packet an ICMP
error quotes (nftables has no arithmetic to keep the ICMP checksum right), so a path MTU message
across a fallback node reaches the pod with the quote untranslated and is ignored there.

A whole table is written in one `nft -f` transaction (flush and fill: no packet meets half of it);
rules and translation of the fast path never conflict with it (their domains are disjoint: a
translated address is never translated again), so a node switching between the two keeps both for a
moment without harm.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Iterable, Sequence

from meshctl.mesh.model import FAMILIES, IPNetwork, sort_key_net
from meshctl.node.shell import sh

log = logging.getLogger(__name__)

TABLE = "meshctl-global"
_MATCH = {4: "ip", 6: "ip6"}


def _host_mask(net: IPNetwork) -> str:
    bits = net.max_prefixlen - net.prefixlen
    return str(ipaddress.ip_address((1 << bits) - 1) if net.version == 4 else ipaddress.IPv6Address((1 << bits) - 1))


def _rewrite(field: str, frm: IPNetwork, to: IPNetwork) -> str:
    m = _MATCH[frm.version]
    return f"{m} {field} set {m} {field} & {_host_mask(frm)} | {to.network_address}"


def ruleset(global_cidrs: Sequence[tuple[IPNetwork, IPNetwork]], leaving: Iterable[IPNetwork]) -> str:
    """The table's content (after `flush table`) for this node: `global_cidrs` its cluster's
    (pod range, global range) pairs, `leaving` the prefixes it sends out of the cluster."""
    leaving_sorted = sorted(leaving, key=sort_key_net)
    lines = [f"table inet {TABLE} {{"]
    for f in FAMILIES:
        elems = ", ".join(str(n) for n in leaving_sorted if n.version == f)
        kind = "ipv4_addr" if f == 4 else "ipv6_addr"
        content = f" elements = {{ {elems} }};" if elems else ""
        lines.append(f"  set leaving{f} {{ type {kind}; flags interval;{content} }}")
    lines.append("  chain arriving {")
    lines.append("    type filter hook prerouting priority raw - 10; policy accept;")
    for pod, glob in global_cidrs:
        lines.append(f"    {_MATCH[glob.version]} daddr {glob} {_rewrite('daddr', glob, pod)}")
    lines.append("  }")
    lines.append("  chain leaving {")
    lines.append("    type filter hook postrouting priority srcnat + 10; policy accept;")
    for pod, glob in global_cidrs:
        m = _MATCH[pod.version]
        lines.append(f"    {m} saddr {pod} {m} daddr @leaving{pod.version} {_rewrite('saddr', pod, glob)}")
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


class TranslationApplier:
    """Keeps `table inet meshctl-global` as the plan wants it: present with the rules of the node's
    global ranges, or absent (no global ranges, or the fast path translates). Remembers what it last
    wrote; `forget` makes the next sync write a ruleset again (the agent's full resync repairs
    drift). A table this applier removed or found absent stays known absent across `forget`: only
    meshctl writes it, so a resync of a node without global ranges (most nodes) runs no `nft`; a new
    applier (an agent's start) removes what an earlier run left."""

    def __init__(self) -> None:
        self._written: str | None = None  # the ruleset in place; "" when the table is known absent

    def sync(self, global_cidrs: Sequence[tuple[IPNetwork, IPNetwork]], leaving: Iterable[IPNetwork]) -> bool:
        """Write the table for these ranges (None of them: remove it); whether the kernel changed
        (removing a table that was absent changes nothing, and says nothing: every full resync of a
        node without global ranges asks for it)."""
        want = ruleset(global_cidrs, leaving) if global_cidrs else ""
        if want == self._written:
            return False
        if want:
            sh(["nft", "-f", "-"], input=f"table inet {TABLE} {{ }}\nflush table inet {TABLE}\n{want}")
            changed = True
        else:
            changed = sh(["nft", "delete", "table", "inet", TABLE], check=False).returncode == 0
        self._written = want
        if changed:
            log.info("global ranges: kernel fallback %s", "written" if want else "removed")
        return changed

    def clear(self) -> bool:
        return self.sync((), ())

    def forget(self) -> None:
        if self._written:
            self._written = None

    def present(self) -> bool:
        """Whether the table is in the kernel now (read, not remembered)."""
        return sh(["nft", "list", "table", "inet", TABLE], check=False).returncode == 0
