# SPDX-License-Identifier: Apache-2.0
"""A running lab cluster's control plane from its recorded access (state.KubeAccess): the
ControlPlane object over its files, and one admin request from inside its namespace. Kept apart
from kube_cluster so the CNI reproductions (cni_calico) can call the API without a cycle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshctl.errors import MeshError
from meshctl.etcd.nsconn import session
from meshctl.lab.namespaces.state import KubeAccess
from meshctl.lab.rigs.kube_control_plane import ControlPlane


def control_plane(kube: KubeAccess) -> ControlPlane:
    """The ControlPlane of a started lab cluster (its files are in `kube.dir`)."""
    host, _, port = kube.url.removeprefix("https://").rpartition(":")
    return ControlPlane(Path(kube.dir), host=host.strip("[]"), port=int(port), netns=kube.netns)


def request(kube: KubeAccess, method: str, path: str, body: Any = None, *,
            content_type: str = "application/json") -> Any:
    """One request to a lab's API server as its admin, from inside its namespace; the decoded
    answer, or MeshError with the server's message."""
    ident = control_plane(kube).admin_identity()
    with session(kube.netns) as s:
        s.verify = kube.ca
        s.cert = (str(ident.cert), str(ident.key))
        r = s.request(method, kube.url + path, data=json.dumps(body) if body is not None else None,
                      headers={"Content-Type": content_type}, timeout=10)
    if r.status_code >= 400:
        raise MeshError(f"{method} {path}: {r.status_code} {r.text.strip()[:200]}")
    return r.json() if r.content else None
