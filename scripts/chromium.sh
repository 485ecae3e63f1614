#!/usr/bin/env bash
# Makes sure Debian's Chromium and its WebDriver (chromedriver) are installed, for the
# dashboard's browser tests (services/imagepipe/tests/dashboard.rs). Source it, or run it.
set -euo pipefail

ensure_chromium() {
  if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then return 0; fi
  echo "==> installing chromium and chromium-driver"
  source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"
  apt_install --no-install-recommends chromium chromium-driver
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then ensure_chromium; fi
