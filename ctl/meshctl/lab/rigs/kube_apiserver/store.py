# SPDX-License-Identifier: Apache-2.0
"""The object store: one resourceVersion counter, objects by (type, namespace, name), a bounded
watch history, and the types it serves (built-in ones, and those CRDs register while they exist).

Writes go through `_admit` (custom objects pruned and validated against their CRD's schema, unknown
fields refused or warned about by the request's fieldValidation) and record field ownership
(fields.py), so client-side and server-side apply behave as against kube-apiserver.
"""

from __future__ import annotations

import copy
import re
import threading
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import fields
from .patches import json_patch, merge_patch, strategic_merge
from .schema import prune, unknown_fields, validate
from .types import BUILTIN, CRD_PLURAL, JSON, ApiFailure, ResourceType, builtin_schema, not_found

# The patch kinds served (Content-Type of a PATCH); any other is answered 415 as kube-apiserver does.
APPLY_PATCH = "application/apply-patch+yaml"
PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json",
               "application/json-patch+json", APPLY_PATCH)
VALIDATION = ("Strict", "Warn", "Ignore")
NAMESPACE_CLEANUP = 2.0  # seconds a deleted namespace stays Terminating before it and its objects go


@dataclass
class Write:
    """How one write is made: by which field manager, with which field validation (kube-apiserver's
    default is Warn), forcing apply conflicts or not, for real or as a dry run (`dryRun=All`: the
    answer is the object as it would be, nothing is stored: `kubectl diff`, `--dry-run=server`);
    the warnings it raises are collected here."""

    manager: str | None = None
    validation: str = "Warn"
    force: bool = False
    warnings: list[str] = field(default_factory=list)
    dry_run: bool = False


# --- selectors -------------------------------------------------------------------------------


def selector(text: str | None) -> list[tuple[str, str, str]]:
    """`a=b,c!=d,e` (equality, inequality and existence only)."""
    out: list[tuple[str, str, str]] = []
    for term in (text or "").split(","):
        term = term.strip()
        if not term:
            continue
        m = re.fullmatch(r"([^=!]+?)\s*(==|=|!=)\s*(.*)", term)
        if m:
            out.append((m.group(1), "!=" if m.group(2) == "!=" else "=", m.group(3)))
        elif term.startswith("!"):
            out.append((term[1:], "!exists", ""))
        else:
            out.append((term, "exists", ""))
    return out


def _field(obj: JSON, path: str) -> str | None:
    cur: Any = obj
    for p in path.split("."):
        if not isinstance(cur, dict) or p not in cur:
            return None
        cur = cur[p]
    return None if cur is None else str(cur)


def matches(obj: JSON, labels: list[tuple[str, str, str]], flds: list[tuple[str, str, str]]) -> bool:
    lab = obj.get("metadata", {}).get("labels") or {}
    for key, op, val in labels:
        have = lab.get(key)
        if (op == "=" and have != val) or (op == "!=" and have == val) or (op == "exists" and have is None) \
                or (op == "!exists" and have is not None):
            return False
    for key, op, val in flds:
        have = _field(obj, key)
        if (op == "=" and (have or "") != val) or (op == "!=" and (have or "") == val):
            return False
    return True


# --- the store -------------------------------------------------------------------------------


@dataclass
class Event:
    rv: int
    rt: ResourceType
    type: str
    obj: JSON


@dataclass(frozen=True)
class CustomType:
    """What a CRD version adds to a served type: its schema and its printer columns."""

    schema: JSON | None
    columns: tuple[JSON, ...]


class Store:
    """Objects by (resource type, namespace, name), one revision counter and a bounded event
    history: a watch can resume from any version still in the history and gets 410 Gone for an
    older one. `compact()` drops the history, as etcd compaction does."""

    def __init__(self, history: int = 1000, namespaces: tuple[str, ...] = ("default", "kube-system")) -> None:
        self.cond = threading.Condition()
        self.rv = 0
        self.types: dict[tuple[str, str, str], ResourceType] = {}
        self.custom: dict[ResourceType, CustomType] = {}
        self.objects: dict[tuple[ResourceType, str, str], JSON] = {}
        self.events: deque[Event] = deque(maxlen=history)
        self.compacted = 0  # versions <= this one may be missing from the history
        self.generation = 0  # bumped by drop_watches: open watches end
        self.held = False  # while set, watches deliver nothing (a network partition, for tests)
        self.changes = 0  # bumped when the served types change (discovery and OpenAPI follow)
        for rt in BUILTIN:
            self.register(rt)
        for ns in namespaces:
            self.create(self.types[("", "v1", "namespaces")], "", {"metadata": {"name": ns}})

    @property
    def schemas(self) -> dict[ResourceType, JSON]:
        """The schema objects are checked against: a custom resource's openAPIV3Schema, a built-in
        kind's top-level fields (types.TOP_FIELDS)."""
        out = {rt: s for rt in self.served() if rt not in self.custom and (s := builtin_schema(rt)) is not None}
        out.update({rt: c.schema for rt, c in self.custom.items() if c.schema})
        return out

    # types

    def register(self, rt: ResourceType) -> None:
        with self.cond:
            self.types[(rt.group, rt.version, rt.plural)] = rt
            self.changes += 1

    def served(self) -> list[ResourceType]:
        with self.cond:
            return list(self.types.values())

    def resource(self, group: str, version: str, plural: str) -> ResourceType:
        rt = self.types.get((group, version, plural))
        if rt is None:
            gv = f"{group}/{version}" if group else version
            raise ApiFailure(404, "NotFound", f"the server could not find the requested resource ({gv} {plural})")
        return rt

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        return next((t for t in self.served() if t.group == group and t.version == version and t.kind == kind), None)

    def _crd_types(self, crd: JSON) -> dict[ResourceType, CustomType]:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        if not spec.get("group") or not names.get("plural") or not names.get("kind"):
            raise ApiFailure(422, "Invalid", "CustomResourceDefinition needs spec.group, spec.names.plural and kind")
        if crd["metadata"]["name"] != f"{names['plural']}.{spec['group']}":
            raise ApiFailure(422, "Invalid", f"metadata.name must be {names['plural']}.{spec['group']}")
        namespaced = spec.get("scope", "Namespaced") == "Namespaced"
        out = {}
        for v in spec.get("versions") or []:
            if v.get("served", True):
                rt = ResourceType(spec["group"], v["name"], names["kind"], names["plural"], namespaced,
                                  tuple(names.get("shortNames") or ()), tuple(names.get("categories") or ()),
                                  names.get("singular") or "")
                schema = (v.get("schema") or {}).get("openAPIV3Schema")
                out[rt] = CustomType(schema, tuple(v.get("additionalPrinterColumns") or ()))
        return out

    def _set_crd(self, old: JSON | None, new: JSON | None) -> None:
        """Serve what CRD `new` defines instead of what `old` did (lock held); objects of a
        removed CRD go with it, as kube-apiserver deletes them."""
        gone = self._crd_types(old) if old else {}
        added = self._crd_types(new) if new else {}
        for rt in gone:
            self.types.pop((rt.group, rt.version, rt.plural), None)
            self.custom.pop(rt, None)
            kept = next((a for a in added if a.same_resource(rt)), None)
            for k in [k for k in self.objects if k[0] == rt]:
                obj = self.objects.pop(k)
                if kept is None:  # the version is no longer served: its objects go
                    self._bump(obj)
                    self._emit(k[0], "DELETED", obj)
                else:  # the same resource with new names: its objects stay, under the new type
                    self.objects[(kept, k[1], k[2])] = obj
        for rt, c in added.items():
            self.types[(rt.group, rt.version, rt.plural)] = rt
            self.custom[rt] = c
        self.changes += 1

    def _admit(self, rt: ResourceType, obj: JSON, w: Write) -> JSON:
        """A custom object as a real API server stores it: unknown fields refused (Strict),
        warned about (Warn) and pruned, then validated; any violation is a 422 Invalid naming
        every field."""
        if rt.plural == CRD_PLURAL:
            self._crd_types(obj)  # refuses a malformed CRD before it is stored
            obj.setdefault("status", {})["conditions"] = [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found"},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted"}]
            obj["status"]["acceptedNames"] = (obj.get("spec") or {}).get("names") or {}
        if rt.plural == "namespaces":
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
            obj.setdefault("status", {"phase": "Active"})
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
        schema = self.schemas.get(rt)
        if schema is None:
            return obj
        unknown = unknown_fields(obj, schema)
        if unknown and w.validation == "Strict":
            words = ", ".join(f'unknown field "{u}"' for u in unknown)
            raise ApiFailure(400, "BadRequest", f'{rt.kind} in version "{rt.version}" cannot be handled as a '
                             f"{rt.kind}: strict decoding error: {words}")
        if w.validation == "Warn":
            w.warnings += [f'unknown field "{u}"' for u in unknown]
        meta = obj.get("metadata")
        out: JSON = prune(obj, schema)
        out["apiVersion"], out["kind"], out["metadata"] = obj.get("apiVersion"), obj.get("kind"), meta
        causes = validate(out, schema, "", root=True)
        if causes:
            name = (meta or {}).get("name", "")
            detail = causes[0] if len(causes) == 1 else "[" + ", ".join(causes) + "]"
            raise ApiFailure(422, "Invalid", f'{rt.kind}.{rt.group} "{name}" is invalid: {detail}')
        return out

    # writes (callers hold no lock)

    def _emit(self, rt: ResourceType, type_: str, obj: JSON) -> None:
        if len(self.events) == self.events.maxlen:
            self.compacted = self.events[0].rv
        self.events.append(Event(self.rv, rt, type_, copy.deepcopy(obj)))
        self.cond.notify_all()

    def _bump(self, obj: JSON) -> None:
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)

    def create(self, rt: ResourceType, ns: str, obj: Any, w: Write | None = None) -> JSON:
        w = w or Write()
        if not isinstance(obj, dict):
            raise ApiFailure(400, "BadRequest", "the body is not an object")
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiFailure(400, "BadRequest", "metadata is not an object")
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise ApiFailure(422, "Invalid", f"{rt.kind}: metadata.name: Required value")
        if rt.namespaced:
            if meta.get("namespace") not in (None, ns):
                raise ApiFailure(400, "BadRequest", "the namespace of the object does not match the namespace on "
                                 "the request")
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        with self.cond:
            obj = self._admit(rt, obj, w)
            meta = obj["metadata"]
            nskey = (self.types[("", "v1", "namespaces")], "", ns)
            if rt.namespaced and nskey not in self.objects:
                raise ApiFailure(404, "NotFound", f'namespaces "{ns}" not found')
            if rt.namespaced and self.objects[nskey]["metadata"].get("deletionTimestamp"):
                raise ApiFailure(403, "Forbidden", f'{rt.plural} "{name}" is forbidden: unable to create new content '
                                 f"in namespace {ns} because it is being terminated")
            key = (rt, ns if rt.namespaced else "", name)
            if key in self.objects:
                what = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
                raise ApiFailure(409, "AlreadyExists", f'{what} "{name}" already exists')
            meta.pop("managedFields", None)
            if w.manager:
                fields.record_update(None, obj, w.manager, rt.api_version)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = fields.now()
            meta.pop("deletionTimestamp", None)
            if w.dry_run:
                return copy.deepcopy(obj)
            self._bump(obj)
            self.objects[key] = obj
            if rt.plural == CRD_PLURAL:
                self._set_crd(None, obj)
            self._emit(rt, "ADDED", obj)
            return copy.deepcopy(obj)

    def get(self, rt: ResourceType, ns: str, name: str) -> JSON:
        with self.cond:
            obj = self.objects.get((rt, ns if rt.namespaced else "", name))
            if obj is None:
                raise not_found(rt, name)
            return copy.deepcopy(obj)

    def _replace(self, rt: ResourceType, ns: str, name: str, new: Any, expect_rv: str | None, w: Write,
                 *, owned: bool = False) -> JSON:
        """Store `new` in place of the current object (lock held): identity fields stay, a stale
        resourceVersion conflicts, an unchanged object is not written. `owned`: the ownership
        in `new` is already worked out (an apply)."""
        key = (rt, ns if rt.namespaced else "", name)
        old = self.objects.get(key)
        if old is None:
            raise not_found(rt, name)
        if not isinstance(new, dict) or not isinstance(new.get("metadata", {}), dict):
            raise ApiFailure(422, "Invalid", "the result is not an object with metadata")
        if expect_rv and expect_rv != old["metadata"]["resourceVersion"]:
            raise ApiFailure(409, "Conflict", f'Operation cannot be fulfilled on {rt.plural} "{name}": the object '
                             "has been modified; please apply your changes to the latest version and try again")
        new = copy.deepcopy(new)
        meta = new.setdefault("metadata", {})
        if meta.get("name", name) != name:
            raise ApiFailure(400, "BadRequest", "metadata.name cannot be changed")
        for k in ("name", "namespace", "uid", "creationTimestamp", "resourceVersion"):
            if k in old["metadata"]:
                meta[k] = old["metadata"][k]
            else:
                meta.pop(k, None)
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        new = self._admit(rt, new, w)
        if not owned:
            fields.record_update(old, new, w.manager, rt.api_version)
        if new == old:
            return copy.deepcopy(old)
        if w.dry_run:
            return copy.deepcopy(new)
        self._bump(new)
        self.objects[key] = new
        if rt.plural == CRD_PLURAL:
            self._set_crd(old, new)
        self._emit(rt, "MODIFIED", new)
        return copy.deepcopy(new)

    def update(self, rt: ResourceType, ns: str, name: str, obj: Any, w: Write | None = None) -> JSON:
        with self.cond:
            rv = (obj.get("metadata") or {}).get("resourceVersion") if isinstance(obj, dict) else None
            return self._replace(rt, ns, name, obj, rv, w or Write())

    def patch(self, rt: ResourceType, ns: str, name: str, content_type: str, body: Any,
              w: Write | None = None) -> JSON:
        """Apply a patch of `content_type` (PATCH_TYPES); an apply patch creates a missing object."""
        w = w or Write()
        if content_type not in PATCH_TYPES:
            raise ApiFailure(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                             f"accepted media types include: {', '.join(PATCH_TYPES)}")
        if content_type == APPLY_PATCH:
            return self.apply(rt, ns, name, body, w)
        with self.cond:
            current = self.get(rt, ns, name)
            if content_type == "application/json-patch+json":
                new = json_patch(current, body)
            elif content_type == "application/strategic-merge-patch+json":
                if self.custom.get(rt) is not None:
                    raise ApiFailure(415, "UnsupportedMediaType", "strategic merge patch is not supported for "
                                     "custom resources: use a merge patch")
                new = strategic_merge(current, body, rt.kind)
            else:
                new = merge_patch(current, body)
            rv = (new.get("metadata") or {}).get("resourceVersion") if isinstance(new, dict) else None
            return self._replace(rt, ns, name, new, rv, w)

    def apply(self, rt: ResourceType, ns: str, name: str, body: Any, w: Write) -> JSON:
        """Server-side apply of the object `body` (YAML or JSON text, or an object) by w.manager."""
        if isinstance(body, bytes | str):
            try:
                body = yaml.safe_load(body)
            except yaml.YAMLError as e:
                raise ApiFailure(400, "BadRequest", f"the apply patch is not YAML: {e}") from None
        if not isinstance(body, dict):
            raise ApiFailure(400, "BadRequest", "the apply patch is not an object")
        if not w.manager:
            raise ApiFailure(422, "Invalid", "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required "
                             "value: is required for apply patch")
        if body.get("apiVersion") != rt.api_version or body.get("kind") != rt.kind:
            raise ApiFailure(400, "BadRequest", f"the apply patch is a {body.get('apiVersion')}/{body.get('kind')}, "
                             f"not a {rt.api_version}/{rt.kind}")
        if (body.get("metadata") or {}).get("name", name) != name:
            raise ApiFailure(400, "BadRequest", "the name of the object does not match the name on the URL")
        schema = self.schemas.get(rt)
        unknown = unknown_fields(body, schema) if schema else []
        if unknown:
            raise ApiFailure(400, "BadRequest", f"failed to create typed patch object ({rt.group}/{rt.version}, "
                             f"Kind={rt.kind}): .{unknown[0]}: field not declared in schema")
        with self.cond:
            key = (rt, ns if rt.namespaced else "", name)
            live = self.objects.get(key)
            new = fields.server_side_apply(live, body, w.manager, w.force, rt.api_version)
            if live is None:
                new.setdefault("metadata", {})["name"] = name
                managed = new["metadata"].get("managedFields")
                made = self.create(rt, ns, new, Write(None, w.validation, w.force, w.warnings, w.dry_run))
                stored = made if w.dry_run else self.objects[key]
                stored["metadata"]["managedFields"] = managed
                return copy.deepcopy(stored)
            return self._replace(rt, ns, name, new, None, w, owned=True)

    def delete(self, rt: ResourceType, ns: str, name: str, *, dry_run: bool = False) -> JSON:
        with self.cond:
            key = (rt, ns if rt.namespaced else "", name)
            obj = self.objects.get(key)
            if obj is None:
                raise not_found(rt, name)
            if dry_run:
                return copy.deepcopy(obj)
            if rt.plural == "namespaces":
                return self._terminate(key)
            del self.objects[key]
            self._bump(obj)
            self._emit(rt, "DELETED", obj)
            if rt.plural == CRD_PLURAL:
                self._set_crd(obj, None)
            return copy.deepcopy(obj)

    def _terminate(self, key: tuple[ResourceType, str, str]) -> JSON:
        """Delete a namespace as kube-apiserver does (lock held): it turns Terminating at once,
        refuses new objects, and goes with everything in it a moment later (its controller's
        work), so deleting its objects right after it still finds them."""
        ns = self.objects[key]
        if not ns["metadata"].get("deletionTimestamp"):
            ns["metadata"]["deletionTimestamp"] = fields.now()
            ns.setdefault("status", {})["phase"] = "Terminating"
            self._bump(ns)
            self._emit(key[0], "MODIFIED", ns)
            timer = threading.Timer(NAMESPACE_CLEANUP, self._finish_namespace, (key,))
            timer.daemon = True
            timer.start()
        return copy.deepcopy(ns)

    def _finish_namespace(self, key: tuple[ResourceType, str, str]) -> None:
        with self.cond:
            for k in [k for k in self.objects if k[0].namespaced and k[1] == key[2]]:
                gone = self.objects.pop(k)
                self._bump(gone)
                self._emit(k[0], "DELETED", gone)
            ns = self.objects.pop(key, None)
            if ns is not None:
                self._bump(ns)
                self._emit(key[0], "DELETED", ns)

    # reads

    def list(self, rt: ResourceType, ns: str | None, labels: str | None = None, flds: str | None = None
             ) -> tuple[int, list[JSON]]:
        lsel, fsel = selector(labels), selector(flds)
        with self.cond:
            items = [copy.deepcopy(o) for (t, n, _), o in sorted(self.objects.items(), key=lambda kv: kv[0][1:])
                     if t == rt and (ns is None or n == ns) and matches(o, lsel, fsel)]
            return self.rv, items

    def compact(self) -> int:
        """Forget the event history, as etcd compaction does: watches from older versions get 410."""
        with self.cond:
            self.events.clear()
            self.compacted = self.rv
            return self.rv

    def hold(self, on: bool = True) -> None:
        """Stop (or resume) delivering watch events: what happens meanwhile is what a client
        behind a partition misses. Lists and writes go on."""
        with self.cond:
            self.held = on
            self.cond.notify_all()

    def drop_watches(self) -> None:
        """End every open watch stream, as a restarting API server does; clients resume."""
        with self.cond:
            self.generation += 1
            self.cond.notify_all()


def load_manifests(store: Store, paths: list[str]) -> int:
    """Create every object of the YAML files, or of a folder's *.yaml in name order, that this
    server serves (namespaced objects in their metadata.namespace, else default)."""
    files: list[Path] = []
    for path in map(Path, paths):
        files += sorted(path.glob("*.yaml")) if path.is_dir() else [path]
    n = 0
    for f in files:
        for doc in yaml.safe_load_all(f.read_text()):
            if not doc:
                continue
            rt = store.by_kind(doc.get("apiVersion", ""), doc.get("kind", ""))
            if rt is None:
                continue  # kinds this server does not serve
            store.create(rt, (doc.get("metadata") or {}).get("namespace") or "default" if rt.namespaced else "", doc)
            n += 1
    return n
