# SPDX-License-Identifier: Apache-2.0
"""Who may read the agent's metrics, asked of the cluster itself (what kube-rbac-proxy does).

A scraper presents a bearer token; the API server says whose it is (TokenReview) and whether that
user may `get` the non-resource URL `/metrics` (SubjectAccessReview), so access follows the
cluster's own RBAC: bind the ClusterRole `meshctl-metrics-reader` (manifests/02-rbac.yaml) to
Prometheus's service account. Answers are kept `ttl` seconds per token (by its SHA-256, never the
token itself), so a scrape every 15 s costs two API calls a minute per scraper, not per scrape.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable

from lightkube import Client
from lightkube.models.authentication_v1 import TokenReviewSpec
from lightkube.models.authorization_v1 import NonResourceAttributes, SubjectAccessReviewSpec
from lightkube.resources.authentication_v1 import TokenReview
from lightkube.resources.authorization_v1 import SubjectAccessReview

from meshctl.backends.kube.errors import describe

METRICS_PATH = "/metrics"
CACHE_TTL_S = 60.0


class DelegatedAuth:
    """`check(token)`: None when the token's user may read `path`, else (401 or 403, why not)."""

    def __init__(self, client: Client, server: str, *, path: str = METRICS_PATH, ttl: float = CACHE_TTL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.client, self.server, self.path, self.ttl, self.clock = client, server, path, ttl, clock
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, tuple[int, str] | None]] = {}

    def check(self, token: str) -> tuple[int, str] | None:
        if not token:
            return 401, "no bearer token"
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and now - hit[0] < self.ttl:
                return hit[1]
        verdict, final = self._ask(token)
        if final:  # an API server that did not answer is asked again next time
            with self._lock:
                if len(self._cache) > 1000:
                    self._cache.clear()
                self._cache[key] = (now, verdict)
        return verdict

    def _ask(self, token: str) -> tuple[tuple[int, str] | None, bool]:
        """The verdict, and whether the API server gave it (else it is the failure's line)."""
        try:
            tr = self.client.create(TokenReview(spec=TokenReviewSpec(token=token)))
            st = tr.status
            if st is None or not st.authenticated or st.user is None:
                return (401, "the token is not valid in this cluster"), True
            user = st.user
            sar = self.client.create(SubjectAccessReview(spec=SubjectAccessReviewSpec(
                user=user.username, groups=user.groups, uid=user.uid, extra=user.extra,
                nonResourceAttributes=NonResourceAttributes(path=self.path, verb="get"))))
        except Exception as e:  # noqa: BLE001 - lightkube raises several shapes; errors.describe names each
            return (503, describe(e, self.server, "asking who may read " + self.path)), False
        if sar.status is not None and sar.status.allowed:
            return None, True
        return (403, f"{user.username} may not get {self.path}"), True
