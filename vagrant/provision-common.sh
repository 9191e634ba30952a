#!/usr/bin/env bash
# Every VM: packages, forwarding, the meshctl image if one was saved next to the Vagrantfile.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends curl ca-certificates wireguard-tools iproute2 jq >/dev/null
cat >/etc/sysctl.d/90-meshctl.conf <<'SYSCTL'
net.ipv4.ip_forward = 1
net.ipv4.conf.all.rp_filter = 2
net.ipv4.conf.default.rp_filter = 2
SYSCTL
sysctl -q --system
mkdir -p /sys/fs/bpf
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
