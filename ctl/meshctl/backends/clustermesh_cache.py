# SPDX-License-Identifier: Apache-2.0
"""The cluster-mesh cache (KVStoreMesh's role), the pure part: where it keeps what, what it
writes, and when agents may trust it.

`meshctl clustermesh cache` watches each remote cluster's etcd once and mirrors the records it
admits into its own cluster's etcd, each under its original key behind `/meshctl-cache/<local>`:

    /meshctl-cache/cluster1/meshctl/cluster2/cluster       (cluster2's published identity)
    /meshctl-cache/cluster1/meshctl/cluster2/mesh
    /meshctl-cache/cluster1/meshctl/cluster2/nodes/g1      (admitted records only)
    /meshctl-cache/cluster1/meshctl/cluster2/forwarding/g1 (the admitted nodes' forwarding reports)
    /meshctl-cache/cluster1/status                         (heartbeat, on a short lease)

Agents' etcd users read that prefix and cannot write it (backends.etcd_identity); only the
cache's user writes it. Agents re-admit every record they read there (the cache is one more
source, not a trusted one), so a record the cache could not have admitted is never installed.
The mirrored records carry no lease: a stopped cache leaves them, and the routes, in place.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from meshctl.backends.etcd import cluster_key, cluster_prefix, forwarding_key, mesh_key, node_key
from meshctl.etcd import EtcdClient

CACHE_ROOT = "/meshctl-cache"
HEARTBEAT_SECONDS = 1.0   # how often the cache writes its status key
HEARTBEAT_TTL = 3         # the status key's lease: a killed cache's key goes within this
STALE_SECONDS = 10.0      # a status key older than this (a hung cache) is not trusted


def cache_prefix(local: str) -> str:
    """Everything the cache of cluster `local` writes."""
    return f"{CACHE_ROOT}/{local}/"


def cache_status_key(local: str) -> str:
    return f"{cache_prefix(local)}status"


def cached_key(local: str, key: str) -> str:
    """Where the cache of `local` keeps a remote record whose own key is `key`."""
    return f"{CACHE_ROOT}/{local}{key}"


def cached_cluster_prefix(local: str, remote: str) -> str:
    """The prefix an agent of `local` watches for `remote`'s records in the cache."""
    return cached_key(local, cluster_prefix(remote))


@dataclass(frozen=True)
class CacheUse:
    """How an agent reads its cluster's cache: its cluster's name (whose prefix it reads) and a
    way to open a client to its own etcd (one per watch: a watch holds its connection)."""

    local: str
    connect: Callable[[], EtcdClient]


def desired_cache(local: str, admitted: Mapping[str, frozenset[str]], records: Mapping[str, Mapping[str, bytes]],
                  keep: frozenset[str], written: Mapping[str, bytes]) -> dict[str, bytes]:
    """What the cache prefix should hold: for each admitted cluster its identity, its mesh
    settings, its admitted node records and their forwarding reports (which choose its locations'
    leaders: mesh/leaders.py), byte for byte as its own etcd holds them. A cluster
    in `keep` (configured, its view not known yet: the cache just started or is reconnecting)
    keeps what was written for it before, so a restarting cache withdraws nothing. Clusters
    refused as a whole, and records not admitted, are absent (their keys are deleted)."""
    out: dict[str, bytes] = {}
    for cname, names in admitted.items():
        recs = records.get(cname, {})
        for key in (cluster_key(cname), mesh_key(cname), *(node_key(cname, n) for n in sorted(names)),
                    *(forwarding_key(cname, n) for n in sorted(names))):
            if key in recs:
                out[cached_key(local, key)] = recs[key]
    for cname in keep - set(admitted):
        p = cached_cluster_prefix(local, cname)
        out.update({k: v for k, v in written.items() if k.startswith(p)})
    return out


def cache_changes(desired: Mapping[str, bytes], actual: Mapping[str, bytes]) -> tuple[list[tuple[str, bytes]],
                                                                                      list[str]]:
    """The puts (new or changed values) and deletes that turn `actual` into `desired`."""
    puts = [(k, v) for k, v in sorted(desired.items()) if actual.get(k) != v]
    deletes = sorted(set(actual) - set(desired))
    return puts, deletes


def heartbeat(now: float, clusters: Mapping[str, tuple[bool, str]]) -> str:
    """The status key's value: when it was written, and per remote cluster ready or why not."""
    return json.dumps({"time": round(now, 3),
                       "clusters": {n: {"ready": r, "reason": why} for n, (r, why) in sorted(clusters.items())}})


def cache_health(raw: bytes | None, now: float, cluster: str) -> str:
    """"" when the cache serves `cluster` (its heartbeat is fresh and that cluster is ready in it),
    else why not, in the words `status` prints after `cache unhealthy: `."""
    if raw is None:
        return "no heartbeat"
    try:
        d = json.loads(raw)
        age = now - float(d["time"])
        entry = d["clusters"].get(cluster)
    except (ValueError, KeyError, TypeError, AttributeError):
        return "heartbeat is not valid JSON with time and clusters"
    if age > STALE_SECONDS:
        return f"heartbeat {age:.0f}s old"
    if not isinstance(entry, dict):
        return f"does not serve {cluster}"
    if not entry.get("ready"):
        return f"{cluster} not ready in the cache: {entry.get('reason') or 'unknown'}"
    return ""
