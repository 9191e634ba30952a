# syntax=docker/dockerfile:1-labs
# SPDX-License-Identifier: Apache-2.0
# The meshctl agent image for the DaemonSet in manifests/ (two containers use it: the agent and
# wireguard-go). Debian 12 like the development machines: python3-bpfcc is Debian's bcc for
# /usr/bin/python3, so the package installs into the system Python, not a venv.
# Build: `make image` (docker buildx build or podman build -t meshctl/meshctl:VERSION .; IMAGE=... for
# your registry). The image carries the programs compiled for every variant the feature probes can
# select (the `objects` stage), so a node without kernel headers loads them (docs/datapath.md).
FROM debian:bookworm-slim AS base

ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-pip python3-bpfcc bpftool \
      wireguard-tools wireguard-go \
      iproute2 nftables iptables ipset kmod ca-certificates \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md* ./
COPY ctl ./ctl
COPY bpf ./bpf
# The lab package (meshctl/lab: the namespace lab, the VM labs and the test rigs with the in-process
# API server and test PKI) is not part of the agent image: the CLI loads it as a plugin and skips it
# when its package is gone.
RUN pip3 install --no-cache-dir --break-system-packages . \
 && rm -rf "$(python3 -c 'import meshctl, os; print(os.path.dirname(meshctl.__file__))')/lab" /src

# The shipped programs: bcc compiles every variant against Debian's headers (the programs use only
# UAPI structures: the bytecode loads on any kernel with the helpers its variant calls). bcc creates
# the maps as it compiles, which needs CAP_BPF and a bpffs: the one privileged step of the build
# (BuildKit: --allow security.insecure; `make image` passes what each engine needs).
FROM base AS objects
RUN apt-get update \
 && apt-get install -y --no-install-recommends linux-headers-amd64 \
 && rm -rf /var/lib/apt/lists/*
RUN --security=insecure set -eu; \
    kdir="/lib/modules/$(uname -r)"; mkdir -p "$kdir"; \
    ln -sfn /usr/src/linux-headers-*-amd64 "$kdir/build"; ln -sfn /usr/src/linux-headers-*-common "$kdir/source"; \
    meshctl datapath build-objects --out /objects

FROM base
COPY --from=objects /objects /usr/lib/meshctl/bpf-objects

# wireguard-go's container: run wireguard-go in the foreground for the device unless the kernel
# has WireGuard (then the agent uses the kernel device and this container leaves a marker for its
# startup probe and waits), so an agent restart never takes the tunnel down.
RUN printf '%s\n' \
      '#!/bin/sh' \
      'set -eu' \
      'ifname=${1:-kilo0}' \
      'mkdir -p /var/run/wireguard && rm -f "/var/run/wireguard/$ifname.kernel"' \
      'if ip link add meshctl-wgprobe type wireguard 2>/dev/null; then' \
      '  ip link del meshctl-wgprobe' \
      '  echo "kernel WireGuard present: wireguard-go not needed"' \
      '  touch "/var/run/wireguard/$ifname.kernel"  # the startup probe reads it' \
      '  exec sleep infinity' \
      'fi' \
      'exec wireguard-go -f "$ifname"' \
      > /usr/local/bin/meshctl-wireguard-go \
 && chmod 0755 /usr/local/bin/meshctl-wireguard-go

WORKDIR /
# The DaemonSet runs it privileged with hostNetwork; the agent's state lives in /var/lib/meshctl.
VOLUME ["/var/lib/meshctl"]
# /healthz and /metrics over TLS (--secure-metrics-addr); the full API stays on the node's loopback.
EXPOSE 9737
ENTRYPOINT ["meshctl"]
CMD ["agent", "--backend=kubernetes"]
