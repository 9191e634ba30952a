# SPDX-License-Identifier: Apache-2.0
"""Forwarding reports on the Kubernetes backend (docs/mesh.md, "Leaders that do not forward"):
each node's report (mesh.leaders.ForwardingReport) in a ConfigMap of its own,
`meshctl-forwarding-<node>` in the agent's namespace, labelled `meshctl.io/forwarding: "true"`,
the report's JSON under the data key `report`.

A ConfigMap of its own, not a key of the node's `meshctl-seen-<node>` summary: every agent
watches the reports (a changed verdict must wake every agent within a second), while the
summaries are larger, rewritten every few seconds and read only by `graph --live` and the UI;
one label selects the reports alone, so no agent receives, parses or wakes for a summary.
The policy meshctl-agent-own-summary (manifests/admission-policy.yaml) lets a node's token write
only its own two ConfigMaps; readers check that the report names the node of its ConfigMap.

A report counts only while its publisher is an admitted member (mesh.leaders.choose_leaders): a
node whose agent died leaves the plans once its last-seen ages out, and its report with it,
as the etcd backend's report goes with its lease. `reports_from_configmaps` is pure."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from meshctl.backends.etcd import MAX_RECORD_BYTES, same_but_time
from meshctl.errors import InputError, MeshError
from meshctl.mesh.admit import Rejection
from meshctl.mesh.leaders import ForwardingReport, report_of

FORWARDING_CONFIGMAP_PREFIX = "meshctl-forwarding-"
FORWARDING_LABEL = "meshctl.io/forwarding"
FORWARDING_DATA_KEY = "report"


def forwarding_configmap(node: str) -> str:
    return f"{FORWARDING_CONFIGMAP_PREFIX}{node}"


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _text(obj: Mapping[str, Any] | None) -> str | None:
    if obj is None:
        return None
    v = (obj.get("data") or {}).get(FORWARDING_DATA_KEY)
    return v if isinstance(v, str) else None


def reports_from_configmaps(objects: Iterable[Mapping[str, Any]], cluster: str, namespace: str
                            ) -> tuple[dict[str, ForwardingReport], list[Rejection]]:
    """The reports of the labelled ConfigMaps, by node, and a rejection (`forwarding/<node>`) for
    each that is not one: misnamed, not JSON, too large, or naming another node than its
    ConfigMap or another cluster than `cluster`. One bad report never hides the others."""
    reports: dict[str, ForwardingReport] = {}
    rejections: list[Rejection] = []
    for obj in sorted(objects, key=_name):
        name = _name(obj)
        node = name.removeprefix(FORWARDING_CONFIGMAP_PREFIX)
        where = f"configmap {namespace}/{name}"
        text = _text(obj) or ""
        try:
            if not name.startswith(FORWARDING_CONFIGMAP_PREFIX):
                raise InputError(where, name, f"is not named {FORWARDING_CONFIGMAP_PREFIX}<node>")
            if len(text) > MAX_RECORD_BYTES:
                raise InputError(where, f"{len(text)} bytes",
                                 f"is larger than a report may be ({MAX_RECORD_BYTES} bytes)")
            try:
                doc = json.loads(text)
            except ValueError:
                raise InputError(where, text[:40], "is not JSON") from None
            reports[node] = report_of(doc, where, node, cluster, "its ConfigMap")
        except (InputError, MeshError) as e:
            rejections.append(Rejection(f"forwarding/{node}", str(e)))
    return reports, rejections


def heartbeat_only(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """A report ConfigMap rewritten with the same verdicts and a later time: kept in the cache,
    waking no agent (as the etcd backend treats its report keys)."""
    new_text = _text(new)
    return new_text is not None and same_but_time(_text(old), new_text)
