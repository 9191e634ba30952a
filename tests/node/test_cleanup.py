# SPDX-License-Identifier: Apache-2.0
"""`meshctl cleanup` removes what carries meshctl's marks and nothing else: next to a foreign
`kilo0` (a WireGuard device someone else started) and a foreign veth, both stay and are named;
routes of other protocols and other people's sets stay; `--force` removes a named device anyway."""

from __future__ import annotations

import ipaddress
import subprocess
import sys

import pytest

from meshctl.lab.rigs import netns
from meshctl.node.keys import generate_private_key
from meshctl.node.wireguard import WireGuard
from meshctl.node.wireguard.uapi import running_pid, spawn, stop

from .conftest import NodeLab, in_ns

pytestmark = pytest.mark.root


def cleanup(lab: NodeLab, ns: str, wg_if: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return netns.run(ns, [sys.executable, "-m", "meshctl.cli", "cleanup", "--wg-interface", wg_if,
                          "--wg-run-dir", str(lab.run_dir("ours")), "--nat-prefix", f"{lab.prefix}nat", *extra],
                     check=False, timeout=300)  # a hang guard: a CLI start under emulation takes a minute


def links(ns: str) -> str:
    return netns.run(ns, ["ip", "-o", "link"]).stdout


def test_cleanup_leaves_a_foreign_kilo0_and_a_foreign_veth(lab: NodeLab) -> None:
    ns = lab.ns("cl")
    netns.run(ns, ["ip", "link", "set", "lo", "up"])
    # Someone else's kilo0: a wireguard-go with its own run dir, started outside the agent.
    foreign_pid = in_ns(ns, spawn, "kilo0", lab.run_dir("kilo"))
    try:
        netns.run(ns, ["ip", "link", "add", "fv0", "type", "veth", "peer", "name", "fv1"])
        netns.run(ns, ["ip", "link", "set", "fv0", "up"])
        netns.run(ns, ["ip", "route", "add", "172.31.0.0/24", "dev", "fv0", "proto", "static"])
        netns.run(ns, ["ip", "route", "add", "172.31.1.0/24", "dev", "fv0", "proto", "109"])
        netns.run(ns, ["ipset", "create", "kilo-foreign", "hash:net"])

        p = cleanup(lab, ns, "kilo0")
        assert p.returncode == 0, p.stderr
        assert "cleanup: kept kilo0 (a tun" in p.stdout and "was not created by meshctl" in p.stdout, p.stdout
        assert "kilo0" in links(ns) and running_pid(lab.run_dir("kilo") / "kilo0.pid") == foreign_pid
        p = cleanup(lab, ns, "fv0")
        assert p.returncode == 0 and "cleanup: kept fv0 (a veth" in p.stdout, (p.stdout, p.stderr)
        assert "fv0@fv1" in links(ns)
        routes = netns.run(ns, ["ip", "route"]).stdout
        assert "172.31.0.0/24" in routes and "172.31.1.0/24" not in routes, routes  # only protocol 109 goes
        assert "kilo-foreign" in netns.run(ns, ["ipset", "list", "-n"]).stdout

        # A device meshctl creates carries its mark: cleanup removes it.
        wg = in_ns(ns, WireGuard, "mk0", run_dir=str(lab.run_dir("ours")))
        in_ns(ns, wg.ensure_device, generate_private_key(), 51821, ipaddress.ip_interface("10.4.0.9/16"), 1420)
        assert "mk0" in links(ns)
        p = cleanup(lab, ns, "mk0")
        assert p.returncode == 0 and "kept" not in p.stdout, (p.stdout, p.stderr)
        assert "mk0" not in links(ns)

        # --force removes what was named.
        p = cleanup(lab, ns, "fv0", "--force")
        assert p.returncode == 0 and "kept" not in p.stdout, (p.stdout, p.stderr)
        assert "fv0" not in links(ns)
    finally:
        stop(foreign_pid)
