#!/usr/bin/env bash
# The image libraries the metadata worker builds and runs with, and the encoders its tests make
# fixtures with (Debian 12 packages). Source it, or run it (then it does both).
#
# ensure_image_libs   libheif-dev (HEIC/AVIF decoding; libheif1 brings libde265 for HEVC and
#                     dav1d/aom for AV1), libdav1d-dev, libturbojpeg0-dev (JPEG shrink-on-load),
#                     libwebp-dev and pkg-config, which build.rs finds them with.
# ensure_image_tools  heif-enc (libheif-examples) and avifenc (libavif-bin): the tests encode
#                     their HEIC and AVIF fixtures with them at test time.
#
# Installs only the packages that are missing, quietly; uses sudo when not root.
set -euo pipefail

# Whether the Debian package $1 is installed.
image_pkg_installed() {
  [[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" == "install ok installed" ]]
}

# Installs those of the Debian packages "$@" that are missing.
image_apt_install() {
  local missing=() pkg
  for pkg in "$@"; do image_pkg_installed "$pkg" || missing+=("$pkg"); done
  ((${#missing[@]})) || return 0
  echo "==> installing ${missing[*]} (Debian)"
  source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"
  apt_install --no-install-recommends "${missing[@]}"
}

ensure_image_libs() {
  image_apt_install libheif-dev libdav1d-dev libturbojpeg0-dev libwebp-dev pkg-config
}

ensure_image_tools() {
  image_apt_install libheif-examples libavif-bin
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  ensure_image_libs
  ensure_image_tools
fi
