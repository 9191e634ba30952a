#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A bridge CNI config for this node's pod CIDR (k3s ships the bridge and host-local plugins).
# meshctl then routes between the nodes' pod CIDRs: WireGuard across locations, the private
# network inside one.
set -euo pipefail
name=$(hostname)
kubeconfig=/etc/rancher/k3s/k3s.yaml
[ -f "$kubeconfig" ] || kubeconfig=/var/lib/rancher/k3s/agent/kubelet.kubeconfig
cidr=""
for _ in $(seq 120); do
  cidr=$(k3s kubectl --kubeconfig "$kubeconfig" get node "$name" -o jsonpath='{.spec.podCIDR}' 2>/dev/null || true)
  [ -n "$cidr" ] && break
  sleep 2
done
[ -n "$cidr" ] || { echo "cni.sh: node $name got no podCIDR" >&2; exit 1; }
mkdir -p /etc/cni/net.d /var/lib/rancher/k3s/agent/etc/cni/net.d
for dir in /etc/cni/net.d /var/lib/rancher/k3s/agent/etc/cni/net.d; do
  cat >"$dir/10-meshctl.conflist" <<CONF
{
  "cniVersion": "1.0.0",
  "name": "meshctl",
  "plugins": [
    {"type": "bridge", "bridge": "mesh0", "isDefaultGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$cidr"}]]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
CONF
done
echo "cni.sh: $name pods on $cidr"
# The agent image, if it was saved next to the Vagrantfile (docker save -o vagrant/meshctl-image.tar ...).
if [ -f /vagrant/vagrant/meshctl-image.tar ]; then
  k3s ctr images import /vagrant/vagrant/meshctl-image.tar >/dev/null && echo "cni.sh: imported the meshctl image"
fi
