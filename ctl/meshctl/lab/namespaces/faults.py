# SPDX-License-Identifier: Apache-2.0
"""Ways a running namespace lab's node breaks while its agent, record and lease stay healthy
(docs/lab.md, "Breaking a leader"):

- `forwarding(node, False)`: an nftables table `<prefix>forwarding` in the node's namespace whose
  forward chain (priority -300, before anything the agent installs) drops and counts every packet
  the node would forward, which is what kilo#489's leader did (a firewall rule, `ip_forward`
  reset): the node's own traffic (its agent's etcd session, WireGuard's handshakes, pings to and
  from it) goes on; what it routes for its location's members and pods does not. True removes
  the table.
- `partition(st, node, True)`: the node's port on its private subnet's bridge leaves the bridge, so
  the node is cut off from its location's private network only (its public NIC, and so its
  record and lease, stay); False puts the port back.

Both are undone by `lab down` with the namespaces (nothing outside them is touched).
"""

from __future__ import annotations

import json

from meshctl.errors import InputError, MeshError
from meshctl.lab.namespaces.state import LabState, NodeState
from meshctl.lab.rigs import netns


def forwarding_table(prefix: str) -> str:
    return f"{prefix.rstrip('-')}-forwarding"


def forwarding(prefix: str, node: NodeState, on: bool) -> int:
    """Let `node` forward again (`on`) or drop what it forwards; returns the packets dropped so far
    (0 once on again)."""
    ns = _netns(node)
    table = forwarding_table(prefix)
    netns.run(ns, ["nft", "delete", "table", "inet", table], check=False)
    if on:
        return 0
    netns.run(ns, ["nft", "-f", "-"], input=(
        f"table inet {table} {{\n"
        f"  chain forward {{ type filter hook forward priority -300; policy accept; counter drop; }}\n"
        f"}}\n"))
    return dropped(prefix, node) or 0


def dropped(prefix: str, node: NodeState) -> int | None:
    """Packets the node's forwarding table dropped; None when forwarding is on (no table)."""
    out = netns.run(_netns(node), ["nft", "-j", "list", "table", "inet", forwarding_table(prefix)], check=False)
    if out.returncode != 0:
        return None
    for item in json.loads(out.stdout).get("nftables", []):
        for expr in item.get("rule", {}).get("expr", []):
            if "counter" in expr:
                return int(expr["counter"].get("packets", 0))
    return 0


def partition(st: LabState, node: NodeState, cut: bool) -> None:
    """Take the node's private port off its bridge (`cut`) or put it back."""
    _netns(node)
    if node.internal_ip is None:
        raise InputError("node", node.name, "has no private network to be cut off from")
    idx = next(i for i, (_, n) in enumerate(st.nodes()) if n is node)
    fab, port = f"{st.prefix}fab", f"n{idx}p"
    if cut:
        netns.run(fab, ["ip", "link", "set", port, "nomaster"])
        return
    bridges = _bridge_of(st, node)
    netns.run(fab, ["ip", "link", "set", port, "master", bridges])


def _bridge_of(st: LabState, node: NodeState) -> str:
    """The bridge of the node's private subnet (`bpriv<i>`): the one its location's other members' ports are on."""
    fab = f"{st.prefix}fab"
    links = json.loads(netns.run(fab, ["ip", "-j", "link", "show"]).stdout)
    idx = {n.name: i for i, (_, n) in enumerate(st.nodes())}
    for _, other in st.nodes():
        if other is not node and other.internal_ip is not None and other.location == node.location:
            port = f"n{idx[other.name]}p"
            master = next((link.get("master") for link in links if link.get("ifname") == port), None)
            if master:
                return str(master)
    raise MeshError(f"no bridge found for {node.name}'s private network")


def _netns(node: NodeState) -> str:
    if node.netns is None:
        raise InputError("node", node.name, "is a VM node (lab.vms): forwarding and partitions are for namespace labs")
    return node.netns
