#!/usr/bin/env bash
# Compose v2 and buildx for the Docker CLI, where no container registry (nor Docker's own package
# repository) is reachable: the plugin binaries of Debian 13's packages `docker-compose` 2.26.1
# and `docker-buildx` 0.13.1 (Go programs needing glibc 2.34 or newer, so they run on Debian 12),
# fetched from the Debian mirror, checked against the SHA-256 sums of trixie's package index,
# unpacked (not installed with dpkg: their dependencies would pull trixie's docker.io) into
# /usr/local/lib/docker/cli-plugins, where the Docker CLI looks for plugins. Then
# `docker compose ...` and `docker buildx build ...` work, and `docker build` uses BuildKit
# through buildx. Source it and call ensure_docker_plugins, or run it.
#
# Environment: IMAGEPIPE_DEBIAN_MIRROR (default http://deb.debian.org/debian),
# IMAGEPIPE_DOCKER_PLUGIN_DIR (default /usr/local/lib/docker/cli-plugins).
set -euo pipefail

# name | path in the mirror | SHA-256 of the .deb (trixie's Packages index)
DOCKER_PLUGINS=(
  "docker-compose|pool/main/d/docker-compose/docker-compose_2.26.1-4_amd64.deb|47681197cb2b1ab88206b42a1a92fc75f50d9530a6322d03494a473eed0408ea"
  "docker-buildx|pool/main/d/docker-buildx/docker-buildx_0.13.1+ds1-3_amd64.deb|fcf8c48204d1603c8f209451d7827eb91bf30759578baf7704e9e1a87e5f1d7f"
)

ensure_docker_plugins() {
  local dir="${IMAGEPIPE_DOCKER_PLUGIN_DIR:-/usr/local/lib/docker/cli-plugins}"
  local mirror="${IMAGEPIPE_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
  local entry name path sum deb work
  for entry in "${DOCKER_PLUGINS[@]}"; do
    IFS='|' read -r name path sum <<<"$entry"
    deb="$(basename "$path")"
    if [[ -x "$dir/$name" && "$(cat "$dir/.$name.deb" 2>/dev/null)" == "$deb" ]]; then continue; fi
    echo "==> installing the Docker CLI plugin $name from Debian's $deb" >&2
    work="$(mktemp -d)"
    curl -fsS --retry 3 -o "$work/$deb" "$mirror/$path" || { rm -rf "$work"; return 1; }
    if ! echo "$sum  $work/$deb" | sha256sum --check --status; then
      echo "$deb: SHA-256 is not $sum" >&2
      rm -rf "$work"
      return 1
    fi
    dpkg-deb -x "$work/$deb" "$work/root"
    mkdir -p "$dir"
    install -m 0755 "$work/root/usr/libexec/docker/cli-plugins/$name" "$dir/$name"
    echo "$deb" >"$dir/.$name.deb"
    rm -rf "$work"
  done
  docker compose version >&2
  docker buildx version >&2
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then ensure_docker_plugins; fi
