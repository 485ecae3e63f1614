#!/usr/bin/env bash
# Installs Debian packages for the project's scripts, the one place they call apt-get install.
# Source it, then `apt_install [apt-get install options] PACKAGE...`: as root or through sudo,
# waiting up to five minutes for another apt's lock instead of failing on it, the package lists
# refreshed once per shell, every log line on stderr (stdout stays a script's answer). Any failure
# returns non-zero, so `set -e` stops the caller.

apt_install() {
  local sudo=() lock=(-o DPkg::Lock::Timeout=300)
  if [[ "$(id -u)" != 0 ]]; then sudo=(sudo); fi
  if [[ -z "${IMAGEPIPE_APT_UPDATED:-}" ]]; then
    "${sudo[@]}" apt-get "${lock[@]}" update -qq >&2 || return 1
    IMAGEPIPE_APT_UPDATED=1
  fi
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get "${lock[@]}" install -y -qq "$@" >&2 \
    || return 1
}
