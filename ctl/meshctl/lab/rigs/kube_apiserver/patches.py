# SPDX-License-Identifier: Apache-2.0
"""The patch kinds kube-apiserver accepts, applied to generic objects:

- JSON merge patch (RFC 7386): what the backend, `kubectl annotate|label` and kubectl's
  client-side apply of custom resources send;
- strategic merge patch: what kubectl's client-side apply sends for built-in kinds. Lists with a
  merge key (containers by name, ports by containerPort, ...) merge element by element; the
  directives kubectl emits (`$patch`, `$retainKeys`, `$setElementOrder/`, `$deleteFromPrimitiveList/`)
  are honoured. The merge keys come from a table of the built-in fields that have one (the real
  server reads them from its Go types); any other list is replaced, as there;
- JSON patch (RFC 6902): what kubectl sends to move managedFields to server-side apply.
"""

from __future__ import annotations

import copy
from typing import Any

from .types import ApiFailure

# (kind or "*", list field) -> merge key, for the built-in lists that merge by key.
MERGE_KEYS: dict[tuple[str, str], str] = {
    ("*", "containers"): "name", ("*", "initContainers"): "name", ("*", "ephemeralContainers"): "name",
    ("*", "env"): "name", ("*", "volumes"): "name", ("*", "volumeMounts"): "mountPath",
    ("*", "volumeDevices"): "devicePath", ("*", "ports"): "containerPort", ("Service", "ports"): "port",
    ("*", "imagePullSecrets"): "name", ("*", "conditions"): "type", ("*", "addresses"): "type",
    ("*", "taints"): "key", ("*", "ownerReferences"): "uid", ("*", "hostAliases"): "ip",
}
# Lists of scalars that merge as sets (patchStrategy: merge without a key).
MERGE_SETS = frozenset({"finalizers"})


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, `null` removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def merge_key(kind: str, field: str) -> str | None:
    """The merge key of list `field` of a `kind` object, or None (the list is replaced)."""
    return MERGE_KEYS.get((kind, field)) or MERGE_KEYS.get(("*", field))


def strategic_merge(target: Any, patch: Any, kind: str) -> Any:
    """A strategic merge patch applied to `target` (an object of `kind`)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    patch = dict(patch)
    directive = patch.pop("$patch", None)
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items()}
    if directive == "delete":
        return None
    retain = patch.pop("$retainKeys", None)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if k.startswith("$setElementOrder/"):
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            field = k.split("/", 1)[1]
            if isinstance(out.get(field), list):
                out[field] = [x for x in out[field] if x not in v]
            continue
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list):
            out[k] = _merge_list(out.get(k), v, kind, k)
        elif isinstance(v, dict):
            merged = strategic_merge(out.get(k), v, kind)
            if merged is None:
                out.pop(k, None)
            else:
                out[k] = merged
        else:
            out[k] = v
    if isinstance(retain, list):
        out = {k: v for k, v in out.items() if k in retain}
    orders = {k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$setElementOrder/")}
    for field, order in orders.items():
        key = merge_key(kind, field)
        if key and isinstance(out.get(field), list):
            out[field] = _ordered(out[field], order, key)
    return out


def _ordered(items: list[Any], order: list[Any], key: str) -> list[Any]:
    """`items` in the order `order` gives (elements it does not name keep theirs, at the end)."""
    rank = {o.get(key): i for i, o in enumerate(order) if isinstance(o, dict)}
    return sorted(items, key=lambda x: rank.get(x.get(key) if isinstance(x, dict) else None, len(rank)))


def _merge_list(current: Any, patch: list[Any], kind: str, field: str) -> list[Any]:
    cur = list(current) if isinstance(current, list) else []
    if field in MERGE_SETS:
        return cur + [x for x in patch if x not in cur]
    key = merge_key(kind, field)
    if key is None or not all(isinstance(x, dict) for x in patch):
        return [x for x in copy.deepcopy(patch) if not (isinstance(x, dict) and x.get("$patch") == "replace")]
    if any(x.get("$patch") == "replace" for x in patch):
        return [{k: v for k, v in x.items() if k != "$patch"} for x in patch if x.get("$patch") != "replace"]
    for item in patch:
        at = next((i for i, c in enumerate(cur) if isinstance(c, dict) and c.get(key) == item.get(key)), None)
        if item.get("$patch") == "delete":
            if at is not None:
                cur.pop(at)
        elif at is None:
            cur.append(strategic_merge({}, item, kind))
        else:
            cur[at] = strategic_merge(cur[at], item, kind)
    return cur


def _pointer(path: str) -> list[str]:
    if path and not path.startswith("/"):
        raise ApiFailure(422, "Invalid", f"the JSON pointer {path!r} does not start with /")
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def _walk(doc: Any, parts: list[str]) -> Any:
    for p in parts:
        if isinstance(doc, dict) and p in doc:
            doc = doc[p]
        elif isinstance(doc, list) and p.isdigit() and int(p) < len(doc):
            doc = doc[int(p)]
        else:
            raise ApiFailure(422, "Invalid", f"the JSON patch path /{'/'.join(parts)} does not exist")
    return doc


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902: add, remove, replace, move, copy and test, in order, on a copy of `target`."""
    if not isinstance(ops, list):
        raise ApiFailure(400, "BadRequest", "a JSON patch is a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        kind, parts = op.get("op"), _pointer(op.get("path", ""))
        if kind in ("move", "copy"):
            src = _pointer(op.get("from", ""))
            value = copy.deepcopy(_walk(doc, src))
            if kind == "move":
                doc = _remove(doc, src)
            doc = _add(doc, parts, value)
        elif kind == "add":
            doc = _add(doc, parts, copy.deepcopy(op.get("value")))
        elif kind == "remove":
            doc = _remove(doc, parts)
        elif kind == "replace":
            _walk(doc, parts)
            doc = _add(_remove(doc, parts), parts, copy.deepcopy(op.get("value")))
        elif kind == "test":
            if _walk(doc, parts) != op.get("value"):
                raise ApiFailure(422, "Invalid", f"the JSON patch test at {op.get('path')} failed")
        else:
            raise ApiFailure(400, "BadRequest", f"unknown JSON patch operation {kind!r}")
    return doc


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return value
    parent = _walk(doc, parts[:-1])
    last = parts[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list) and (last == "-" or (last.isdigit() and int(last) <= len(parent))):
        parent.insert(len(parent) if last == "-" else int(last), value)
    else:
        raise ApiFailure(422, "Invalid", f"the JSON patch path /{'/'.join(parts)} cannot be added to")
    return doc


def _remove(doc: Any, parts: list[str]) -> Any:
    parent = _walk(doc, parts[:-1])
    _walk(doc, parts)
    if isinstance(parent, dict):
        del parent[parts[-1]]
    else:
        parent.pop(int(parts[-1]))
    return doc
