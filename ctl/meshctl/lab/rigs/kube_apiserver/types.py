# SPDX-License-Identifier: Apache-2.0
"""The resource types the server serves: what discovery, OpenAPI, tables and the store agree on.

Built-in kinds are stored as generic objects (no controllers run): the server only has to know
each one's group, version, plural, scope and short names, as kube-apiserver's discovery says them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

JSON = dict[str, Any]

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    """One served resource: `kind` in `group/version` at `plural`, namespaced or cluster-wide."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    singular: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular_name(self) -> str:
        return self.singular or self.kind.lower()

    def same_resource(self, other: ResourceType) -> bool:
        """Whether both name the same resource (short names and categories aside)."""
        return (self.group, self.version, self.plural) == (other.group, other.version, other.plural)


def _t(group: str, version: str, kind: str, plural: str, namespaced: bool, short: tuple[str, ...] = (),
       cats: tuple[str, ...] = ()) -> ResourceType:
    return ResourceType(group, version, kind, plural, namespaced, short, cats)


# Every kind manifests/ holds, what the agent reads and writes, and what the global-services work
# reads (Services, EndpointSlices, Leases); short names and categories as kube-apiserver has them.
BUILTIN = (
    _t("", "v1", "Node", "nodes", False, ("no",)),
    _t("", "v1", "Namespace", "namespaces", False, ("ns",)),
    _t("", "v1", "ConfigMap", "configmaps", True, ("cm",)),
    _t("", "v1", "Secret", "secrets", True),
    _t("", "v1", "Event", "events", True, ("ev",)),
    _t("", "v1", "ServiceAccount", "serviceaccounts", True, ("sa",)),
    _t("", "v1", "Service", "services", True, ("svc",), ("all",)),
    _t("", "v1", "Pod", "pods", True, ("po",), ("all",)),
    _t("apps", "v1", "DaemonSet", "daemonsets", True, ("ds",), ("all",)),
    _t("apps", "v1", "Deployment", "deployments", True, ("deploy",), ("all",)),
    _t("rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", False),
    _t("rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", False),
    _t("rbac.authorization.k8s.io", "v1", "Role", "roles", True),
    _t("rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", True),
    _t("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicy", "validatingadmissionpolicies", False),
    _t("admissionregistration.k8s.io", "v1", "ValidatingAdmissionPolicyBinding",
       "validatingadmissionpolicybindings", False),
    _t("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "customresourcedefinitions", False,
       ("crd", "crds")),
    _t("discovery.k8s.io", "v1", "EndpointSlice", "endpointslices", True),
    _t("coordination.k8s.io", "v1", "Lease", "leases", True),
)

CRD_PLURAL = "customresourcedefinitions"

# The top-level fields of each built-in kind besides apiVersion, kind and metadata (their Go types'
# JSON names): anything else is an unknown field, refused under fieldValidation=Strict and dropped
# otherwise, as kube-apiserver's decoder does. Below the top level the server keeps what it gets.
_SPEC_STATUS = ("spec", "status")
TOP_FIELDS: dict[str, tuple[str, ...]] = {
    **{k: _SPEC_STATUS for k in ("Node", "Namespace", "Service", "Pod", "DaemonSet", "Deployment", "Lease",
                                 "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
                                 "CustomResourceDefinition")},
    "ConfigMap": ("data", "binaryData", "immutable"),
    "Secret": ("data", "stringData", "type", "immutable"),
    "Event": ("involvedObject", "reason", "message", "source", "firstTimestamp", "lastTimestamp", "count", "type",
              "eventTime", "series", "action", "related", "reportingComponent", "reportingInstance"),
    "ServiceAccount": ("secrets", "imagePullSecrets", "automountServiceAccountToken"),
    "ClusterRole": ("rules", "aggregationRule"),
    "Role": ("rules",),
    "ClusterRoleBinding": ("subjects", "roleRef"),
    "RoleBinding": ("subjects", "roleRef"),
    "EndpointSlice": ("addressType", "endpoints", "ports"),
}


def builtin_schema(rt: ResourceType) -> JSON | None:
    """A built-in kind's schema as far as this server checks it: its top-level fields, each kept
    whole."""
    top = TOP_FIELDS.get(rt.kind)
    if top is None or rt.group not in {b.group for b in BUILTIN if b.kind == rt.kind}:
        return None
    return {"type": "object", "description": f"{rt.kind} ({rt.api_version}).",
            "properties": {f: {"x-kubernetes-preserve-unknown-fields": True} for f in top}}


class ApiFailure(Exception):
    """An API error: becomes a Status object with this code and reason."""

    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message

    def status(self) -> JSON:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "code": self.code}


def not_found(rt: ResourceType, name: str) -> ApiFailure:
    """kube-apiserver's 404 for one object: `peers.meshctl.io "x" not found`."""
    what = f"{rt.plural}.{rt.group}" if rt.group else rt.plural
    return ApiFailure(404, "NotFound", f'{what} "{name}" not found')
