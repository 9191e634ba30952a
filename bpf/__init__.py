# SPDX-License-Identifier: Apache-2.0
"""The eBPF programs as package data (meshctl.bpf): datapath.c and meshctl_maps.h, compiled at load
time by meshctl.datapath.loader. Nothing here runs in Python."""
