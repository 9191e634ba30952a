# SPDX-License-Identifier: Apache-2.0
"""Structural schemas of custom resources: pruning, validation and unknown-field detection, as
kube-apiserver applies a CRD version's openAPIV3Schema to the objects it stores."""

from __future__ import annotations

import json
import re
from typing import Any

from .types import JSON

_TYPES: dict[str, tuple[type, ...]] = {"object": (dict,), "array": (list,), "string": (str,),
                                        "integer": (int,), "number": (int, float), "boolean": (bool,)}
# The fields every object has whatever its schema says (kube-apiserver never prunes them).
_ROOT_FIELDS = ("apiVersion", "kind", "metadata")


def _keeps_all(schema: JSON) -> bool:
    return schema.get("x-kubernetes-preserve-unknown-fields") is True or (
        schema.get("properties") is None and schema.get("additionalProperties") is None
        and schema.get("type") is None)


def prune(value: Any, schema: JSON) -> Any:
    """Drop the fields a structural schema does not declare (kube-apiserver's pruning), except under
    `x-kubernetes-preserve-unknown-fields: true` or `additionalProperties`."""
    if isinstance(value, dict) and schema.get("type", "object") == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        out = {}
        for k, v in value.items():
            if props is not None and k in props:
                out[k] = prune(v, props[k])
            elif isinstance(extra, dict):
                out[k] = prune(v, extra)
            elif _keeps_all(schema):
                out[k] = v
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [prune(v, schema["items"]) for v in value]
    return value


def unknown_fields(value: Any, schema: JSON, path: str = "", *, root: bool = True) -> list[str]:
    """The paths of the fields pruning would drop (`spec.foo`, `spec.list[0].bar`): what strict
    field validation refuses and warn validation warns about."""
    out: list[str] = []
    if isinstance(value, dict) and schema.get("type", "object") == "object":
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        for k, v in value.items():
            sub = f"{path}.{k}" if path else k
            if root and k in _ROOT_FIELDS:
                continue
            if props is not None and k in props:
                out += unknown_fields(v, props[k], sub, root=False)
            elif isinstance(extra, dict):
                out += unknown_fields(v, extra, sub, root=False)
            elif not _keeps_all(schema):
                out.append(sub)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            out += unknown_fields(v, schema["items"], f"{path}[{i}]", root=False)
    return out


def _json_type(value: Any) -> str:
    for name, types in (("boolean", (bool,)), ("integer", (int,)), ("number", (float,)), ("string", (str,)),
                        ("object", (dict,)), ("array", (list,))):
        if isinstance(value, types):
            return name
    return "null"


def validate(value: Any, schema: JSON, path: str, *, root: bool = False) -> list[str]:
    """Every violation of `schema` in `value`, worded as kube-apiserver words them
    (`spec.port: Invalid value: 70000: spec.port in body should be less than or equal to 65535`)."""
    out: list[str] = []
    want = schema.get("type")
    if want and value is not None:
        ok = isinstance(value, _TYPES.get(want, (object,))) and not (want in ("integer", "number")
                                                                     and isinstance(value, bool))
        if not ok:
            got = _json_type(value)
            return [f'{path}: Invalid value: "{got}": {path} in body must be of type {want}: "{got}"']
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for req in schema.get("required") or []:
            if req not in value:
                out.append(f"{path + '.' if path else ''}{req}: Required value")
        for k, v in value.items():
            if root and k in _ROOT_FIELDS:
                continue
            sub = props.get(k) or (schema["additionalProperties"] if isinstance(schema.get("additionalProperties"),
                                                                                 dict) else None)
            if sub is not None:
                out += validate(v, sub, f"{path + '.' if path else ''}{k}")
    elif isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            out.append(f"{path}: Invalid value: {len(value)}: {path} in body should have at least "
                       f"{schema['minItems']} items")
        if isinstance(schema.get("items"), dict):
            for i, v in enumerate(value):
                out += validate(v, schema["items"], f"{path}[{i}]")
    elif isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            out.append(f"{path}: Too long: may not be longer than {schema['maxLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f'{path}: Invalid value: {json.dumps(value)}: {path} in body should match '
                       f"'{schema['pattern']}'")
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            out.append(f"{path}: Invalid value: {value}: {path} in body should be greater than or equal to "
                       f"{schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            out.append(f"{path}: Invalid value: {value}: {path} in body should be less than or equal to "
                       f"{schema['maximum']}")
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: Unsupported value: {json.dumps(value)}")
    return out
