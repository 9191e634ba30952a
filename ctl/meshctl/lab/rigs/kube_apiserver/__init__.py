# SPDX-License-Identifier: Apache-2.0
"""An in-process Kubernetes API server for tests and the namespace lab.

No real API server is available to the tests (none installs from Debian, PyPI or npm), so the
Kubernetes backend, and this machine's kubectl, are run against this one. It speaks real HTTP and
keeps the semantics clients rely on, so a client that works here works against kube-apiserver:

- one cluster-wide resourceVersion counter; every write bumps it, a no-op write does not;
- list returns the collection's resourceVersion; `limit`/`continue` page through a sorted list;
- watch streams ADDED/MODIFIED/DELETED as JSON lines; without a resourceVersion (or with "0") it
  starts with synthetic ADDED events for what exists, with one it resumes right after it; a
  version older than the kept history gets an ERROR event carrying a 410 Gone Status, as
  kube-apiserver does after etcd compaction; `timeoutSeconds` ends the stream; no BOOKMARKs;
- merge, strategic merge and JSON patches, and server-side apply with field managers
  (patches.py, fields.py); a stale metadata.resourceVersion gets 409 Conflict;
- the built-in kinds of types.py stored as generic objects; a CustomResourceDefinition that is
  created registers its resource, and its objects are pruned and validated against the version's
  openAPIV3Schema as kube-apiserver does (schema.py), unknown fields refused under
  `fieldValidation=Strict`;
- discovery, aggregated discovery (discovery.py), OpenAPI v3 (openapi.py) and Table output
  (tables.py): what kubectl needs to get, describe, apply, annotate, label and delete.

There is no authentication, no TLS and no admission: it binds where it is told (tests use
127.0.0.1 or an address inside a lab namespace). `python -m meshctl.lab.rigs.kube_apiserver --listen ADDR`
runs it standalone and can write a kubeconfig for clients (cli.py).
"""

from __future__ import annotations

from .cli import kubeconfig, main, parse_listen
from .http import ApiServer
from .patches import json_patch, merge_patch, strategic_merge
from .store import Store, Write, load_manifests
from .types import BUILTIN, ApiFailure, ResourceType

__all__ = ["BUILTIN", "ApiFailure", "ApiServer", "ResourceType", "Store", "Write", "json_patch", "kubeconfig",
           "load_manifests", "main", "merge_patch", "parse_listen", "strategic_merge"]
