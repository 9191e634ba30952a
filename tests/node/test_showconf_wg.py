# SPDX-License-Identifier: Apache-2.0
"""`meshctl showconf -o wireguard` is what `wg setconf` reads: loaded into a wireguard-go device in a
namespace of this test, the device holds exactly the plan's peers. `-o wg-quick` is not (its
Address lines are wg-quick's), and `--as-peer` output is a [Peer] that `wg addconf` takes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from meshctl.cli import main
from meshctl.node.wireguard import uapi
from meshctl.setns import NETNS_DIR
from tests.plan.fixtures import KILO_CLASSIC, key

from .conftest import NodeLab, in_ns

IFNAME = "k8wg0"


@pytest.fixture
def prefix() -> str:
    return f"k8{os.getpid() % 10000}-"


def showconf(tmp: Path, *args: str) -> str:
    f = tmp / "topo.yaml"
    f.write_text(yaml.safe_dump(KILO_CLASSIC))
    r = CliRunner().invoke(main, ["showconf", "-f", str(f), *args])
    assert r.exit_code == 0, r.output
    return r.stdout


def wg(ns: str, run_dir: Path, *args: str, conf: str | None = None) -> subprocess.CompletedProcess[str]:
    """`wg` inside `ns`, talking to the wireguard-go whose socket is in `run_dir`."""
    script = 'mkdir -p /var/run/wireguard && mount --bind "$1" /var/run/wireguard && shift && exec wg "$@"'
    return subprocess.run(["nsenter", f"--net={NETNS_DIR / ns}", "unshare", "--mount", "--propagation", "private",
                           "sh", "-c", script, "sh", str(run_dir), *args],
                          input=conf, capture_output=True, text=True, timeout=20)


def device_peers(ns: str, run_dir: Path) -> dict[str, dict[str, str]]:
    out = wg(ns, run_dir, "showconf", IFNAME)
    assert out.returncode == 0, out.stderr
    peers: dict[str, dict[str, str]] = {}
    cur: dict[str, str] | None = None
    for line in out.stdout.splitlines():
        if line.strip() == "[Peer]":
            cur = {}
            continue
        k, _, v = line.partition(" = ")
        if cur is not None and v:
            cur[k] = v
            if k == "PublicKey":
                peers[v] = cur
    return peers


def test_wireguard_output_loads_with_wg_setconf(lab: NodeLab, tmp_path: Path) -> None:
    ns = lab.ns("sc")
    run_dir = lab.run_dir("sc")
    in_ns(ns, uapi.spawn, IFNAME, run_dir)
    conf = showconf(tmp_path, "node", "a", "-o", "wireguard")
    r = wg(ns, run_dir, "setconf", IFNAME, "/dev/stdin", conf=conf)
    assert r.returncode == 0, r.stderr
    peers = device_peers(ns, run_dir)
    # a leads aws: its peers are the segments gcp (c) and d, and the peers p1 and p2.
    assert set(peers) == {key(3), key(4), key(101), key(102)}
    assert peers[key(3)]["Endpoint"] == "198.51.100.3:51820"
    assert peers[key(3)]["AllowedIPs"] == "10.1.0.1/32, 10.2.3.0/24, 10.4.0.2/32"
    assert peers[key(101)]["Endpoint"] == "192.0.2.1:51820"
    assert "Endpoint" not in peers[key(102)]
    shown = wg(ns, run_dir, "show", IFNAME, "listen-port")
    assert shown.stdout.strip() == "51820"

    # wg-quick's Address line is exactly what `wg setconf` refuses.
    r = wg(ns, run_dir, "setconf", IFNAME, "/dev/stdin", conf=showconf(tmp_path, "node", "a", "-o", "wg-quick"))
    assert r.returncode != 0 and "Address" in r.stderr

    # A peer's own config: one [Peer] per segment leader; loads the same way.
    r = wg(ns, run_dir, "setconf", IFNAME, "/dev/stdin", conf=showconf(tmp_path, "peer", "p2"))
    assert r.returncode == 0, r.stderr
    assert set(device_peers(ns, run_dir)) == {key(1), key(3), key(4)}

    # --as-peer: node c as another device must know it, plus a service CIDR, added with addconf.
    as_peer = showconf(tmp_path, "node", "c", "--as-peer", "--allowed-ips", "10.96.0.0/12")
    r = wg(ns, run_dir, "addconf", IFNAME, "/dev/stdin", conf=as_peer)
    assert r.returncode == 0, r.stderr
    assert device_peers(ns, run_dir)[key(3)]["AllowedIPs"] == "10.1.0.1/32, 10.2.3.0/24, 10.4.0.2/32, 10.96.0.0/12"
