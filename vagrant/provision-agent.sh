#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# A k3s agent joining the server over the "public" network.
set -euo pipefail
if ! command -v k3s >/dev/null; then
  curl -sfL https://get.k3s.io | INSTALL_K3S_VERSION="$K3S_VERSION" K3S_TOKEN="$TOKEN" \
    K3S_URL="https://$SERVER_IP:6443" sh -s - agent \
    --node-ip="$NODE_IP" --node-external-ip="$PUBLIC_IP" --node-label="topology.kubernetes.io/region=$LOCATION"
fi
bash /vagrant/vagrant/cni.sh
