# SPDX-License-Identifier: Apache-2.0
"""Field ownership (metadata.managedFields) and server-side apply, simplified.

A manager owns a set of leaf paths of an object (`("data", "foo")`, `("metadata", "labels", "a")`);
lists are atomic (one leaf), which is how kube-apiserver treats lists without a merge key. Writes
that are not applies hand the fields they change to their manager (operation Update); an apply
makes the applier own exactly what it sent (operation Apply), removes what it owned before and no
longer sends (unless another manager owns it too), and meets a conflict where it would change a
value another manager owns, unless forced. managedFields are written in the FieldsV1 format, so
kubectl (`apply --server-side`, its client-side-apply migration) reads and patches them as there.
"""

from __future__ import annotations

import copy
import json
from datetime import UTC, datetime
from typing import Any

from .types import JSON, ApiFailure

Path_ = tuple[str, ...]
# Fields no manager owns: the object's identity and what the server writes.
_SERVER_META = frozenset({"name", "namespace", "uid", "resourceVersion", "creationTimestamp", "managedFields",
                          "generation", "deletionTimestamp", "selfLink"})
LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def leaves(obj: Any, path: Path_ = ()) -> dict[Path_, Any]:
    """Every owned leaf of `obj` with its value: scalars, lists and empty maps."""
    if isinstance(obj, dict) and (obj or not path):
        out: dict[Path_, Any] = {}
        for k, v in obj.items():
            if (not path and k in ("apiVersion", "kind")) or (path == ("metadata",) and k in _SERVER_META):
                continue
            out.update(leaves(v, (*path, k)))
        return out
    return {path: obj}


def to_fields_v1(paths: set[Path_]) -> JSON:
    """A path set in the FieldsV1 form (`{"f:data": {".": {}, "f:foo": {}}}`)."""
    root: JSON = {}
    for p in sorted(paths):
        node = root
        for depth, k in enumerate(p):
            node = node.setdefault(f"f:{k}", {})
            if depth < len(p) - 1 and depth >= 1:
                node.setdefault(".", {})
    return root


def from_fields_v1(fields: Any, path: Path_ = ()) -> set[Path_]:
    """The leaf paths of a FieldsV1 value; a list's items (`k:`, `v:`, `i:`) make the list one leaf."""
    if not isinstance(fields, dict):
        return set()
    children = [k for k in fields if k != "."]
    if not children:
        return {path} if path else set()
    if any(not k.startswith("f:") for k in children):
        return {path}
    out: set[Path_] = set()
    for k in children:
        out |= from_fields_v1(fields[k], (*path, k[2:]))
    return out


Owners = dict[tuple[str, str], tuple[set[Path_], JSON]]  # (manager, operation) -> (paths, the entry as read)


def read_owners(obj: JSON) -> Owners:
    out: Owners = {}
    for e in (obj.get("metadata") or {}).get("managedFields") or []:
        if isinstance(e, dict) and e.get("manager") is not None:
            out[(e["manager"], e.get("operation", "Update"))] = (from_fields_v1(e.get("fieldsV1")), e)
    return out


def write_owners(obj: JSON, owners: Owners, api_version: str, changed: set[tuple[str, str]]) -> None:
    """Set obj's managedFields from `owners`; the entries in `changed` get a new time."""
    entries = []
    for (mgr, op), (paths, old) in owners.items():
        if not paths:
            continue
        if (mgr, op) in changed or not old:
            old = {"manager": mgr, "operation": op, "apiVersion": api_version, "time": now(),
                   "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(paths)}
        entries.append(old)
    meta = obj.setdefault("metadata", {})
    if entries:
        meta["managedFields"] = entries
    else:
        meta.pop("managedFields", None)


def _covered(p: Path_, owned: set[Path_]) -> bool:
    return any(p[:i] in owned for i in range(1, len(p) + 1))


def record_update(old: JSON | None, new: JSON, manager: str | None, api_version: str) -> None:
    """Ownership after a write that is not an apply: `manager` takes the fields it changed from
    every other manager; fields gone from the object are owned by nobody. A write that sets
    managedFields itself (kubectl's migration to server-side apply) keeps what it set."""
    given = (new.get("metadata") or {}).get("managedFields")
    if old is not None and given is not None and given != (old.get("metadata") or {}).get("managedFields"):
        return
    owners = read_owners(old) if old is not None else {}
    before = leaves(old) if old is not None else {}
    after = leaves(new)
    changed = {p for p, v in after.items() if p not in before or before[p] != v}
    touched: set[tuple[str, str]] = set()
    for key, (paths, _) in owners.items():
        kept = {p for p in paths if p in after and p not in changed}
        if kept != paths:
            owners[key] = (kept, {})
            touched.add(key)
    if manager and changed:
        key = (manager, "Update")
        mine = owners.get(key, (set(), {}))[0]
        owners[key] = (mine | changed, {})
        touched.add(key)
    write_owners(new, owners, api_version, touched)


def _set(obj: JSON, path: Path_, value: Any) -> None:
    node = obj
    for k in path[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    if value == {} and isinstance(node.get(path[-1]), dict):
        return  # an empty map applied claims the map, not its entries' removal
    node[path[-1]] = copy.deepcopy(value)


def _unset(obj: JSON, path: Path_) -> None:
    """Remove the leaf at `path` and the maps it leaves empty."""
    chain = [obj]
    for k in path[:-1]:
        nxt = chain[-1].get(k)
        if not isinstance(nxt, dict):
            return
        chain.append(nxt)
    chain[-1].pop(path[-1], None)
    for depth in range(len(path) - 1, 0, -1):
        if not chain[depth]:
            chain[depth - 1].pop(path[depth - 1], None)


def server_side_apply(live: JSON | None, applied: JSON, manager: str, force: bool, api_version: str) -> JSON:
    """The object after `manager` applies `applied` to `live` (None: it is created)."""
    base = copy.deepcopy(live) if live is not None else {"metadata": {}}
    owners = read_owners(base)
    want = leaves(applied)
    have = leaves(base)
    mine_key = (manager, "Apply")
    conflicts: list[tuple[str, Path_]] = []
    for (mgr, _op), (paths, _) in owners.items():
        if mgr == manager:
            continue
        for p in sorted(paths):
            if p in want and have.get(p) != want[p]:
                conflicts.append((mgr, p))
    if conflicts and not force:
        raise ApiFailure(409, "Conflict", _conflict_message(conflicts, api_version))
    touched = {mine_key}
    if force:
        for mgr, p in conflicts:
            for key, (paths, _) in owners.items():
                if key[0] == mgr and p in paths:
                    owners[key] = (paths - {p}, {})
                    touched.add(key)
    others: set[Path_] = set()
    for key, (paths, _) in owners.items():
        if key != mine_key:
            others |= paths
    for p in owners.get(mine_key, (set(), {}))[0] - set(want):
        if not _covered(p, others):
            _unset(base, p)
    for p, v in want.items():
        _set(base, p, v)
    live_annotations = ((live or {}).get("metadata") or {}).get("annotations") or {}
    if LAST_APPLIED in live_annotations:
        # kube-apiserver keeps a client-side-apply annotation in step with applies, so a later
        # client-side apply diffs against what was applied last.
        _set(base, ("metadata", "annotations", LAST_APPLIED), json.dumps(applied, separators=(",", ":")) + "\n")
    old_mine = owners.get(mine_key)
    owners[mine_key] = (set(want), old_mine[1] if old_mine and old_mine[0] == set(want) else {})
    if old_mine and old_mine[0] == set(want):
        touched.discard(mine_key)
    after = leaves(base)
    for key, (paths, _entry) in list(owners.items()):
        kept = {p for p in paths if p in after}
        if kept != paths:
            owners[key] = (kept, {})
            touched.add(key)
    write_owners(base, owners, api_version, touched)
    return base


def _conflict_message(conflicts: list[tuple[str, Path_]], api_version: str) -> str:
    """kube-apiserver's words: `Apply failed with 1 conflict: conflict with "kubectl-client-side-apply"
    using v1: .data.foo`."""
    def field(p: Path_) -> str:
        return "".join(f".{k}" for k in p)
    if len(conflicts) == 1:
        mgr, p = conflicts[0]
        return f'Apply failed with 1 conflict: conflict with "{mgr}" using {api_version}: {field(p)}'
    lines = [f'conflict with "{mgr}" using {api_version}: {field(p)}' for mgr, p in conflicts]
    return f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
