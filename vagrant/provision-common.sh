#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every VM: packages, forwarding, the meshctl image if one was saved next to the Vagrantfile.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends curl ca-certificates wireguard-tools iproute2 jq >/dev/null
bash /vagrant/vagrant/node-prep.sh  # shared with the multi-VM lab (ctl/meshctl/lab/vms/vmnodes.py)
