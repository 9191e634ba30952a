# SPDX-License-Identifier: Apache-2.0
"""Helpers for the Kubernetes tests: Node objects as kubelet and agents leave them, waiting, and a
backend's `run` in a thread."""

from __future__ import annotations

import base64
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node as KNode

from meshctl.backends.kube import nodes as A
from meshctl.lab.namespaces import build, state
from meshctl.lab.namespaces.spec import parse_lab
from meshctl.lab.rigs import netns
from tests.names import unique
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "manifests"


def wg_key(seed: int) -> str:
    return base64.b64encode(seed.to_bytes(2, "big") * 16).decode()


def node_obj(name: str, pod_cidr: str | None, *, key: int | None = None, internal: str | None = None,
             endpoint: str | None = None, last_seen: float | None = None, ann: dict[str, str] | None = None,
             labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A Node as the API holds it once its agent has published (key, addresses, last-seen)."""
    a: dict[str, str] = dict(ann or {})
    if key is not None:
        a[A.PUBLIC_KEY] = wg_key(key)
        a[A.LAST_SEEN] = str(int(time.time() if last_seen is None else last_seen))
    if internal:
        a[A.INTERNAL_IP] = internal
    if endpoint:
        a[A.ENDPOINT] = endpoint
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Node",
                           "metadata": {"name": name, "annotations": a, "labels": labels or {}}, "spec": {}}
    if pod_cidr:
        obj["spec"]["podCIDR"] = pod_cidr
    return obj


def create_node(c: Client, obj: dict[str, Any]) -> None:
    c.create(KNode.from_dict(obj))


def wait_for(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition", poll: float = 0.05) -> Any:
    return wait_until(cond, timeout, what, poll)


class Running:
    """A backend's `run` in a thread, with a count of `changed()` calls."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.stop = threading.Event()
        self.changes = 0
        self.thread = threading.Thread(target=backend.run, args=(self.stop, self._changed), daemon=True)

    def _changed(self) -> None:
        self.changes += 1

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(10)
        assert not self.thread.is_alive(), "backend.run did not stop"
        self.backend.close()


def lab_fixture(doc: dict[str, Any], wait: float = 120, prefix: str = "k8", scope: str = "function") -> Any:
    """A pytest fixture that builds the lab `doc` (a Kubernetes-backend lab) under a unique name
    starting with `prefix` and takes it down after the test (or, `scope` "module", after the
    module's tests), asserting nothing is left."""

    @pytest.fixture(scope=scope)  # type: ignore[call-overload]
    def lab() -> Any:
        prefix_ = unique(prefix) + "-"
        try:
            yield build.up(parse_lab(doc), prefix=prefix_, wait=wait)
        finally:
            assert not build.down(state.lab_name(prefix_))
            assert not netns.list_prefixed(prefix_)

    return lab
