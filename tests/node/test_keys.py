# SPDX-License-Identifier: Apache-2.0
"""The node's key pair: made once with mode 0600, reused, matching `wg pubkey`, never echoed."""

from __future__ import annotations

import base64
import stat
import subprocess
from pathlib import Path

import pytest

from meshctl.errors import InputError
from meshctl.node.keys import generate_private_key, load_or_create_private_key, public_key


def test_key_is_created_0600_and_reused(tmp_path: Path):
    state = tmp_path / "state"
    key = load_or_create_private_key(state)
    path = state / "private.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    raw = base64.b64decode(key)
    assert len(raw) == 32 and raw[0] & 7 == 0 and raw[31] & 0xC0 == 0x40  # clamped like `wg genkey`
    assert load_or_create_private_key(state) == key
    assert [p.name for p in state.iterdir()] == ["private.key"]  # no temp file left behind


def test_loose_permissions_are_tightened_not_replaced(tmp_path: Path):
    key = load_or_create_private_key(tmp_path)
    (tmp_path / "private.key").chmod(0o644)
    assert load_or_create_private_key(tmp_path) == key
    assert stat.S_IMODE((tmp_path / "private.key").stat().st_mode) == 0o600


def test_garbage_key_file_is_an_input_error_that_does_not_echo_it(tmp_path: Path):
    (tmp_path / "private.key").write_text("c2VjcmV0LWJ1dC1zaG9ydA==\n")
    with pytest.raises(InputError) as e:
        load_or_create_private_key(tmp_path)
    assert "private.key" in str(e.value) and "c2VjcmV0" not in str(e.value)


def test_public_key_matches_wg_pubkey():
    for _ in range(3):
        key = generate_private_key()
        wg = subprocess.run(["wg", "pubkey"], input=key, capture_output=True, text=True, check=True).stdout.strip()
        assert public_key(key) == wg
