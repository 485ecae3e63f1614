#!/usr/bin/env bash
# The pipeline in containers, end to end, on local images (no registry needed):
#
#   scripts/compose-e2e.sh [nats|kafka]        (default nats)
#
# 1. scripts/images.sh: the base, brokers, Redis, the client and imagepipe from the host's
#    release build (cached: quick when nothing changed).
# 2. docker-compose.yml, rendered for Compose v1 with ephemeral host ports
#    (scripts/compose_render.py), up as project imagepipe-e2e-$$; kafka mode:
#    IMAGEPIPE_BUS__KIND=kafka and profile kafka (Tansu). Waits until every container is healthy.
# 3. From the e2e client on the compose network (scripts/compose_e2e.py smoke): one sample photo
#    enqueued by the bus (a NATS publish on imagepipe.tasks.submit, or a Kafka produce to the
#    topic keyed by the task id, as README's "Enqueue a task" says) with a URL the download worker
#    fetches from the coordinator, one uploaded (POST /v1/blobs) and submitted by HTTP
#    ({"blob": key}); both watched to task.completed on GET /v1/events, labels checked.
# 4. The thumbnails and previews of both tasks are files on the blob volume.
# 5. docker-compose down -v, also on failure or interrupt (the logs are printed first on failure).
#
# Uses `docker compose` (v2) when the CLI has it, `docker-compose` (v1) otherwise; IMAGEPIPE_COMPOSE=v1|v2
# insists on one (scripts/compose-lib.sh).
# IMAGEPIPE_E2E_SKIP_IMAGES=1 skips step 1 (the images must exist).
# IMAGEPIPE_E2E_IMAGE=<image> runs that imagepipe image instead of the host-built one (e.g.
# imagepipe/imagepipe:full from `scripts/images.sh full`, the full multi-stage Dockerfile).
# Under CI, scripts/test.sh refuses both (scripts/ci-guard.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode="${1:-nats}"
case "$mode" in
  nats | kafka) ;;
  *) echo "usage: $0 [nats|kafka]" >&2; exit 2 ;;
esac

log() { echo "==> $*" >&2; }
started=$SECONDS

if [[ "${IMAGEPIPE_E2E_SKIP_IMAGES:-}" != 1 ]]; then
  if [[ -n "${IMAGEPIPE_E2E_IMAGE:-}" ]]; then
    "$ROOT/scripts/images.sh" base nats redis tansu e2e-client
  else
    "$ROOT/scripts/images.sh" base nats redis tansu e2e-client imagepipe
  fi
fi
# The images' names (KEY=value words); a failure stops here, since without them Compose would
# run its default public images.
image_env="$("$ROOT/scripts/images.sh" --print-env base 2>/dev/null)" || image_env=""
[[ "$image_env" == *IMAGEPIPE_IMAGE=* ]] || { echo "scripts/images.sh --print-env base named no images" >&2; exit 1; }
# shellcheck disable=SC2086 # KEY=value words
export $image_env
if [[ -n "${IMAGEPIPE_E2E_IMAGE:-}" ]]; then export IMAGEPIPE_IMAGE="$IMAGEPIPE_E2E_IMAGE"; fi
images_done=$SECONDS

project="imagepipe-e2e-$$"
profiles=()
if [[ "$mode" == kafka ]]; then
  export IMAGEPIPE_BUS__KIND=kafka
  profiles=(--profile kafka)
else
  export IMAGEPIPE_BUS__KIND=nats
fi
# The NATS/Kafka-submitted photo is downloaded from the coordinator, on the compose network.
export IMAGEPIPE_NET__ALLOW_CIDRS=10.0.0.0/8,172.16.0.0/12,192.168.0.0/16
unset IMAGEPIPE_HTTP__AUTH_TOKEN OTEL_EXPORTER_OTLP_ENDPOINT

rendered="$(mktemp --suffix=.yml "${TMPDIR:-/tmp}/$project.XXXXXX")"
# shellcheck source=scripts/compose-lib.sh
source "$ROOT/scripts/compose-lib.sh"
compose_render

ok=0
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if ((ok == 0)); then
    echo "==> FAILED ($mode); state and logs of $project:" >&2
    compose ps >&2 || true
    compose logs --no-color --tail=40 >&2 2>&1 || true
  fi
  log "down -v ($project)"
  compose down -v --remove-orphans >/dev/null 2>&1 || true
  rm -f "$rendered"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

log "up ($project, bus $mode, ${compose_cmd[*]})"
compose up -d --no-build >&2

up_started=$SECONDS
wait_healthy 240
healthy=$SECONDS
log "every container healthy in $((healthy - up_started)) s"

# The published port answers on the host too (an ephemeral one, 127.0.0.1 only).
port="$(compose port coordinator 8080)"
python3 -c 'import sys, urllib.request; urllib.request.urlopen(f"http://{sys.argv[1]}/readyz", timeout=5)' "$port"
log "coordinator ready on the host at http://$port"

# Every service runs on the bus of this mode (its log has lines of imagepipe_bus::nats or ::kafka).
for service in coordinator download-worker metadata-worker ai-worker notification-worker \
  tag-indexer-worker similarity-indexer analytics-worker; do
  service_log="$(compose logs --no-color "$service" 2>&1)"
  grep -q "imagepipe_bus::$mode::" <<<"$service_log" \
    || { echo "$service: no line of imagepipe_bus::$mode in its log" >&2; exit 1; }
done
log "every service logs imagepipe_bus::$mode"

network="${project}_default"
result="$(docker run --rm --network "$network" \
  -v "$ROOT/scripts/compose_e2e.py:/e2e/compose_e2e.py:ro" \
  -v "$ROOT/services/imagepipe/samples:/samples:ro" \
  imagepipe/e2e-client python3 /e2e/compose_e2e.py smoke --via "$mode" --run "e2e$$" --timeout 180)"
echo "$result"
submitted=$SECONDS

# Every derivative of both tasks is a file of the blob volume (<dir>/<hex[0:2]>/<hex>). A result
# Python cannot read, or without the two tasks or their derivatives, fails here: an empty list
# would check nothing.
hexes="$(python3 -c 'import json, sys
tasks = json.loads(sys.argv[1])["tasks"]
if len(tasks) != 2 or not all(t["keys"] for t in tasks.values()):
    sys.exit(f"the smoke result does not list the derivatives of two tasks: {sys.argv[1]}")
for t in tasks.values():
    for k in t["keys"]: print(k.split(":", 1)[1])' "$result")"
mapfile -t keys <<<"$hexes"
if [[ -z "$hexes" ]] || ((${#keys[@]} < 2)); then
  echo "no derivative keys in the smoke result: $result" >&2
  exit 1
fi
docker run --rm -v "${project}_blobs:/b:ro" imagepipe/debian:bookworm bash -c '
  for hex in "$@"; do
    f="/b/${hex:0:2}/$hex"
    [[ -s "$f" ]] || { echo "missing on the blob volume: $f" >&2; exit 1; }
    echo "blob volume: $f $(stat -c %s "$f") bytes"
  done' _ "${keys[@]}" >&2
log "${#keys[@]} derivatives on volume ${project}_blobs"

ok=1
log "PASSED ($mode): images $((images_done - started)) s, up to healthy $((healthy - up_started)) s, two tasks $((submitted - healthy)) s, total $((SECONDS - started)) s (before down)"
