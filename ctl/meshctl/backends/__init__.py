# SPDX-License-Identifier: Apache-2.0
"""Where records come from: the Backend protocol and cluster state (`base`), a topology file,
etcd, other clusters' etcd (`clustermesh`) and Kubernetes (`kube`)."""
