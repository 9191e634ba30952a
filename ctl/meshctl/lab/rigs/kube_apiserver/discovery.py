# SPDX-License-Identifier: Apache-2.0
"""Discovery as kube-apiserver serves it: the legacy documents (`/api`, `/api/v1`, `/apis`,
`/apis/<group>/<version>`) and the aggregated ones (apidiscovery.k8s.io/v2 APIGroupDiscoveryList,
what kubectl 1.31 asks for first). Built from the served types, so a CRD shows up once created,
with its short names and categories."""

from __future__ import annotations

from .types import JSON, VERBS, ResourceType

AGGREGATED = "application/json;g=apidisco.k8s.io;v=v2;as=APIGroupDiscoveryList"


def wants_aggregated(accept: str) -> bool:
    """Whether an Accept header asks for aggregated discovery v2 before plain JSON."""
    for part in accept.split(","):
        params = {p.strip() for p in part.split(";")}
        if {"g=apidisco.k8s.io", "v=v2", "as=APIGroupDiscoveryList"} <= params:
            return True
        if "application/json" in params and len(params) == 1:
            return False
    return False


def _groups(types: list[ResourceType]) -> dict[str, dict[str, list[ResourceType]]]:
    out: dict[str, dict[str, list[ResourceType]]] = {}
    for rt in sorted(types, key=lambda t: (t.group, t.version, t.plural)):
        out.setdefault(rt.group, {}).setdefault(rt.version, []).append(rt)
    return out


def _resource(rt: ResourceType) -> JSON:
    out: JSON = {"name": rt.plural, "singularName": rt.singular_name, "namespaced": rt.namespaced,
                 "kind": rt.kind, "verbs": list(VERBS)}
    if rt.short_names:
        out["shortNames"] = list(rt.short_names)
    if rt.categories:
        out["categories"] = list(rt.categories)
    return out


def api_versions() -> JSON:
    return {"kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": ""}]}


def _group(name: str, versions: dict[str, list[ResourceType]]) -> JSON:
    vs = [{"groupVersion": f"{name}/{v}", "version": v} for v in sorted(versions, reverse=True)]
    return {"name": name, "versions": vs, "preferredVersion": vs[0]}


def group_list(types: list[ResourceType]) -> JSON:
    groups = _groups(types)
    return {"kind": "APIGroupList", "apiVersion": "v1",
            "groups": [_group(g, vs) for g, vs in groups.items() if g]}


def resource_list(types: list[ResourceType], group: str, version: str) -> JSON | None:
    rts = _groups(types).get(group, {}).get(version)
    if rts is None:
        return None
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}" if group else version,
            "resources": [_resource(rt) for rt in rts]}


def _disco_resource(rt: ResourceType) -> JSON:
    out: JSON = {"resource": rt.plural, "responseKind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
                 "scope": "Namespaced" if rt.namespaced else "Cluster", "singularResource": rt.singular_name,
                 "verbs": list(VERBS)}
    if rt.short_names:
        out["shortNames"] = list(rt.short_names)
    if rt.categories:
        out["categories"] = list(rt.categories)
    return out


def aggregated(types: list[ResourceType], legacy: bool) -> JSON:
    """The APIGroupDiscoveryList of `/api` (legacy: the core group) or of `/apis` (every other)."""
    items = []
    for g, versions in _groups(types).items():
        if (g == "") != legacy:
            continue
        items.append({"metadata": {"name": g, "creationTimestamp": None},
                      "versions": [{"version": v, "resources": [_disco_resource(rt) for rt in versions[v]],
                                    "freshness": "Current"} for v in sorted(versions, reverse=True)]})
    return {"kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {}, "items": items}
