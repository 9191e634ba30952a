# SPDX-License-Identifier: Apache-2.0
"""`--cni install`: the config the kubelet reads (bridge + host-local on the pod CIDR, the
WireGuard MTU), written atomically and only when it changes; a Kilo leftover moved aside; with
`--cni keep` the leftover is a warning. The config is checked by the CNI plugins' own rules for
the fields meshctl relies on."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from meshctl.node import cni


def test_install_writes_the_bridge_config_and_moves_kilos_aside(tmp_path: Path) -> None:
    (tmp_path / "10-kilo.conflist").write_text('{"name": "kilo"}')
    (tmp_path / "20-other.conf").write_text("{}")
    done = cni.install(tmp_path, (ipaddress.ip_network("10.42.3.0/24"),), 1420)
    assert len(done) == 2 and "moved Kilo's" in done[1]
    conf = json.loads((tmp_path / "10-meshctl.conflist").read_text())
    bridge, portmap = conf["plugins"]
    assert conf["cniVersion"] == "0.4.0" and conf["name"] == "meshctl"
    assert bridge["type"] == "bridge" and bridge["bridge"] == "meshctl0" and bridge["mtu"] == 1420
    assert bridge["isDefaultGateway"] is True
    assert bridge["ipam"] == {"type": "host-local", "ranges": [[{"subnet": "10.42.3.0/24"}]]}
    assert portmap["type"] == "portmap"
    # Kilo's config no longer sorts first; ours is the first .conflist the kubelet finds.
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith((".conf", ".conflist"))) == \
        ["10-meshctl.conflist", "20-other.conf"]
    assert (tmp_path / "10-kilo.conflist.meshctl-disabled").read_text() == '{"name": "kilo"}'
    before = (tmp_path / "10-meshctl.conflist").stat().st_mtime_ns
    assert cni.install(tmp_path, (ipaddress.ip_network("10.42.3.0/24"),), 1420) == []  # unchanged: not rewritten
    assert (tmp_path / "10-meshctl.conflist").stat().st_mtime_ns == before
    assert cni.install(tmp_path, (ipaddress.ip_network("10.42.3.0/24"),), 1380)[0].endswith("MTU 1380)")


N = ipaddress.ip_network


@pytest.mark.parametrize("cidrs, ranges", [
    pytest.param([N("10.42.3.0/24")], [[{"subnet": "10.42.3.0/24"}]], id="one CIDR"),
    pytest.param([N("fd00:42:3::/64"), N("10.42.3.0/24")],
                 [[{"subnet": "10.42.3.0/24"}], [{"subnet": "fd00:42:3::/64"}]],
                 id="dual stack: a range set per family"),
    pytest.param([N("10.42.3.0/26"), N("10.42.3.64/26")],
                 [[{"subnet": "10.42.3.0/26"}, {"subnet": "10.42.3.64/26"}]], id="two of one family: one set"),
])
def test_host_local_ranges_hold_every_pod_cidr(cidrs, ranges) -> None:
    """host-local gives a pod one address per range set: one set per family, so a dual-stack pod
    gets one address of each and a node's second block is a second range of the same set."""
    assert cni.conflist(cidrs, 1420)["plugins"][0]["ipam"]["ranges"] == ranges


def test_keep_warns_about_a_kilo_leftover(tmp_path: Path) -> None:
    assert cni.leftover_warning(tmp_path) is None
    (tmp_path / "10-kilo.conflist").write_text("{}")
    w = cni.leftover_warning(tmp_path)
    assert w is not None and "Kilo's CNI config" in w and "--cni install" in w
