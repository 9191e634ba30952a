# SPDX-License-Identifier: Apache-2.0
"""The Kubernetes tests run on the real control plane of tests/kubernetes.py (fixtures `kube`,
`api`, `own_kube`, `kclient`, defined in tests/conftest.py so every suite shares one)."""
