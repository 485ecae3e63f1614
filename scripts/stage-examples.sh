#!/usr/bin/env bash
# The Python of the example stages of examples/stages/ (today: faces, a face detector on OpenCV's
# Haar cascade), with their pinned requirements, in a venv outside the repository
# (${IMAGEPIPE_CACHE_DIR:-~/.cache/imagepipe}/stages-venv): tests/tests/stages.rs starts
# examples/stages/faces/faces.py with it as a worker of a custom stage.
# Source it, then `ensure_stage_examples`: exports IMAGEPIPE_TEST_FACES_PYTHON, the venv's python
# (without it those tests fail, unless IMAGEPIPE_TEST_ALLOW_SKIP=1). Run it as a script to set the
# venv up and print that python. Idempotent: the venv is made again only when the requirements
# changed. Needs python3 with venv (Debian's python3-venv is installed when it is missing).

STAGE_EXAMPLES_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

ensure_stage_examples() {
  local venv="${IMAGEPIPE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/imagepipe}/stages-venv"
  local requirements="$STAGE_EXAMPLES_ROOT/examples/stages/faces/requirements.txt" wanted
  wanted="$(grep -v '^#' "$requirements" | sed '/^$/d')"
  if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.requirements" 2>/dev/null)" != "$wanted" ]]; then
    echo "==> installing the example stages' requirements (PyPI: $(echo $wanted)) into $venv" >&2
    if ! python3 -m venv --clear "$venv" >&2; then
      echo "==> installing python3-venv (Debian)" >&2
      source "$STAGE_EXAMPLES_ROOT/scripts/apt.sh"
      apt_install python3-venv
      python3 -m venv --clear "$venv" >&2
    fi
    "$venv/bin/pip" install -q --disable-pip-version-check --only-binary=:all: -r "$requirements" >&2
    # The cascade the stage loads ships in the OpenCV wheel: fail here, not in a test, without it.
    "$venv/bin/python" -c 'import cv2, os, sys; p = cv2.data.haarcascades + "haarcascade_frontalface_default.xml"; sys.exit(0 if os.path.isfile(p) else "no Haar cascade at " + p)' >&2
    echo "$wanted" > "$venv/.requirements"
  fi
  export IMAGEPIPE_TEST_FACES_PYTHON="$venv/bin/python"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  ensure_stage_examples
  echo "$IMAGEPIPE_TEST_FACES_PYTHON"
fi
