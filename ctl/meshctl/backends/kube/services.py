# SPDX-License-Identifier: Apache-2.0
"""Global services, the Kubernetes side: Services, MCS ServiceExports and EndpointSlices read
through the API server, meshctl's slices written, and the Lease (coordination.k8s.io/v1) that
elects the one agent per cluster that publishes and writes (agent.global_services).

Leader election follows client-go's leaderelection: the holder renews `spec.renewTime` every
`retry` seconds; another candidate takes the Lease over only when it has seen the same record,
unchanged, for `leaseDurationSeconds` by its OWN clock (never comparing clocks across machines);
every write is an update at the resourceVersion read, so two candidates cannot both win; a holder
that could not renew for `renew_deadline` seconds stops acting as leader before anyone can take
over (renew_deadline < duration). On the way out the holder releases the Lease (empty holder),
so the next candidate takes it at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx2 as httpx
from lightkube import ApiError, Client
from lightkube.generic_resource import create_namespaced_resource

from meshctl.backends.kube.errors import is_kubernetes_answer, status_of
from meshctl.mesh.services import MANAGED_BY, MANAGED_BY_LABEL, ObjectChanges

log = logging.getLogger("meshctl.kube.services")

Obj = dict[str, Any]

SERVICES = create_namespaced_resource("", "v1", "Service", "services")
ENDPOINT_SLICES = create_namespaced_resource("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices")
SERVICE_EXPORTS = create_namespaced_resource("multicluster.x-k8s.io", "v1alpha1", "ServiceExport", "serviceexports")
SERVICE_IMPORTS = create_namespaced_resource("multicluster.x-k8s.io", "v1alpha1", "ServiceImport", "serviceimports")
LEASES = create_namespaced_resource("coordination.k8s.io", "v1", "Lease", "leases")

LEASE_NAME = "meshctl-global-services"
LEASE_DURATION_S = 15.0  # client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry
RENEW_DEADLINE_S = 10.0
RETRY_S = 2.0


def as_dict(obj: Any) -> Obj:
    """A lightkube object (or a dict) as a plain dict."""
    return dict(obj.to_dict() if hasattr(obj, "to_dict") else obj)


class KubeServiceApi:
    """The reads and writes global services need, as plain dicts."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def services(self) -> list[Obj]:
        return [as_dict(o) for o in self.client.list(SERVICES, namespace="*")]

    def exports(self) -> list[Obj] | None:
        """ServiceExports; None when the MCS CRD is not installed (kube-apiserver answers a group it
        does not serve with a plain-text 404, which lightkube raises as httpx's error)."""
        return self._list_optional(SERVICE_EXPORTS)

    def imports(self) -> list[Obj] | None:
        """ServiceImports; None when the MCS CRD is not installed."""
        return self._list_optional(SERVICE_IMPORTS)

    def _list_optional(self, resource: Any) -> list[Obj] | None:
        try:
            return [as_dict(o) for o in self.client.list(resource, namespace="*")]
        except (ApiError, httpx.HTTPStatusError) as e:
            if status_of(e) == 404 and is_kubernetes_answer(e):
                return None
            raise

    def slices(self) -> list[Obj]:
        return [as_dict(o) for o in self.client.list(ENDPOINT_SLICES, namespace="*")]

    def apply(self, changes: ObjectChanges) -> tuple[int, list[str]]:
        """Create, replace and delete meshctl's slices (apply_changes: only slices labelled managed
        by meshctl.io are deleted)."""
        return apply_changes(self.client, ENDPOINT_SLICES, "endpointslice", changes,
                             labelled(MANAGED_BY_LABEL, MANAGED_BY))

    # --- the Lease --------------------------------------------------------------------------

    def get_lease(self, ns: str, name: str) -> Obj | None:
        try:
            return as_dict(self.client.get(LEASES, name, namespace=ns))
        except ApiError as e:
            if e.status.code == 404:
                return None
            raise

    def write_lease(self, ns: str, obj: Obj) -> Obj | None:
        """Create (no resourceVersion) or replace at the resourceVersion read; None when someone
        else wrote first (409 Conflict / AlreadyExists)."""
        try:
            if (obj.get("metadata") or {}).get("resourceVersion"):
                return as_dict(self.client.replace(LEASES.from_dict(obj)))
            return as_dict(self.client.create(LEASES.from_dict(obj), namespace=ns))
        except ApiError as e:
            if e.status.code == 409:
                return None
            raise


def labelled(key: str, value: str) -> Callable[[Obj], bool]:
    """Whether an object carries label `key` with `value`."""
    return lambda o: ((o.get("metadata") or {}).get("labels") or {}).get(key) == value


def apply_changes(client: Client, resource: Any, kind: str, changes: ObjectChanges,
                  owned: Callable[[Obj], bool]) -> tuple[int, list[str]]:
    """Create, replace and delete objects of `resource`, each on its own: one refused write (its
    namespace gone, a conflict) is named in the second value and the others go on. A delete
    re-reads the object first and leaves it if it is not `owned` (someone else's now). Returns the
    writes made and the failures."""
    n, failed = 0, []
    for verb, obj in [*(("create", o) for o in changes.creates), *(("replace", o) for o in changes.updates)]:
        meta = obj["metadata"]
        try:
            if verb == "create":
                client.create(resource.from_dict(obj), namespace=meta["namespace"])
            else:
                client.replace(resource.from_dict(obj))
            n += 1
        except ApiError as e:
            failed.append(f"{kind} {meta['namespace']}/{meta['name']}: {verb}: {e.status.message}")
    for ns, name in changes.deletes:
        try:
            if not owned(as_dict(client.get(resource, name, namespace=ns))):
                continue
            client.delete(resource, name, namespace=ns)
            n += 1
        except ApiError as e:
            if e.status.code != 404:
                failed.append(f"{kind} {ns}/{name}: delete: {e.status.message}")
    return n, failed


def micro_time(t: float) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_spec(lease: Obj | None) -> Mapping[str, Any]:
    return (lease or {}).get("spec") or {}


def next_lease(lease: Obj | None, me: str, ns: str, name: str, *, now: float, observed_at: float,
               duration: float, wall: float) -> Obj | None:
    """The Lease to write for `me`, or None when another holder's Lease is still valid. Pure:
    `observed_at` is when this candidate first saw the current record unchanged and `now` the
    same clock's time (monotonic); `wall` is written as the renew time, for people to read.
    A Lease held by nobody (released) or not renewed for `duration` is taken; our own is renewed."""
    spec = lease_spec(lease)
    holder = spec.get("holderIdentity") or ""
    if holder and holder != me and now < observed_at + float(spec.get("leaseDurationSeconds") or duration):
        return None
    t = micro_time(wall)
    new_spec: Obj = {"holderIdentity": me, "leaseDurationSeconds": int(duration), "renewTime": t,
                     "acquireTime": spec.get("acquireTime") if holder == me else t,
                     "leaseTransitions": int(spec.get("leaseTransitions") or 0)
                     + (1 if lease is not None and holder != me else 0)}
    meta: Obj = {"name": name, "namespace": ns}
    if lease is not None:
        meta["resourceVersion"] = (lease.get("metadata") or {}).get("resourceVersion")
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": new_spec}


@dataclass
class Observed:
    record: Mapping[str, Any]
    at: float


class LeaseElector:
    """One candidate of a Lease (see the module docstring). `tick()` says whether this candidate
    leads now; call it at least every `retry` seconds."""

    def __init__(self, api: KubeServiceApi, me: str, namespace: str, name: str = LEASE_NAME, *,
                 duration: float = LEASE_DURATION_S, renew_deadline: float = RENEW_DEADLINE_S,
                 retry: float = RETRY_S, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.api, self.me, self.namespace, self.name = api, me, namespace, name
        self.duration, self.renew_deadline, self.retry = duration, renew_deadline, retry
        self.clock, self.wall = clock, wall
        self._observed: Observed | None = None
        self._renewed = 0.0  # when (our clock) we last wrote the Lease as its holder
        self._next = 0.0
        self.leading = False
        self.holder: str | None = None
        self.transitions = 0

    def tick(self) -> bool:
        now = self.clock()
        if now < self._next:
            if self.leading and now - self._renewed > self.renew_deadline:
                self._lose("renew deadline passed")
            return self.leading
        self._next = now + self.retry
        try:
            self._try(now)
        except Exception as e:  # noqa: BLE001 - the API away: keep leading until the renew deadline
            log.warning("lease %s/%s: %s", self.namespace, self.name, e)
            if self.leading and now - self._renewed > self.renew_deadline:
                self._lose("renew deadline passed")
        return self.leading

    def _try(self, now: float) -> None:
        lease = self.api.get_lease(self.namespace, self.name)
        spec = dict(lease_spec(lease))
        if self._observed is None or self._observed.record != spec:
            self._observed = Observed(spec, now)
        self.holder = spec.get("holderIdentity") or None
        want = next_lease(lease, self.me, self.namespace, self.name, now=now, observed_at=self._observed.at,
                          duration=self.duration, wall=self.wall())
        if want is None:
            if self.leading:
                self._lose(f"taken over by {self.holder}")
            return
        wrote = self.api.write_lease(self.namespace, want)
        if wrote is None:
            if self.leading:
                self._lose("lost a conflicting write")
            return
        self._observed = Observed(dict(lease_spec(wrote)), now)
        self._renewed = now
        self.holder = self.me
        self.transitions = int(lease_spec(wrote).get("leaseTransitions") or 0)
        if not self.leading:
            log.info("lease %s/%s: %s leads (transitions %d)", self.namespace, self.name, self.me, self.transitions)
        self.leading = True

    def _lose(self, why: str) -> None:
        log.warning("lease %s/%s: %s no longer leads: %s", self.namespace, self.name, self.me, why)
        self.leading = False

    def release(self) -> None:
        """Give the Lease up (empty holder) so another candidate takes it at once."""
        if not self.leading:
            return
        self.leading = False
        try:
            lease = self.api.get_lease(self.namespace, self.name)
            if lease is not None and lease_spec(lease).get("holderIdentity") == self.me:
                lease["spec"] = {**lease_spec(lease), "holderIdentity": None, "renewTime": micro_time(self.wall())}
                self.api.write_lease(self.namespace, lease)
        except Exception as e:  # noqa: BLE001 - it expires by itself
            log.debug("lease release: %s", e)
