# SPDX-License-Identifier: Apache-2.0
"""The etcd backend: node records under `/meshctl/<cluster>/`, kept in memory by list + watch.

Key layout (docs/agent.md):
    /meshctl/<cluster>/cluster        {"name", "id", "subnet"}     created if absent by the first agent
    /meshctl/<cluster>/mesh           records.mesh_to_record       changeable at run time
    /meshctl/<cluster>/nodes/<name>   records.node_to_record       attached to the agent's lease
    /meshctl/<cluster>/peers/<name>   a peer record (records.parse_peer)
    /meshctl/<cluster>/services/<namespace>/<name>   a global Service's ready endpoints (mesh.services),
                                      written by the cluster's elected agent (agent.global_services)
    /meshctl/<cluster>/mcs/exports/<namespace>/<name>  a ServiceExport's Service (mesh.mcs.Export) and
    /meshctl/<cluster>/mcs/missing/<namespace>/<name>  an import whose namespace the cluster lacks,
                                      written by the cluster-mesh cache (backends.kube.mcs_controller)
    /meshctl/<cluster>/forwarding/<name>  leaders.ForwardingReport  on the same lease; watched: a
                                      changed verdict wakes every agent (a heartbeat that only
                                      moves the report's time does not)
    /meshctl-seen/<cluster>/<name>    observed.NodeSeen            on the same lease; outside the
                                      watched prefix, so no agent wakes for another's summary

The watch thread mirrors the prefix into a dict; `snapshot()` parses from that mirror, caching each
record's parse by its mod_revision, so a reconcile over 5,000 records costs only the changed ones.
Records are parsed one at a time: a bad one becomes a Rejection and never hides the others.
When etcd is unreachable the last good mirror stays (ready=False): the agent keeps its routes.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from meshctl.backends.base import BackendStatus, ClusterState, OwnRecord, RecordMirror
from meshctl.errors import InputError, MeshError
from meshctl.etcd import Compacted, EtcdClient, EtcdError, KeyValue, WatchIdle
from meshctl.mesh import records
from meshctl.mesh.admit import Rejection
from meshctl.mesh.leaders import ForwardingReport, report_of
from meshctl.mesh.model import Cluster, MeshSettings, Node, Peer
from meshctl.mesh.observed import MAX_SEEN_BYTES, NodeSeen, summary_of
from meshctl.mesh.services import MAX_SERVICE_RECORD_BYTES, RecordIn

log = logging.getLogger("meshctl.etcd")

ROOT = "/meshctl"


def cluster_prefix(cluster: str) -> str:
    return f"{ROOT}/{cluster}/"


def node_key(cluster: str, name: str) -> str:
    return f"{ROOT}/{cluster}/nodes/{name}"


def peer_key(cluster: str, name: str) -> str:
    return f"{ROOT}/{cluster}/peers/{name}"


def services_prefix(cluster: str) -> str:
    return f"{ROOT}/{cluster}/services/"


def service_key(cluster: str, namespace: str, name: str) -> str:
    """A global Service's published endpoints (mesh.services): one record per Service and cluster."""
    return f"{services_prefix(cluster)}{namespace}/{name}"


def split_service_key(key: str, kind: str = "services") -> tuple[str, str, str] | None:
    """(cluster, namespace, name) of a service key (or, with `kind`, of an MCS key: `mcs/exports`,
    `mcs/missing`), or None for any other key."""
    parts = key.split("/")
    depth = kind.count("/")
    if len(parts) != 6 + depth or parts[0] != "" or f"/{parts[1]}" != ROOT or "/".join(parts[3:4 + depth]) != kind:
        return None
    return parts[2], parts[4 + depth], parts[5 + depth]


def mcs_prefix(cluster: str) -> str:
    """What the cluster-mesh cache publishes for the Multi-Cluster Services API (mesh.mcs)."""
    return f"{ROOT}/{cluster}/mcs/"


def remote_records(mirrors: Mapping[str, RecordMirror], admitted: Collection[str],
                   kind: str = "services") -> list[RecordIn]:
    """The `kind` records (global services, or mcs/exports, mcs/missing) of every admitted remote
    cluster (by name), as its mirror holds them (its own prefix only: the watcher mirrors nothing
    else), in key order, each decoded under the size limit or carrying why it could not be."""
    out = []
    for name, m in sorted(mirrors.items()):
        if name not in admitted:
            continue
        for kv in sorted(m.records_under(f"{cluster_prefix(name)}{kind}/"), key=lambda kv: kv.key):
            if (parts := split_service_key(kv.key, kind)) is None:
                continue
            try:
                doc, error = parse_record(kv, kv.key, MAX_SERVICE_RECORD_BYTES), None
            except InputError as e:
                doc, error = None, str(e)
            out.append(RecordIn(name, parts[0], parts[1], parts[2], kv.key, doc, error))
    return out


MCS_EXPORTS = "mcs/exports"  # /meshctl/<cluster>/mcs/exports/<namespace>/<name>: one export (mesh.mcs.Export)
MCS_MISSING = "mcs/missing"  # /meshctl/<cluster>/mcs/missing/<namespace>/<name>: an import without its namespace


def mcs_key(kind: str, cluster: str, namespace: str, name: str) -> str:
    return f"{ROOT}/{cluster}/{kind}/{namespace}/{name}"


STATUS = "status/"  # /meshctl/<cluster>/status/...: what one agent says for the others' `status`


def services_status_key(cluster: str) -> str:
    """The elected global-services agent's account of the cluster's global Services and
    Multi-Cluster Services (agent.global_services), which every other agent's `status` shows."""
    return f"{ROOT}/{cluster}/{STATUS}global-services"


def forwarding_prefix(cluster: str) -> str:
    return f"{ROOT}/{cluster}/forwarding/"


def forwarding_key(cluster: str, name: str) -> str:
    """A node's forwarding report (mesh/leaders.py): its verdicts on the members of its location."""
    return f"{forwarding_prefix(cluster)}{name}"


def mesh_key(cluster: str) -> str:
    return f"{ROOT}/{cluster}/mesh"


def cluster_key(cluster: str) -> str:
    return f"{ROOT}/{cluster}/cluster"


SEEN_ROOT = "/meshctl-seen"


def seen_prefix(cluster: str) -> str:
    return f"{SEEN_ROOT}/{cluster}/"


def seen_key(cluster: str, name: str) -> str:
    return f"{seen_prefix(cluster)}{name}"


def read_seen(client: EtcdClient, cluster: str) -> tuple[dict[str, NodeSeen], list[str]]:
    """Every node's summary of `cluster`, by node, and a line per summary refused: not JSON, too
    large, or claiming another node or cluster than its key (a node's credentials write only its
    own key, so a summary that names someone else was not written by them)."""
    kvs, _ = client.range(seen_prefix(cluster), prefix=True)
    seen: dict[str, NodeSeen] = {}
    refused: list[str] = []
    for kv in kvs:
        name = kv.key.removeprefix(seen_prefix(cluster))
        try:
            s = summary_of(parse_record(kv, kv.key, MAX_SEEN_BYTES), kv.key, name, "its key")
            if s.cluster != cluster:
                raise InputError(kv.key, s.cluster, "names another cluster than its key")
        except (InputError, MeshError) as e:
            refused.append(str(e))
            continue
        seen[name] = s
    return seen, refused


def parse_report(kv: KeyValue, name: str, cluster: str) -> ForwardingReport:
    """The forwarding report at `kv`, written by node `name` of `cluster` (its key says so)."""
    return report_of(parse_record(kv, kv.key), kv.key, name, cluster, "the key")


def same_but_time(old: str | bytes | None, new: str | bytes) -> bool:
    """Two texts of one node's forwarding report that differ at most in the report's time `at` (a
    heartbeat, which changes no decision: stores keep it without waking the agents)."""
    if old is None:
        return False
    try:
        a, b = json.loads(old), json.loads(new)
    except ValueError:
        return False
    return isinstance(a, dict) and isinstance(b, dict) and {**a, "at": 0} == {**b, "at": 0}


def cluster_record(cluster: Cluster, mesh: MeshSettings) -> dict[str, Any]:
    return {"name": cluster.name, "id": cluster.id, "subnet": str(mesh.subnet)}


def write_topology(client: EtcdClient, cluster: Cluster, mesh: MeshSettings, peers: tuple[Peer, ...] = ()) -> None:
    """Seed a cluster's settings (the lab, the benchmarks, an operator's first setup)."""
    client.put(cluster_key(cluster.name), json.dumps(cluster_record(cluster, mesh)))
    client.put(mesh_key(cluster.name), json.dumps(records.mesh_to_record(mesh)))
    for p in peers:
        rec: dict[str, Any] = {"name": p.name, "public_key": p.public_key,
                               "allowed_ips": [str(a) for a in p.allowed_ips]}
        if p.endpoint is not None:
            rec["endpoint"] = str(p.endpoint)
        if p.persistent_keepalive is not None:
            rec["persistent_keepalive"] = p.persistent_keepalive
        if p.preshared_key is not None and p.preshared_key.source == "file":
            rec["preshared_key_file"] = p.preshared_key.name
        client.put(peer_key(cluster.name, p.name), json.dumps(rec))


LAPSE_CHECK_S = 0.5  # how often a read-only view ends lapse graces that ran out
MAX_RECORD_BYTES = 64 * 1024  # a node record is a few hundred bytes; anything past this is not one


def withdraw_record(client: EtcdClient, cluster: str, name: str) -> None:
    """Delete a node's record for good (`meshctl cleanup`): first taken off its lease, so peers
    see a record without a lease go and drop it at once instead of keeping it through a lapse grace."""
    key = node_key(cluster, name)
    kv = client.get(key)
    if kv is not None and kv.lease:
        client.put(key, kv.value)
    client.delete(key)


def kv_to_json(kv: KeyValue) -> dict[str, Any]:
    """One mirrored key as JSON-able data (a saved view, lapsing records handed to the next agent)."""
    return {"key": kv.key, "value": base64.b64encode(kv.value).decode(), "create_revision": kv.create_revision,
            "mod_revision": kv.mod_revision, "lease": kv.lease}


def kv_from_json(d: Mapping[str, Any]) -> KeyValue:
    """kv_to_json's data back (KeyError, ValueError, TypeError when it is not that)."""
    return KeyValue(str(d["key"]), base64.b64decode(d["value"]), int(d["create_revision"]), int(d["mod_revision"]),
                    int(d.get("lease", 0)))


def parse_record(kv: KeyValue, path: str, limit: int = MAX_RECORD_BYTES) -> Any:
    """The JSON of a record; a record larger than `limit` is refused unread, so a huge value costs
    no parsing (and delays no other record's admission)."""
    if len(kv.value) > limit:
        raise InputError(path, f"{len(kv.value)} bytes", f"is larger than a record may be ({limit} bytes)")
    try:
        return json.loads(kv.value)
    except (ValueError, UnicodeDecodeError):
        raise InputError(path, kv.value[:40].decode(errors="replace"), "is not JSON") from None


class EtcdBackend:
    """Implements backend.Backend over etcd. `lease_ttl` is how long a dead agent's record lives."""

    # The `cluster` field of parsed nodes: "" for the local cluster; a remote cluster's watcher
    # sets its name, so its nodes are `cluster2/g1` from the start (no copy per reconcile).
    record_cluster = ""

    def __init__(self, client: EtcdClient, cluster: Cluster, *, lease_ttl: int = 10,
                 default_mesh: MeshSettings | None = None, lease_file: Path | None = None,
                 lapse_grace: float = 0.0, lapsing_file: Path | None = None) -> None:
        self.client = client
        self.cluster = cluster
        self.lease_ttl = lease_ttl
        self.prefix = cluster_prefix(cluster.name)
        self.default_mesh = default_mesh or MeshSettings()
        self._lock = threading.Lock()
        self._kvs: dict[str, KeyValue] = {}
        self._revision = 0
        self._synced = False
        self._ready = False
        self._reason = "not yet listed"
        self._parsed: dict[str, tuple[int, Node | Peer | Rejection]] = {}
        self._reports: dict[str, tuple[int, ForwardingReport | Rejection]] = {}
        self._last_mesh: MeshSettings = self.default_mesh
        self._lease = 0
        self._published: Node | None = None
        self._published_value: str | None = None
        self._pub_lock = threading.Lock()
        self.lease_losses = 0
        # A restarting agent takes over its predecessor's lease (kept in the state dir) if the
        # lease is still alive, so a restart shorter than the TTL leaves its record in place.
        self.lease_file = lease_file
        # A node record whose lease ran out stays in the view this long (its agent is restarting,
        # or stopped): peers keep its routes and WireGuard peer, so a restart of up to
        # `lapse_grace` seconds loses nothing. Records without a lease, or withdrawn (see
        # withdraw_record), go at once.
        self.lapse_grace = lapse_grace
        self._lapsed: dict[str, tuple[KeyValue, float]] = {}  # key -> (last value, until when)
        # The graces outlive this agent: `close` hands the node records it would keep through a
        # lapse to the next agent of this node in `lapsing_file`, and that agent's first list keeps
        # those it no longer finds (see hand_over_lapsing). Else a node whose agent restarts while
        # another's is away (a rolling update slower than the lease) drops that node's routes.
        self.lapsing_file = lapsing_file
        self._took_over = False
        self._changed: Callable[[], None] | None = None
        # Our own record, watched: deleted or changed by anyone else, it is put back at once.
        self._kick = threading.Event()
        self._tampered: str | None = None
        self._writing: str | None = None
        self.restored_total = 0
        self.last_restored: str | None = None

    # --- publishing ----------------------------------------------------------------------

    def publish(self, node: Node) -> None:
        """Put our record on our lease (granting one if needed). Raises EtcdError when etcd is
        down; the keepalive thread puts it again once etcd is back."""
        value = json.dumps(records.node_to_record(node), sort_keys=True)
        with self._pub_lock:
            self._published = node
            if value == self._published_value and self._lease:
                return
            self._put_own(value)

    def publish_seen(self, seen: NodeSeen) -> None:
        """Put this node's summary (agent.seen.SeenStore) on the record's lease, so it goes with the
        record; before the record has a lease there is nothing to describe yet, and nothing is written."""
        if self._published is None or seen.node != self._published.name or not self._lease:
            return
        self.client.put(seen_key(self.cluster.name, seen.node), json.dumps(seen.to_json(), sort_keys=True),
                        lease=self._lease)

    def publish_forwarding(self, report: ForwardingReport) -> None:
        """Put this node's forwarding report (agent.leadership.ForwardingStore) on the record's
        lease, so it goes with the record; nothing before the record has a lease."""
        if self._published is None or report.node != self._published.name or not self._lease:
            return
        self.client.put(forwarding_key(self.cluster.name, report.node), json.dumps(report.to_json(), sort_keys=True),
                        lease=self._lease)

    def _put_own(self, value: str) -> None:
        assert self._published is not None
        if not self._lease:
            self._lease = self._inherited_lease() or self.client.lease_grant(self.lease_ttl)
            if self.lease_file is not None:
                with contextlib.suppress(OSError):
                    self.lease_file.write_text(f"{self._lease}\n")
        self._writing = value
        self.client.put(node_key(self.cluster.name, self._published.name), value, lease=self._lease)
        self._published_value = value

    def _inherited_lease(self) -> int:
        if self.lease_file is None:
            return 0
        try:
            lease = int(self.lease_file.read_text().strip())
        except (OSError, ValueError):
            return 0
        try:
            return lease if self.client.lease_keepalive(lease) > 0 else 0
        except EtcdError:
            return 0

    def _keepalive_once(self) -> None:
        with self._pub_lock:
            if self._published is None:
                return
            value = json.dumps(records.node_to_record(self._published), sort_keys=True)
            tampered, self._tampered = self._tampered, None
            if self._lease:
                ttl = self.client.lease_keepalive(self._lease)
                if ttl > 0 and value == self._published_value and tampered is None:
                    return
                if ttl <= 0:
                    # Lease expired (etcd was away longer than the TTL): a new lease, the record again.
                    log.warning("lease %x expired; publishing %s again", self._lease, self._published.name)
                    self.lease_losses += 1
                    self._lease = 0
                    tampered = None  # the lease took the record, not someone else
            if tampered is not None:
                self.restored_total += 1
                self.last_restored = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {tampered}"
                log.warning("own record %s was %s by someone else: publishing it again (restored %d times)",
                            self._published.name, tampered, self.restored_total)
            self._put_own(value)

    def _keepalive_loop(self, stop: threading.Event) -> None:
        """Refreshes the lease every TTL/3, and at once when the watch saw our record tampered
        with; also ends lapse graces that ran out (and wakes the agent for them)."""
        interval = max(0.5, self.lease_ttl / 3)
        next_refresh = time.monotonic() + interval
        while not stop.is_set():
            self._kick.wait(min(interval, max(0.05, next_refresh - time.monotonic())))
            if stop.is_set():
                return
            self._end_lapsed_graces()
            kicked = self._kick.is_set()
            self._kick.clear()
            if not kicked and time.monotonic() < next_refresh:
                continue
            next_refresh = time.monotonic() + interval
            try:
                self._keepalive_once()
            except EtcdError as e:
                log.debug("keepalive: %s", e)
                if kicked:
                    self._tampered = self._tampered or "changed (restoring failed once)"
                    next_refresh = time.monotonic() + 0.2

    def ensure_cluster(self) -> None:
        """Create the cluster record if absent (for the cluster mesh); never overwrite it."""
        self.client.put_if_absent(cluster_key(self.cluster.name),
                                  json.dumps(cluster_record(self.cluster, self.default_mesh)))

    def withdraw(self, name: str) -> None:
        """Delete a node's record now (`meshctl cleanup`), instead of waiting for its lease."""
        with self._pub_lock:
            self._published = None
        withdraw_record(self.client, self.cluster.name, name)
        if self._lease:
            with contextlib.suppress(EtcdError):
                self.client.lease_revoke(self._lease)
            self._lease = 0

    # --- the mirror ----------------------------------------------------------------------

    def run(self, stop: threading.Event, changed: Callable[[], None]) -> None:
        self._changed = changed
        ka = threading.Thread(target=self._keepalive_loop, args=(stop,), name="etcd-keepalive", daemon=True)
        ka.start()
        backoff = 0.1
        while not stop.is_set():
            try:
                if not self._synced:
                    self._list()
                    try:
                        self.ensure_cluster()
                    except EtcdError as e:
                        log.debug("cluster record: %s", e)
                    self._set_ready(True, "")
                    changed()
                for rev, events in self.client.watch(self.prefix, prefix=True, start_revision=self._revision + 1):
                    backoff = 0.1
                    if stop.is_set():
                        return
                    if not self._ready:
                        self._set_ready(True, "")
                        changed()
                    if (events or rev > self._revision) and self._apply(rev, events):
                        changed()
            except Compacted as e:
                log.info("%s; listing again", e)
                self._synced = False
            except WatchIdle:
                continue
            except EtcdError as e:
                if stop.is_set():
                    return
                if self._ready or self._reason != str(e):
                    log.warning("%s", e)
                    self._set_ready(False, str(e))
                    changed()
                # After an outage, list again: it also picks up an etcd restored from a backup.
                self._synced = False
                stop.wait(backoff)
                backoff = min(backoff * 2, 1.0)
        self.client.close()

    def load_once(self) -> ClusterState:
        """One consistent read without a watch (`meshctl node list`, the benchmarks)."""
        self._list()
        self._set_ready(True, "")
        return self.snapshot()

    def _list(self) -> None:
        kvs, rev = self.client.range(self.prefix, prefix=True)
        with self._lock:
            new = {kv.key: kv for kv in kvs}
            for key, old in self._kvs.items():
                if key not in new:
                    self._gone(old)
            self._take_over_lapsing(new)
            for kv in kvs:
                self._came(kv)
            self._kvs = new
            self._revision = rev
            self._synced = True

    def _apply(self, rev: int, events: list[Any]) -> bool:
        """Mirror the events; True when one may change a plan (not a report's heartbeat, not a
        status record: no plan reads those)."""
        wakes = False
        fwd, status = self.prefix + "forwarding/", self.prefix + STATUS
        with self._lock:
            for e in events:
                said = e.kv.key.startswith(status)
                if e.type == "DELETE":
                    old = self._kvs.pop(e.kv.key, None)
                    if old is not None:
                        self._gone(old)
                    wakes = wakes or not said
                else:
                    old = self._kvs.get(e.kv.key)
                    self._kvs[e.kv.key] = e.kv
                    self._came(e.kv)
                    heartbeat = e.kv.key.startswith(fwd) and same_but_time(old.value if old else None, e.kv.value)
                    wakes = wakes or not (heartbeat or said)
            self._revision = max(self._revision, rev)
        return wakes

    def _own_key(self) -> str | None:
        pub = self._published
        return node_key(self.cluster.name, pub.name) if pub is not None else None

    def _gone(self, old: KeyValue) -> None:
        """A key left the store (lock held): our own record is put back; a node record that was
        on a lease (its agent's) lapses into the grace period."""
        if old.key == self._own_key():
            self._tampered = "deleted"
            self._kick.set()
        elif self._lapses(old):
            self._lapsed[old.key] = (old, time.monotonic() + self.lapse_grace)

    def _lapses(self, kv: KeyValue) -> bool:
        """Whether a record that leaves the store is kept through the lapse grace: a node record
        on a lease (its agent's). Records without one (withdrawn, written by hand) go at once."""
        return self.lapse_grace > 0 and bool(kv.lease) and kv.key.startswith(self.prefix + "nodes/")

    def hand_over_lapsing(self) -> None:
        """Write the node records this agent would keep through a lapse (those in the mirror, and
        those in their grace now, with its end) to `lapsing_file`, mode 0600, for the next agent of
        this node; its own record is left out (that agent publishes it)."""
        if self.lapsing_file is None:
            return
        now, wall = time.monotonic(), time.time()
        own = self._own_key()
        with self._lock:
            held = [(kv, wall + self.lapse_grace) for kv in self._kvs.values() if self._lapses(kv)]
            held += [(kv, wall + until - now) for kv, until in self._lapsed.values()]
        doc = {"records": [{**kv_to_json(kv), "until": round(until, 3)} for kv, until in held if kv.key != own]}
        tmp = self.lapsing_file.with_suffix(".tmp")
        try:
            self.lapsing_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, self.lapsing_file)
        except OSError as e:
            log.warning("cannot hand the lapsing records to the next agent in %s: %s", self.lapsing_file, e)

    def _take_over_lapsing(self, listed: Mapping[str, KeyValue]) -> None:
        """(lock held; once, at the first list) The records the previous agent handed over that
        the store no longer holds lapse now, until the end of their grace: their agents are away,
        and this node keeps routing to them as its previous agent would have."""
        path = self.lapsing_file
        if path is None or self._took_over:
            return
        self._took_over = True
        try:
            saved = json.loads(path.read_text())["records"]
            path.unlink()
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("ignoring the lapsing records handed over in %s: %s", path, e)
            return
        now, wall = time.monotonic(), time.time()
        kept = []
        for d in saved:
            try:
                kv, left = kv_from_json(d), min(float(d["until"]) - wall, self.lapse_grace)
            except (KeyError, ValueError, TypeError):
                continue
            if kv.key not in listed and left > 0 and self._lapses(kv):
                self._lapsed[kv.key] = (kv, now + left)
                kept.append(kv.key.rpartition("/")[2])
        if kept:
            log.info("records %s lapsed while this node's agent restarted: kept through their grace",
                     ", ".join(sorted(kept)))

    def _came(self, kv: KeyValue) -> None:
        """A key was written (lock held): a lapsed record is back; our own record written with
        another value or lease than ours is put back."""
        self._lapsed.pop(kv.key, None)
        if kv.key == self._own_key():
            value = kv.value.decode(errors="replace")
            if value not in (self._published_value, self._writing) or (self._lease and kv.lease != self._lease):
                self._tampered = "overwritten"
                self._kick.set()

    def _expire_lapsed_loop(self, stop: threading.Event) -> None:
        """End lapse graces that ran out (and wake the agent for them) until `stop`: the part of the
        keepalive loop a backend that publishes nothing still needs."""
        while not stop.wait(LAPSE_CHECK_S):
            self._end_lapsed_graces()

    def _end_lapsed_graces(self) -> None:
        if self._expire_lapsed() and self._changed is not None:
            self._changed()

    def _expire_lapsed(self) -> bool:
        """Forget lapsed records whose grace ran out; True if any went."""
        now = time.monotonic()
        with self._lock:
            gone = [k for k, (_, until) in self._lapsed.items() if until <= now]
            for k in gone:
                log.info("record %s lapsed %.0f s ago: removing it", k, self.lapse_grace)
                del self._lapsed[k]
        return bool(gone)

    def _set_ready(self, ready: bool, reason: str) -> None:
        with self._lock:
            self._ready, self._reason = ready, reason

    # --- the view ------------------------------------------------------------------------

    def snapshot(self) -> ClusterState:
        with self._lock:
            kvs = list(self._kvs.values())
            lapsed = [kv for kv, _ in self._lapsed.values()]
            kvs += lapsed
            ready, reason, rev = self._ready and self._synced, self._reason, self._revision
        rejections: list[Rejection] = []
        nodes: list[tuple[int, Node]] = []
        peers: list[tuple[int, Peer]] = []
        mesh = self._last_mesh
        mesh_seen = False
        nodes_p, peers_p, fwd_p = self.prefix + "nodes/", self.prefix + "peers/", self.prefix + "forwarding/"
        forwarding: dict[str, ForwardingReport] = {}
        for kv in kvs:
            if kv.key.startswith(fwd_p):
                report = self._report_cached(kv, kv.key[len(fwd_p):])
                if isinstance(report, Rejection):
                    rejections.append(report)
                else:
                    forwarding[report.node] = report
                continue
            if kv.key.startswith(nodes_p):
                item = self._parse_cached(kv, kv.key[len(nodes_p):], "node")
            elif kv.key.startswith(peers_p):
                item = self._parse_cached(kv, kv.key[len(peers_p):], "peer")
            elif kv.key == self.prefix + "mesh":  # mesh_key, also under a cache's prefix
                mesh_seen = True
                try:
                    mesh = records.parse_mesh(parse_record(kv, kv.key), kv.key)
                    self._last_mesh = mesh
                except InputError as e:
                    rejections.append(Rejection("mesh", str(e)))
                continue
            else:
                continue
            if isinstance(item, Rejection):
                rejections.append(item)
            elif isinstance(item, Node):
                nodes.append((kv.create_revision, item))
            else:
                peers.append((kv.create_revision, item))
        if not mesh_seen and ready:
            mesh = self.default_mesh
        nodes.sort(key=lambda t: (t[0], t[1].name))
        peers.sort(key=lambda t: (t[0], t[1].name))
        return ClusterState(
            cluster=self.cluster, mesh=mesh, nodes=tuple(n for _, n in nodes), peers=tuple(p for _, p in peers),
            rejections=tuple(rejections), ready=ready, reason=reason if not ready else "", revision=rev,
            records=len(kvs) - len(lapsed), lapsed=len(lapsed), forwarding=forwarding,
        )

    def _report_cached(self, kv: KeyValue, name: str) -> ForwardingReport | Rejection:
        """A forwarding report, parsed once per revision; one that names another node or cluster
        than its key (only that node's credentials write it) is a rejection."""
        hit = self._reports.get(kv.key)
        if hit is not None and hit[0] == kv.mod_revision:
            return hit[1]
        item: ForwardingReport | Rejection
        try:
            item = parse_report(kv, name, self.cluster.name)
        except (InputError, MeshError) as e:
            item = Rejection(f"forwarding/{name}", str(e))
        if len(self._reports) > 2 * len(self._kvs) + 100:
            self._reports = {k: x for k, x in self._reports.items() if k in self._kvs}
        self._reports[kv.key] = (kv.mod_revision, item)
        return item

    def _parse_cached(self, kv: KeyValue, name: str, kind: str) -> Node | Peer | Rejection:
        hit = self._parsed.get(kv.key)
        if hit is not None and hit[0] == kv.mod_revision:
            return hit[1]
        item: Node | Peer | Rejection
        try:
            rec = parse_record(kv, kv.key)
            if kind == "node":
                item = records.parse_node(rec, kv.key, default_port=self._last_mesh.port, cluster=self.record_cluster,
                                           one_per_family=False)
            else:
                item = records.parse_peer(rec, kv.key)
            if item.name != name:
                raise InputError(f"{kv.key}.name", item.name, "does not match the key")
        except InputError as e:
            item = Rejection(name, str(e))
        if len(self._parsed) > 2 * len(self._kvs) + 100:
            live = set(self._kvs) | set(self._lapsed)
            self._parsed = {k: x for k, x in self._parsed.items() if k in live}
        self._parsed[kv.key] = (kv.mod_revision, item)
        return item

    def records_under(self, prefix: str) -> list[KeyValue]:
        """The mirrored keys under `prefix` (e.g. services_prefix): what another reader of this
        watch (agent.global_services) takes without a watch of its own."""
        with self._lock:
            return [kv for k, kv in self._kvs.items() if k.startswith(prefix)]

    def status(self) -> BackendStatus:
        """`own_record`: how often our record was put back after someone else deleted or changed
        it; `lapsed`: records kept through their lapse grace (their agents are away)."""
        with self._lock:
            now = time.monotonic()
            lapsed = {k.rpartition("/")[2]: round(until - now, 1) for k, (_, until) in self._lapsed.items()}
        return BackendStatus(OwnRecord(self.restored_total, self.last_restored), lapsed)

    def close(self) -> None:
        """Stop watching; first hand the lapsing records over (hand_over_lapsing)."""
        self.hand_over_lapsing()
        self.client.abort_watch()
        self.client.close()
