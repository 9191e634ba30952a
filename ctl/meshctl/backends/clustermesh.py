# SPDX-License-Identifier: Apache-2.0
"""Cluster mesh, the imperative part: watch other clusters' etcd over mutual TLS.

`--clustermesh-dir` holds one file per remote cluster, named after it, in Cilium's format
(certificates and keys may sit beside them, as in a mounted cilium-clustermesh Secret: only
entries named like a cluster are read, see `config_name`):

    endpoints:
    - https://192.0.2.10:2379
    ca-file: /etc/meshctl/clustermesh/cluster2-ca.crt      # or trusted-ca-file
    cert-file: /etc/meshctl/clustermesh/cluster2-client.crt
    key-file: /etc/meshctl/clustermesh/cluster2-client.key
    username: remote:cluster1                             # cluster2's read-only user for us
    password-file: /etc/meshctl/clustermesh/cluster2-password

Adding a file connects, removing it drains the cluster; the directory is polled (no inotify
dependency) every `poll` seconds. A remote etcd that goes away keeps its last good view (routes
stay, connections keep working) and the cluster is marked not ready while it reconnects with
backoff. The records themselves are judged by the pure `mesh.admit.admit_remotes`, memoised per
cluster (`mesh.admit_memo`): a pass re-admits only the clusters whose records a change can affect.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from meshctl.backends.base import ClusterState
from meshctl.backends.clustermesh_cache import (
    HEARTBEAT_TTL,
    CacheUse,
    cache_health,
    cache_status_key,
    cached_cluster_prefix,
)
from meshctl.backends.etcd import ROOT, EtcdBackend, cluster_key, cluster_prefix, kv_from_json, kv_to_json, parse_record
from meshctl.backends.remote_status import Rejected, RemotesStatus
from meshctl.backends.remote_status import RemoteCluster as ClusterReport
from meshctl.errors import InputError, MeshError
from meshctl.etcd import EtcdClient, EtcdError
from meshctl.mesh import fields
from meshctl.mesh.admit import Rejection, identity_refusals
from meshctl.mesh.admit_memo import RemoteAdmission, same_items
from meshctl.mesh.leaders import choose_leaders, with_leaders
from meshctl.mesh.model import Cluster, Node, Topology
from meshctl.mesh.segments import Remote
from meshctl.process import gc_paused

log = logging.getLogger("meshctl.clustermesh")


@dataclass(frozen=True)
class RemoteConfig:
    name: str
    endpoints: tuple[str, ...]
    ca_file: str | None
    cert_file: str | None
    key_file: str | None
    username: str | None = None  # the read-only identity the remote cluster gave us (remote:<us>)
    password_file: str | None = None


def parse_config(path: Path) -> RemoteConfig:
    """One clustermesh file; errors name the file and field."""
    name = path.name.removesuffix(".yaml").removesuffix(".yml")
    fields.cluster_name(name, f"{path.name}: file name")
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise InputError(path.name, str(path), f"cannot be read as YAML: {e}") from None
    if not isinstance(doc, dict):
        raise InputError(path.name, doc, "is not a mapping of endpoints, ca-file, cert-file, key-file")
    eps = doc.get("endpoints")
    if isinstance(eps, str):
        eps = [eps]
    if not eps or not isinstance(eps, list) or not all(isinstance(e, str) for e in eps):
        raise InputError(f"{path.name}: endpoints", eps, "is not a list of https URLs")
    for url in eps:
        if not url.startswith(("https://", "http://")):
            raise InputError(f"{path.name}: endpoints", url, "is not an https URL")
    ca = doc.get("ca-file") or doc.get("trusted-ca-file")
    files = {"ca-file": ca, "cert-file": doc.get("cert-file"), "key-file": doc.get("key-file")}
    for field, f in files.items():
        if f is not None and not Path(f).is_file():
            raise InputError(f"{path.name}: {field}", f, "does not exist")
    if bool(files["cert-file"]) != bool(files["key-file"]):
        raise InputError(f"{path.name}: cert-file", files["cert-file"], "needs key-file too (and the other way)")
    user, pw = doc.get("username"), doc.get("password-file")
    if user is not None and not isinstance(user, str):
        raise InputError(f"{path.name}: username", user, "is not a string")
    if pw is not None and not Path(pw).is_file():
        raise InputError(f"{path.name}: password-file", pw, "does not exist")
    if bool(user) != bool(pw):
        raise InputError(f"{path.name}: username", user, "needs password-file too (and the other way)")
    return RemoteConfig(name, tuple(eps), ca, files["cert-file"], files["key-file"], user or None, pw or None)


def config_fingerprint(cfg: RemoteConfig) -> str:
    """What a saved view was learned under: endpoints, certificate paths and the CA's content."""
    h = hashlib.sha256(json.dumps([cfg.endpoints, cfg.ca_file, cfg.cert_file, cfg.key_file, cfg.username]).encode())
    if cfg.ca_file:
        with contextlib.suppress(OSError):
            h.update(Path(cfg.ca_file).read_bytes())
    return h.hexdigest()


class ReadOnlyEtcdBackend(EtcdBackend):
    """A remote cluster's records: the same mirror as the local backend, but it never writes
    (no lease, no cluster record) and it reads the cluster's published identity. `lapse_grace`
    keeps a node whose lease ran out (its agent restarting) in the view that long, as the local
    backend does for its own cluster's nodes: a restart in one cluster loses no packet to another."""

    def __init__(self, client: EtcdClient, cluster: Cluster, prefix: str | None = None, *,
                 lapse_grace: float = 0.0) -> None:
        super().__init__(client, cluster, lapse_grace=lapse_grace)
        if prefix is not None:  # the same records mirrored elsewhere (a cluster's cache)
            self.prefix = prefix

    def ensure_cluster(self) -> None:  # never write to another cluster's etcd
        pass

    def _keepalive_loop(self, stop: threading.Event) -> None:  # nothing to keep alive; graces still end
        if self.lapse_grace > 0:
            self._expire_lapsed_loop(stop)

    def dump(self) -> dict[str, Any]:
        """The mirror as JSON-able data (what `restore` takes back)."""
        with self._lock:
            kvs = list(self._kvs.values())
            rev = self._revision
        return {"revision": rev, "kvs": [kv_to_json(kv) for kv in kvs]}

    def restore(self, data: dict[str, Any]) -> None:
        """Fill the mirror from `dump` output: a view to plan with until the live one has synced."""
        kvs = {kv.key: kv for kv in map(kv_from_json, data["kvs"])}
        with self._lock:
            self._kvs = kvs
            self._revision = int(data["revision"])
            self._synced = True
            self._ready = False
            self._reason = "not connected yet: planning with the view saved before the agent restarted"

    def records(self) -> dict[str, bytes]:
        """The raw values of the view (the mirror and the lapsed records it still keeps), by the key
        they have in their own cluster's etcd."""
        with self._lock:
            kvs = [*self._kvs.values(), *(kv for kv, _ in self._lapsed.values())]
            return {cluster_prefix(self.cluster.name) + kv.key[len(self.prefix):]: kv.value for kv in kvs}

    def view_key(self) -> tuple[Any, ...]:
        """Changes whenever snapshot() could: lets callers reuse a snapshot of thousands of records."""
        with self._lock:
            return self._revision, self._ready, self._synced, self._reason, len(self._kvs), len(self._lapsed)

    def published_identity(self) -> dict[str, Any] | None:
        with self._lock:
            kv = self._kvs.get(self.prefix + "cluster")  # cluster_key, or its copy in a cache
        if kv is None:
            return None
        try:
            d = parse_record(kv, kv.key)
        except InputError as e:
            return {"error": e.reason}
        return d if isinstance(d, dict) else {"error": "is not a mapping"}


class RemoteCluster:
    """One remote cluster: its connection thread and its status."""

    def __init__(self, cfg: RemoteConfig, changed: Callable[[], None], previous: RemoteCluster | None = None,
                 cache_file: Path | None = None, via: tuple[EtcdClient, str] | None = None,
                 lapse_grace: float = 0.0) -> None:
        self.cfg = cfg
        # The last good view is saved here, so an agent restarted while this cluster's etcd is
        # away still plans with it (learned routes stay, as they do without a restart).
        self.cache_file = cache_file
        self._dirty = False
        self._saved_at = 0.0
        # A changed file (a rotated certificate, a new endpoint) reconnects; until the new
        # connection has synced, the previous one's last view keeps the routes in place.
        self.previous = previous
        # `via`: read the cluster's records from another etcd under a prefix (the local cluster's
        # cache, backends.clustermesh_cache) instead of from the cluster's own etcd.
        self.client = via[0] if via is not None else EtcdClient(
            cfg.endpoints, ca=cfg.ca_file, cert=cfg.cert_file, key=cfg.key_file, timeout=2.0,
            user=cfg.username, password_file=cfg.password_file)
        self.backend = ReadOnlyEtcdBackend(self.client, Cluster(name=cfg.name), via[1] if via is not None else None,
                                           lapse_grace=lapse_grace)
        self.backend.record_cluster = cfg.name
        self._changed = changed
        self._stop = threading.Event()
        self.reconnects = 0
        self.last_change = 0.0
        self.last_sync = 0.0
        self._was_ready = False
        self._snap: tuple[tuple[Any, ...], ClusterState] | None = None
        self.thread = threading.Thread(target=self._run, name=f"clustermesh-{cfg.name}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        """Stop following; the watch stream's connection closes now, not at its idle timeout (a
        direct connection dropped for the cache must leave the remote etcd at once)."""
        self._stop.set()
        self.backend.close()

    def snapshot(self) -> ClusterState:
        """The backend's snapshot, reused while nothing changed (a reconcile and a status request
        each ask for it)."""
        key = self.backend.view_key()
        if self._snap is None or self._snap[0] != key:
            self._snap = (key, self.backend.snapshot())
        return self._snap[1]

    @classmethod
    def from_cache(cls, cfg: RemoteConfig, cache_file: Path) -> RemoteCluster | None:
        """A never-started stand-in holding the view saved by an earlier agent, or None. A view
        saved under another configuration (other endpoints or trust) is not used: it was learned
        from a source the current file no longer vouches for."""
        try:
            data = json.loads(cache_file.read_text())
            if data.get("config") != config_fingerprint(cfg):
                log.info("clustermesh %s: the saved view was learned under another configuration; not used",
                         cfg.name)
                return None
            rc = cls(cfg, lambda: None)
            rc.backend.restore(data)
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("clustermesh %s: ignoring the saved view %s: %s", cfg.name, cache_file, e)
            return None
        return rc

    def save_if_dirty(self, min_interval: float = 2.0) -> None:
        """Write the mirror to the cache file (atomically), at most every `min_interval` s."""
        if not (self._dirty and self.cache_file) or time.monotonic() - self._saved_at < min_interval:
            return
        self._dirty = False
        self._saved_at = time.monotonic()
        try:
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.cache_file.with_suffix(".tmp")
            tmp.write_text(json.dumps({**self.backend.dump(), "config": config_fingerprint(self.cfg)}))
            os.replace(tmp, self.cache_file)
        except OSError as e:
            log.warning("clustermesh %s: cannot save the view to %s: %s", self.cfg.name, self.cache_file, e)

    def _on_change(self) -> None:
        now = time.time()
        snap_ready = self.snapshot().ready
        if snap_ready:
            self.last_sync = now
            self._dirty = True
        if self._was_ready and not snap_ready:
            self.reconnects += 1
        self._was_ready = snap_ready
        self.last_change = now
        self._changed()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.backend.run(self._stop, self._on_change)
            except Exception as e:  # a bug must not kill the thread silently
                log.exception("clustermesh %s: %s", self.cfg.name, e)
                self._stop.wait(1.0)

    def state(self, local: Cluster) -> tuple[ClusterState | None, str]:
        """The remote view to plan with (None if refused or never seen) and why it is not ready."""
        snap = self.snapshot()
        if snap.revision == 0 and not snap.ready:
            first = snap.reason in ("", "not yet listed")
            why = "connecting" if first else _tls_reason(snap.reason)
            if self.previous is not None:
                kept, _ = self.previous.state(local)
                return kept, why
            return None, why
        self.previous = None
        ident = self.backend.published_identity()
        if ident is None:
            return None, (f"no cluster record at {cluster_key(self.cfg.name)} in its etcd: "
                          f"is the file named after the cluster?{self._other_names()}")
        if "error" in ident:
            return None, f"{cluster_key(self.cfg.name)}: {ident['error']}"
        try:
            name = fields.cluster_name(ident.get("name"), "cluster.name")
            cid = fields.cluster_id(ident.get("id"), "cluster.id")
        except InputError as e:
            return None, f"published {e}"
        if name != self.cfg.name:
            return None, f"published cluster name {name!r} does not match the file name {self.cfg.name!r}"
        if cid == local.id:
            return None, f"cluster id {cid} is the local cluster's id"
        st = replace(snap, cluster=Cluster(name=name, id=cid))
        return st, "" if snap.ready else (_tls_reason(snap.reason) or snap.reason or "not ready")

    def records(self) -> dict[str, bytes]:
        """The raw records of the view `state` plans with (the previous connection's until this
        one has synced), by their key in the cluster's own etcd."""
        snap = self.snapshot()
        if snap.revision == 0 and not snap.ready and self.previous is not None:
            return self.previous.records()
        return self.backend.records()

    def _other_names(self) -> str:
        try:
            kvs, _ = self.client.range(f"{ROOT}/", prefix=True, keys_only=True)
        except EtcdError:
            return ""
        names = sorted({kv.key.split("/")[2] for kv in kvs if kv.key.endswith("/cluster") and kv.key.count("/") == 3})
        return f" (its etcd holds: {', '.join(names)})" if names else ""


def _tls_reason(reason: str) -> str:
    """Name the usual certificate problems plainly."""
    r = reason.lower()
    if "certificate verify failed" in r or "unknown ca" in r or "self-signed" in r or "self signed" in r:
        return f"TLS: the server's certificate is not signed by ca-file ({reason})"
    if "bad certificate" in r or "certificate required" in r or "alert" in r and "certificate" in r:
        return f"TLS: the server refused our client certificate ({reason})"
    return reason


class RemoteClusters:
    """Every remote cluster of `--clustermesh-dir`, for the agent's reconcile loop."""

    def __init__(self, directory: str | Path, local: Cluster, changed: Callable[[], None], *,
                 poll: float = 0.5, cache_dir: str | Path | None = None, cache: CacheUse | None = None,
                 lapse_grace: float = 0.0) -> None:
        self.dir = Path(directory)
        # How long a remote node whose lease ran out stays in the view (ReadOnlyEtcdBackend).
        self.lapse_grace = lapse_grace
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        self.local = local
        self._changed = changed
        self.poll = poll
        self._lock = threading.Lock()
        self._remotes: dict[str, RemoteCluster] = {}
        self._errors: dict[str, str] = {}          # file name -> why it cannot be used
        self._seen: dict[str, float] = {}          # file name -> mtime
        self._status: dict[str, dict[str, Any]] = {}
        self._status_key: tuple[Any, ...] | None = None
        self._rejections: dict[str, list[Rejection]] = {}
        self._admission = RemoteAdmission()  # used by the reconcile pass only
        # Each remote cluster's topology with the leaders its own reports choose (mesh/leaders.py),
        # kept while its records and reports are the same objects: cluster -> (key, topology).
        self._led: dict[str, tuple[tuple[object, ...], tuple[Node, ...], Topology]] = {}
        # With a cache (backends.clustermesh_cache): each cluster is read from the local etcd's
        # cache prefix while the cache serves it; `_remotes` then holds only the direct
        # connections of clusters the cache does not serve (fallback), each planning with the
        # cached view until it has synced, so no route goes while switching.
        self.cache = cache
        self._cached: dict[str, RemoteCluster] = {}
        self._health: dict[str, str] = {}          # cluster -> "" (served by the cache) or why not
        self._health_client: EtcdClient | None = cache.connect() if cache is not None else None
        self._heartbeat: tuple[bytes | None, float] = (None, float("-inf"))  # last read value, when read
        self._configs: dict[str, RemoteConfig] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch_dir, name="clustermesh-dir", daemon=True)

    def start(self) -> None:
        self._scan()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for r in [*self._remotes.values(), *self._cached.values()]:
                r.stop()
        if self._health_client is not None:
            self._health_client.close()

    def _cache_file(self, name: str) -> Path | None:
        return self.cache_dir / f"{name}.json" if self.cache_dir is not None else None

    def _watch_dir(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self._scan()
                if self.cache is not None:
                    self._follow_cache()
                with self._lock:
                    remotes = list(self._remotes.values())
                for r in remotes:
                    r.save_if_dirty()
            except Exception as e:  # keep watching whatever one scan met
                log.exception("clustermesh dir: %s", e)

    def _scan(self) -> None:
        files: dict[str, float] = {}
        if self.dir.is_dir():
            for p in self.dir.iterdir():
                if p.is_file() and config_name(p.name) is not None:
                    files[p.name] = p.stat().st_mtime
        changed = False
        with self._lock:
            for fname in set(self._seen) - set(files):
                changed = True
                self._errors.pop(fname, None)
                name = _cluster_of(fname)
                self._configs.pop(name, None)
                for r in (self._remotes.pop(name, None), self._cached.pop(name, None)):
                    if r is not None:
                        log.info("clustermesh: %s removed; draining its routes", name)
                        r.stop()
                cache = self._cache_file(name)
                if cache is not None:
                    cache.unlink(missing_ok=True)
            for fname, mtime in files.items():
                if self._seen.get(fname) == mtime:
                    continue
                changed = True
                name = _cluster_of(fname)
                try:
                    cfg = parse_config(self.dir / fname)
                except (InputError, MeshError) as e:
                    # A broken edit keeps the running connection: fix the file, nothing drains.
                    self._errors[fname] = str(e)
                    log.error("clustermesh: %s", e)
                    continue
                self._errors.pop(fname, None)
                self._configs[cfg.name] = cfg
                if self.cache is not None:
                    self._start_cached(cfg)
                    if cfg.name not in self._remotes:
                        continue  # the direct connection starts only if the cache does not serve it
                old = self._remotes.pop(name, None)
                if old is not None:
                    old.stop()
                    old.previous = None
                cache = self._cache_file(cfg.name)
                if old is None and cache is not None and cache.exists():
                    old = RemoteCluster.from_cache(cfg, cache)
                r = RemoteCluster(cfg, self._changed, previous=old, cache_file=cache, lapse_grace=self.lapse_grace)
                self._remotes[cfg.name] = r
                r.start()
                log.info("clustermesh: connecting to %s at %s", cfg.name, ", ".join(cfg.endpoints))
            self._seen = files
        if changed:
            self._changed()

    def _start_cached(self, cfg: RemoteConfig) -> None:
        """(Re)start the watch of `cfg`'s cluster in the local cache (lock held)."""
        assert self.cache is not None
        old = self._cached.pop(cfg.name, None)
        if old is not None:
            old.stop()
        r = RemoteCluster(cfg, self._changed, via=(self.cache.connect(), cached_cluster_prefix(self.cache.local,
                                                                                             cfg.name)))
        self._cached[cfg.name] = r
        r.start()

    def _follow_cache(self) -> None:
        """Read the cache's heartbeat; connect directly to each cluster it does not serve, and
        drop the direct connection again once it does and its cached view has synced."""
        assert self.cache is not None and self._health_client is not None
        try:
            kv = self._health_client.get(cache_status_key(self.cache.local))
            raw, unreachable = (kv.value if kv is not None else None), ""
            self._heartbeat = (raw, time.monotonic())
        except EtcdError as e:
            # A read that failed (a slow etcd, a busy node) says nothing about the cache: the last
            # heartbeat read stands (its own age still counts) for as long as the cache's key would
            # outlive a killed cache; reads failing longer than that are a verdict.
            last, at = self._heartbeat
            if time.monotonic() - at < HEARTBEAT_TTL:
                raw, unreachable = last, ""
            else:
                raw, unreachable = None, f"cannot read the heartbeat: {e}"
        now = time.time()
        changed = False
        with self._lock:
            for name, cfg in self._configs.items():
                why = unreachable or cache_health(raw, now, name)
                if self._health.get(name) != why:
                    changed = True
                    log.info("clustermesh %s: %s", name, "via cache" if not why else f"direct (cache unhealthy: {why})")
                self._health[name] = why
                cached = self._cached.get(name)
                direct = self._remotes.get(name)
                if why and direct is None:
                    r = RemoteCluster(cfg, self._changed, previous=cached, cache_file=self._cache_file(name),
                                      lapse_grace=self.lapse_grace)
                    self._remotes[name] = r
                    r.start()
                    changed = True
                elif not why and direct is not None and cached is not None and cached.snapshot().ready:
                    del self._remotes[name]
                    direct.stop()
                    changed = True
        if changed:
            self._changed()

    def _source(self, name: str) -> RemoteCluster | None:
        """The view a cluster is planned with: direct when connected directly, else the cache's."""
        return self._remotes.get(name) or self._cached.get(name)

    def records(self) -> dict[str, dict[str, bytes]]:
        """Each configured cluster's raw records, as the view it is planned with holds them."""
        with self._lock:
            names = sorted(set(self._remotes) | set(self._cached))
            srcs = [(n, self._source(n)) for n in names]
        return {n: r.records() for n, r in srcs if r is not None}

    def undecided(self) -> frozenset[str]:
        """Configured clusters whose view is not known yet (connecting, no saved view)."""
        with self._lock:
            return frozenset(n for n, s in self._status.items() if s.get("undecided"))

    def states(self) -> list[ClusterState]:
        """Remote views to plan with: refused clusters (name or id collisions, `identity_refusals`,
        or no identity) are left out, every claimant of a shared id named in its status line; a
        cluster whose etcd went away keeps its last good view."""
        with self._lock:
            names = sorted(set(self._remotes) | set(self._cached))
            remotes = [r for r in (self._source(n) for n in names) if r is not None]
            errors = dict(self._errors)
        out: list[ClusterState] = []
        status: dict[str, dict[str, Any]] = {}
        judged = [(r, *r.state(self.local)) for r in remotes]
        clash = identity_refusals(self.local, [st.cluster for _, st, _ in judged if st is not None])
        for r, st, reason in judged:
            if st is not None and st.cluster.name in clash:
                reason, st = clash[st.cluster.name], None
            snap = r.snapshot()
            if snap.ready:  # the watch is live: the view is current now
                r.last_sync = time.time()
            status[r.cfg.name] = {
                "name": r.cfg.name, "ready": st is not None and not reason, "reason": reason,
                "undecided": st is None and not snap.ready and r.cfg.name not in clash,
                "nodes": len(st.nodes) if st is not None else 0,
                "record_rejections": [{"name": x.name, "reason": x.reason} for x in snap.rejections],
                "endpoints": list(r.cfg.endpoints),
                "connected": snap.ready,
                "last_change": r.last_change or None,
                "last_sync": r.last_sync or None,  # the age is worked out when status() is read
                "reconnects": r.reconnects,
            }
            if st is not None:
                out.append(st)
        for fname, err in errors.items():
            name = _cluster_of(fname)
            status[name] = {"name": name, "ready": False, "reason": err, "nodes": 0, "record_rejections": [],
                            "endpoints": [], "connected": False, "last_change": None, "last_sync": None,
                            "reconnects": 0}
        with self._lock:
            self._status = status
            self._status_key = self._views_key()
        return out

    def _views_key(self) -> tuple[Any, ...]:
        """Changes whenever a remote's view, connection or the file set does (call with _lock held)."""
        return (tuple((n, r.backend.view_key()) for n, r in sorted(self._remotes.items())),
                tuple((n, r.backend.view_key()) for n, r in sorted(self._cached.items())),
                tuple(sorted(self._errors.items())), tuple(sorted(self._health.items())))

    def admit(self, local: Topology) -> tuple[list[Remote], list[Rejection]]:
        """The remote records that may join the local plan (mesh.admit.admit_remotes, memoised
        per cluster), with the rejections recorded per cluster for status and metrics."""
        states = self.states()
        with gc_paused():
            remotes, rejections = self._admission.admit(local, [self._led_topology(s) for s in states])
        per: dict[str, list[Rejection]] = {}
        for rej in rejections:
            per.setdefault(rej.name.split("/", 1)[0], []).append(rej)
        with self._lock:
            self._rejections = per
        return remotes, rejections

    def _led_topology(self, st: ClusterState) -> Topology:
        """A remote cluster's topology planning with the leaders its agents choose from the reports
        its nodes publish (the same rule on the same facts: both clusters agree on who leads)."""
        reports = tuple(sorted((n, id(r)) for n, r in st.forwarding.items()))
        hit = self._led.get(st.cluster.name)
        if hit is not None and hit[0] == (st.cluster, st.mesh, reports) and same_items(hit[1], st.nodes):
            return hit[2]
        topo = st.topology()
        topo = with_leaders(topo, choose_leaders(topo, st.forwarding))
        self._led[st.cluster.name] = ((st.cluster, st.mesh, reports), st.nodes, topo)
        return topo

    def mirrors(self) -> dict[str, EtcdBackend]:
        """Each remote cluster's mirror of its etcd, by name (agent.global_services reads its
        service records from it)."""
        with self._lock:
            return {n: r.backend for n, r in self._remotes.items()}

    def status(self) -> dict[str, Any]:
        """The ClusterMesh block of `/status` (`ClusterMesh: 1/1 remote clusters ready`): per
        cluster, ready or why not, nodes, rejected records (unparsable ones and those refused by
        admission), endpoints, connection, last change. Current on every call: recomputed only when
        a remote view changed since the last `states()` (the reconcile pass that just ran it)."""
        with self._lock:
            stale = self._status_key != self._views_key()
        if stale:
            self.states()
        with self._lock:
            base = [dict(self._status[k]) for k in sorted(self._status)]
            per = dict(self._rejections)
        clusters = []
        now = time.time()
        for c in base:
            admitted_out = per.get(c["name"], [])
            refused = next((r.reason for r in admitted_out if r.name == c["name"]), None)
            rejections = c.pop("record_rejections") + [{"name": r.name, "reason": r.reason}
                                                        for r in admitted_out if r.name != c["name"]]
            if refused:
                c["ready"], c["reason"] = False, refused
            c.pop("undecided", None)
            synced = c.pop("last_sync")
            # while the view is current (connected) it is current now; else its age grows
            c["last_sync_age"] = 0.0 if c["connected"] else (round(now - synced, 3) if synced else None)
            c["rejected"] = len(rejections)
            c["rejections"] = rejections[:50]
            clusters.append(c)
        ready = sum(1 for c in clusters if c["ready"])
        out: dict[str, Any] = {"ready": ready, "total": len(clusters), "clusters": clusters}
        if self.cache is not None:
            with self._lock:
                health = dict(self._health)
            out["via"] = via_line(health)
        return out

    def report(self) -> RemotesStatus:
        """`status()`, typed: the ClusterMesh block as the agent's status carries it."""
        st = self.status()
        clusters = tuple(ClusterReport(
            c["name"], c["ready"], c["reason"], c["nodes"], tuple(c["endpoints"]), c["connected"], c["last_change"],
            c["reconnects"], c["last_sync_age"], c["rejected"],
            tuple(Rejected(r["name"], r["reason"]) for r in c["rejections"])) for c in st["clusters"])
        return RemotesStatus(st["ready"], st["total"], clusters, via=st.get("via"))


def _cluster_of(fname: str) -> str:
    return fname.removesuffix(".yaml").removesuffix(".yml")


# Files that sit beside the configs in Cilium's layout (a mounted cilium-clustermesh Secret:
# `cluster2` next to `cluster2.etcd-client.crt`, `.key`, `.ca.crt`, and the Secret volume's
# `..data` links): never clusters.
_NOT_CONFIG_SUFFIXES = (".crt", ".key", ".pem", ".csr")


def config_name(fname: str) -> str | None:
    """The cluster a clustermesh directory entry configures, or None for everything else there:
    hidden entries, certificates and keys, and names that are not cluster names."""
    if fname.startswith(".") or fname.endswith(_NOT_CONFIG_SUFFIXES):
        return None
    name = _cluster_of(fname)
    try:
        fields.cluster_name(name, "")
    except InputError:
        return None
    return name


def via_line(health: dict[str, str]) -> str:
    """How the clusters are followed: `via cache`, or `direct (cache unhealthy: <why>)` naming
    each cluster the cache does not serve (`health`: cluster -> "" or why not)."""
    bad = {n: why for n, why in sorted(health.items()) if why}
    if health and not bad:
        return "via cache"
    if not bad:
        return "direct (cache unhealthy: no heartbeat read yet)"
    whys = set(bad.values())
    if len(whys) == 1:
        return f"direct (cache unhealthy: {whys.pop()})"
    return "direct (cache unhealthy: " + "; ".join(f"{n}: {w}" for n, w in bad.items()) + ")"


def summary_line(status: dict[str, Any]) -> str:
    """`ClusterMesh: 1/1 remote clusters ready, 2 global-services`, then `, 1 exports, 2 imports`
    where the cluster serves the Multi-Cluster Services API, then `, via cache` or
    `, direct (cache unhealthy: ...)` when a cache is configured (`services`, `clusterset`:
    agent.global_services)."""
    via = f", {status['via']}" if status.get("via") else ""
    cs = status.get("clusterset")
    mcs = f", {cs.get('exports') or 0} exports, {len(cs.get('imports') or ())} imports" if cs else ""
    return (f"ClusterMesh: {status['ready']}/{status['total']} remote clusters ready, "
            f"{len(status.get('services') or ())} global-services{mcs}{via}")
