# SPDX-License-Identifier: Apache-2.0
"""What the tests and benchmarks build on: network-namespace helpers, the two-node datapath
testbed, BPF test runs, polling, a real Kubernetes control plane (with a kubelet and scheduler
reproduction), etcd processes and a throwaway PKI. Nothing here knows a lab; the namespace lab builds on these."""
