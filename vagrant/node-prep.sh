#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# What a node needs before its agent starts, shared by the Vagrant VMs (provision-common.sh) and the
# multi-VM lab's guests (ctl/meshctl/lab/vms/vmnodes.py): forwarding, loose reverse-path filtering (a
# reply may come back over another NIC than the request left by: the tunnel or the private NIC),
# and bpffs for the pinned maps.
set -euo pipefail
mkdir -p /etc/sysctl.d
cat >/etc/sysctl.d/90-meshctl.conf <<'SYSCTL'
net.ipv4.ip_forward = 1
net.ipv4.conf.all.rp_filter = 2
net.ipv4.conf.default.rp_filter = 2
SYSCTL
sysctl -q -p /etc/sysctl.d/90-meshctl.conf
mkdir -p /sys/fs/bpf
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
