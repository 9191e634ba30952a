# SPDX-License-Identifier: Apache-2.0
"""Pre-shared keys reach the WireGuard device (wireguard-go in a namespace of this test): set with
the peer, changed when the key changes, cleared when the reference goes; key files must be 0600."""

from __future__ import annotations

import base64
import ipaddress
import os
from pathlib import Path

import pytest

from meshctl.errors import MeshError
from meshctl.mesh.model import KeyRef
from meshctl.mesh.plan import PeerPlan
from meshctl.node.keys import generate_private_key, public_key
from meshctl.node.wireguard import WireGuard
from meshctl.node.wireguard.psk import read_key

from .conftest import NodeLab, in_ns
from .test_showconf_wg import wg

IFNAME = "k8psk0"
PSK1 = base64.b64encode(bytes(range(32))).decode()
PSK2 = base64.b64encode(bytes(range(1, 33))).decode()


@pytest.fixture
def prefix() -> str:
    return f"k8{os.getpid() % 10000}-"


def psks(ns: str, run_dir: Path) -> dict[str, str]:
    out = wg(ns, run_dir, "show", IFNAME, "preshared-keys")
    assert out.returncode == 0, out.stderr
    return dict(line.split("\t") for line in out.stdout.splitlines())


def test_preshared_key_set_changed_and_cleared(lab: NodeLab) -> None:
    ns = lab.ns("psk")
    run_dir = lab.run_dir("psk")
    dev = in_ns(ns, WireGuard, IFNAME, run_dir=str(run_dir), mode="wireguard-go")
    in_ns(ns, dev.ensure_device, generate_private_key(), 51821, ipaddress.ip_interface("10.4.0.1/16"), 1420)
    pub = public_key(generate_private_key())
    ref = KeyRef("secret", "psk", "laptop")
    p = PeerPlan("laptop", "peer", pub, None, (ipaddress.ip_network("10.5.0.1/32"),), 0, ref)
    in_ns(ns, dev.sync_peers, [p], {pub: PSK1})
    assert psks(ns, run_dir) == {pub: PSK1}
    in_ns(ns, dev.sync_peers, [p], {pub: PSK2})  # the Secret was rotated
    assert psks(ns, run_dir) == {pub: PSK2}
    in_ns(ns, dev.sync_peers, [p], {pub: PSK2})  # unchanged: nothing sent
    plain = PeerPlan("laptop", "peer", pub, None, (ipaddress.ip_network("10.5.0.1/32"),), 0)
    in_ns(ns, dev.sync_peers, [plain], {})
    assert psks(ns, run_dir) == {pub: "(none)"}


def test_key_files_must_be_private_and_hold_a_key(tmp_path: Path) -> None:
    f = tmp_path / "laptop.psk"
    f.write_text(PSK1 + "\n")
    f.chmod(0o600)
    assert read_key(KeyRef("file", str(f)), None) == PSK1
    f.chmod(0o644)
    with pytest.raises(MeshError, match="readable by others"):
        read_key(KeyRef("file", str(f)), None)
    f.chmod(0o600)
    f.write_text("not a key")
    with pytest.raises(MeshError) as e:
        read_key(KeyRef("file", str(f)), None)
    assert "not a WireGuard key" in str(e.value)
    with pytest.raises(MeshError, match="this backend has no Secrets"):
        read_key(KeyRef("secret", "psk", "laptop"), None)
