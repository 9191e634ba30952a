# SPDX-License-Identifier: Apache-2.0
"""Pre-shared keys: read from where a peer's record says they are (`KeyRef`), only to hand them to
the device. Never logged, never in status or plans; a key file must be private (mode 0600)."""

from __future__ import annotations

import base64
import os
from typing import Protocol, runtime_checkable

from meshctl.errors import InputError, MeshError
from meshctl.mesh.fields import wg_key
from meshctl.mesh.model import KeyRef


@runtime_checkable
class SecretSource(Protocol):
    """A store of Secrets (the Kubernetes backend): the raw value of one key of one Secret."""

    def read_secret(self, name: str, key: str) -> bytes: ...


def read_key(ref: KeyRef, secrets: SecretSource | None) -> str:
    """The base64 key `ref` points at; MeshError (naming the reference, never the key) otherwise."""
    if ref.source == "file":
        try:
            st = os.stat(ref.name)
            if st.st_mode & 0o077:
                raise MeshError(f"preshared key {ref}: readable by others (chmod 600 it)")
            with open(ref.name, "rb") as f:
                raw = f.read(256)
        except OSError as e:
            raise MeshError(f"preshared key {ref}: {e.strerror}") from None
    else:
        if secrets is None:
            raise MeshError(f"preshared key {ref}: this backend has no Secrets (use preshared_key_file)")
        raw = secrets.read_secret(ref.name, ref.key)
    try:
        return wg_key(raw.decode("ascii").strip(), "")
    except (UnicodeDecodeError, InputError):
        raise MeshError(f"preshared key {ref}: not a WireGuard key (base64 of 32 bytes, as `wg genpsk` prints)"
                        ) from None


NO_KEY = base64.b64encode(bytes(32)).decode()  # what WireGuard takes as "no pre-shared key"
