#!/usr/bin/env bash
# The image libraries the metadata worker builds and runs with, and the encoders its tests make
# fixtures with (Debian packages). Source it, or run it (then it does both).
#
# ensure_image_libs   libheif-dev and libheif1 1.19 or newer (HEIC/AVIF decoding) with its
#                     decoder plugins: ffmpegdec (HEVC through FFmpeg's libavcodec, several times
#                     faster than libde265, which libheif1 brings as its fallback) and dav1d (AV1);
#                     libdav1d-dev, libturbojpeg0-dev (JPEG shrink-on-load), libwebp-dev and
#                     pkg-config, which build.rs finds them with.
# ensure_image_tools  heif-enc (libheif-examples, with the x265 plugin it encodes HEIC with) and
#                     avifenc (libavif-bin): the tests encode their HEIC and AVIF fixtures with
#                     them at test time.
#
# Debian 12 ships libheif 1.15 (libde265 only); the 1.19 packages come from Debian's
# bookworm-backports, which is added as an apt source (a deb822 file) when no source names it.
# Newer Debian releases have 1.19 in their own archive.
#
# Installs only the packages that are missing (or, for libheif, older than 1.19), quietly; uses
# sudo when not root.
set -euo pipefail

# The oldest libheif whose packages have the ffmpegdec plugin and whose decoding options choose
# the decoder; every libheif package is held to it, since each pins libheif1 to its own version.
IMAGE_HEIF_VERSION=1.19
# The apt source file written for bookworm-backports.
IMAGE_BACKPORTS_SOURCE=/etc/apt/sources.list.d/debian-backports.sources

# Whether the Debian package $1 is installed (at version $2 or newer, when given).
image_pkg_installed() {
  local status version
  status="$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" || return 1
  [[ "$status" == "install ok installed" ]] || return 1
  [[ -z "${2:-}" ]] && return 0
  version="$(dpkg-query -W -f='${Version}' "$1")"
  dpkg --compare-versions "$version" ge "$2"
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

# The apt release libheif $IMAGE_HEIF_VERSION comes from on this machine: bookworm-backports on
# Debian 12, nothing (the release's own archive) elsewhere.
image_heif_release() {
  local codename=""
  if [[ -r /etc/os-release ]]; then codename="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"; fi
  if [[ "$codename" == bookworm ]]; then echo bookworm-backports; fi
}

# Adds Debian's bookworm-backports as an apt source, unless a source already names it; the
# package lists are refreshed by the next install.
image_backports_source() {
  if grep -qs '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
    /etc/apt/sources.list.d/*.sources; then
    return 0
  fi
  echo "==> adding Debian's bookworm-backports as an apt source ($IMAGE_BACKPORTS_SOURCE)"
  local sudo=()
  if [[ "$(id -u)" != 0 ]]; then sudo=(sudo); fi
  printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm-backports' \
    'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' \
    | "${sudo[@]}" tee "$IMAGE_BACKPORTS_SOURCE" >/dev/null
  unset IMAGEPIPE_APT_UPDATED
}

# Installs those of the libheif packages "$@" that are missing or older than
# $IMAGE_HEIF_VERSION, from the release image_heif_release names, together with every other
# libheif package already installed at an older version (they pin libheif1 to theirs).
image_heif_install() {
  local wanted=() pkg release
  for pkg in "$@"; do image_pkg_installed "$pkg" "$IMAGE_HEIF_VERSION" || wanted+=("$pkg"); done
  ((${#wanted[@]})) || return 0
  while read -r pkg; do
    [[ -n "$pkg" && " ${wanted[*]} " != *" $pkg "* ]] || continue
    image_pkg_installed "$pkg" "$IMAGE_HEIF_VERSION" || wanted+=("$pkg")
  done < <(dpkg-query -W -f='${db:Status-Abbrev} ${Package}\n' 'libheif*' 2>/dev/null | awk '$1 == "ii" { print $2 }')
  release="$(image_heif_release)"
  [[ -z "$release" ]] || image_backports_source
  echo "==> installing ${wanted[*]} (Debian${release:+, $release})"
  # Each package as PACKAGE/RELEASE: apt takes these (and the libheif packages they pin) from
  # backports, and every other dependency from the release itself (`-t` would take those from
  # backports too, e.g. a libwebp7 that libwebp-dev of Debian 12 cannot go with).
  source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"
  apt_install --no-install-recommends "${wanted[@]/%/${release:+/$release}}"
}

ensure_image_libs() {
  image_heif_install libheif-dev libheif1 libheif-plugin-ffmpegdec libheif-plugin-dav1d
  image_apt_install libdav1d-dev libturbojpeg0-dev libwebp-dev pkg-config
}

ensure_image_tools() {
  image_heif_install libheif-examples libheif-plugin-x265
  image_apt_install libavif-bin
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  ensure_image_libs
  ensure_image_tools
fi
