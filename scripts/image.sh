#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# `make image`: build the agent image with the container engine that can build here.
#
#   scripts/image.sh [build]   the image, tagged $IMAGE (default meshctl/meshctl:<version>)
#   scripts/image.sh base      only the offline base image (mmdebstrap), tagged $LOCAL_BASE
#   scripts/image.sh engine    print the engine and builder it would use, and exit
#
# Settings (environment; `make image VAR=...` passes them):
#   ENGINE     docker, podman, or a path to either; default: docker when its daemon answers (buildx
#              when the plugin is there, else `docker build`), else podman. A docker CLI whose daemon
#              does not answer is not an engine.
#   IMAGE      the tag; BASE the image the Dockerfile starts from (default: debian:bookworm-slim if
#              the engine has it or can pull it, else $LOCAL_BASE, made from Debian's packages with
#              mmdebstrap where no registry answers).
#   CA_BUNDLE  a PEM file of the CAs pip trusts inside the build (a proxy that re-signs HTTPS):
#              default $PIP_CERT, $REQUESTS_CA_BUNDLE or $SSL_CERT_FILE, else the host's
#              /etc/ssl/certs/ca-certificates.crt; `none` for none. It reaches only the build
#              stages (build/image/ca.pem in the context), never the final image.
#   OBJECTS_CACHE  where compiled objects are kept by the objects image's ID (default
#              /var/cache/meshctl/image-objects): a fresh clone reuses them instead of compiling again.
#   DRY_RUN=1  print the commands instead of running them; NO_CACHE=1 build with no cached layer.
# Errors are one line on stderr and exit 2.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE=${IMAGE:-meshctl/meshctl:$VERSION}
OBJECTS_IMAGE=$IMAGE-objects
BUILD_IMAGE=$IMAGE-build
LOCAL_BASE=${LOCAL_BASE:-localhost/meshctl/debian:bookworm-slim}
DEFAULT_BASE=docker.io/library/debian:bookworm-slim
SUITE=bookworm
CTX=build/image
OBJECTS_CACHE=${OBJECTS_CACHE:-/var/cache/meshctl/image-objects}

die() { echo "make image: $*" >&2; exit 2; }
run() {
  if [ -n "${DRY_RUN:-}" ]; then echo "$*"; else "$@"; fi
}

# --- the engine --------------------------------------------------------------------------------
docker_answers() { timeout 20 "$1" version --format '{{.Server.Version}}' >/dev/null 2>&1; }
docker_error() {  # docker's own reason, one line
  timeout 20 "$1" version --format '{{.Server.Version}}' 2>&1 >/dev/null | grep -v '^$' | tail -n1 || true
}

pick_engine() {
  local want=${ENGINE:-}
  if [ -z "$want" ]; then
    if command -v docker >/dev/null 2>&1 && docker_answers docker; then want=docker
    elif command -v podman >/dev/null 2>&1; then want=podman
    elif command -v docker >/dev/null 2>&1; then
      die "no container engine can build here: docker's daemon does not answer ($(docker_error docker)) and podman is not installed"
    else
      die "no container engine: install docker or podman, or set ENGINE"
    fi
  fi
  command -v "$want" >/dev/null 2>&1 || die "ENGINE=$want is not installed (no $want on PATH)"
  ENGINE_BIN=$want
  case "$(basename "$want")" in
    docker)
      docker_answers "$want" || die "ENGINE=$want cannot build here: its daemon does not answer ($(docker_error "$want"))"
      ENGINE_KIND=docker
      if "$want" buildx version >/dev/null 2>&1; then BUILD=("$want" buildx build --load ${NOCACHE[@]+"${NOCACHE[@]}"})
      else BUILD=("$want" build ${NOCACHE[@]+"${NOCACHE[@]}"}); fi
      RUN=("$want" run --rm)
      ;;
    podman)
      ENGINE_KIND=podman
      # runc where installed (Debian 12's crun refuses hybrid cgroups); explicit limits within
      # the host's hard ones, which root without CAP_SYS_RESOURCE cannot raise (podman's default
      # nofile is above them here; podman runs its containers' nproc at most 32768); the host's
      # network (podman's default bridge would add its own bridge and NAT rules to the host).
      local opts=()
      if command -v runc >/dev/null 2>&1; then opts+=(--runtime runc); fi
      local n p
      n=$(ulimit -Hn); p=$(ulimit -Hu)
      if [ "$n" = unlimited ] || [ "$n" -gt 1048576 ]; then n=1048576; fi
      if [ "$p" = unlimited ] || [ "$p" -gt 32768 ]; then p=32768; fi
      opts+=(--ulimit "nofile=$n:$n" --ulimit "nproc=$p:$p")
      BUILD=("$want" build --network=host "${opts[@]}" ${NOCACHE[@]+"${NOCACHE[@]}"})
      RUN=("$want" run --rm "${opts[@]}")
      ;;
    *) die "ENGINE=$want is neither docker nor podman" ;;
  esac
}

# What a tag names now (empty: nothing).
tagged_id() { "$ENGINE_BIN" image inspect --format '{{.Id}}' "$1" 2>/dev/null || true; }
has_image() { [ -n "$(tagged_id "$1")" ]; }

# --- the base image ----------------------------------------------------------------------------
make_local_base() {
  command -v mmdebstrap >/dev/null 2>&1 || \
    die "no registry answers for $DEFAULT_BASE and mmdebstrap is not installed to make $LOCAL_BASE (apt-get install mmdebstrap, or set BASE)"
  local tar
  tar=$(mktemp --suffix=.tar)
  # As slim as Debian's own -slim images: merged /usr without the usrmerge package (and its perl),
  # no manuals, docs (licences kept) or translations, apt's lists dropped.
  local log
  log=$(mktemp)
  if ! run mmdebstrap --quiet --variant=minbase --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
      --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
      --dpkgopt='path-include=/usr/share/doc/*/copyright' --dpkgopt='path-exclude=/usr/share/locale/*' \
      --dpkgopt='path-exclude=/usr/share/info/*' --aptopt='APT::Install-Recommends "false"' \
      --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/* "$1"/var/log/*' \
      "$SUITE" "$tar" >"$log" 2>&1; then
    tail -n 20 "$log" >&2; rm -f "$tar" "$log"; die "mmdebstrap could not make the base image (its output above)"
  fi
  if ! run "$ENGINE_BIN" import "$tar" "$LOCAL_BASE" >"$log" 2>&1; then
    tail -n 5 "$log" >&2; rm -f "$tar" "$log"; die "$ENGINE_BIN import of the base failed (its output above)"
  fi
  rm -f "$tar" "$log"
  echo "make image: base $LOCAL_BASE made from Debian's packages (mmdebstrap $SUITE)" >&2
}

pick_base() {
  if [ -n "${BASE:-}" ]; then return; fi
  if has_image "$DEFAULT_BASE"; then BASE=$DEFAULT_BASE
  elif has_image "$LOCAL_BASE"; then BASE=$LOCAL_BASE
  elif timeout 120 "$ENGINE_BIN" pull -q "$DEFAULT_BASE" >/dev/null 2>&1; then BASE=$DEFAULT_BASE
  else
    echo "make image: no registry answers for $DEFAULT_BASE: making $LOCAL_BASE from Debian's packages" >&2
    make_local_base
    BASE=$LOCAL_BASE
  fi
}

# --- the context -------------------------------------------------------------------------------
pick_ca() {
  local ca=${CA_BUNDLE:-}
  if [ -z "$ca" ]; then
    for f in "${PIP_CERT:-}" "${REQUESTS_CA_BUNDLE:-}" "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt; do
      if [ -n "$f" ] && [ -f "$f" ]; then ca=$f; break; fi
    done
  fi
  if [ "$ca" = none ]; then ca=""; fi
  if [ -n "$ca" ] && [ ! -f "$ca" ]; then die "CA_BUNDLE=$ca is not a file"; fi
  CA=$ca
}

prepare_context() {
  if [ -n "${DRY_RUN:-}" ]; then echo "# context: $CTX/ca.pem from ${CA:-nothing}"; return; fi
  mkdir -p "$CTX"
  if [ -n "$CA" ]; then cp "$CA" "$CTX/ca.pem.tmp"; else : > "$CTX/ca.pem.tmp"; fi
  # unchanged content keeps the build stage's cache
  if cmp -s "$CTX/ca.pem.tmp" "$CTX/ca.pem"; then rm "$CTX/ca.pem.tmp"; else mv "$CTX/ca.pem.tmp" "$CTX/ca.pem"; fi
  mkdir -p "$CTX/objects"
}

# --- the steps ---------------------------------------------------------------------------------
build_objects() {
  # The build stage tagged too: its layers (pip's downloads) then stay cached, not pruned as the
  # intermediate images of a stage no tagged image descends from.
  run "${BUILD[@]}" --target build --build-arg "BASE=$BASE" -t "$BUILD_IMAGE" .
  run "${BUILD[@]}" --target objects --build-arg "BASE=$BASE" -t "$OBJECTS_IMAGE" .
  local compile=("${RUN[@]}" --network=none --privileged -v "$PWD/$CTX/objects:/out" "$OBJECTS_IMAGE" /out)
  [ -n "${DRY_RUN:-}" ] && { echo "${compile[*]}"; return; }
  # The objects depend only on that image (its sources and compiler): compiled again when it changed.
  local id
  id=$("$ENGINE_BIN" image inspect --format '{{.Id}}' "$OBJECTS_IMAGE")
  if [ "$(cat "$CTX/objects.image-id" 2>/dev/null)" = "$id" ] && ls "$CTX"/objects/*.json >/dev/null 2>&1; then
    return
  fi
  rm -f "$CTX"/objects/*.json "$CTX/objects.image-id"
  local kept="$OBJECTS_CACHE/${id#sha256:}"
  if [ -n "${NO_CACHE:-}" ] || ! ls "$kept"/*.json >/dev/null 2>&1; then
    # bcc creates the maps as it compiles: CAP_BPF and a bpffs, which build-objects mounts for itself
    # (a private one: the host's bpffs is not touched). No network.
    "${compile[@]}"
    mkdir -p "$kept.tmp" && rm -f "$kept.tmp"/* && cp -p "$CTX"/objects/*.json "$kept.tmp"/
    rm -rf "$kept" && mv "$kept.tmp" "$kept"
  else
    # with their times: the final stage's COPY of them is then the layer cached before
    cp -p "$kept"/*.json "$CTX"/objects/
  fi
  echo "$id" > "$CTX/objects.image-id"
}

# After a build, the image a tag named before is removed once the tag has moved on: a rebuild would
# otherwise leave it behind, untagged (1.3 GB a build of the three). rmi refuses an image a
# container still uses or another tag names: that one stays.
drop_replaced() {  # drop_replaced OLD_ID TAG
  [ -n "$1" ] && [ -z "${DRY_RUN:-}" ] && [ "$1" != "$(tagged_id "$2")" ] || return 0
  "$ENGINE_BIN" rmi "$1" >/dev/null 2>&1 || true
}

# NO_CACHE=1: no cached layer (bench/image.py --cold)
if [ -n "${NO_CACHE:-}" ]; then NOCACHE=(--no-cache); else NOCACHE=(); fi

cmd=${1:-build}
case "$cmd" in
  engine)
    pick_engine
    echo "$ENGINE_KIND: ${BUILD[*]}"
    ;;
  base)
    pick_engine
    make_local_base
    ;;
  build)
    if [ -z "${DRY_RUN:-}" ] && command -v flock >/dev/null 2>&1; then
      # one build at a time in this checkout: two would share build/image/ (the objects, the CA)
      mkdir -p "$CTX"; exec 9>"$CTX/.lock"; flock 9
    fi
    pick_engine
    pick_base
    pick_ca
    prepare_context
    t0=$(date +%s)
    before=()
    for tag in "$IMAGE" "$OBJECTS_IMAGE" "$BUILD_IMAGE"; do before+=("$(tagged_id "$tag")"); done
    build_objects
    run "${BUILD[@]}" --build-arg "BASE=$BASE" -t "$IMAGE" .
    drop_replaced "${before[0]}" "$IMAGE"
    drop_replaced "${before[1]}" "$OBJECTS_IMAGE"
    drop_replaced "${before[2]}" "$BUILD_IMAGE"
    [ -n "${DRY_RUN:-}" ] || echo "make image: $IMAGE built with $ENGINE_KIND from $BASE in $(( $(date +%s) - t0 )) s" >&2
    ;;
  *) die "unknown command $cmd (build, base or engine)" ;;
esac
