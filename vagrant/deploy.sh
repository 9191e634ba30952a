#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# On the k3s server once every VM is up: each node's WireGuard endpoint on the "public" network
# (the VMs' default route is the provider's NAT, the same address everywhere), then manifests/.
# NODES="a1=192.168.56.11 ..." and IMAGE come from the Vagrantfile's trigger.
set -euo pipefail
export KUBECONFIG=/etc/rancher/k3s/k3s.yaml
kubectl() { k3s kubectl "$@"; }
for pair in $NODES; do
  name=${pair%%=*}; ip=${pair#*=}
  for _ in $(seq 90); do kubectl get node "$name" >/dev/null 2>&1 && break; sleep 2; done
  kubectl annotate --overwrite node "$name" "meshctl.io/force-endpoint=$ip:51820" >/dev/null
done
# The private networks (10.10.<location>.0/24): the agent takes the NIC holding an address inside
# INTERNAL_CIDR as its private one (the NAT NIC holds the default route and the same address on
# every VM). Set before the DaemonSet starts: the agent reads it from its environment.
INTERNAL_CIDR=${INTERNAL_CIDR:-10.10.0.0/16}
kubectl apply -f /vagrant/manifests/00-namespace.yaml -f /vagrant/manifests/03-configmap.yaml
kubectl -n meshctl patch configmap meshctl --type merge -p "{\"data\": {\"internal_cidr\": \"$INTERNAL_CIDR\"}}"
kubectl apply -k /vagrant/manifests
kubectl -n meshctl set image daemonset/meshctl agent="$IMAGE" wireguard-go="$IMAGE" >/dev/null
kubectl -n meshctl rollout status daemonset/meshctl --timeout=300s
kubectl wait --for=condition=Ready nodes --all --timeout=300s
echo "deploy.sh: meshctl is running; check with: vagrant ssh a1 -c 'sudo /vagrant/vagrant/check.sh'"
