# SPDX-License-Identifier: Apache-2.0
"""NatApplier with real traffic: a pod behind a node reaches an outside host masqueraded, while a
mesh destination sees the pod's own address; set members change in place (the rules and their
counters stay); cleanup removes it all."""

from __future__ import annotations

import ipaddress
import re

import pytest

from meshctl.lab.rigs import netns
from meshctl.node.masquerade import NatApplier
from meshctl.node.sysctls import ensure_sysctls
from tests.waiting import wait_until

from .conftest import NodeLab, in_ns

N = ipaddress.ip_network
PREFIX = "mndnat"
# Host prefixes too: a second sync must read /32 and /128 members back as equal.
MESH = ["10.42.2.0/24", "10.4.0.0/16", "fd42::/48", "10.30.0.7/32", "fd43::7/128"]

ECHO_SERVER = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 9999))
while True:
    data, src = s.recvfrom(100)
    s.sendto(src[0].encode(), src)
"""

PROBE = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(2)
for _ in range(3):
    s.sendto(b"who", (sys.argv[1], 9999))
    try:
        print(s.recvfrom(100)[0].decode()); break
    except TimeoutError:
        pass
else:
    print("timeout")
"""


class World:
    """pod (10.42.1.2) -- node -- mesh host (10.20.0.2, pod 10.42.2.5) / outside host (203.0.113.2)."""

    def __init__(self, lab: NodeLab):
        self.lab = lab
        self.node, self.pod, self.mesh, self.out = (lab.ns(n) for n in ("nnode", "npod", "nmesh", "nout"))
        netns.veth(self.node, "pp", self.pod, "eth0")
        netns.veth(self.node, "pv", self.mesh, "pv")
        netns.veth(self.node, "pu", self.out, "pu")
        for ns, dev, cidr in ((self.node, "pp", "10.42.1.1/24"), (self.pod, "eth0", "10.42.1.2/24"),
                              (self.node, "pv", "10.20.0.1/24"), (self.mesh, "pv", "10.20.0.2/24"),
                              (self.mesh, "lo", "10.42.2.5/32"), (self.node, "pu", "203.0.113.1/24"),
                              (self.out, "pu", "203.0.113.2/24")):
            netns.addr(ns, dev, cidr)
        lab.sh(self.pod, "ip", "route", "add", "default", "via", "10.42.1.1")
        lab.sh(self.node, "ip", "route", "add", "10.42.2.0/24", "via", "10.20.0.2")
        lab.sh(self.mesh, "ip", "route", "add", "10.42.1.0/24", "via", "10.20.0.1")
        # The outside host can answer a pod directly too, so what it reports is what it saw.
        lab.sh(self.out, "ip", "route", "add", "10.42.1.0/24", "via", "203.0.113.1")
        for ns in (self.mesh, self.out):
            lab.spawn(ns, "python3", "-c", ECHO_SERVER)

    def seen_by(self, dst: str) -> str:
        return self.lab.sh(self.pod, "python3", "-c", PROBE, dst).stdout.strip()

    def masq_packets(self) -> int:
        out = self.lab.sh(self.node, "iptables-nft", "-w", "-t", "nat", "-L", f"{PREFIX.upper()}-NAT",
                          "-v", "-x", "-n").stdout
        line = next(ln for ln in out.splitlines() if "MASQUERADE" in ln)
        return int(line.split()[0])


@pytest.fixture
def world(lab: NodeLab) -> World:
    w = World(lab)
    changed = in_ns(w.node, ensure_sysctls, "pv", None)
    assert changed["net.ipv4.ip_forward"] == "1"
    return w


def _sync(w: World, nat: NatApplier, mesh: list[str]) -> bool:
    return in_ns(w.node, nat.sync, [N("10.42.1.0/24")], [N(m) for m in mesh], ["pv", "kilo0"])


def _wait_servers(w: World) -> None:
    def listening(ns: str) -> bool:
        return "9999" in w.lab.sh(ns, "ss", "-uln").stdout

    wait_until(lambda: listening(w.out) and listening(w.mesh), 30, "the echo servers listening")


def test_outside_is_masqueraded_mesh_keeps_the_source_and_sets_change_in_place(world: World, lab: NodeLab):
    w = world
    nat = in_ns(w.node, NatApplier, PREFIX)
    assert _sync(w, nat, MESH)
    assert not _sync(w, nat, MESH), "second sync changed something"
    _wait_servers(w)
    assert w.seen_by("10.42.2.5") == "10.42.1.2"  # mesh: the pod's own address
    assert w.seen_by("203.0.113.2") == "203.0.113.1"  # outside: the node's address
    rules_before = lab.sh(w.node, "iptables-nft-save").stdout
    masq_before = w.masq_packets()
    assert masq_before >= 1

    # The outside network joins the mesh (a peer's allowed IPs): only set members change.
    assert _sync(w, nat, [*MESH, "203.0.113.0/24"])
    members = lab.sh(w.node, "ipset", "list", f"{PREFIX}-mesh4").stdout
    assert "203.0.113.0/24" in members and "10.42.1.0/24" in members  # local pods count as mesh
    assert w.seen_by("203.0.113.2") == "10.42.1.2"
    assert w.masq_packets() == masq_before, "rules were rewritten (counters reset) or masqueraded anyway"
    strip = re.compile(r"\[\d+:\d+\]|^#.*$", re.M)
    assert strip.sub("", lab.sh(w.node, "iptables-nft-save").stdout) == strip.sub("", rules_before)

    assert _sync(w, nat, MESH)
    assert w.seen_by("203.0.113.2") == "203.0.113.1"
    assert w.masq_packets() > masq_before
    assert "fd42::/48" in lab.sh(w.node, "ipset", "list", f"{PREFIX}-mesh6").stdout
    assert f"-A POSTROUTING -j {PREFIX.upper()}-NAT" in lab.sh(w.node, "ip6tables-nft-save").stdout

    assert nat.mode == "nft" and "iptables-nft holds 0 rules" in nat.mode_reason  # an empty host: nft
    assert PREFIX.upper() not in lab.sh(w.node, "iptables-legacy-save").stdout  # never both
    in_ns(w.node, nat.cleanup)
    saved = lab.sh(w.node, "iptables-nft-save").stdout + lab.sh(w.node, "ip6tables-nft-save").stdout
    assert PREFIX.upper() not in saved
    assert PREFIX not in lab.sh(w.node, "ipset", "list", "-n").stdout
    in_ns(w.node, nat.cleanup)  # twice is fine


def test_forward_rules_follow_the_interfaces_and_bad_prefix_is_an_input_error(lab: NodeLab):
    ns = lab.ns("nfwd")
    nat = in_ns(ns, NatApplier, PREFIX)
    in_ns(ns, nat.sync, [N("10.42.1.0/24")], [], ["eth1", "kilo0"])
    fwd = lab.sh(ns, "iptables-nft", "-w", "-S", f"{PREFIX.upper()}-FWD").stdout
    assert f"-A {PREFIX.upper()}-FWD -i eth1 -o kilo0 -j ACCEPT" in fwd
    assert f"-A {PREFIX.upper()}-FWD -i kilo0 -m set --match-set {PREFIX}-pods4 dst -j ACCEPT" in fwd
    assert in_ns(ns, nat.sync, [N("10.42.1.0/24")], [], ["eth2", "kilo0"])
    fwd = lab.sh(ns, "iptables-nft", "-w", "-S", f"{PREFIX.upper()}-FWD").stdout
    assert "eth1" not in fwd and "-i eth2 -o kilo0" in fwd
    assert lab.sh(ns, "iptables-nft", "-w", "-S", "FORWARD").stdout.count(f"-j {PREFIX.upper()}-FWD") == 1
    # A default route among the mesh CIDRs is stored as its two halves (hash:net has no /0).
    in_ns(ns, nat.sync, [N("10.42.1.0/24")], [N("0.0.0.0/0")], ["eth2"])
    members = lab.sh(ns, "ipset", "list", f"{PREFIX}-mesh4").stdout
    assert "0.0.0.0/1" in members and "128.0.0.0/1" in members
    in_ns(ns, nat.cleanup)
    from meshctl.errors import InputError

    with pytest.raises(InputError, match="nat prefix"):
        NatApplier("bad prefix!")


def test_set_members_are_diffed_against_memory_until_forget(lab: NodeLab):
    """After the first sync, members change by difference from what was last applied: no `ipset save`
    and no rule check; a member removed behind the applier's back comes back after `forget()`.
    Many changes at once go through one `ipset restore`."""
    ns = lab.ns("nmem")
    nat = in_ns(ns, NatApplier, PREFIX + "m")
    mesh = [N(f"10.60.{i}.0/24") for i in range(100)]  # > RESTORE_OVER: the first fill is one restore
    try:
        assert in_ns(ns, nat.sync, [N("10.42.1.0/24")], mesh, ["pv"])
        sets = lab.sh(ns, "ipset", "list", f"{PREFIX}m-mesh4").stdout
        assert "Number of entries: 101" in sets
        lab.sh(ns, "ipset", "del", f"{PREFIX}m-mesh4", "10.60.7.0/24")
        lab.sh(ns, "iptables-nft", "-t", "nat", "-F", f"{PREFIX.upper()}M-NAT")
        assert in_ns(ns, nat.sync, [N("10.42.1.0/24")], [*mesh, N("10.61.0.0/24")], ["pv"])
        members = lab.sh(ns, "ipset", "save", f"{PREFIX}m-mesh4").stdout
        assert "10.61.0.0/24" in members and "10.60.7.0/24" not in members
        assert "-j MASQUERADE" not in lab.sh(ns, "iptables-nft", "-t", "nat", "-S").stdout
        in_ns(ns, nat.forget)
        assert in_ns(ns, nat.sync, [N("10.42.1.0/24")], [*mesh, N("10.61.0.0/24")], ["pv"])
        assert "10.60.7.0/24" in lab.sh(ns, "ipset", "save", f"{PREFIX}m-mesh4").stdout
        assert "-j MASQUERADE" in lab.sh(ns, "iptables-nft", "-t", "nat", "-S").stdout
        assert not in_ns(ns, nat.sync, [N("10.42.1.0/24")], [*mesh, N("10.61.0.0/24")], ["pv"])
        # A /0 is held as its halves; dropping it keeps a half that is also wanted on its own.
        in_ns(ns, nat.sync, [N("10.42.1.0/24")], [*mesh, N("0.0.0.0/0"), N("0.0.0.0/1")], ["pv"])
        members = lab.sh(ns, "ipset", "save", f"{PREFIX}m-mesh4").stdout
        assert "0.0.0.0/1" in members and "128.0.0.0/1" in members and "10.61.0.0/24" not in members
        in_ns(ns, nat.sync, [N("10.42.1.0/24")], [*mesh, N("0.0.0.0/1")], ["pv"])
        members = lab.sh(ns, "ipset", "save", f"{PREFIX}m-mesh4").stdout
        assert "0.0.0.0/1" in members and "128.0.0.0/1" not in members and "10.60.7.0/24" in members
    finally:
        in_ns(ns, nat.cleanup)


def test_a_full_resync_on_an_nft_host_reads_nft_and_the_sets_but_never_runs_iptables_legacy(
        lab: NodeLab, monkeypatch: pytest.MonkeyPatch) -> None:
    """A namespace where iptables-legacy made no table: a full resync (`forget`, then `sync`)
    reads the rules (iptables-nft-save, both families) and the sets again, and starts no legacy
    process: its save would print nothing. Once a legacy table exists, it is read (the moved
    host's test)."""
    from meshctl.node import masquerade

    ns = lab.ns("nres")
    nat = in_ns(ns, NatApplier, PREFIX + "r")
    ran: list[str] = []
    real = masquerade.sh
    monkeypatch.setattr(masquerade, "sh", lambda argv, **kw: ran.append(" ".join(argv)) or real(argv, **kw))
    try:
        in_ns(ns, nat.sync, [N("10.42.1.0/24")], [N("10.42.2.0/24")], ["pv"])
        assert nat.mode == "nft" and not any("legacy" in r for r in ran), ran
        ran.clear()
        in_ns(ns, nat.forget)
        assert not in_ns(ns, nat.sync, [N("10.42.1.0/24")], [N("10.42.2.0/24")], ["pv"])
        assert sorted(ran) == sorted(["iptables-nft-save", "ip6tables-nft-save",
                                      *(f"ipset save {PREFIX}r-{k}{v}" for k in ("pods", "mesh") for v in (4, 6))])
        lab.sh(ns, "iptables-legacy", "-w", "-t", "filter", "-S")  # legacy's first use makes its table
        ran.clear()
        in_ns(ns, nat.forget)
        in_ns(ns, nat.sync, [N("10.42.1.0/24")], [N("10.42.2.0/24")], ["pv"])
        assert "iptables-legacy-save" in ran and "ip6tables-legacy-save" not in ran, ran
    finally:
        in_ns(ns, nat.cleanup)


def test_choose_mode_as_iptables_wrappers_does() -> None:
    from meshctl.node.masquerade import choose_mode

    legacy = "*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j KUBE-FIREWALL\n-A KUBE-FIREWALL -j DROP\nCOMMIT\n"
    nft = "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n"
    assert choose_mode({"legacy": legacy, "nft": nft})[0] == "legacy"
    assert choose_mode({"legacy": "", "nft": nft})[0] == "nft"
    assert choose_mode({"legacy": "", "nft": ""}) == ("nft", "iptables-nft holds 0 rules, iptables-legacy 0")
    # kubelet's hint chain decides even against more rules elsewhere
    assert choose_mode({"legacy": legacy, "nft": "*mangle\n:KUBE-IPTABLES-HINT - [0:0]\nCOMMIT\n"})[0] == "nft"
    # our own chains never decide it
    own = "*nat\n-A POSTROUTING -j MESHCTL-NAT\n-A MESHCTL-NAT -j MASQUERADE\nCOMMIT\n"
    assert choose_mode({"legacy": own, "nft": nft}, "meshctl")[0] == "nft"


def test_a_legacy_host_gets_legacy_rules_and_a_moved_host_loses_the_old_ones(lab: NodeLab) -> None:
    ns = lab.ns("nmode")
    # A host whose kube-proxy writes through iptables-legacy (kubelet's hint chain there).
    lab.sh(ns, "iptables-legacy", "-w", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
    nat = in_ns(ns, NatApplier, PREFIX + "x")
    try:
        in_ns(ns, nat.sync, [N("10.42.1.0/24")], [N("10.42.2.0/24")], ["pv"])
        assert nat.mode == "legacy"
        assert f"-A POSTROUTING -j {PREFIX.upper()}X-NAT" in lab.sh(ns, "iptables-legacy-save").stdout
        assert PREFIX.upper() not in lab.sh(ns, "iptables-nft-save").stdout
        # The host moves to nft (the hint chain with it): a new agent writes nft and clears legacy.
        lab.sh(ns, "iptables-legacy", "-w", "-t", "mangle", "-X", "KUBE-IPTABLES-HINT")
        lab.sh(ns, "iptables-nft", "-w", "-t", "mangle", "-N", "KUBE-IPTABLES-HINT")
        again = in_ns(ns, NatApplier, PREFIX + "x")
        in_ns(ns, again.sync, [N("10.42.1.0/24")], [N("10.42.2.0/24")], ["pv"])
        assert again.mode == "nft"
        assert f"-A POSTROUTING -j {PREFIX.upper()}X-NAT" in lab.sh(ns, "iptables-nft-save").stdout
        assert PREFIX.upper() not in lab.sh(ns, "iptables-legacy-save").stdout
    finally:
        in_ns(ns, nat.cleanup)


@pytest.mark.parametrize(("name", "masquerade6", "version", "masquerades"), [
    ("ipv4 pods are masqueraded", False, 4, True),
    ("ipv6 pods are left alone by default", False, 6, False),
    ("ipv6 pods are masqueraded when asked", True, 6, True),
    ("asking for ipv6 keeps ipv4", True, 4, True),
])
def test_ipv6_pod_egress_is_masqueraded_only_when_asked(name: str, masquerade6: bool, version: int,
                                                        masquerades: bool) -> None:
    nat, fwd = NatApplier(PREFIX, "nft", masquerade6=masquerade6)._rules(version, ["pv"])
    assert any("-j MASQUERADE" in r for r in nat) == masquerades, name
    assert any(f"{PREFIX}-pods{version}" in r for r in fwd), "forwarding for the family's pods stays"
