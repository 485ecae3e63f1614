#!/usr/bin/env bash
# schemathesis (PyPI, pinned below) against the coordinator's OpenAPI document: it generates
# requests from the document for every operation and fails on a server error (5xx) or on an
# answer the document does not describe (status, content type, headers, body schema).
#
# What runs: the coordinator, the tag indexer, the analytics worker and the similarity indexer (with
# the model of scripts/prepare-model.sh, which POST /v1/search/similar runs) as four processes (the
# in-process bus, embedded stores, one blob directory, a temporary directory, a token, spare
# loopback ports), the coordinator forwarding /v1/search, /v1/stats and the similarity routes to
# the other three, as in compose; before schemathesis, a tag search, the stats, the duplicates
# and a similarity search of a sample photo must answer 200 through the coordinator (not 404
# not_configured). Not `imagepipe run`: its download worker would fetch the URLs schemathesis puts
# in submits, and nothing here may reach beyond loopback; here submitted tasks wait in a queue
# nobody reads (so GET /v1/tasks/{id}/similar answers 404, no embedding, or 400).
# Left out: GET /v1/events, a Server-Sent Events stream that stays open while the server runs.
#
# Usage: scripts/schemathesis.sh [extra schemathesis run options]
#   IMAGEPIPE_SCHEMATHESIS_EXAMPLES  examples per operation (default 25)
#   IMAGEPIPE_SCHEMATHESIS_SEED      the seed (default fixed, so a CI run is reproducible; empty:
#                                    a new one each run)
# Under CI, scripts/test.sh refuses both (scripts/ci-guard.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
SCHEMATHESIS_VENV="${IMAGEPIPE_SCHEMATHESIS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/imagepipe/schemathesis-venv}"
EXAMPLES="${IMAGEPIPE_SCHEMATHESIS_EXAMPLES:-25}"
SEED="${IMAGEPIPE_SCHEMATHESIS_SEED-20240611}"
BIN_DIR="${CARGO_TARGET_DIR:-target}/debug"

schemathesis_binary() {
  local bin="$SCHEMATHESIS_VENV/bin/schemathesis"
  if [[ -x "$bin" ]] && "$bin" --version 2>/dev/null | grep -F "$SCHEMATHESIS_VERSION" >/dev/null; then
    echo "$bin"
    return 0
  fi
  echo "==> installing schemathesis $SCHEMATHESIS_VERSION (PyPI) into $SCHEMATHESIS_VENV" >&2
  if ! python3 -m venv "$SCHEMATHESIS_VENV" >&2; then
    echo "==> installing python3-venv (Debian)" >&2
    source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"
    apt_install python3-venv
    python3 -m venv --clear "$SCHEMATHESIS_VENV" >&2
  fi
  "$SCHEMATHESIS_VENV/bin/pip" install -q --disable-pip-version-check "schemathesis==$SCHEMATHESIS_VERSION" >&2
  echo "$bin"
}

source "$(dirname "${BASH_SOURCE[0]}")/net.sh"

SCHEMATHESIS="$(schemathesis_binary)"
# The workspace's binaries as `cargo nextest run --workspace --all-features` builds them (it
# runs this same `cargo test --no-run`), so after it this builds nothing. A `cargo build --bins`
# would resolve features without the dev-dependencies and rebuild half the workspace (minutes).
cargo test -q --no-run --workspace --all-features
for name in coordinator tag-indexer-worker analytics-worker similarity-indexer; do
  [[ -x "$BIN_DIR/imagepipe-$name" ]] || { echo "schemathesis.sh: no $BIN_DIR/imagepipe-$name after the build" >&2; exit 1; }
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/imagepipe-schemathesis.XXXXXX")"
PIDS=()
stop_services() {
  local pid
  for pid in "${PIDS[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${PIDS[@]}"; do
    wait "$pid" 2>/dev/null || true
  done
}
show_logs() {
  local log
  for log in "$WORK"/*.log; do
    echo "--- $(basename "$log") (last 40 lines)" >&2
    tail -n 40 "$log" >&2 || true
  done
}
trap 'stop_services; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

TOKEN="schemathesis-$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
COORDINATOR_PORT="$(spare_port)"
SEARCH_PORT="$(spare_port)"
STATS_PORT="$(spare_port)"
SIMILARITY_PORT="$(spare_port)"
MODEL_DIR="$(scripts/prepare-model.sh --print-dir)"

# start NAME PORT [VAR=VALUE...]: one service binary with the shared environment.
# The failure limit is raised: schemathesis sends missing and wrong tokens on purpose, and a
# throttled 429 would hide what the routes answer (the limiter has tests of its own).
start() {
  local name="$1" port="$2"
  shift 2
  env -i PATH="$PATH" \
    IMAGEPIPE_HTTP__PORT="$port" \
    IMAGEPIPE_HTTP__AUTH_TOKEN="$TOKEN" \
    IMAGEPIPE_HTTP__AUTH_FAILURE_LIMIT=1000000 \
    IMAGEPIPE_STORE__PATH="$WORK/store-$name" \
    IMAGEPIPE_BLOB__DIR="$WORK/blobs" \
    RUST_LOG=warn \
    "$@" "$BIN_DIR/imagepipe-$name" >"$WORK/$name.log" 2>&1 &
  PIDS+=("$!")
}

wait_ready() {
  local name="$1" port="$2"
  for _ in $(seq 1 300); do
    if python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)' \
      "http://127.0.0.1:$port/readyz" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  echo "imagepipe-$name did not get ready on 127.0.0.1:$port" >&2
  show_logs
  return 1
}

start tag-indexer-worker "$SEARCH_PORT"
start analytics-worker "$STATS_PORT"
start similarity-indexer "$SIMILARITY_PORT" IMAGEPIPE_AI__MODEL_DIR="$MODEL_DIR"
start coordinator "$COORDINATOR_PORT" \
  IMAGEPIPE_COORDINATOR__SEARCH_URL="http://127.0.0.1:$SEARCH_PORT" \
  IMAGEPIPE_COORDINATOR__STATS_URL="http://127.0.0.1:$STATS_PORT" \
  IMAGEPIPE_COORDINATOR__SIMILARITY_URL="http://127.0.0.1:$SIMILARITY_PORT"
wait_ready tag-indexer-worker "$SEARCH_PORT"
wait_ready analytics-worker "$STATS_PORT"
wait_ready similarity-indexer "$SIMILARITY_PORT"
wait_ready coordinator "$COORDINATOR_PORT"

# The forwarded routes answer for real through the coordinator: a 404 not_configured passes
# schemathesis (the document describes it) and would leave their services untested. A sample
# photo searched by similarity runs the model.
for call in "GET /v1/search?tags=cat" "GET /v1/stats" "GET /v1/duplicates" \
  "POST /v1/search/similar services/imagepipe/samples/chelsea.jpg"; do
  read -r method path body <<<"$call"
  python3 -c 'import sys, urllib.request
method, url, token, body = sys.argv[1:5]
data = open(body, "rb").read() if body else None
headers = {"Authorization": "Bearer " + token}
if data: headers["Content-Type"] = "image/jpeg"
request = urllib.request.Request(url, data=data, method=method, headers=headers)
try:
    with urllib.request.urlopen(request, timeout=30) as answer:
        if answer.status != 200: raise Exception(f"status {answer.status}")
except Exception as e:
    sys.exit(f"{method} {url} through the coordinator: {e}")' "$method" "http://127.0.0.1:$COORDINATOR_PORT$path" "$TOKEN" "${body:-}" \
    || { show_logs; exit 1; }
done
echo "==> search, stats and similarity answer through the coordinator"

echo "==> schemathesis $SCHEMATHESIS_VERSION against http://127.0.0.1:$COORDINATOR_PORT/v1/openapi.json ($EXAMPLES examples per operation, seed ${SEED:-random})"
seed=()
if [[ -n "$SEED" ]]; then seed=(--seed "$SEED"); fi
status=0
(
  cd "$WORK"
  "$SCHEMATHESIS" run "http://127.0.0.1:$COORDINATOR_PORT/v1/openapi.json" \
    --header "Authorization: Bearer $TOKEN" \
    --checks all --exclude-checks positive_data_acceptance \
    --exclude-path /v1/events \
    --max-examples "$EXAMPLES" \
    "${seed[@]}" \
    --request-timeout 10 \
    --workers 1 \
    "$@"
) | tee "$WORK/schemathesis.out" || status=$?
if [[ $status -ne 0 ]]; then
  show_logs
  exit "$status"
fi
# The closing line in the plain form CI reads (schemathesis's own summary precedes it).
passed="$(grep -oE '[0-9]+ passed' "$WORK/schemathesis.out" | tail -n 1 | grep -oE '[0-9]+' || true)"
if [[ -n "$passed" ]]; then
  echo "schemathesis: $passed passed, 0 failed"
fi
