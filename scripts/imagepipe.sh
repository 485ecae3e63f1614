#!/usr/bin/env bash
# `imagepipe` from this checkout, on a fresh Debian machine or a used one: installs the image
# libraries the build links (scripts/image-libs.sh: libjpeg-turbo, libheif, libwebp; apt-get,
# needs root or sudo), then builds in release and runs `imagepipe "$@"`. The README's main
# command is `./scripts/imagepipe.sh demo`; `./scripts/imagepipe.sh run` starts every service in
# one process (API on :8080). The AI model is prepared on first use.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/image-libs.sh
ensure_image_libs

exec cargo run --release -p imagepipe -- "$@"
