# SPDX-License-Identifier: Apache-2.0
"""Table output (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), what `kubectl get`
prints: the columns kube-apiserver's printers give the built-in kinds (priority 1 only with
`-o wide`), a CRD's additionalPrinterColumns for its custom resources, Name and Age otherwise."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from .types import JSON, ResourceType

Cell = Callable[[JSON], Any]
Column = tuple[str, str, int, Cell]  # name, type, priority, cell

TABLE_MEDIA = "application/json;as=Table;v=v1;g=meta.k8s.io"


def wants_table(accept: str) -> bool:
    for part in accept.split(","):
        params = {p.strip() for p in part.split(";")}
        if {"as=Table", "g=meta.k8s.io"} <= params:
            return True
        if "application/json" in params and len(params) == 1:
            return False
    return False


def human_duration(seconds: float) -> str:
    """kubectl's short ages: 45s, 3m2s, 5h, 2d3h, 400d (apimachinery's HumanDuration)."""
    s = int(max(seconds, 0))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = s // 3600
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if h < 24 * 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    return f"{d // 365}y{d % 365}d" if d < 365 * 8 else f"{d // 365}y"


def age(stamp: Any) -> str:
    if not isinstance(stamp, str):
        return "<unknown>"
    try:
        then = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return "<invalid>"
    return human_duration((datetime.now(UTC) - then).total_seconds())


def _get(obj: Any, *path: str) -> Any:
    for p in path:
        obj = obj.get(p) if isinstance(obj, dict) else None
    return obj


def _age(o: JSON) -> str:
    return age(_get(o, "metadata", "creationTimestamp"))


def _node_status(o: JSON) -> str:
    ready = next((c for c in _get(o, "status", "conditions") or [] if c.get("type") == "Ready"), None)
    out = "Unknown" if ready is None else "Ready" if ready.get("status") == "True" else "NotReady"
    return out + (",SchedulingDisabled" if _get(o, "spec", "unschedulable") else "")


def _node_roles(o: JSON) -> str:
    labels = _get(o, "metadata", "labels") or {}
    roles = sorted({k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/") and "/" in k}
                   | ({labels["kubernetes.io/role"]} if labels.get("kubernetes.io/role") else set()))
    return ",".join(r for r in roles if r) or "<none>"


def _address(kind: str) -> Cell:
    def cell(o: JSON) -> str:
        return next((a.get("address", "") for a in _get(o, "status", "addresses") or [] if a.get("type") == kind),
                    "<none>")
    return cell


def _info(key: str) -> Cell:
    return lambda o: _get(o, "status", "nodeInfo", key) or "<unknown>"


def _count(*path: str) -> Cell:
    return lambda o: len(_get(o, *path) or {})


def _int(*path: str) -> Cell:
    return lambda o: int(_get(o, *path) or 0)


def _text(*path: str, none: str = "<none>") -> Cell:
    def cell(o: JSON) -> str:
        v = _get(o, *path)
        return none if v in (None, "", [], {}) else str(v)
    return cell


def _created(o: JSON) -> str:
    return str(_get(o, "metadata", "creationTimestamp") or "")


def _containers(key: str) -> Cell:
    return lambda o: ",".join(c.get(key, "") for c in _get(o, "spec", "template", "spec", "containers") or [])


def _selector(o: JSON) -> str:
    ml = _get(o, "spec", "selector", "matchLabels") or {}
    return ",".join(f"{k}={v}" for k, v in sorted(ml.items())) or "<none>"


def _ports(o: JSON) -> str:
    ports = _get(o, "spec", "ports") or []
    return ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in ports) or "<none>"


def _slice_ports(o: JSON) -> str:
    return ",".join(str(p.get("port")) for p in o.get("ports") or []) or "<unset>"


def _slice_endpoints(o: JSON) -> str:
    addrs = [a for e in o.get("endpoints") or [] for a in e.get("addresses") or []]
    return ",".join(addrs[:3]) + (f" + {len(addrs) - 3} more..." if len(addrs) > 3 else "") or "<unset>"


def _ready(o: JSON) -> str:
    return f"{_get(o, 'status', 'readyReplicas') or 0}/{_get(o, 'spec', 'replicas') or 0}"


def _role_binding(o: JSON) -> str:
    ref = o.get("roleRef") or {}
    return f"{ref.get('kind', '')}/{ref.get('name', '')}"


_NAME: Column = ("Name", "string", 0, lambda o: _get(o, "metadata", "name") or "")
_AGE: Column = ("Age", "string", 0, _age)

COLUMNS: dict[str, list[Column]] = {
    "Node": [_NAME, ("Status", "string", 0, _node_status), ("Roles", "string", 0, _node_roles), _AGE,
             ("Version", "string", 0, _info("kubeletVersion")),
             ("Internal-IP", "string", 1, _address("InternalIP")), ("External-IP", "string", 1, _address("ExternalIP")),
             ("OS-Image", "string", 1, _info("osImage")), ("Kernel-Version", "string", 1, _info("kernelVersion")),
             ("Container-Runtime", "string", 1, _info("containerRuntimeVersion"))],
    "Namespace": [_NAME, ("Status", "string", 0, _text("status", "phase", none="")), _AGE],
    "ConfigMap": [_NAME, ("Data", "integer", 0, _count("data")), _AGE],
    "Secret": [_NAME, ("Type", "string", 0, _text("type", none="")), ("Data", "integer", 0, _count("data")), _AGE],
    "ServiceAccount": [_NAME, ("Secrets", "integer", 0, _count("secrets")), _AGE],
    "Service": [_NAME, ("Type", "string", 0, _text("spec", "type", none="ClusterIP")),
                ("Cluster-IP", "string", 0, _text("spec", "clusterIP")),
                ("External-IP", "string", 0, lambda o: ",".join(_get(o, "spec", "externalIPs") or []) or "<none>"),
                ("Port(s)", "string", 0, _ports), _AGE,
                ("Selector", "string", 1, lambda o: ",".join(f"{k}={v}" for k, v in sorted(
                    (_get(o, "spec", "selector") or {}).items())) or "<none>")],
    "EndpointSlice": [_NAME, ("AddressType", "string", 0, _text("addressType")), ("Ports", "string", 0, _slice_ports),
                      ("Endpoints", "string", 0, _slice_endpoints), _AGE],
    "Lease": [_NAME, ("Holder", "string", 0, _text("spec", "holderIdentity", none="")), _AGE],
    "DaemonSet": [_NAME, ("Desired", "integer", 0, _int("status", "desiredNumberScheduled")),
                  ("Current", "integer", 0, _int("status", "currentNumberScheduled")),
                  ("Ready", "integer", 0, _int("status", "numberReady")),
                  ("Up-to-date", "integer", 0, _int("status", "updatedNumberScheduled")),
                  ("Available", "integer", 0, _int("status", "numberAvailable")),
                  ("Node Selector", "string", 0, lambda o: ",".join(f"{k}={v}" for k, v in sorted(
                      (_get(o, "spec", "template", "spec", "nodeSelector") or {}).items())) or "<none>"), _AGE,
                  ("Containers", "string", 1, _containers("name")), ("Images", "string", 1, _containers("image")),
                  ("Selector", "string", 1, _selector)],
    "Deployment": [_NAME, ("Ready", "string", 0, _ready),
                   ("Up-to-date", "integer", 0, _int("status", "updatedReplicas")),
                   ("Available", "integer", 0, _int("status", "availableReplicas")), _AGE,
                   ("Containers", "string", 1, _containers("name")), ("Images", "string", 1, _containers("image")),
                   ("Selector", "string", 1, _selector)],
    "ClusterRole": [_NAME, ("Created At", "date", 0, _created)],
    "Role": [_NAME, ("Created At", "date", 0, _created)],
    "ClusterRoleBinding": [_NAME, ("Role", "string", 0, _role_binding), _AGE],
    "RoleBinding": [_NAME, ("Role", "string", 0, _role_binding), _AGE],
    "CustomResourceDefinition": [_NAME, ("Created At", "date", 0, _created)],
    "ValidatingAdmissionPolicy": [_NAME, ("Validations", "integer", 0, _count("spec", "validations")),
                                  ("ParamKind", "string", 0, _text("spec", "paramKind")), _AGE],
    "ValidatingAdmissionPolicyBinding": [_NAME, ("PolicyName", "string", 0, _text("spec", "policyName")),
                                         ("ParamRef", "string", 0, _text("spec", "paramRef")), _AGE],
}


def _json_path(obj: Any, path: str) -> Any:
    """The value at a simple JSONPath (`.spec.allowedIPs`, `.spec.list[0].x`), or None."""
    for part in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path):
        key, idx = part
        if key:
            obj = obj.get(key) if isinstance(obj, dict) else None
        else:
            obj = obj[int(idx)] if isinstance(obj, list) and int(idx) < len(obj) else None
        if obj is None:
            return None
    return obj


def _crd_cell(col: JSON) -> Cell:
    """A printer column's cell as the CRD table convertor renders it: strings through JSONPath's
    printing (lists and maps as JSON), dates as ages, numbers as numbers, missing as none."""
    def cell(o: JSON) -> Any:
        v = _json_path(o, col.get("jsonPath", ""))
        if v is None:
            return None
        t = col.get("type", "string")
        if t == "date":
            return age(v)
        if t == "string":
            return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))
        if t == "integer" and isinstance(v, int | float) and not isinstance(v, bool):
            return int(v)
        if t == "boolean" and isinstance(v, bool):
            return v
        if t == "number" and isinstance(v, int | float):
            return v
        return None
    return cell


def columns(rt: ResourceType, printer_columns: tuple[JSON, ...] | None) -> list[Column]:
    if printer_columns is not None and printer_columns:
        return [_NAME] + [(c["name"], "string" if c.get("type") == "date" else c.get("type", "string"),
                           int(c.get("priority", 0)), _crd_cell(c)) for c in printer_columns]
    return COLUMNS.get(rt.kind, [_NAME, _AGE])


def table(rt: ResourceType, printer_columns: tuple[JSON, ...] | None, items: list[JSON], meta: JSON,
          include: str = "Metadata") -> JSON:
    """A meta.k8s.io/v1 Table of `items`; each row carries the object as `include` asks
    (Metadata: PartialObjectMetadata, Object: the whole, None: nothing)."""
    cols = columns(rt, printer_columns)
    rows = []
    for o in items:
        row: JSON = {"cells": [c[3](o) for c in cols]}
        if include == "Object":
            row["object"] = o
        elif include != "None":
            row["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                             "metadata": o.get("metadata") or {}}
        rows.append(row)
    defs = [{"name": n, "type": t, "format": "name" if n == "Name" else "", "description": n, "priority": p}
            for n, t, p, _ in cols]
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": defs,
            "rows": rows}
