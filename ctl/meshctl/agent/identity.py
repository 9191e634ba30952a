# SPDX-License-Identifier: Apache-2.0
"""The cluster's identity at start: a changed `cluster_id` or cluster name is refused, not applied.

Why refused rather than applied live: other clusters know this one by the name of their
clustermesh file (the file name must equal the published name) and check its id against theirs;
the id record at `/meshctl/<cluster>/cluster` is written once (`put_if_absent`) by the first agent.
An agent started under a new name publishes its node under a prefix no other cluster watches (their
routes to it drain); one started under a new id runs beside a record that still says the old one,
so other clusters and this one disagree. Neither can be fixed by this agent alone: the other
clusters' files must change too. So the agent refuses to start, in one line naming both values
and the procedure (docs/clustermesh.md, "Changing a cluster's name or id"); routes, WireGuard and
maps installed by the previous run stay in place, so no pod loses connectivity meanwhile.

The identity a node last ran under is kept in `<state-dir>/cluster-identity.json`; the id the
cluster runs under is the one published in its etcd.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Protocol

from meshctl.errors import InputError
from meshctl.etcd import EtcdError, KeyValue
from meshctl.mesh import fields
from meshctl.mesh.admit import IDENTITY_DOC
from meshctl.mesh.model import Cluster

log = logging.getLogger("meshctl.agent")

IDENTITY_FILE = "cluster-identity.json"
_PROCEDURE = f"a meshed cluster's identity is not changed live: follow {IDENTITY_DOC}"


def identity_change(want: Cluster, ran_under: Cluster | None, published_id: int | None,
                    where: str = "its etcd") -> InputError | None:
    """Why the agent must not start as `want`, or None.

    `ran_under` is the identity this node's agent last ran under (None: first start here),
    `published_id` the id at `/meshctl/<want.name>/cluster` (None: not published yet). A name that
    differs from the one this node ran under is refused; so is an id that differs from the
    published one (or, before anything is published, from the one this node ran under)."""
    if ran_under is not None and ran_under.name != want.name:
        return InputError("cluster name", want.name,
                          f"differs from {ran_under.name!r}, the name this node's agent ran under; {_PROCEDURE}")
    if published_id is not None and published_id != want.id:
        return InputError("cluster_id", want.id,
                          f"differs from {published_id}, the id cluster {want.name!r} runs under "
                          f"(published in {where}); {_PROCEDURE}")
    if published_id is None and ran_under is not None and ran_under.id != want.id:
        return InputError("cluster_id", want.id,
                          f"differs from {ran_under.id}, the id this node's agent ran cluster {want.name!r} "
                          f"under; {_PROCEDURE}")
    return None


def load_identity(state_dir: Path) -> Cluster | None:
    """The identity saved by the last start here; an unreadable file counts as none (logged)."""
    path = state_dir / IDENTITY_FILE
    try:
        d = json.loads(path.read_text())
        return Cluster(fields.cluster_name(d.get("name"), "name"), fields.cluster_id(d.get("id"), "id"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError) as e:
        log.warning("ignoring %s: %s", path, e)
        return None


def save_identity(state_dir: Path, cluster: Cluster) -> None:
    """Write the identity atomically (the next start compares with it)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    path = state_dir / IDENTITY_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"name": cluster.name, "id": cluster.id}))
    os.replace(tmp, path)


class KeyReader(Protocol):
    def get(self, key: str) -> KeyValue | None: ...


def published_id(client: KeyReader, key: str) -> int | None:
    """The id in the cluster record at `key`, or None when absent, unreadable or etcd is away
    (then the saved identity alone is checked: an etcd outage must not keep agents down)."""
    try:
        kv = client.get(key)
    except EtcdError as e:
        log.warning("cannot read %s to check the cluster id: %s", key, e)
        return None
    if kv is None:
        return None
    try:
        return fields.cluster_id(json.loads(kv.value).get("id"), "id")
    except (ValueError, AttributeError):
        return None


def check_identity(state_dir: Path, want: Cluster, client: KeyReader | None, key: str) -> None:
    """Raise the refusal line, or save `want` as the identity this node runs under."""
    pub = published_id(client, key) if client is not None else None
    err = identity_change(want, load_identity(state_dir), pub, where=key)
    if err is not None:
        raise err
    save_identity(state_dir, want)
