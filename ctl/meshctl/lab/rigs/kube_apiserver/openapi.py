# SPDX-License-Identifier: Apache-2.0
"""OpenAPI v3 as kube-apiserver serves it: `/openapi/v3` names one document per group-version
(`/openapi/v3/apis/meshctl.io/v1alpha1?hash=...`), each with the paths of its resources and the
schemas of its kinds. A custom resource's schema is its CRD's openAPIV3Schema, so `kubectl explain`
and kubectl's validation see it; every PATCH operation declares the `fieldValidation` parameter,
which tells kubectl (1.27+) to leave field validation to the server (fieldValidation=Strict).
Built-in kinds get their top-level fields only (types.TOP_FIELDS: this server keeps no Go types to
describe them further)."""

from __future__ import annotations

import copy
import hashlib
import json

from .types import JSON, ResourceType

OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_WRITE_PARAMS = ("dryRun", "fieldManager", "fieldValidation")


def _prefix(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def schema_name(rt: ResourceType) -> str:
    """The component name kube-apiserver gives a kind: io.k8s.api.core.v1.Node, io.meshctl.v1alpha1.Peer."""
    if rt.group == "" or rt.group.endswith(".k8s.io") or "." not in rt.group:
        g = "core" if rt.group == "" else rt.group.removesuffix(".k8s.io").split(".")[0]
        return f"io.k8s.api.{g}.{rt.version}.{rt.kind}"
    return ".".join(reversed(rt.group.split("."))) + f".{rt.version}.{rt.kind}"


def _kind_schema(rt: ResourceType, custom: JSON | None) -> JSON:
    if custom is not None:
        out = copy.deepcopy(custom)
    else:
        out = {"type": "object", "x-kubernetes-preserve-unknown-fields": True,
               "description": f"{rt.kind} ({rt.api_version}), stored as sent."}  # a kind without TOP_FIELDS
    props = out.setdefault("properties", {})
    props["apiVersion"] = {"type": "string", "description": "APIVersion defines the versioned schema of this object."}
    props["kind"] = {"type": "string", "description": "Kind is a string value representing the REST resource."}
    props["metadata"] = {"allOf": [{"$ref": f"#/components/schemas/{OBJECT_META}"}],
                         "description": "Standard object's metadata."}
    out["x-kubernetes-group-version-kind"] = [{"group": rt.group, "version": rt.version, "kind": rt.kind}]
    return out


def _op(rt: ResourceType, action: str, params: tuple[str, ...], body: tuple[str, ...] = ()) -> JSON:
    ref = {"$ref": f"#/components/schemas/{schema_name(rt)}"}
    out: JSON = {"operationId": f"{action}{rt.kind}", "x-kubernetes-action": action,
                 "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
                 "parameters": [{"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
                                for p in params],
                 "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}}}
    if body:
        out["requestBody"] = {"content": {c: {"schema": ref} for c in body}, "required": True}
    return out


def document(types: list[ResourceType], schemas: dict[ResourceType, JSON], group: str, version: str) -> JSON | None:
    """The OpenAPI v3 document of one group-version, or None when nothing is served there."""
    rts = [rt for rt in types if rt.group == group and rt.version == version]
    if not rts:
        return None
    paths: JSON = {}
    components: JSON = {OBJECT_META: {"type": "object", "description": "ObjectMeta is metadata that all persisted "
                                      "resources must have.", "x-kubernetes-preserve-unknown-fields": True}}
    for rt in sorted(rts, key=lambda t: t.plural):
        base = "/" + _prefix(group, version) + ("/namespaces/{namespace}" if rt.namespaced else "")
        paths[f"{base}/{rt.plural}"] = {"get": _op(rt, "list", ("labelSelector", "fieldSelector", "limit")),
                                        "post": _op(rt, "post", _WRITE_PARAMS, ("*/*",))}
        patch_types = ("application/json-patch+json", "application/merge-patch+json", "application/apply-patch+yaml")
        paths[f"{base}/{rt.plural}/{{name}}"] = {
            "get": _op(rt, "get", ()), "put": _op(rt, "put", _WRITE_PARAMS, ("*/*",)),
            "patch": _op(rt, "patch", (*_WRITE_PARAMS, "force"), patch_types),
            "delete": _op(rt, "delete", ("dryRun",))}
        components[schema_name(rt)] = _kind_schema(rt, schemas.get(rt))
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.31.0"}, "paths": paths,
            "components": {"schemas": components}}


def index(types: list[ResourceType], schemas: dict[ResourceType, JSON]) -> JSON:
    """`/openapi/v3`: each group-version's document by its path, with a hash of its content."""
    out: JSON = {}
    for gv in sorted({(rt.group, rt.version) for rt in types}):
        doc = document(types, schemas, *gv)
        digest = hashlib.sha512(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()
        out[_prefix(*gv)] = {"serverRelativeURL": f"/openapi/v3/{_prefix(*gv)}?hash={digest}"}
    return {"paths": out}
