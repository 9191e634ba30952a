# SPDX-License-Identifier: Apache-2.0
"""`showconf peer NAME` gives the peer what its handshake needs: the pre-shared key the nodes
hold, read from the key's file where it is readable (else a comment, or in JSON/YAML a
reference, naming the file and the Secret), in every format; and no [Peer] for a node that
neither end could call."""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from meshctl.cli import main

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "laptop-peer.yaml"
PSK = base64.b64encode(bytes(range(32))).decode()


def topo_with_psk(tmp_path: Path, psk_file: Path) -> Path:
    d = yaml.safe_load(EXAMPLE.read_text())
    d["peers"][0]["preshared_key_file"] = str(psk_file)
    f = tmp_path / "topo.yaml"
    f.write_text(yaml.safe_dump(d))
    return f


def showconf(f: Path, *args: str):
    r = CliRunner().invoke(main, ["showconf", "-f", str(f), "peer", "laptop", *args])
    assert r.exit_code == 0, (r.output, r.exception)
    return r


def key_file(tmp_path: Path, mode: int) -> Path:
    k = tmp_path / "laptop.psk"
    k.write_text(PSK + "\n")
    k.chmod(mode)
    return k


@pytest.mark.parametrize("fmt", ["wireguard", "wg-quick"])
def test_readable_key_file_gives_a_presharedkey_line_per_peer(tmp_path: Path, fmt: str) -> None:
    f = topo_with_psk(tmp_path, key_file(tmp_path, 0o600))
    r = showconf(f, "-o", fmt)
    assert r.stdout.count("[Peer]") == 2
    assert r.stdout.count(f"\nPresharedKey = {PSK}\n") == 2
    assert PSK not in r.stderr


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_readable_key_file_gives_the_key_to_programs(tmp_path: Path, fmt: str) -> None:
    f = topo_with_psk(tmp_path, key_file(tmp_path, 0o600))
    r = showconf(f, "-o", fmt)
    conf = json.loads(r.stdout) if fmt == "json" else yaml.safe_load(r.stdout)
    assert [p["preshared_key"] for p in conf["peers"]] == [PSK, PSK]
    assert PSK not in r.stderr


@pytest.mark.parametrize(("mode", "why"), [(None, "No such file or directory"), (0o644, "readable by others")])
def test_unreadable_key_is_a_comment_naming_the_file_and_the_secret(tmp_path: Path, mode: int | None,
                                                                    why: str) -> None:
    k = key_file(tmp_path, mode) if mode is not None else tmp_path / "missing.psk"
    f = topo_with_psk(tmp_path, k)
    for fmt in ("wireguard", "wg-quick"):
        out = showconf(f, "-o", fmt).stdout
        notes = [ln for ln in out.splitlines() if ln.startswith("# PresharedKey: ")]
        assert len(notes) == 2 and "\nPresharedKey" not in out
        assert f"file {k} not readable here (" in notes[0] and why in notes[0]
        assert "Secret the Peer's spec.presharedKey names" in notes[0]
    for fmt in ("json", "yaml"):
        r = showconf(f, "-o", fmt)
        conf = json.loads(r.stdout) if fmt == "json" else yaml.safe_load(r.stdout)
        assert all("preshared_key" not in p and p["preshared_key_from"] == f"file {k}" for p in conf["peers"])
        assert PSK not in r.stdout


def test_node_without_endpoint_is_left_out_of_a_roaming_peers_config(tmp_path: Path) -> None:
    d = yaml.safe_load(EXAMPLE.read_text())
    del d["nodes"][2]["endpoint"]  # do-1, alone in ams3: the laptop (no endpoint) can never reach it
    f = tmp_path / "topo.yaml"
    f.write_text(yaml.safe_dump(d))
    out = showconf(f).stdout
    assert "# left out: do-1 (no endpoint the peer can reach)\n" in out
    assert out.count("[Peer]") == 1 and "# fsn1-1\n" in out and "# do-1\n" not in out
    conf = json.loads(showconf(f, "-o", "json").stdout)
    assert conf["left_out"] == [{"name": "do-1", "reason": "no endpoint the peer can reach"}]
    assert [p["name"] for p in conf["peers"]] == ["fsn1-1"]
    # A peer with an endpoint of its own is called by the node: the node stays in its config.
    d2 = copy.deepcopy(d)
    d2["peers"][0]["endpoint"] = "192.0.2.50:51820"
    f.write_text(yaml.safe_dump(d2))
    out = showconf(f).stdout
    assert "left out" not in out and out.count("[Peer]") == 2


def test_nodes_config_still_names_the_key_never_prints_it(tmp_path: Path) -> None:
    f = topo_with_psk(tmp_path, key_file(tmp_path, 0o600))
    r = CliRunner().invoke(main, ["showconf", "-f", str(f), "node", "fsn1-1"])
    assert r.exit_code == 0 and PSK not in r.stdout
    assert f"# PresharedKey = <from file {tmp_path / 'laptop.psk'}, never printed>" in r.stdout


def test_secret_reference_is_a_note_naming_the_secret() -> None:
    from meshctl.cli.psk import with_preshared_keys
    from meshctl.mesh.model import KeyRef
    from meshctl.mesh.render import WgConf, WgPeer, conf_dict, conf_text

    ref = KeyRef("secret", "psk", "laptop")
    conf = with_preshared_keys(WgConf(None, (), (WgPeer("n1", "k", None, (), None, ref),)))
    assert "# PresharedKey: the key is in the Kubernetes Secret psk, key laptop" in conf_text(conf, "wg-quick")
    assert conf_dict(conf)["peers"][0]["preshared_key_from"] == "secret psk key laptop"
