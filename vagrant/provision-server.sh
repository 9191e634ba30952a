#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The k3s server (first VM of location a). No flannel: meshctl routes pods between nodes; each
# node's pods sit on a plain bridge (cni.sh). The API is reached over the "public" network.
set -euo pipefail
if ! command -v k3s >/dev/null; then
  curl -sfL https://get.k3s.io | INSTALL_K3S_VERSION="$K3S_VERSION" K3S_TOKEN="$TOKEN" sh -s - server \
    --flannel-backend=none --disable-network-policy --disable=traefik,servicelb \
    --cluster-cidr=10.42.0.0/16 --service-cidr=10.43.0.0/16 \
    --node-ip="$NODE_IP" --node-external-ip="$PUBLIC_IP" --advertise-address="$PUBLIC_IP" \
    --tls-san="$PUBLIC_IP" --node-label="topology.kubernetes.io/region=$LOCATION"
fi
bash /vagrant/vagrant/cni.sh
