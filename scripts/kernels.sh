#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Fetches the Debian kernels of the VM matrix (5.10, 6.1, 6.12) and unpacks each into
# $MESHCTL_KERNELS/<series>/ (default /var/lib/meshctl/kernels; not under /var/cache, which
# virtme-ng hides behind a tmpfs in the guest): boot/vmlinuz-* plus its module
# tree with modules.dep. The packages come through apt with a private configuration (own sources
# list, state and cache directories), so the host's sources and package database are never
# touched, and they are unpacked with `dpkg-deb -x`, never installed as a boot kernel.
# Quiet and quick when the cache is complete. Usage: scripts/kernels.sh [SERIES...]
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"

ROOT=${MESHCTL_KERNELS:-/var/lib/meshctl/kernels}
MIRROR=${MESHCTL_DEBIAN_MIRROR:-http://deb.debian.org}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg

# series -> Debian suite whose linux-image-amd64 is that series
suite_of() {
  case "$1" in
    5.10) echo bullseye ;;
    6.1) echo bookworm ;;
    6.12) echo trixie ;;
    *) echo "kernels: unknown kernel series '$1' (known: 5.10 6.1 6.12)" >&2; return 1 ;;
  esac
}

# bcc in the guest compiles against /lib/modules/<kver>/build: the kernel's own Debian headers when
# the host has them, else the host's distro headers (the programs use only uapi structures and
# bcc's helper table, which these carry for every kernel of the matrix).
link_headers() {
  local tree=$1 kver=$2 arch common
  arch=/usr/src/linux-headers-$kver
  common=/usr/src/linux-headers-${kver%-amd64}-common
  if [ ! -d "$arch" ]; then
    arch=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n1 || true)
    common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n1 || true)
  fi
  [ -n "$arch" ] && [ -n "$common" ] || { echo "kernels: no kernel headers in /usr/src for bcc" >&2; return 0; }
  ln -sfn "$arch" "$tree/build"
  ln -sfn "$common" "$tree/source"
}

series=("$@")
[ ${#series[@]} -gt 0 ] || series=(5.10 6.1 6.12)

for s in "${series[@]}"; do
  suite=$(suite_of "$s")
  dest="$ROOT/$s"
  [ -f "$dest/.complete" ] && continue
  echo "kernels: fetching Debian's $suite kernel ($s) into $dest"
  apt_root="$ROOT/.apt/$suite"
  mkdir -p "$apt_root/etc/preferences.d" "$apt_root/state/lists/partial" "$apt_root/cache/archives/partial" \
    "$apt_root/debs"
  cat > "$apt_root/etc/sources.list" <<SRC
deb [signed-by=$KEYRING] $MIRROR/debian $suite main
deb [signed-by=$KEYRING] $MIRROR/debian-security $suite-security main
SRC
  : > "$apt_root/status"
  apt_opts=(-o "Dir::Etc::sourcelist=$apt_root/etc/sources.list" -o "Dir::Etc::sourceparts=-"
    -o "Dir::Etc::preferencesparts=$apt_root/etc/preferences.d" -o "Dir::State=$apt_root/state"
    -o "Dir::State::status=$apt_root/status" -o "Dir::Cache=$apt_root/cache"
    -o "APT::Get::List-Cleanup=0" -o "Debug::NoLocking=1" -o "Acquire::Languages=none" -o "APT::Sandbox::User=root")
  apt-get -qq "${apt_opts[@]}" update >/dev/null
  # linux-image-amd64 is the metapackage; its Depends names the versioned image of the suite.
  image=$(apt-cache "${apt_opts[@]}" depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
  if [ -z "$image" ]; then
    echo "kernels: $suite has no linux-image-amd64 dependency" >&2; exit 1
  fi
  (cd "$apt_root/debs" && rm -f ./*.deb && apt-get -qq "${apt_opts[@]}" download "$image" >/dev/null)
  tmp="$dest.tmp"
  rm -rf "$tmp" && mkdir -p "$tmp"
  dpkg-deb -x "$apt_root"/debs/"$image"_*.deb "$tmp"
  # Newer images keep modules under usr/lib; give every tree the same layout: lib/modules/<kver>.
  if [ ! -d "$tmp/lib/modules" ] && [ -d "$tmp/usr/lib/modules" ]; then
    mkdir -p "$tmp/lib" && mv "$tmp/usr/lib/modules" "$tmp/lib/modules"
  fi
  if [ ! -d "$tmp/boot" ] && [ -d "$tmp/usr/lib/linux" ]; then mkdir -p "$tmp/boot"; fi
  kver=$(ls "$tmp/lib/modules")
  depmod -a -b "$tmp" "$kver"
  link_headers "$tmp/lib/modules/$kver" "$kver"
  rm -rf "$dest" && mv "$tmp" "$dest"
  echo "$kver" > "$dest/.kver"
  touch "$dest/.complete"
  rm -f "$apt_root"/debs/*.deb
  echo "kernels: $s is $kver ($(du -sh "$dest" | cut -f1))"
done
