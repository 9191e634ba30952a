# SPDX-License-Identifier: Apache-2.0
"""meshctl: a multi-cloud, multi-cluster network mesh for Kubernetes."""

__version__ = "0.1.0"
