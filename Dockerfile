# SPDX-License-Identifier: Apache-2.0
# The meshctl agent image for the DaemonSet in manifests/ (two containers use it: the agent and
# wireguard-go). Build it with `make image` (scripts/image.sh, docs/kubernetes.md "The image"):
# docker (BuildKit or the classic builder) or podman/buildah read this file the same way, so it uses
# no feature only one of them has (no RUN --security, no RUN --mount, no syntax line).
#
# What `make image` prepares in the context first, under build/image/:
#   ca.pem    the CA bundle pip trusts in the `build` stage (a proxy that re-signs HTTPS; may be
#             empty). Only the `build` stage copies it; the others take only its /install.
#   objects/  the compiled programs of every variant (one JSON file each), made by running the
#             `objects` stage as a container with CAP_BPF (bcc creates maps as it compiles, which no
#             unprivileged build step may do in every engine).
# The runtime image carries those objects and libbpf, which loads them through ctypes: no bcc, LLVM
# or clang (a node whose kernel refuses every shipped object runs on kernel routes and says so).
ARG BASE=debian:bookworm-slim

# What the agent runs with: Debian's Python, libbpf for the shipped objects, the tools of the appliers.
FROM ${BASE} AS base
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 libbpf1 wireguard-tools wireguard-go \
      iproute2 nftables iptables ipset kmod ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log

# The package and its dependencies, installed under /install by pip (which is not in the runtime
# image). The lab package (meshctl/lab: the namespace lab, the VM labs and the test rigs) is left
# out: the CLI loads it as a plugin and skips it when its package is gone.
FROM base AS build
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-pip python3-wheel \
 && rm -rf /var/lib/apt/lists/*
COPY build/image/ca.pem /tmp/build-ca.pem
WORKDIR /src
# The dependencies first (from pyproject.toml alone), so a change of the code reuses their layer.
COPY pyproject.toml README.md ./
RUN if [ -s /tmp/build-ca.pem ]; then export PIP_CERT=/tmp/build-ca.pem; fi \
 && python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
      > /tmp/requirements.txt \
 && pip3 install --no-cache-dir --break-system-packages --root /install -r /tmp/requirements.txt
COPY ctl ./ctl
COPY bpf ./bpf
RUN pip3 install --no-cache-dir --break-system-packages --no-deps --no-index --no-build-isolation --root /install . \
 && rm -rf /install/usr/local/lib/python3*/dist-packages/meshctl/lab

# The compiler of the shipped objects (bcc and Debian's kernel headers), run as a container by
# `make image`: its entry point (scripts/container/meshctl-build-objects) writes every variant into /out.
FROM base AS objects
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-bpfcc linux-headers-amd64 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /install/usr/local /usr/local
COPY scripts/container/meshctl-build-objects /usr/local/bin/
ENTRYPOINT ["/usr/local/bin/meshctl-build-objects"]

FROM base
# The image it was built from, as OCI names it (docker.io/library/debian:bookworm-slim, or the
# local one scripts/image.sh made with mmdebstrap).
ARG BASE
LABEL org.opencontainers.image.base.name=${BASE}
COPY --from=build /install/usr/local /usr/local
COPY build/image/objects /usr/lib/meshctl/bpf-objects
# wireguard-go's container (scripts/container/meshctl-wireguard-go): wireguard-go for kilo0 unless
# the kernel has WireGuard, so an agent restart never takes the tunnel down.
COPY scripts/container/meshctl-wireguard-go /usr/local/bin/

WORKDIR /
# The DaemonSet runs it with hostNetwork; the agent's state lives in /var/lib/meshctl.
VOLUME ["/var/lib/meshctl"]
# /healthz and /metrics over TLS (--secure-metrics-addr); the full API stays on the node's loopback.
EXPOSE 9737
ENTRYPOINT ["meshctl"]
CMD ["agent", "--backend=kubernetes"]
