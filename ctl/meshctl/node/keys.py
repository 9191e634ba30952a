# SPDX-License-Identifier: Apache-2.0
"""The node's WireGuard key pair: made once into the state directory, reused on every later start.

The private key lives only in `<state_dir>/private.key` (mode 0600, directory 0700) and in the
WireGuard device; it is never logged, published or placed in an exception message. The public key
is derived here, with `cryptography` when it is installed and `wg pubkey` otherwise.
"""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path

from meshctl.errors import InputError, MeshError

KEY_FILE = "private.key"


def _clamp(raw: bytes) -> bytes:
    """An X25519 private scalar as WireGuard makes it (`wg genkey`): clamped per RFC 7748."""
    b = bytearray(raw)
    b[0] &= 248
    b[31] = (b[31] & 127) | 64
    return bytes(b)


def generate_private_key() -> str:
    return base64.b64encode(_clamp(os.urandom(32))).decode()


def _check(key: str, path: Path) -> str:
    try:
        raw = base64.b64decode(key, validate=True)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        # The file's content is a secret: name the file, never echo what is in it.
        raise InputError(str(path), "<redacted>", "is not a WireGuard private key (base64 of 32 bytes)")
    return key


def load_or_create_private_key(state_dir: Path) -> str:
    """The base64 private key from `<state_dir>/private.key`, made (0600, atomically) if missing.

    An existing file with looser permissions is tightened to 0600 rather than rejected: a key that
    was readable by others is still the node's identity, and changing it would break every peer.
    """
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = state_dir / KEY_FILE
    if path.exists():
        if path.stat().st_mode & 0o077:
            path.chmod(0o600)
        return _check(path.read_text().strip(), path)
    key = generate_private_key()
    tmp = state_dir / f".{KEY_FILE}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (key + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        # link() fails if another process made the key meanwhile: then theirs wins and is reused.
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    return _check(path.read_text().strip(), path)


def public_key(private_key: str) -> str:
    """The X25519 public key of a base64 private key, base64 (what `wg pubkey` prints)."""
    raw = base64.b64decode(private_key)
    try:
        from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
    except ImportError:
        pass
    else:
        pub = X25519PrivateKey.from_private_bytes(raw).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        return base64.b64encode(pub).decode()
    try:
        p = subprocess.run(["wg", "pubkey"], input=private_key + "\n", capture_output=True, text=True, timeout=10)
    except FileNotFoundError:
        raise MeshError("neither the Python package cryptography nor `wg` (wireguard-tools) is installed") from None
    if p.returncode != 0:
        raise MeshError(f"wg pubkey failed: {p.stderr.strip() or p.returncode}")
    return p.stdout.strip()
