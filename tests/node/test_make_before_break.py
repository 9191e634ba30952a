# SPDX-License-Identifier: Apache-2.0
"""Make before break in the node appliers, on real namespaces: a route that moves to another
device is replaced, never deleted and added; a broader route is in before the narrower ones it
takes over go; the WireGuard address moves without the device ever being without one (and
without the kernel flushing the routes through it); allowed IPs move between peers with the new
peer holding them before the old one lets go. Watched with `ip -o monitor` in the namespace, and
by reading the device between stage and retire."""

from __future__ import annotations

import contextlib
import ipaddress
import queue
import subprocess
import threading
import time

import pytest

from meshctl.mesh.plan import PeerPlan, Route
from meshctl.node.encap import RT_PROTO_ENCAP
from meshctl.node.keys import generate_private_key, public_key
from meshctl.node.routes import RouteApplier
from meshctl.node.wireguard import RESCUE_UNTIL_S, WireGuard
from meshctl.node.wireguard.state import PeerOp
from meshctl.node.wireguard.uapi import UapiClient
from tests.waiting import wait_until

from .conftest import NodeLab, in_ns

N = ipaddress.ip_network
A = ipaddress.ip_address
PORT = 51820
SENTINEL = "10.254.254.254"


class Monitor:
    """`ip -o monitor OBJECTS` in a namespace: the lines it printed, read once it is surely
    listening (a sentinel route it has seen come and go)."""

    def __init__(self, lab: NodeLab, ns: str, *objects: str) -> None:
        self.lab, self.ns = lab, ns
        self.proc: subprocess.Popen[str] = lab.spawn(ns, "ip", "-o", "monitor", *objects)
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            lab.sh(ns, "ip", "route", "add", f"{SENTINEL}/32", "dev", "lo", check=False)
            lab.sh(ns, "ip", "route", "del", f"{SENTINEL}/32", "dev", "lo", check=False)
            if any(SENTINEL in line for line in self._drain()):
                return
        raise AssertionError("ip monitor printed nothing")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def _drain(self, wait: float = 0.2) -> list[str]:
        out, deadline = [], time.monotonic() + wait
        while time.monotonic() < deadline:
            with contextlib.suppress(queue.Empty):
                out.append(self.lines.get(timeout=0.05))
        return out

    def events(self) -> list[str]:
        """What it printed since the last call (the sentinel's lines left out)."""
        return [line for line in self._drain(0.5) if SENTINEL not in line]


def _deleted(events: list[str], text: str) -> list[int]:
    return [i for i, e in enumerate(events) if e.startswith("Deleted") and text in e]


def _added(events: list[str], text: str) -> list[int]:
    return [i for i, e in enumerate(events) if not e.startswith("Deleted") and text in e]


@pytest.fixture
def node(lab: NodeLab) -> str:
    """A node with a private NIC `pv` (10.20.0.1/24) and a stand-in `wg` device (a veth)."""
    return lab.route_node("mbb")


@pytest.mark.parametrize("n", [1, 300])  # one request; more than one netlink send carries (rtnl.CHUNK)
def test_a_route_that_moves_device_is_replaced_never_deleted(lab: NodeLab, node: str, n: int) -> None:
    old = [Route(N(f"10.{43 + i // 250}.{i % 250}.0/24"), A("10.20.0.2"), "private") for i in range(n)]
    new = [Route(r.dst, None, "wireguard") for r in old]
    ra = RouteApplier("pv", "wg")
    in_ns(node, ra.sync, old)
    mon = Monitor(lab, node, "route")
    diff = in_ns(node, ra.sync, new)
    assert (len(diff.changed), diff.removed) == (n, [])
    events = mon.events()
    ours = ("10.43.", "10.44.")
    assert not [e for e in events if e.startswith("Deleted") and any(p in e for p in ours)], events
    assert len([i for i in _added(events, "dev wg") if any(p in events[i] for p in ours)]) == n, events


def test_a_broader_route_is_in_before_the_narrower_ones_go(lab: NodeLab, node: str) -> None:
    """Two /24s on the private NIC give way to the /16 over the WireGuard device: stage adds the
    /16 and keeps the /24s, retire deletes them, and the monitor sees the add first."""
    ra = RouteApplier("pv", "wg")
    in_ns(node, ra.sync, [Route(N("10.42.1.0/24"), A("10.20.0.2"), "private"),
                          Route(N("10.42.2.0/24"), A("10.20.0.3"), "private")])
    mon = Monitor(lab, node, "route")
    staged = in_ns(node, ra.stage, [Route(N("10.42.0.0/16"), None, "wireguard")])
    assert (staged.added, staged.removed) == (["10.42.0.0/16"], [])
    ours = lab.sh(node, "ip", "route", "show", "proto", "109").stdout
    assert all(d in ours for d in ("10.42.0.0/16", "10.42.1.0/24", "10.42.2.0/24")), ours
    retired = in_ns(node, ra.retire)
    assert sorted(retired.removed) == ["10.42.1.0/24", "10.42.2.0/24"]
    events = mon.events()
    add16 = _added(events, "10.42.0.0/16")
    gone = _deleted(events, "10.42.1.0/24") + _deleted(events, "10.42.2.0/24")
    assert add16 and len(gone) == 2 and add16[0] < min(gone), events
    assert in_ns(node, ra.retire).removed == []  # nothing twice


def test_a_destination_of_the_tunnel_applier_is_taken_over_by_a_replace(lab: NodeLab, node: str) -> None:
    """A pair leaving direct+vxlan: its route through the tunnel device (proto 110) becomes the
    route applier's in one call; another owner's route on a destination stays."""
    lab.sh(node, "ip", "route", "add", "10.42.5.0/24", "via", "10.20.0.5", "dev", "wg", "onlink", "proto",
           str(RT_PROTO_ENCAP))
    lab.sh(node, "ip", "route", "add", "10.42.6.0/24", "via", "10.20.0.6", "dev", "wg", "onlink", "proto", "static")
    mon = Monitor(lab, node, "route")
    diff = in_ns(node, RouteApplier("pv", "wg").stage, [Route(N("10.42.5.0/24"), A("10.20.0.5"), "private"),
                                                         Route(N("10.42.6.0/24"), A("10.20.0.6"), "private")])
    assert diff.added == ["10.42.5.0/24"] and [x.split(":")[0] for x in diff.skipped] == ["10.42.6.0/24"]
    shown = lab.sh(node, "ip", "route", "show", "10.42.5.0/24").stdout
    assert "dev pv" in shown and "proto 109" in shown, shown
    assert "proto static" in lab.sh(node, "ip", "route", "show", "10.42.6.0/24").stdout
    events = mon.events()
    assert not _deleted(events, "10.42.5.0/24"), events


def _peer(name: str, key: str, *nets: str) -> PeerPlan:
    return PeerPlan(name, "node", public_key(key), None, tuple(N(n) for n in nets), 0)


def test_the_wireguard_address_moves_without_a_gap_and_keeps_the_routes(lab: NodeLab) -> None:
    """10.4.0.1/16 -> 10.4.0.7/16 on kilo0 (wireguard-go), with a route through kilo0: the new
    address is added before the old goes (promote_secondaries keeps it when the old primary is
    removed), so the device always has one and the kernel never flushes the route."""
    ns = lab.ns("mbw")
    wg = in_ns(ns, WireGuard, "kilo0", run_dir=str(lab.run_dir("w")), mode="wireguard-go")
    key = generate_private_key()
    in_ns(ns, wg.ensure_device, key, PORT, ipaddress.ip_interface("10.4.0.1/16"), 1420)
    ra = RouteApplier(None, "kilo0")
    in_ns(ns, ra.sync, [Route(N("10.42.3.0/24"), None, "wireguard")])
    mon = Monitor(lab, ns, "address", "route")
    assert in_ns(ns, wg.ensure_device, key, PORT, ipaddress.ip_interface("10.4.0.7/16"), 1420)
    addrs = lab.sh(ns, "ip", "-4", "-o", "addr", "show", "dev", "kilo0").stdout
    assert "10.4.0.1/16" in addrs and "10.4.0.7/16" in addrs, addrs
    assert in_ns(ns, wg.retire_device)
    addrs = lab.sh(ns, "ip", "-4", "-o", "addr", "show", "dev", "kilo0").stdout
    assert "10.4.0.7/16" in addrs and "10.4.0.1/16" not in addrs, addrs
    assert "10.42.3.0/24" in lab.sh(ns, "ip", "route", "show", "dev", "kilo0").stdout
    events = mon.events()
    assert not _deleted(events, "10.42.3.0/24"), events
    new, old_gone = _added(events, "10.4.0.7/16"), _deleted(events, "10.4.0.1/16")
    assert new and old_gone and new[0] < old_gone[0], events
    assert not in_ns(ns, wg.retire_device)  # nothing left to remove


def test_the_new_address_is_put_back_if_it_went_with_the_old_primary(lab: NodeLab) -> None:
    """Where promote_secondaries is off after all (set back behind the agent), removing the old
    primary takes the new secondary along: retire_device adds it again."""
    ns = lab.ns("mbs")
    wg = in_ns(ns, WireGuard, "kilo0", run_dir=str(lab.run_dir("s")), mode="wireguard-go")
    key = generate_private_key()
    in_ns(ns, wg.ensure_device, key, PORT, ipaddress.ip_interface("10.4.0.1/16"), 1420)
    in_ns(ns, wg.ensure_device, key, PORT, ipaddress.ip_interface("10.4.0.7/16"), 1420)
    lab.sh(ns, "sysctl", "-qw", "net.ipv4.conf.kilo0.promote_secondaries=0")
    assert in_ns(ns, wg.retire_device)
    addrs = lab.sh(ns, "ip", "-4", "-o", "addr", "show", "dev", "kilo0").stdout
    assert "10.4.0.7/16" in addrs and "10.4.0.1/16" not in addrs, addrs


def test_allowed_ips_move_to_the_new_peer_before_the_old_one_lets_go(lab: NodeLab) -> None:
    """b gains c's 10.42.3.0/24; c loses 10.42.9.0/24 (no one takes it) and gains 10.42.8.0/24;
    d goes. After the stage every address either side covers is held by a peer (the moved one by
    b, b's own kept, d still there); after the retire the device holds exactly the new plan."""
    ns = lab.ns("mbp")
    wg = in_ns(ns, WireGuard, "kilo0", run_dir=str(lab.run_dir("p")), mode="wireguard-go")
    in_ns(ns, wg.ensure_device, generate_private_key(), PORT, ipaddress.ip_interface("10.4.0.1/16"), 1420)
    kb, kc, kd = generate_private_key(), generate_private_key(), generate_private_key()
    old = [_peer("b", kb, "10.42.2.0/24", "10.4.0.2/32"), _peer("c", kc, "10.42.3.0/24", "10.42.9.0/24"),
           _peer("d", kd, "10.42.4.0/24")]
    new = [_peer("b", kb, "10.42.2.0/24", "10.4.0.2/32", "10.42.3.0/24"), _peer("c", kc, "10.42.8.0/24")]
    in_ns(ns, wg.sync_peers, old)
    sock = UapiClient(lab.run_dir("p") / "kilo0.sock")

    def held() -> dict[str, set[str]]:
        return {p.public_key: {str(n) for n in p.allowed_ips} for p in sock.get().peers.values()}

    staged = in_ns(ns, wg.stage_peers, new)
    assert (staged.updated, staged.removed) == (["b", "c"], [])
    assert held() == {public_key(kb): {"10.42.2.0/24", "10.4.0.2/32", "10.42.3.0/24"},
                      public_key(kc): {"10.42.9.0/24", "10.42.8.0/24"}, public_key(kd): {"10.42.4.0/24"}}
    retired = in_ns(ns, wg.retire_peers)
    assert (retired.updated, retired.removed) == (["c"], ["d"])
    assert held() == {public_key(kb): {"10.42.2.0/24", "10.4.0.2/32", "10.42.3.0/24"},
                      public_key(kc): {"10.42.8.0/24"}}
    # the object's memory is the device's: the same plan again sends nothing
    assert not in_ns(ns, wg.sync_peers, new)


def test_a_peer_without_a_handshake_is_added_anew_by_the_lower_key_first(lab: NodeLab) -> None:
    """Crossed handshakes, made deterministic: the lower-keyed end adds its peer first (whose end
    does not know it yet: its greeting is dropped), so the peer has no handshake after the wait;
    rescue adds it anew (a new greeting). The higher end, adding its peer later, does nothing of
    the kind before HIGH_END_DELAY_S; its own greeting makes the handshake."""
    from .test_wireguard import PORT as WG_PORT
    from .test_wireguard import Pair

    pair = Pair(lab)
    nodes = {public_key(pair.ka): (pair.a, pair.wa, pair.ka, "192.168.77.1"),
             public_key(pair.kb): (pair.b, pair.wb, pair.kb, "192.168.77.2")}
    low, high = (nodes[k] for k in sorted(nodes))
    for ns, wg, key, _ in (low, high):
        in_ns(ns, wg.ensure_device, key, WG_PORT, None, 1420)

    def peer_of(end: tuple) -> PeerPlan:
        _, _, key, ip = end
        return PeerPlan("high" if end is high else "low", "node", public_key(key), f"{ip}:{WG_PORT}", (), 0)

    in_ns(low[0], low[1].stage_peers, [peer_of(high)])
    assert in_ns(low[0], low[1].rescue, public_key(low[2]), wait=0.2) == ["high"]
    assert in_ns(low[0], low[1].rescue, public_key(low[2])) == []  # not again within RESCUE_S
    in_ns(high[0], high[1].stage_peers, [peer_of(low)])
    assert in_ns(high[0], high[1].rescue, public_key(high[2]), wait=0.2) == []  # the higher end: not yet
    wait_until(lambda: all(s.last_handshake for s in in_ns(low[0], low[1].show)), 30, "the handshake")
    due = in_ns(low[0], low[1].rescue_due, time.monotonic())
    assert due is not None  # still watched ...
    # ... with its handshake it is listened to until RESCUE_UNTIL_S after its add: a rescue that is
    # due finds nothing sent unanswered (the pair is idle) and adds nothing anew
    wait_until(lambda: time.monotonic() >= due, 10, "the rescue due")
    assert in_ns(low[0], low[1].rescue, public_key(low[2])) == []
    wait_until(lambda: in_ns(low[0], low[1].rescue_due, time.monotonic()) is None or
               in_ns(low[0], low[1].rescue, public_key(low[2])) != [], RESCUE_UNTIL_S + 5, "the watch over")
    assert in_ns(low[0], low[1].rescue_due, time.monotonic()) is None


def test_a_peer_that_answers_on_a_key_this_end_lacks_is_added_anew(lab: NodeLab) -> None:
    """The other outcome of crossed handshakes, made deterministic: a has a session with b, and b
    has lost its keys (its peer a removed and added again, without an endpoint to call back). a
    sends and hears nothing; WireGuard would start over after 15 s. a's rescue adds b anew after
    UNHEARD_S of that, a greets b, and the pair answers again well before WireGuard's own retry."""
    from .test_wireguard import PORT as WG_PORT
    from .test_wireguard import Pair

    pair = Pair(lab)
    for ns, wg, key, ip in ((pair.a, pair.wa, pair.ka, "10.4.0.1/16"), (pair.b, pair.wb, pair.kb, "10.4.0.2/16")):
        in_ns(ns, wg.ensure_device, key, WG_PORT, ipaddress.ip_interface(ip), 1420)
    net_a, net_b = ipaddress.ip_network("10.4.0.1/32"), ipaddress.ip_network("10.4.0.2/32")
    to_b = PeerPlan("b", "node", public_key(pair.kb), f"192.168.77.2:{WG_PORT}", (net_b,), 0)
    to_a = PeerPlan("a", "node", public_key(pair.ka), None, (net_a,), 0)
    in_ns(pair.b, pair.wb.sync_peers, [to_a])
    t0 = time.monotonic()
    in_ns(pair.a, pair.wa.stage_peers, [to_b])
    assert in_ns(pair.a, pair.wa.rescue, public_key(pair.ka), wait=2.0) == []  # a's greeting: a session
    assert pair.ping(1)
    sock = UapiClient(lab.run_dir("b") / "kilo0.sock")  # b forgets its keys behind its object's back
    sock.set(peers=[PeerOp(public_key(pair.ka), remove=True)])
    sock.set(peers=[PeerOp(public_key(pair.ka), allowed_ips=(net_a,))])
    lab.spawn(pair.a, "ping", "-i", "0.05", "10.4.0.2")  # a sends on a key b no longer has, and hears nothing
    rescued: list[str] = []

    def rescued_once() -> bool:
        rescued.extend(in_ns(pair.a, pair.wa.rescue, public_key(pair.ka)))
        return bool(rescued)

    wait_until(rescued_once, RESCUE_UNTIL_S, "a's rescue of b")
    assert rescued == ["b"] and time.monotonic() - t0 <= RESCUE_UNTIL_S
    assert pair.first_contact(within=5.0), pair.why()  # well before WireGuard's own 15 s
