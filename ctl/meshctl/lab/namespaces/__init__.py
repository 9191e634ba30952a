# SPDX-License-Identifier: Apache-2.0
"""The namespace lab: a lab file read (spec), built into network namespaces with etcd and one
agent per node (build), its fabrics, NAT routers and Kubernetes API servers, its state file, and
the pod-to-pod check of a running lab. It knows nothing of VMs (lab/vms builds on it)."""
