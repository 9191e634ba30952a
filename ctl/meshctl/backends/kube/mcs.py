# SPDX-License-Identifier: Apache-2.0
"""The Multi-Cluster Services API, the Kubernetes side: what the controller of the cluster-mesh
cache (backends.kube.mcs_controller) reads (Services, EndpointSlices, ServiceExports, ServiceImports,
Namespaces) and writes (ServiceImports and their status, derived Services, their EndpointSlices,
ServiceExport conditions), as plain dicts. Every write goes through the grants of the
`meshctl-clustermesh-cache` ServiceAccount (manifests/02-rbac.yaml) and the admission policy
that holds them to the objects labelled managed by mcs.meshctl.io (manifests/admission-policy.yaml).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lightkube import ApiError, Client
from lightkube.generic_resource import create_global_resource, create_namespaced_resource
from lightkube.types import PatchType

from meshctl.backends.kube.services import (
    ENDPOINT_SLICES,
    SERVICE_IMPORTS,
    SERVICES,
    KubeServiceApi,
    Obj,
    apply_changes,
    as_dict,
)
from meshctl.errors import MeshError
from meshctl.mesh.mcs import must_recreate, owned
from meshctl.mesh.services import ObjectChanges

NAMESPACES = create_global_resource("", "v1", "Namespace", "namespaces")
EXPORT_STATUS = create_namespaced_resource("multicluster.x-k8s.io", "v1alpha1", "ServiceExport", "serviceexports")
IMPORT_STATUS = create_namespaced_resource("multicluster.x-k8s.io", "v1alpha1", "ServiceImport", "serviceimports")


@dataclass(frozen=True)
class McsView:
    """One read of what the controller decides from."""

    services: list[Obj]
    slices: list[Obj]
    exports: list[Obj]
    imports: list[Obj]
    namespaces: frozenset[str]


class KubeMcsApi:
    """The controller's reads and writes."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self._lists = KubeServiceApi(client)

    def read(self) -> McsView:
        """Everything at once; MeshError when the MCS CRDs are not served (install
        manifests/06-mcs-crds.yaml)."""
        exports, imports = self._lists.exports(), self._lists.imports()
        if exports is None or imports is None:
            raise MeshError("the Multi-Cluster Services CRDs (serviceexports and serviceimports."
                            "multicluster.x-k8s.io) are not served: apply manifests/ (06-mcs-crds.yaml)")
        names = frozenset(str((as_dict(n).get("metadata") or {}).get("name")) for n in self.client.list(NAMESPACES))
        return McsView(self._lists.services(), self._lists.slices(), exports, imports, names)

    def apply_services(self, changes: ObjectChanges, have: dict[tuple[str, str], Obj]
                       ) -> tuple[int, list[str], dict[tuple[str, str], list[str]]]:
        """Write derived Services (a replace keeps the allocated ClusterIP; a change of headlessness
        deletes and creates, a ClusterIP being immutable). Returns the writes, the failures, and
        the ClusterIPs of the Services created or replaced, by namespace and name."""
        ips: dict[tuple[str, str], list[str]] = {}
        creates, updates = list(changes.creates), []
        deletes = list(changes.deletes)
        for want in changes.updates:
            ref = (want["metadata"]["namespace"], want["metadata"]["name"])
            old = have.get(ref, {})
            if must_recreate(old, want):
                deletes.append(ref)
                meta = {k: v for k, v in want["metadata"].items() if k != "resourceVersion"}
                creates.append({**want, "metadata": meta})
                continue
            spec = {**want["spec"]}
            if want["spec"].get("clusterIP") != "None":
                for k in ("clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"):
                    if (old.get("spec") or {}).get(k) is not None:
                        spec[k] = old["spec"][k]
            updates.append({**want, "spec": spec})
        n, failed = apply_changes(self.client, SERVICES, "service", ObjectChanges(deletes=tuple(deletes)), owned)
        for obj in creates:
            meta = obj["metadata"]
            try:
                made = as_dict(self.client.create(SERVICES.from_dict(obj), namespace=meta["namespace"]))
                ips[(meta["namespace"], meta["name"])] = cluster_ips(made)
                n += 1
            except ApiError as e:
                failed.append(f"service {meta['namespace']}/{meta['name']}: create: {e.status.message}")
        for obj in updates:
            meta = obj["metadata"]
            try:
                made = as_dict(self.client.replace(SERVICES.from_dict(obj)))
                ips[(meta["namespace"], meta["name"])] = cluster_ips(made)
                n += 1
            except ApiError as e:
                failed.append(f"service {meta['namespace']}/{meta['name']}: replace: {e.status.message}")
        return n, failed, ips

    def apply_imports(self, changes: ObjectChanges) -> tuple[int, list[str]]:
        return apply_changes(self.client, SERVICE_IMPORTS, "serviceimport", changes, owned)

    def apply_slices(self, changes: ObjectChanges) -> tuple[int, list[str]]:
        return apply_changes(self.client, ENDPOINT_SLICES, "endpointslice", changes, owned)

    def set_status(self, kind: str, ns: str, name: str, status: dict[str, Any]) -> str | None:
        """Merge-patch the status of a ServiceExport (`kind` serviceexport) or ServiceImport; why
        not, or None."""
        res = EXPORT_STATUS if kind == "serviceexport" else IMPORT_STATUS
        try:
            self.client.patch(res.Status, name, {"status": status}, namespace=ns, patch_type=PatchType.MERGE)
        except ApiError as e:
            if e.status.code == 404:
                return None  # gone since the read: the next pass forgets it
            return f"{kind} {ns}/{name}: status: {e.status.message}"
        return None


def cluster_ips(svc: Obj) -> list[str]:
    """A Service's ClusterIPs (none for a headless one)."""
    spec = svc.get("spec") or {}
    ips = [str(a) for a in spec.get("clusterIPs") or () if a and a != "None"]
    return ips or ([str(spec["clusterIP"])] if spec.get("clusterIP") not in (None, "", "None") else [])
