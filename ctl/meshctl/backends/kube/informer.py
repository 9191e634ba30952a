# SPDX-License-Identifier: Apache-2.0
"""One kind of Kubernetes object kept as a local cache the way client-go's informers keep it: one
LIST, then a WATCH from the list's resourceVersion; every event updates the cache and wakes the
consumer (`on_change`). A watch the server ends, or one that breaks, resumes from the last
resourceVersion seen, without a relist; only `410 Gone` (that version is older than the server's
history) costs a relist. A kind is readable again once the server accepts a watch of it (its
`200`), not only at its next event: a kind with no objects may have none for hours. A CRD-backed
kind that is not installed (`optional`) is an empty cache, not an error, and is listed again every
`retry_missing` seconds. Failures are one line each (errors.describe), logged once per cause, and
readable by the consumer (`error`).

Readers take what they need from `items()` (a list, under the cache's lock); the cache keeps what
`slim` leaves of each object (`managedFields` always goes: 8 kB of a typical object that no
reader of meshctl's looks at). `Informers` follows several kinds from a thread of their own, for
consumers that are not asyncio code (the global-services step, the MCS controller).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from typing import Any

import httpx2 as httpx
from lightkube import ApiError, AsyncClient, Client, KubeConfig

from meshctl.backends.kube.errors import describe, install_hooks, is_kubernetes_answer, status_of
from meshctl.worker import Worker

log = logging.getLogger("meshctl.kube")

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace, name); namespace "" for a cluster-scoped object
# What a failed API call raises through lightkube (errors.describe makes each one line).
FAILURES = (ApiError, httpx.HTTPError, OSError)
ALL_NAMESPACES = "*"  # lightkube's word for every namespace of a namespaced kind
WATCH_TIMEOUT_S = 300  # the server ends each watch after this; it resumes from the last version
RETRY_MISSING_S = 30.0  # a CRD not installed is looked for again this often


def as_dict(obj: Any) -> Obj:
    """A lightkube object (or a mapping) as a plain dict."""
    return dict(obj.to_dict() if hasattr(obj, "to_dict") else obj)


def slim(obj: Obj) -> Obj:
    """What a cache keeps of an object: everything but `metadata.managedFields`."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _rv(obj: Mapping[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("resourceVersion") or "0")


class Informer:
    """One watched collection: its objects by (namespace, name) and the last version seen.

    `namespace` None lists a cluster-scoped kind (or the client's namespace), ALL_NAMESPACES every
    namespace; `fields` and `labels` are selectors. `quiet(old, new)` says a modification changes
    nothing the consumer reads (it is cached without waking it). `stats` (shared between the
    informers of one consumer, if it likes) counts relists, resumes, 410s and errors; `lock`
    (likewise shared) guards `objects`, so a consumer reads several kinds consistently."""

    def __init__(self, name: str, resource: Any, *, namespace: str | None = None,
                 fields: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None,
                 slim: Callable[[Obj], Obj] = slim, quiet: Callable[[Obj | None, Obj], bool] | None = None,
                 optional: bool = False, server: str = "?", on_change: Callable[[], None] = lambda: None,
                 stats: dict[str, int] | None = None, lock: threading.Lock | None = None,
                 retry_missing: float = RETRY_MISSING_S, watch_timeout: int = WATCH_TIMEOUT_S) -> None:
        self.name, self.resource = name, resource
        self.namespace = namespace
        self.fields = dict(fields) if fields else None
        self.labels = dict(labels) if labels else None
        self.slim, self.quiet, self.optional = slim, quiet, optional
        self.server = server
        self.on_change = on_change
        self.stats = stats if stats is not None else {}
        for k in ("relists", "resumes", "gone", "errors"):
            self.stats.setdefault(k, 0)
        self.lock = lock or threading.Lock()
        self.retry_missing, self.watch_timeout = retry_missing, watch_timeout
        self.objects: dict[Key, Obj] = {}
        self.rv: str | None = None
        self.listed = False
        self.missing = False  # the API does not serve it (a CRD that is not installed)
        self.error: tuple[str, str] | None = None  # (doing, why) while it cannot be read
        # Held while listing, so a synchronous reader (`list_now`) and `follow` never both list.
        self.list_lock = threading.Lock()

    # --- reading -----------------------------------------------------------------------------

    def items(self) -> list[Obj]:
        with self.lock:
            return list(self.objects.values())

    def get(self, key: Key) -> Obj | None:
        with self.lock:
            return self.objects.get(key)

    def reset(self) -> None:
        """Forget everything (the next `follow` lists again): a consumer that stops following
        gives the memory back."""
        with self.lock:
            self.objects, self.rv, self.listed, self.missing, self.error = {}, None, False, False, None

    # --- the cache ---------------------------------------------------------------------------

    def store(self, obj: Obj, deleted: bool = False) -> None:
        """Apply one object (already slimmed) unless the cache holds a newer version of it: a
        write's answer may be stored by its writer before the watch delivers it."""
        key, rv = key_of(obj), _rv(obj)
        with self.lock:
            have = self.objects.get(key)
            have_rv = _rv(have)
            if have is not None and rv.isdigit() and have_rv.isdigit() and int(have_rv) > int(rv):
                return
            if deleted:
                self.objects.pop(key, None)
            else:
                self.objects[key] = obj

    def _replace_all(self, items: list[Obj], rv: str | None) -> None:
        with self.lock:
            self.objects = {key_of(o): o for o in items}
            self.rv, self.listed, self.missing = rv, True, False
            self.stats["relists"] += 1

    def _absent(self, e: BaseException) -> bool:
        """A Kubernetes 404 on listing an optional kind: its CRD is not installed. A real API
        server answers a group it does not serve with a plain `404 page not found`."""
        if self.optional and status_of(e) == 404 and is_kubernetes_answer(e):
            with self.lock:
                self.objects, self.missing, self.listed = {}, True, True
            return True
        return False

    def _args(self) -> dict[str, Any]:
        args: dict[str, Any] = {}
        if self.namespace is not None:
            args["namespace"] = self.namespace
        if self.fields:
            args["fields"] = self.fields
        if self.labels:
            args["labels"] = self.labels
        return args

    # --- listing and watching ----------------------------------------------------------------

    def list_now(self, client: Client) -> None:
        """List synchronously unless `follow` listed meanwhile (a reader that cannot wait for the
        first list); a failure is remembered in `error`, not raised."""
        with self.list_lock:
            if self.listed or self.missing:
                return
            try:
                it = client.list(self.resource, **self._args())
                items = [self.slim(as_dict(o)) for o in it]
            except FAILURES as e:
                if not self._absent(e):
                    self.failed("listing", e, wake=False)
                return
            self._replace_all(items, it.resourceVersion)
        self.healthy()

    async def _relist(self, client: AsyncClient) -> None:
        try:
            ait = client.list(self.resource, **self._args())
            items = [self.slim(as_dict(o)) async for o in ait]
        except FAILURES as e:
            if self._absent(e):
                return
            raise
        self._replace_all(items, ait.resourceVersion)

    async def follow(self, client: AsyncClient, stop: threading.Event) -> None:
        """List, then watch until `stop`; see the module docstring. Run it as a task of its own:
        the task's context names this informer to `_watch_accepted`."""
        _FOLLOWING.set(self)
        backoff = 0.2
        while not stop.is_set():
            doing = "watching"
            try:
                if self.rv is None or not self.listed:
                    doing = "listing"
                    if not self.list_lock.acquire(blocking=False):
                        await asyncio.sleep(0.02)  # a synchronous reader is listing it now
                        continue
                    try:
                        if self.rv is None or not self.listed:
                            await self._relist(client)
                    finally:
                        self.list_lock.release()
                    self.healthy()
                    self.on_change()
                    doing = "watching"
                if self.missing:
                    await asyncio.sleep(self.retry_missing)  # the CRD may be installed later
                    self.listed = False
                    continue
                async for typ, obj in client.watch(self.resource, resource_version=self.rv,
                                                   server_timeout=self.watch_timeout, **self._args()):
                    d = self.slim(as_dict(obj))
                    old = self.get(key_of(d))
                    self.store(d, deleted=typ == "DELETED")
                    self.rv = _rv(d)
                    self.healthy()
                    if not (typ == "MODIFIED" and self.quiet is not None and self.quiet(old, d)):
                        self.on_change()
                    backoff = 0.2
            except FAILURES as e:
                if status_of(e) == 410:
                    # Our version is older than the server's history: only a relist is correct now.
                    self.stats["gone"] += 1
                    self.rv = None
                    continue
                self.failed(doing, e, wake=True)
            else:
                continue
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 5.0)
            self.stats["resumes"] += 1  # the next round watches again from self.rv, without a relist

    # --- health ------------------------------------------------------------------------------

    def failed(self, doing: str, e: BaseException, *, wake: bool) -> None:
        """Remember why the kind cannot be read now (`doing` it: listing, watching), logged once
        per cause; with `wake`, the consumer is woken when it was readable until now."""
        cause = describe(e, self.server, doing).removeprefix(f"{doing}: ")
        self.stats["errors"] += 1
        with self.lock:
            was, self.error = self.error, (doing, cause)
        if was != self.error:
            log.warning("%s %s: %s", doing, self.name, cause)
        if wake and was is None:
            self.on_change()

    def healthy(self) -> bool:
        """Forget the kind's error; whether it had one (it is readable again)."""
        with self.lock:
            was, self.error = self.error, None
        if was is not None:
            log.warning("kubernetes API: %s readable again", self.name)
        return was is not None


def grouped(errors: Mapping[str, tuple[str, str]]) -> str:
    """The kinds that cannot be read, one clause per cause: `listing nodes, peers.meshctl.io:
    cannot connect ...` rather than the same cause once per kind."""
    by_cause: dict[tuple[str, str], list[str]] = {}
    for kind, (doing, cause) in errors.items():
        by_cause.setdefault((doing, cause), []).append(kind)
    return "; ".join(f"{doing} {', '.join(sorted(kinds))}: {cause}"
                     for (doing, cause), kinds in sorted(by_cause.items()))


def errors_of(informers: Iterable[Informer]) -> str:
    """Why some of `informers` cannot be read now ("" when all can), grouped by cause."""
    return grouped({i.name: i.error for i in informers if i.error is not None})


# The informer whose `follow` runs in the current asyncio task (each task has its own context).
_FOLLOWING: ContextVar[Informer | None] = ContextVar("meshctl_informer", default=None)


async def _watch_accepted(response: httpx.Response) -> None:
    """The client's response hook: a watch the server accepted makes the following informer's
    kind readable again (lightkube's watch opens the next request itself and yields only events)."""
    informer = _FOLLOWING.get()
    accepted = response.status_code == 200 and response.request.url.params.get("watch") == "true"
    if informer is not None and accepted and informer.healthy():
        informer.on_change()


def async_client(config: KubeConfig, field_manager: str = "meshctl") -> AsyncClient:
    client = AsyncClient(config, trust_env=False, field_manager=field_manager)
    install_hooks(client, _watch_accepted)
    return client


async def follow_all(config: KubeConfig, informers: Sequence[Informer], stop: threading.Event,
                     beside: Callable[[], Awaitable[None]] | None = None) -> None:
    """Follow every informer over one connection until `stop` (checked every 0.1 s, so a watch
    with nothing to say does not hold it up); `beside()`, if given, runs every 0.1 s too. A bug
    in one informer's loop (anything but an API failure, which each handles itself) ends all."""
    client = async_client(config)
    tasks = [asyncio.create_task(i.follow(client, stop), name=f"informer {i.name}") for i in informers]
    try:
        while not stop.is_set():
            await asyncio.sleep(0.1)
            if beside is not None:
                await beside()
            for t in tasks:
                if t.done() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()


class Informers:
    """Several informers followed from one thread of their own (its own asyncio loop and API
    connection), started and stopped by a consumer that is not asyncio code. `stop` forgets the
    caches (the memory goes back); a later `start` lists again."""

    def __init__(self, config: KubeConfig, informers: Sequence[Informer], name: str = "informers") -> None:
        self.config, self.informers, self.name = config, list(informers), name
        self._worker = Worker(self._run, name)
        self.failure: str = ""  # why the thread ended, if it did by itself

    @property
    def running(self) -> bool:
        return self._worker.running

    def start(self) -> None:
        if not self.running:
            self.failure = ""
            self._worker.start()

    def _run(self, stop: threading.Event) -> None:
        try:
            asyncio.run(follow_all(self.config, self.informers, stop))
        except Exception as e:  # noqa: BLE001 - a bug, not the API: said in the consumer's errors
            self.failure = f"{type(e).__name__}: {e}"
            log.exception("%s: %s", self.name, e)

    def stop(self, timeout: float = 5.0) -> None:
        self._worker.stop(timeout)
        for i in self.informers:
            i.reset()

    def synced(self) -> bool:
        """Every informer has listed (or found its CRD missing) since it started."""
        return all(i.listed or i.missing for i in self.informers)

    def errors(self) -> str:
        return self.failure or errors_of(self.informers)
