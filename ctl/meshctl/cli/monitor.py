# SPDX-License-Identifier: Apache-2.0
"""`meshctl monitor`: a live stream of the fast path's packet events on one node (docs/monitor.md).

The node is found as `maps dump` finds it: a lab node (`--node N`, `--lab NAME`) through the lab's
state, else `--bpf-pin-root` and `--netns`, by default the pins under /sys/fs/bpf/meshctl and this
namespace. Owners of addresses come from the node's agent (its node list), when it answers.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import click

from meshctl import defaults
from meshctl.cli import targets
from meshctl.cli.datapath import pinned_targets
from meshctl.cli.options import TEXT_FORMATS, lab_option, node_option, output_option, pin_root_option
from meshctl.datapath import monitor as mon
from meshctl.errors import InputError, MeshError
from meshctl.mesh.model import IPNetwork, Path
from meshctl.setns import in_netns

POLL_MS = 200  # how long one wait for events lasts (Ctrl-C is seen between waits at the latest)
IFNAMES_REFRESH_S = 1.0  # an unknown ifindex re-reads the interface names at most this often


def _target(node: str | None, lab_name: str | None, pin_root: str | None, netns: str | None
            ) -> tuple[str, str, str | None]:
    """(node, pin root, netns) of the node to monitor; InputError for a node no lab has."""
    try:
        found = pinned_targets(node, lab_name, pin_root, netns, host_default=False)
    except MeshError as e:  # only a lab's lookup of the node raises
        raise InputError("--node", node, f"is not a node of lab {lab_name} ({e})") from None
    if len(found) != 1:
        raise InputError("--node", None, f"is required: {len(found)} nodes are pinned under "
                         f"{pin_root or defaults.PIN_ROOT}")
    node, root, netns = found[0]
    if netns is not None and not os.path.exists(netns if netns.startswith("/") else f"/run/netns/{netns}"):
        raise InputError("--netns", netns, "is not a network namespace")
    return node, root, netns


def _positive(flag: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise InputError(flag, value, "is not a whole number above 0")
    return n


OWNERS_TIMEOUT = 5.0  # seconds for the agent's node list, once at start, where agents answer at the usual pace


def _owners(node: str, lab_name: str | None, pin_root: str, netns: str | None, *, lab_pins: bool
            ) -> list[tuple[IPNetwork, mon.Owner]]:
    """Owners from the node's agent (its node list); none, with one line on stderr, when it does
    not answer: the events are complete without them. It waits OWNERS_TIMEOUT, or longer where
    agents are known to answer slowly: an emulated VM's lab node, or $MESHCTL_AGENT_WAIT (which
    the labs set for the commands they run inside such a guest)."""
    from meshctl.agent.server import answer_wait, fetch_status

    addr, wait = defaults.METRICS_ADDR, answer_wait()
    try:
        if targets.has_lab() and lab_pins:
            t = targets.lab().agent(lab_name, node)
            netns, addr, wait = t.netns, t.addr, t.wait or wait
        doc = fetch_status(addr, netns, timeout=max(OWNERS_TIMEOUT, wait))
    except (MeshError, OSError, ValueError) as e:
        reason = str(e).split(" (")[0]  # the agent's address, without status's advice on --addr
        click.echo(f"meshctl: addresses shown without owners ({reason})", err=True)
        return []
    own = mon.Owner(f"{doc.get('cluster') or 'default'}/{doc.get('node') or node}", Path.LOCAL)
    return [*mon.owners_from_node_list(doc.get("node_list") or []), *_local_pods(node, pin_root, own)]


def _local_pods(node: str, pin_root: str, own: mon.Owner) -> list[tuple[IPNetwork, mon.Owner]]:
    """This node's own pods (its fast path's pod map): the node list names only the others."""
    from meshctl.datapath import Datapath

    dp = Datapath.pinned(node, pin_root=pin_root)
    try:
        return [(ipaddress.ip_network(ip), own) for ip in dp.pod_addresses()]
    finally:
        dp.close()


@contextlib.contextmanager
def _stop_signals() -> Iterator[list[int]]:
    """SIGINT and SIGTERM only append to the list it yields, from before the monitor claims its
    slot until it has printed its summary: Ctrl-C while it is still asking the agent for owners
    (seconds, on a busy node) ends it with the events so far and the summary, like a Ctrl-C later."""
    stop: list[int] = []
    old = {s: signal.signal(s, lambda n, _f: stop.append(n)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _run(session: mon.Session, node: str, netns: str | None, owners: list[tuple[IPNetwork, mon.Owner]],
         flt: mon.Filter, count: int | None, output: str, stop: list[int]) -> int:
    """Print events until `count` of them, or until a signal lands in `stop` (then also what was
    still in the ring); the number printed. A signal only sets the flag: a batch is never cut in half."""
    ifnames = in_netns(netns, mon.interface_names)
    refreshed = time.monotonic()
    offset = mon.clock_offset_ns()
    shown = 0

    def show(raws: list[bytes]) -> bool:
        nonlocal ifnames, refreshed, shown
        for raw in raws:
            ev = mon.decode_event(raw)
            unknown = ev["ifindex"] not in ifnames or (ev["out_ifindex"] and ev["out_ifindex"] not in ifnames)
            if unknown and time.monotonic() - refreshed > IFNAMES_REFRESH_S:  # a new interface
                ifnames, refreshed = in_netns(netns, mon.interface_names), time.monotonic()
            e = mon.describe(ev, node, ifnames, owners, offset)
            if not mon.wanted(e, flt.type):
                continue
            click.echo(json.dumps(e, sort_keys=True) if output == "json" else mon.text_line(e))
            shown += 1
            if count is not None and shown >= count:
                return False
        return True

    while not stop and show(session.poll(POLL_MS)):
        pass
    if stop:
        show(session.stop())
    return shown


@click.command("monitor")
@node_option(help="The node to watch, by its name (the agent's --node; in a lab, found there; default: the only "
             "node pinned here).")
@lab_option("Lab name, when several labs are up.")
@pin_root_option(default=None, help=f"bpffs folder of the pins (default {defaults.PIN_ROOT}).")
@click.option("--netns", default=None, help="Network namespace of the node (default: the lab's, or this one).")
@click.option("--from", "src", default=None, metavar="ADDR|CIDR", help="Only packets from this address or prefix.")
@click.option("--to", "dst", default=None, metavar="ADDR|CIDR", help="Only packets to this address or prefix.")
@click.option("--type", "type_", default="all", show_default=True, metavar="|".join(mon.TYPES),
              help="Only events of this type.")
@click.option("--rate", default=str(mon.DEFAULT_RATE), show_default=True, metavar="N",
              help="Events per second at most (0: unlimited); the rest is counted as lost.")
@click.option("--count", default=None, metavar="K", help="Stop after K events.")
@output_option(TEXT_FORMATS)
def monitor_cmd(node: str | None, lab_name: str | None, pin_root: str | None, netns: str | None, src: str | None,
                dst: str | None, type_: str, rate: str, count: str | None, output: str) -> None:
    """Packet events of the fast path, one line (or JSON object) each, filtered in the kernel;
    Ctrl-C ends it with a summary line."""
    flt = mon.parse_filter(src, dst, type_, rate)
    limit = _positive("--count", count)
    name, root, ns = _target(node, lab_name, pin_root, netns)
    with _stop_signals() as stop:
        session = mon.Session(f"{root}/{name}", flt)
        try:
            owners = _owners(name, lab_name, root, ns, lab_pins=pin_root is None)
            shown = _run(session, name, ns, owners, flt, limit, output, stop)
            tail = session.stop()
            lost = session.lost()
        finally:
            session.close()
    summary: dict[str, Any] = {"summary": True, "node": name, "events": shown, "lost": lost["rate"] + lost["buffer"],
                               "lost_rate": lost["rate"], "lost_buffer": lost["buffer"], "unread": len(tail)}
    if output == "json":
        click.echo(json.dumps(summary, sort_keys=True))
    else:
        click.echo(f"{name}: {shown} events, {summary['lost']} lost (rate {lost['rate']}, buffer {lost['buffer']})")

