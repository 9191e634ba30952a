# SPDX-License-Identifier: Apache-2.0
"""kilo0 through wireguard-go in real namespaces: two nodes, each with its own UAPI run_dir, peers
synced from PeerPlans, traffic through the tunnel, per-peer changes, restart and removal."""

from __future__ import annotations

import ipaddress
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshctl.lab.rigs import netns
from meshctl.mesh.plan import PeerPlan
from meshctl.node.keys import generate_private_key, public_key
from meshctl.node.wireguard import PeerStatus, WireGuard, resolve_endpoint
from meshctl.node.wireguard.uapi import UapiClient, _proc_state, running_pid, stop
from tests.waiting import wait_until

from .conftest import NodeLab, in_ns

N = ipaddress.ip_network
PORT = 51820


def _peer(name: str, key: str, endpoint: str | None, *nets: str, keepalive: int = 0) -> PeerPlan:
    return PeerPlan(name, "node", public_key(key), endpoint, tuple(N(n) for n in nets), keepalive)


class Pair:
    """Nodes a and b on one veth (192.168.77.0/24), kilo0 on each, a third fake peer c on a."""

    def __init__(self, lab: NodeLab, mode: str | None = "wireguard-go"):
        """mode None: detected, as the agent does (the kernel's where the module exists)."""
        self.lab = lab
        self.a, self.b = lab.ns("wa"), lab.ns("wb")
        netns.veth(self.a, "pv", self.b, "pv")
        netns.addr(self.a, "pv", "192.168.77.1/24")
        netns.addr(self.b, "pv", "192.168.77.2/24")
        self.ka, self.kb, self.kc = generate_private_key(), generate_private_key(), generate_private_key()
        self.wa = in_ns(self.a, WireGuard, "kilo0", run_dir=str(lab.run_dir("a")), mode=mode)
        self.wb = in_ns(self.b, WireGuard, "kilo0", run_dir=str(lab.run_dir("b")), mode=mode)

    def peers_a(self, c_nets: tuple[str, ...] = ("10.42.3.0/24", "10.4.0.3/32")) -> list[PeerPlan]:
        return [_peer("b", self.kb, f"192.168.77.2:{PORT}", "10.42.2.0/24", "10.4.0.2/32"),
                _peer("c", self.kc, f"192.168.77.3:{PORT}", *c_nets)]

    def peers_b(self) -> list[PeerPlan]:
        return [_peer("a", self.ka, f"192.168.77.1:{PORT}", "10.42.1.0/24", "10.4.0.1/32")]

    def up(self) -> None:
        assert in_ns(self.a, self.wa.ensure_device, self.ka, PORT, ipaddress.ip_interface("10.4.0.1/16"), 1420)
        assert in_ns(self.b, self.wb.ensure_device, self.kb, PORT, ipaddress.ip_interface("10.4.0.2/16"), 1420)
        in_ns(self.a, self.wa.sync_peers, self.peers_a())
        in_ns(self.b, self.wb.sync_peers, self.peers_b())

    def ping(self, count: int = 1) -> bool:
        return self.lab.sh(self.a, "ping", "-c", str(count), "-i", "0.2", "-W", "2", "10.4.0.2",
                           check=False).returncode == 0

    def first_contact(self, within: float = 30.0) -> bool:
        """a reaches b within `within` s of both adding each other. Each side greets the other at
        once (a handshake on add); an initiation that reaches b before b knows a, or two that cross,
        is retried after REKEY_TIMEOUT (5 s plus jitter), for 90 s. 30 s allows five retries: on a
        loaded machine wireguard-go's goroutines and each ping's process start wait for a CPU."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.lab.sh(self.a, "ping", "-c", "1", "-W", "0.5", "10.4.0.2", check=False).returncode == 0:
                return True
        return False

    def why(self) -> str:
        """Both ends' view of the other (handshake, bytes, endpoint), for a failed first contact."""
        ends = {"a": in_ns(self.a, self.wa.show), "b": in_ns(self.b, self.wb.show)}
        return "; ".join(f"{end}: {peers}" for end, peers in ends.items())

    def status_a(self) -> dict[str, PeerStatus]:
        return {s.name or s.public_key: s for s in in_ns(self.a, self.wa.show)}


@pytest.fixture
def pair(lab: NodeLab) -> Pair:
    return Pair(lab)


def test_two_nodes_on_kilo0_with_own_run_dirs_ping_through_the_tunnel(lab: NodeLab, caplog):
    caplog.set_level(logging.DEBUG, logger="meshctl")
    pair = Pair(lab, mode=None)
    t0 = time.monotonic()
    pair.up()
    started = time.monotonic() - t0
    assert in_ns(pair.a, pair.wa.exists) and in_ns(pair.b, pair.wb.exists)
    # kernel WireGuard wherever the kernel has the module (a VM of the matrix), wireguard-go elsewhere
    expected = "kernel" if Path("/sys/module/wireguard").exists() else "wireguard-go"
    assert pair.wa.mode == pair.wb.mode == expected
    if expected == "wireguard-go":
        # Two devices named kilo0, two processes, two sockets: each in its own run_dir.
        pa, pb = running_pid(lab.run_dir("a") / "kilo0.pid"), running_pid(lab.run_dir("b") / "kilo0.pid")
        assert pa and pb and pa != pb
        assert (lab.run_dir("a") / "kilo0.sock").is_socket() and (lab.run_dir("b") / "kilo0.sock").is_socket()
    else:
        assert "wireguard" in lab.sh(pair.a, "ip", "-d", "link", "show", "kilo0").stdout
    t1 = time.monotonic()
    assert pair.first_contact(), f"no ping through kilo0: {pair.why()}"
    first_ping = time.monotonic() - t1
    st = pair.status_a()
    assert st["b"].last_handshake is not None and st["b"].rx_bytes > 0
    assert st["b"].endpoint == f"192.168.77.2:{PORT}"
    assert st["c"].last_handshake is None
    assert st["b"].allowed_ips == (N("10.4.0.2/32"), N("10.42.2.0/24"))
    link = lab.sh(pair.a, "ip", "-j", "-d", "addr", "show", "dev", "kilo0").stdout
    assert '"mtu":1420' in link and '"local":"10.4.0.1","prefixlen":16' in link and "UP" in link
    print(f"\nwireguard-go start+config of two nodes: {started * 1000:.0f} ms; first ping (handshake): "
          f"{first_ping * 1000:.0f} ms")
    # The private keys appear in no log: ours, wireguard-go's.
    logs = caplog.text + "".join(p.read_text() for p in lab.tmp.glob("run-*/*.log"))
    assert pair.ka not in logs and pair.kb not in logs and "private" not in repr(in_ns(pair.a, pair.wa.state))


def test_same_config_again_changes_nothing_and_restart_keeps_the_process(pair: Pair, lab: NodeLab):
    pair.up()
    assert pair.first_contact(), pair.why()
    pid = running_pid(lab.run_dir("a") / "kilo0.pid")
    assert not in_ns(pair.a, pair.wa.ensure_device, pair.ka, PORT, ipaddress.ip_interface("10.4.0.1/16"), 1420)
    assert not in_ns(pair.a, pair.wa.sync_peers, pair.peers_a())
    # A restarted agent is a new object: it finds the running device and has nothing to change.
    fresh = in_ns(pair.a, WireGuard, "kilo0", run_dir=str(lab.run_dir("a")), mode="wireguard-go")
    assert not in_ns(pair.a, fresh.ensure_device, pair.ka, PORT, ipaddress.ip_interface("10.4.0.1/16"), 1420)
    assert not in_ns(pair.a, fresh.sync_peers, pair.peers_a())
    assert running_pid(lab.run_dir("a") / "kilo0.pid") == pid
    # Changing the port and the MTU is seen and applied.
    assert in_ns(pair.a, fresh.ensure_device, pair.ka, PORT + 1, ipaddress.ip_interface("10.4.0.1/16"), 1400)
    assert UapiClient(lab.run_dir("a") / "kilo0.sock").get().listen_port == PORT + 1


def test_changing_one_peer_leaves_the_other_untouched(pair: Pair):
    pair.up()
    assert pair.first_contact(), pair.why()
    assert pair.ping(3)
    before = pair.status_a()["b"]
    # A reset handshake would show as a later second (the device reports whole seconds): let the
    # clock pass the handshake's second first.
    assert before.last_handshake is not None
    wait_until(lambda: time.time() >= int(before.last_handshake) + 1.05, 5, "the next second")
    diff = in_ns(pair.a, pair.wa.sync_peers, pair.peers_a(c_nets=("10.42.3.0/24", "10.42.9.0/24", "10.4.0.3/32")))
    assert (diff.added, diff.updated, diff.removed) == ([], ["c"], [])
    after = pair.status_a()
    assert after["c"].allowed_ips == (N("10.4.0.3/32"), N("10.42.3.0/24"), N("10.42.9.0/24"))
    b = after["b"]
    assert (b.last_handshake, b.endpoint, b.allowed_ips) == (before.last_handshake, before.endpoint, before.allowed_ips)
    assert b.rx_bytes >= before.rx_bytes and b.tx_bytes >= before.tx_bytes  # a re-created peer starts at 0
    assert pair.ping()
    assert pair.status_a()["b"].last_handshake == before.last_handshake
    # Keepalive and endpoint changes are per peer too; removal names the peer.
    moved = [pair.peers_a()[0], _peer("c", pair.kc, f"192.168.77.9:{PORT}", "10.42.3.0/24", keepalive=25)]
    diff = in_ns(pair.a, pair.wa.sync_peers, moved)
    assert diff.updated == ["c"] and pair.status_a()["c"].endpoint == f"192.168.77.9:{PORT}"
    assert pair.status_a()["c"].persistent_keepalive == 25
    diff = in_ns(pair.a, pair.wa.sync_peers, pair.peers_a()[:1])
    assert (diff.added, diff.updated, diff.removed) == ([], [], ["c"])
    assert set(pair.status_a()) == {"b"} and pair.status_a()["b"].last_handshake == before.last_handshake


def test_wireguard_go_survives_the_process_that_started_it(lab: NodeLab):
    ns = lab.ns("ws")
    run_dir = lab.run_dir("s")
    key = generate_private_key()
    code = ("import ipaddress, sys; from meshctl.node.wireguard import WireGuard; "
            f"WireGuard('kilo0', run_dir={str(run_dir)!r}, mode='wireguard-go')"
            f".ensure_device(sys.stdin.read().strip(), {PORT}, ipaddress.ip_interface('10.4.0.9/16'), 1420)")
    p = subprocess.run([*netns.exec_prefix(ns), sys.executable, "-c", code], input=key, capture_output=True,
                       text=True, timeout=300)  # a hang guard: the import alone is slow under emulation
    assert p.returncode == 0, p.stderr
    pid = running_pid(run_dir / "kilo0.pid")
    assert pid is not None, "wireguard-go died with its parent"
    assert os.getsid(pid) != os.getsid(0)
    dev = UapiClient(run_dir / "kilo0.sock").get()
    assert dev.private_key == key and dev.listen_port == PORT
    # The device is in the node's namespace, not in ours.
    assert "kilo0" in lab.sh(ns, "ip", "-br", "link").stdout
    w = in_ns(ns, WireGuard, "kilo0", run_dir=str(run_dir), mode="wireguard-go")
    in_ns(ns, w.delete)
    state = _proc_state(pid)
    assert running_pid(run_dir / "kilo0.pid") is None and (state is None or state[1] == "Z")  # init reaps it
    assert not in_ns(ns, w.exists) and not (run_dir / "kilo0.sock").exists()


def test_sync_of_many_peers_is_idempotent_and_changes_one_peer_alone(lab: NodeLab):
    """500 peers (the times are printed; bench/appliers.py measures them)."""
    ns = lab.ns("wm")
    w = in_ns(ns, WireGuard, "kilo0", run_dir=str(lab.run_dir("m")))
    in_ns(ns, w.ensure_device, generate_private_key(), PORT, None, 1420)
    peers = [PeerPlan(f"n{i}", "node", public_key(generate_private_key()) if i < 3 else _fake_key(i),
                      f"198.51.100.{i % 250 + 1}:{PORT}", (N(f"10.{64 + i // 256}.{i % 256}.0/24"),), 0)
             for i in range(500)]
    t0 = time.monotonic()
    assert len(in_ns(ns, w.sync_peers, peers).added) == 500
    t1 = time.monotonic()
    assert not in_ns(ns, w.sync_peers, peers)
    t2 = time.monotonic()
    changed = [*peers[:250], PeerPlan("n250", "node", peers[250].public_key, peers[250].endpoint,
                                      (N("10.99.0.0/24"),), 0), *peers[251:]]
    diff = in_ns(ns, w.sync_peers, changed)
    t3 = time.monotonic()
    assert diff.updated == ["n250"] and not diff.added and not diff.removed
    print(f"\n500 peers: first sync {1000 * (t1 - t0):.0f} ms, no-op {1000 * (t2 - t1):.0f} ms, "
          f"one changed {1000 * (t3 - t2):.0f} ms")


def _fake_key(i: int) -> str:
    """A distinct valid-looking public key without the cost of an X25519 per peer."""
    import base64

    return base64.b64encode(i.to_bytes(4, "big") * 8).decode()


def test_dns_endpoints_resolve_and_bad_ones_are_left_unset():
    assert resolve_endpoint("127.0.0.1:51820") == ("127.0.0.1", 51820)
    assert resolve_endpoint("[fd00::1]:51820") == ("fd00::1", 51820)
    assert resolve_endpoint("localhost:51820") in (("127.0.0.1", 51820), ("::1", 51820))
    assert resolve_endpoint("no-such-host.invalid:51820") is None


def test_kernel_mode_falls_back_to_wireguard_go_without_the_module(lab: NodeLab):
    if Path("/sys/module/wireguard").exists():
        pytest.skip("this kernel has WireGuard: the fallback is not reachable")
    ns = lab.ns("wk")
    w = in_ns(ns, WireGuard, "kilo0", run_dir=str(lab.run_dir("k")), mode="kernel")
    assert in_ns(ns, w.ensure_device, generate_private_key(), PORT, None, 1420)
    assert w.mode == "wireguard-go" and running_pid(lab.run_dir("k") / "kilo0.pid")
    # A new object detects the running device's kind by itself.
    assert in_ns(ns, WireGuard, "kilo0", run_dir=str(lab.run_dir("k"))).mode == "wireguard-go"


def test_peer_syncs_trust_their_memory_until_forget(pair: Pair, lab: NodeLab):
    """After a sync, the next one diffs against what this object applied, without reading the device:
    a peer removed behind its back is only put back after `forget()` (or once the device is made
    anew: a new ifindex). Status reads can skip the allowed-IP lists."""
    pair.up()
    sock = UapiClient(lab.run_dir("a") / "kilo0.sock")
    c_pub = public_key(pair.kc)
    from meshctl.node.wireguard.state import PeerOp

    in_ns(pair.a, sock.set, peers=[PeerOp(c_pub, remove=True)])
    assert not in_ns(pair.a, pair.wa.sync_peers, pair.peers_a())
    assert c_pub not in in_ns(pair.a, sock.get).peers
    # ensure_device on the same device with the same key and port reads nothing either.
    assert not in_ns(pair.a, pair.wa.ensure_device, pair.ka, PORT, ipaddress.ip_interface("10.4.0.1/16"), 1420)
    assert not in_ns(pair.a, pair.wa.sync_peers, pair.peers_a())
    in_ns(pair.a, pair.wa.forget)
    assert not in_ns(pair.a, pair.wa.ensure_device, pair.ka, PORT, ipaddress.ip_interface("10.4.0.1/16"), 1420)
    assert in_ns(pair.a, pair.wa.sync_peers, pair.peers_a()).added == ["c"]
    light = {s.name: s for s in in_ns(pair.a, pair.wa.show, allowed_ips=False)}
    assert light["c"].allowed_ips == (N("10.4.0.3/32"), N("10.42.3.0/24"))  # as this object set them
    assert light.keys() == {"b", "c"} and light["b"].endpoint == f"192.168.77.2:{PORT}"
    # A device made anew (its wireguard-go died) is noticed by its ifindex and configured in full.
    stop(running_pid(lab.run_dir("a") / "kilo0.pid"))
    assert in_ns(pair.a, pair.wa.ensure_device, pair.ka, PORT, ipaddress.ip_interface("10.4.0.1/16"), 1420)
    assert len(in_ns(pair.a, pair.wa.sync_peers, pair.peers_a()).added) == 2
    assert pair.ping()


def test_a_peer_added_again_starts_a_handshake_at_once(pair: Pair, lab: NodeLab):
    """b drops a and takes it back (a record overwritten and restored, a node that lapsed): a still
    holds its old session, and without a handshake from b would send into the void until its rekey
    timeout (15 s). b's device greets a as soon as the peer is back: a's ping works at once."""
    pair.up()
    assert pair.first_contact(), pair.why()
    # Not within the same ~17 ms: WireGuard refuses an initiation whose (coarse) timestamp is not
    # newer than the last one it took from that peer (its replay protection).
    time.sleep(0.1)  # the protocol's own rhythm, not a wait for an event
    in_ns(pair.b, pair.wb.sync_peers, [])
    in_ns(pair.b, pair.wb.sync_peers, pair.peers_b())
    # a pings until b answers: at once (a packet racing the handshake may be lost), not after the
    # 15 s a's old session would take; 10 s leaves a loaded machine its slack and still tells them apart.
    t0 = time.monotonic()
    wait_until(lambda: lab.sh(pair.a, "ping", "-c", "1", "-W", "0.3", "10.4.0.2", check=False).returncode == 0,
               10, "a's ping answered after b took it back")
    took = time.monotonic() - t0
    print(f"\nfirst answered ping after the peer came back: {took * 1000:.0f} ms")


def test_roaming_peer_keeps_its_learned_endpoint_across_resyncs_and_restarts(pair: Pair, lab: NodeLab):
    """Kilo #34: b configures a with an address b cannot reach (a's inside address behind NAT); a
    calls b, b learns where a really is. No full resync (forget) and no agent restart (a new
    WireGuard object) puts the configured endpoint back while the handshakes are fresh."""
    from dataclasses import replace

    unreachable = f"192.168.77.9:{PORT}"
    a_at_b = replace(pair.peers_b()[0], endpoint=unreachable, roaming=True)
    pair.up()
    in_ns(pair.b, pair.wb.sync_peers, [a_at_b])
    assert pair.first_contact(), pair.why()  # a calls b at b's real address; b learns a's
    live = {p.name: p.endpoint for p in in_ns(pair.b, pair.wb.show)}
    assert live["a"] == f"192.168.77.1:{PORT}"
    for _ in range(3):
        pair.wb.forget()
        in_ns(pair.b, pair.wb.sync_peers, [a_at_b])
    restarted = in_ns(pair.b, WireGuard, "kilo0", run_dir=str(lab.run_dir("b")))
    in_ns(pair.b, restarted.sync_peers, [a_at_b])
    assert {p.name: p.endpoint for p in in_ns(pair.b, restarted.show)}["a"] == f"192.168.77.1:{PORT}"
    assert lab.sh(pair.b, "ping", "-c", "2", "-i", "0.2", "-W", "2", "10.4.0.1", check=False).returncode == 0
    # A discovered endpoint the plan changes IS applied (the mesh saw the peer move); and a peer not
    # marked roaming gets its configured endpoint after a restart too.
    moved = replace(a_at_b, endpoint=f"192.168.77.8:{PORT}", discovered=True)
    in_ns(pair.b, restarted.sync_peers, [moved])
    assert {p.name: p.endpoint for p in in_ns(pair.b, restarted.show)}["a"] == f"192.168.77.8:{PORT}"
    fixed = in_ns(pair.b, WireGuard, "kilo0", run_dir=str(lab.run_dir("b")))
    in_ns(pair.b, fixed.sync_peers, [replace(a_at_b, roaming=False)])
    assert {p.name: p.endpoint for p in in_ns(pair.b, fixed.show)}["a"] == unreachable
