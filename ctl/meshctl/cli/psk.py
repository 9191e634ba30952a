# SPDX-License-Identifier: Apache-2.0
"""The pre-shared keys of a peer's own config (`showconf peer NAME`): the peer needs the key the
nodes hold, so it is read here, where the operator runs the command, from the file the peer's
record names; a key that cannot be read is replaced by a comment saying where it is. The key is
written to the config only, never logged."""

from __future__ import annotations

from dataclasses import replace

from meshctl.errors import MeshError
from meshctl.mesh.model import KeyRef
from meshctl.mesh.render import WgConf, WgPeer
from meshctl.node.wireguard.psk import read_key


def unread_note(ref: KeyRef, why: str | None) -> str:
    """Where the key of `ref` is, for a config that could not carry it."""
    if ref.source == "secret":
        return (f"the key is in the Kubernetes Secret {ref.name}, key {ref.key} (the agents' namespace); "
                f"put it here")
    return (f"{ref} not readable here ({why}): put here the key that file holds on the nodes (on "
            f"Kubernetes: the Secret the Peer's spec.presharedKey names)")


def with_preshared_keys(conf: WgConf) -> WgConf:
    """`conf` with each [Peer]'s pre-shared key read from its file where readable, else a note."""
    cache: dict[KeyRef, tuple[str | None, str | None]] = {}

    def resolve(p: WgPeer) -> WgPeer:
        ref = p.preshared_key
        if ref is None:
            return p
        if ref not in cache:
            cache[ref] = _read(ref)
        value, note = cache[ref]
        return replace(p, preshared_key_value=value, preshared_key_note=note)

    return replace(conf, peers=tuple(resolve(p) for p in conf.peers))


def _read(ref: KeyRef) -> tuple[str | None, str | None]:
    if ref.source == "secret":
        return None, unread_note(ref, None)
    try:
        return read_key(ref, None), None
    except MeshError as e:
        return None, unread_note(ref, str(e).removeprefix(f"preshared key {ref}: "))
