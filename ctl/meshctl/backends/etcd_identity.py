# SPDX-License-Identifier: Apache-2.0
"""Who may write what in a cluster's etcd: one identity per agent, one per reader cluster, one
for the Kubernetes kvstore mirror, and the operator's.

    identity            etcd user              may
    node a1             a1                     write /meshctl/<c>/nodes/a1; read /meshctl/<c>/
    remote cluster2     remote:cluster2        read /meshctl/<c>/
    kvstore mirror      meshctl:kvstore        write and read /meshctl/<c>/; read /meshctl-cache/<c>/
    clustermesh cache   meshctl:clustermesh-cache  write and read /meshctl-cache/<c>/ and /meshctl/<c>/mcs/;
                                               read /meshctl/<c>/
    operator            root                   everything (etcd's own superuser, role root)

Node users are named after their node (the name in the record key), so etcd itself answers "may
a1 write this key?". The other users carry a `:`, which no node name (DNS-1123) can, so no node
can ever be given a service identity by its name; the one name etcd reserves, `root`, is refused
as a node name here. etcd's JSON gateway, which meshctl's client speaks, cannot take the user from
a certificate's CN (etcd PR 10392), so each identity is a user with a password (a random secret in
a 0600 file) over mutual TLS; its client certificate names the identity in OU, not CN.
"""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from meshctl.backends.clustermesh_cache import cache_prefix
from meshctl.backends.etcd import cluster_prefix, forwarding_key, mcs_prefix, node_key, seen_key, seen_prefix
from meshctl.errors import InputError
from meshctl.etcd.client import EtcdClient, EtcdError, prefix_end

ADMIN_USER = "root"
KVSTORE_USER = "meshctl:kvstore"
CACHE_USER = "meshctl:clustermesh-cache"


def remote_user(reader: str) -> str:
    """The user another cluster (`reader`) reads this cluster's records as."""
    return f"remote:{reader}"


def node_user(node: str) -> str:
    if node == ADMIN_USER:
        raise InputError("node name", node, "is reserved: etcd's superuser is called root")
    return node


@dataclass(frozen=True)
class Grant:
    """One permission: `perm` is READ, WRITE or READWRITE; `prefix` grants every key under `key`."""

    perm: str
    key: str
    prefix: bool = False


def node_grants(cluster: str, node: str) -> tuple[Grant, ...]:
    """A node writes its own record, its own summary and its own forwarding report (its lease rides
    on all three), and reads its cluster, the other nodes' summaries and the cluster-mesh cache
    (which it cannot write)."""
    return (Grant("READWRITE", node_key(cluster, node)), Grant("READWRITE", seen_key(cluster, node)),
            Grant("READWRITE", forwarding_key(cluster, node)),
            Grant("READ", cluster_prefix(cluster), True), Grant("READ", seen_prefix(cluster), True),
            Grant("READ", cache_prefix(cluster), True))


def cache_grants(cluster: str) -> tuple[Grant, ...]:
    """The cluster-mesh cache writes its prefix and the cluster's Multi-Cluster Services records
    (which every reader of the cluster reads), and reads the local records it admits against."""
    return (Grant("READWRITE", cache_prefix(cluster), True), Grant("READWRITE", mcs_prefix(cluster), True),
            Grant("READ", cluster_prefix(cluster), True))


def reader_grants(cluster: str) -> tuple[Grant, ...]:
    return (Grant("READ", cluster_prefix(cluster), True), Grant("READ", seen_prefix(cluster), True))


def kvstore_grants(cluster: str) -> tuple[Grant, ...]:
    """The Kubernetes agents' identity in their cluster's etcd (the kvstore): it mirrors the
    cluster's records and publishes its global services, and reads the cluster-mesh cache (which
    it cannot write)."""
    return (Grant("READWRITE", cluster_prefix(cluster), True), Grant("READ", cache_prefix(cluster), True))


def new_password(path: Path) -> Path:
    """A random password in a new 0600 file (kept if the file exists: identities are stable)."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    return path


def _b64(s: str) -> str:
    return base64.b64encode(s.encode()).decode()


class AuthAdmin:
    """etcd's user and role API over the gateway, idempotent: adding what exists is no error."""

    def __init__(self, client: EtcdClient) -> None:
        self.client = client

    def _call(self, path: str, body: dict[str, object], *, may_exist: bool = True) -> None:
        try:
            self.client.call(path, body)
        except EtcdError as e:
            if not (may_exist and "already exists" in str(e)):
                raise

    def user(self, name: str, password_file: Path | None, roles: Iterable[str]) -> None:
        body: dict[str, object] = {"name": name}
        if password_file is not None:
            body["password"] = password_file.read_text().strip()
        else:
            body["options"] = {"no_password": True}
        self._call("/v3/auth/user/add", body)
        if password_file is not None:  # the password of an existing user follows its file
            self._call("/v3/auth/user/changepw", {"name": name, "password": body["password"]})
        for role in roles:
            self._call("/v3/auth/user/grant", {"user": name, "role": role})

    def role(self, name: str, grants: Iterable[Grant]) -> None:
        self._call("/v3/auth/role/add", {"name": name})
        for g in grants:
            perm: dict[str, object] = {"permType": g.perm, "key": _b64(g.key)}
            if g.prefix:
                perm["range_end"] = prefix_end(g.key)
            self._call("/v3/auth/role/grant", {"name": name, "perm": perm})

    def enable(self) -> None:
        self._call("/v3/auth/enable", {}, may_exist=False)


def provision(client: EtcdClient, cluster: str, *, admin_password: Path, nodes: dict[str, Path],
              readers: dict[str, Path], kvstore: Path | None, cache: Path | None = None) -> None:
    """Users and roles of one cluster's etcd, then auth on. `nodes` and `readers` map a node name or
    a reader cluster to its password file. Run as root once auth is on (adding a node later)."""
    admin = AuthAdmin(client)
    admin.user(ADMIN_USER, admin_password, ["root"])
    for node, pw in nodes.items():
        role = f"node:{node}"
        admin.role(role, node_grants(cluster, node))
        admin.user(node_user(node), pw, [role])
    if readers:
        admin.role("remote", reader_grants(cluster))
        for reader, pw in readers.items():
            admin.user(remote_user(reader), pw, ["remote"])
    if kvstore is not None:
        admin.role("kvstore", kvstore_grants(cluster))
        admin.user(KVSTORE_USER, kvstore, ["kvstore"])
    if cache is not None:
        admin.role("clustermesh-cache", cache_grants(cluster))
        admin.user(CACHE_USER, cache, ["clustermesh-cache"])
    admin.enable()
