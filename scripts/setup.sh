#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs everything `make test` and `make lab` need on a fresh Debian 12 machine (as root):
# Debian packages, kernel headers wired for bcc, and the project venv with bcc importable.
# (The VM kernels of the matrix come from scripts/kernels.sh: `make kernels`.)
# Quiet and quick when all is there already.
set -euo pipefail
cd "$(dirname "$0")/.."

# podman, buildah, runc and mmdebstrap: `make image` without a registry (the base from Debian's
# packages) and the lab's agents from the image (lab.agent image; runc: Debian 12's crun refuses
# this machine kind's hybrid cgroups, docs/lab.md); containernetworking-plugins: the CNI plugins
# the `cni: install` labs run (/usr/lib/cni); dnsutils: `dig`, which the Multi-Cluster Services tests
# ask the clusterset.local server with from a lab pod.
APT_PACKAGES=(python3-venv python3-bpfcc bpftool linux-headers-amd64 etcd-server etcd-client
  wireguard-go wireguard-tools iperf3 nftables iproute2 ipset graphviz iputils-ping procps
  util-linux openssl ca-certificates iptables vagrant curl
  qemu-system-x86 busybox-static cpio kmod file tcpdump chromium
  podman buildah runc mmdebstrap containernetworking-plugins dnsutils)
VENV=.venv

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# bcc compiles against /lib/modules/$(uname -r)/build. A kernel without packaged headers (this
# one) gets Debian's distro headers: build -> the arch tree, source -> the common tree. A host
# that has real headers is left alone.
kdir=/lib/modules/$(uname -r)
if [ ! -e "$kdir/build" ]; then
  arch_tree=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n1 || true)
  common_tree=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n1 || true)
  if [ -n "$arch_tree" ] && [ -n "$common_tree" ]; then
    echo "setup: no kernel headers for $(uname -r); pointing bcc at $arch_tree"
    mkdir -p "$kdir"
    ln -sfn "$arch_tree" "$kdir/build"
    ln -sfn "$common_tree" "$kdir/source"
  else
    echo "setup: WARNING: no kernel headers found; the eBPF fast path will fall back to kernel routes" >&2
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "setup: creating $VENV"
  /usr/bin/python3 -m venv "$VENV"
fi
# Debian's bcc lives in dist-packages; expose only the bcc package to the venv through a .pth
# pointing at a folder that holds just a `bcc` symlink.
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$VENV/bcc-only"
ln -sfn /usr/lib/python3/dist-packages/bcc "$VENV/bcc-only/bcc"
echo "$(cd "$VENV/bcc-only" && pwd)" > "$site/bcc-only.pth"

stamp="$VENV/.installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing Python packages into $VENV"
  log=$(mktemp)
  if ! "$VENV/bin/pip" install -q --disable-pip-version-check -e '.[test]' >"$log" 2>&1; then
    cat "$log" >&2; rm -f "$log"; exit 1
  fi
  rm -f "$log"
  touch "$stamp"
fi

# The tests' and the Kubernetes labs' control plane: kube-apiserver and kube-controller-manager of
# one pinned version (lab.rigs.kube_binaries: $MESHCTL_KUBE_BINARIES, the unpacked cache, a
# shared/tools/kubernetes folder beside the checkout, or the official release with its SHA-256),
# unpacked once under /var/lib/meshctl/kube/. Where none can be had this says where it looked, and
# the Kubernetes tests fail with that line.
if ! "$VENV/bin/python" -m meshctl.lab.rigs.kube_binaries; then
  echo "setup: WARNING: no Kubernetes control plane binaries: the Kubernetes tests and labs will fail" >&2
fi

# The package's bytecode, written once: every agent, CLI call and emulated guest of the labs imports
# the package, and where PYTHONDONTWRITEBYTECODE is set (as on this project's CI machine) each of
# them would compile its ~170 modules again, a TCG guest at emulated speed. Python checks each .pyc
# against its source, so an edited file is compiled again here, never read stale.
"$VENV/bin/python" -m compileall -q -j 0 ctl/meshctl >/dev/null
