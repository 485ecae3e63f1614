#!/usr/bin/env bash
# The pipeline replicated in containers, under failures, on local images:
#
#   scripts/compose-cluster.sh [--tasks N] [SCENARIO...]
#
# Starts docker-compose.yml's profile `cluster` as project imagepipe-cluster-$$: three NATS
# servers (JetStream clustered; IMAGEPIPE_BUS__NATS__URL names the three and
# IMAGEPIPE_BUS__NATS__REPLICAS=3 gives streams of three replicas), a Redis Cluster of six nodes
# (three primaries with a replica each, created by the one-shot redis-cluster-init; every service
# on IMAGEPIPE_STORE__REDIS__URL=redis+cluster://redis-1:6379,redis-2:6379,redis-3:6379, the
# coordinators with IMAGEPIPE_STORE__REDIS__MIN_REPLICAS=1: a batch of transitions counts once a
# replica holds it), SeaweedFS's S3 gateway (the bucket made by the one-shot seaweedfs-init; every
# service on IMAGEPIPE_BLOB__KIND=s3, and no `blobs` volume: the file is rendered without it),
# three coordinators and two replicas of every other service (--scale; the rendered file
# publishes on ephemeral host ports, so replicas do not collide). Checks that the three streams
# have three replicas, all current. Then, for each scenario, enqueues N tasks (default 1000,
# POST /v1/tasks:batch; the coordinator stores each before it answers) and disrupts the run
# (network: as soon as they are enqueued, while the downloads run; redis: once half of the tasks
# completed; the others once a tenth of the tasks completed):
#
#   nats-node    the NATS server leading the task stream is stopped for 20 s, then started
#   network      a download worker is disconnected from the network for 30 s, then reconnected
#   coordinator  a coordinator replica is stopped (docker stop: SIGTERM, 30 s grace) mid-run and
#                stays stopped
#   redis        a failover: the Redis primary owning the most coordinator shards (shard N's keys
#                share the hash tag {imagepipe:sN}: CLUSTER KEYSLOT, then CLUSTER NODES' slot
#                ranges) is killed (docker kill: SIGKILL, a crash); once its replica is promoted
#                (role master, cluster_state:ok: the promotion time is logged) the killed node is
#                started again and rejoins as that one's replica (which min_replicas = 1 needs
#                before the moved shards' transitions count again); asserts besides that each
#                task's task.completed event id was recorded once
#   seaweedfs    the SeaweedFS container (the blob store) is stopped (docker stop) for 10 s, then
#                started again on its volume
#
# and asserts, from the client on the compose network (scripts/compose_e2e.py check): every task
# terminal and completed (none lost), none completed twice (one transition to completed in its
# history, one task.completed event id). Always `down -v` at the end.
# Default: every scenario, in that order. IMAGEPIPE_E2E_SKIP_IMAGES=1 skips scripts/images.sh
# (under CI, scripts/test.sh refuses it: scripts/ci-guard.sh).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tasks=1000
scenarios=()
while (($#)); do
  case "$1" in
    --tasks) tasks="$2"; shift 2 ;;
    nats-node | network | coordinator | redis | seaweedfs) scenarios+=("$1"); shift ;;
    *) echo "usage: $0 [--tasks N] [nats-node|network|coordinator|redis|seaweedfs]..." >&2; exit 2 ;;
  esac
done
((${#scenarios[@]})) || scenarios=(nats-node network coordinator redis seaweedfs)
# The coordinator's key prefix (bus.prefix) and shard count (coordinator.shards): the defaults,
# which the compose file keeps.
key_prefix=imagepipe
shards=64

log() { echo "==> $(date +%T) $*" >&2; }
started=$SECONDS

if [[ "${IMAGEPIPE_E2E_SKIP_IMAGES:-}" != 1 ]]; then
  "$ROOT/scripts/images.sh" base nats redis seaweedfs e2e-client imagepipe
fi
# The images' names (KEY=value words); a failure stops here, since without them Compose would
# run its default public images.
image_env="$("$ROOT/scripts/images.sh" --print-env base 2>/dev/null)" || image_env=""
[[ "$image_env" == *IMAGEPIPE_IMAGE=* ]] || { echo "scripts/images.sh --print-env base named no images" >&2; exit 1; }
# shellcheck disable=SC2086 # KEY=value words
export $image_env

project="imagepipe-cluster-$$"
profiles=(--profile cluster)
# Blobs are in SeaweedFS: no service keeps the shared directory to fall back on.
render_args=(--drop-volume blobs)
export IMAGEPIPE_BUS__KIND=nats
export IMAGEPIPE_BUS__NATS__URL=nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222
export IMAGEPIPE_BUS__NATS__REPLICAS=3
export IMAGEPIPE_STORE__REDIS__URL=redis+cluster://redis-1:6379,redis-2:6379,redis-3:6379
export IMAGEPIPE_STORE__REDIS__MIN_REPLICAS=1
export IMAGEPIPE_BLOB__KIND=s3
# Shorter than the network scenario's 30 s cut: the cut-off worker's messages go to the other.
export IMAGEPIPE_WORKER__ACK_WAIT=10s
# A task whose state write a disruption lost (a step result the store refused and that was not
# redelivered in time) waits for its step deadline (5 min by default); a command still waiting in
# its queue is not charged one, so 30 s is safe under load.
export IMAGEPIPE_COORDINATOR__STEP_DEADLINE=30s
# The seaweedfs scenario's S3 outage lasts about a minute (a clean stop ~25 s, 10 s down, ~25 s
# until the gateway answers again), and a blob operation fails within seconds of it (the S3
# client stops after its 10 quick retries, well short of blob.s3.retry_timeout): 5 attempts per
# step (the default; 1-s backoff doubling, full jitter) can all fall inside it, 10 do not.
export IMAGEPIPE_COORDINATOR__MAX_ATTEMPTS=10
unset IMAGEPIPE_HTTP__AUTH_TOKEN OTEL_EXPORTER_OTLP_ENDPOINT IMAGEPIPE_NET__ALLOW_CIDRS
services=(coordinator download-worker metadata-worker ai-worker notification-worker tag-indexer-worker
  similarity-indexer analytics-worker)
scale=()
# Three coordinators share the shards out (22/21/21 of 64); two of every other service.
for service in "${services[@]}"; do
  if [[ "$service" == coordinator ]]; then scale+=(--scale "$service=3"); else scale+=(--scale "$service=2"); fi
done

work="$(mktemp -d "${TMPDIR:-/tmp}/$project.XXXXXX")"
chmod 0777 "$work" # the client runs as nobody and writes its event logs here
rendered="$work/docker-compose.yml"
# shellcheck source=scripts/compose-lib.sh
source "$ROOT/scripts/compose-lib.sh"
compose_render
network="${project}_default"

# The e2e client on the compose network; the event logs go to $work (/out).
client() {
  docker run --rm --network "$network" -v "$work:/out" \
    -v "$ROOT/scripts/compose_e2e.py:/e2e/compose_e2e.py:ro" \
    -v "$ROOT/services/imagepipe/samples:/samples:ro" \
    "$@"
}

ok=0
loaders=()
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for loader in "${loaders[@]}"; do docker rm -f "$loader" >/dev/null 2>&1 || true; done
  if ((ok == 0)); then
    echo "==> FAILED; state and logs of $project:" >&2
    compose ps >&2 || true
    compose logs --no-color --tail=30 >&2 2>&1 || true
  fi
  log "down -v ($project)"
  compose down -v --remove-orphans >/dev/null 2>&1 || true
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The id of container $2 (1-based) of service $1.
container() { compose ps -q "$1" | while read -r id; do docker inspect -f '{{.Name}} {{.Id}}' "$id"; done | sort | sed -n "${2}p" | cut -d' ' -f2; }
name_of() { docker inspect -f '{{.Name}}' "$1" | sed 's|^/||'; }
# Seconds (one decimal) since $1, an $EPOCHREALTIME (whose decimal point follows the locale).
since() { awk -v a="${1/,/.}" -v b="${EPOCHREALTIME/,/.}" 'BEGIN { printf "%.1f", b - a }'; }
# redis-cli in Redis container $1; field $2 of its INFO-style reply to the rest.
redis_field() { docker exec "$1" redis-cli "${@:3}" 2>/dev/null | tr -d '\r' | sed -n "s/^$2://p"; }
# Role, link to the primary, keys and AOF state of Redis container $1.
redis_info() {
  echo "role $(redis_field "$1" role info replication)," \
    "link $(redis_field "$1" master_link_status info replication)," \
    "keys $(docker exec "$1" redis-cli dbsize 2>/dev/null)," \
    "$(docker exec "$1" redis-cli info persistence 2>/dev/null | tr -d '\r' |
      grep -E '^(aof_enabled|aof_last_write_status):' | tr '\n' ' ')"
}
# The Redis Cluster as node $1 sees it, one line: "host role [slots]; " for each node.
redis_cluster_summary() {
  docker exec "$1" redis-cli cluster nodes | awk '{ host = $2; sub(/.*,/, "", host); role = $3
    sub(/myself,/, "", role); slots = ""; for (i = 9; i <= NF; i++) slots = slots (slots == "" ? "" : ",") $i
    print host, role (slots == "" ? "" : " " slots) ";" }' | sort | tr '\n' ' '
}

# Where the coordinator's shards live, asked of Redis container $1: prints the host name of the
# primary owning the most of them, that count, its replica's host name, and every primary's
# count ("redis-2 22 redis-5 redis-1=21,redis-2=22,redis-3=21"). Shard N's keys share the hash
# tag {<prefix>:sN} (services/coordinator/src/store/redis/keys.rs), so one slot each.
shard_primaries() {
  local slots
  slots="$(for ((i = 0; i < shards; i++)); do echo "CLUSTER KEYSLOT $key_prefix:{$key_prefix:s$i}:lease"; done |
    docker exec -i "$1" redis-cli | tr '\n' ' ')"
  docker exec "$1" redis-cli cluster nodes | awk -v slots="$slots" '
    { host = $2; sub(/.*,/, "", host); name[$1] = host }
    $3 ~ /master/ { for (i = 9; i <= NF; i++) { if ($i ~ /^\[/) continue
        n = split($i, r, "-"); k[$1]++; lo[$1, k[$1]] = r[1]; hi[$1, k[$1]] = (n == 2 ? r[2] : r[1]) } }
    $3 ~ /slave/ { replica[$4] = $1 }
    END {
      n = split(slots, s, " ")
      for (j = 1; j <= n; j++) for (m in k) for (x = 1; x <= k[m]; x++)
        if (s[j] + 0 >= lo[m, x] + 0 && s[j] + 0 <= hi[m, x] + 0) count[m]++
      best = ""; spread = ""
      for (m in k) { spread = spread (spread == "" ? "" : ",") name[m] "=" count[m] + 0
        if (best == "" || count[m] > count[best]) best = m }
      print name[best], count[best] + 0, name[replica[best]], spread
    }'
}

# Waits up to $2 s until Redis container $1 is a primary in a cluster that is ok.
wait_promoted() {
  local deadline=$((SECONDS + $2))
  until [[ "$(redis_field "$1" role info replication)" == master &&
    "$(redis_field "$1" cluster_state cluster info)" == ok ]]; do
    ((SECONDS > deadline)) && { echo "$(name_of "$1") was not promoted in $2 s" >&2; return 1; }
    sleep 0.2
  done
}

# Waits up to $2 s until Redis container $1 is a replica whose link to its primary is up.
wait_replica() {
  local deadline=$((SECONDS + $2))
  until [[ "$(redis_field "$1" role info replication)" == slave &&
    "$(redis_field "$1" master_link_status info replication)" == up ]]; do
    ((SECONDS > deadline)) && { echo "$(name_of "$1") did not rejoin as a replica in $2 s" >&2; return 1; }
    sleep 0.2
  done
}

# Waits up to $2 s until SeaweedFS container $1's S3 gateway answers its health check.
wait_seaweedfs() {
  local deadline=$((SECONDS + $2))
  until docker exec "$1" wget -q --spider http://127.0.0.1:8333/healthz 2>/dev/null; do
    ((SECONDS > deadline)) && { echo "$(name_of "$1") did not answer in $2 s" >&2; return 1; }
    sleep 0.2
  done
}


log "up ($project: 3 NATS servers, R3 streams, a Redis Cluster of 6 nodes, SeaweedFS, 3 coordinators," \
  "2 replicas of each of the other services)"
up_started=$SECONDS
compose up -d --no-build "${scale[@]}" >&2
wait_healthy 360
log "every container healthy in $((SECONDS - up_started)) s ($(compose ps -q | wc -l) containers)"
client imagepipe/e2e-client python3 /e2e/compose_e2e.py streams --run x --nats "$IMAGEPIPE_BUS__NATS__URL" \
  --replicas 3 --timeout 60 >&2
log "Redis Cluster: $(redis_cluster_summary "$(container redis-1 1)")"
log "$(compose logs --no-color redis-cluster-init seaweedfs-init 2>&1 | grep -E 'redis-cluster-init: cluster_state|seaweedfs-init: bucket' |
  sed 's/^[^|]*| //' | tr '\n' ' ')"

# Enqueues $tasks tasks of run $1 in a background client recording events; waits until enqueued.
start_load() {
  local run="$1" name="$project-load-$1"
  loaders+=("$name")
  docker run -d --name "$name" --network "$network" -v "$work:/out" \
    -v "$ROOT/scripts/compose_e2e.py:/e2e/compose_e2e.py:ro" \
    -v "$ROOT/services/imagepipe/samples:/samples:ro" \
    imagepipe/e2e-client python3 /e2e/compose_e2e.py load --via http --run "$run" --tasks "$tasks" \
    --out "/out/events-$run.jsonl" >/dev/null
  local deadline=$((SECONDS + 300))
  until docker logs "$name" 2>&1 | grep -F "tasks enqueued" >/dev/null; do
    if ! docker inspect -f '{{.State.Running}}' "$name" | grep -F true >/dev/null || ((SECONDS > deadline)); then
      docker logs "$name" >&2
      echo "the load of run $run did not enqueue" >&2
      return 1
    fi
    sleep 0.2
  done
  log "run $run: $(docker logs "$name" 2>&1 | grep 'tasks enqueued' | sed 's/^compose_e2e: //')"
}

# Waits for every task of run $1 and asserts; stops its recorder.
check_run() {
  local run="$1" started_at=$SECONDS summary
  summary="$(client imagepipe/e2e-client python3 /e2e/compose_e2e.py check --run "$run" --tasks "$tasks" \
    --events "/out/events-$run.jsonl" --timeout 900)" || { echo "run $run: $summary" >&2; return 1; }
  docker stop -t 5 "$project-load-$run" >/dev/null 2>&1 || true
  log "run $run: every task checked $((SECONDS - started_at)) s after the disruption ended: $summary"
  echo "$summary"
}

# Waits until at least $2 tasks of run $1 are completed (the disruption lands mid-run); up to
# 900 s, as long as check waits (the test command's debug binaries reach the redis scenario's
# 500 of 1,000 in about 6 min).
wait_progress() {
  local run="$1" want="$2" deadline=$((SECONDS + 900)) done_count
  while true; do
    done_count="$(grep -c '"eventType": "task.completed"' "$work/events-$run.jsonl" 2>/dev/null || true)"
    ((${done_count:-0} >= want)) && { log "run $run: $done_count tasks completed"; return 0; }
    ((SECONDS > deadline)) && { echo "run $run: only ${done_count:-0} of $want completed in 900 s" >&2; return 1; }
    sleep 1
  done
}

results=()
for scenario in "${scenarios[@]}"; do
  run="c${scenario//-/}$$"
  scenario_started=$SECONDS
  if [[ "$scenario" == network ]]; then
    # Read before the load: the cut comes the moment the tasks are enqueued, while this worker
    # holds downloads in flight (a metrics call in between gave them time to finish).
    id="$(container download-worker 1)"
    metrics_url="http://$(name_of "$id"):8080/metrics"
    log "$(name_of "$id") before: $(client imagepipe/e2e-client python3 /e2e/compose_e2e.py metrics --run x --url "$metrics_url")"
  fi
  if [[ "$scenario" == redis ]]; then
    # The primary to kill is found before the trigger, so that the kill lands at half the tasks
    # (the lookups take seconds on a loaded machine).
    read -r primary primary_shards replica spread <<<"$(shard_primaries "$(container redis-1 1)")"
    [[ -n "$replica" ]] || { echo "no primary with a replica found (CLUSTER NODES)" >&2; exit 1; }
    id="$(container "$primary" 1)"
    replica_id="$(container "$replica" 1)"
    log "coordinator shards per Redis primary: $spread; $primary: $(redis_info "$id")"
  fi
  start_load "$run"
  # Downloads run far ahead of the other stages (1,000 take about 20 s, before the first task
  # completes): the download worker is cut off as soon as the tasks are enqueued, the others
  # once a tenth of the tasks completed.
  case "$scenario" in
    network) ;;
    redis) wait_progress "$run" $((tasks / 2)) ;;
    *) wait_progress "$run" $((tasks / 10)) ;;
  esac
  case "$scenario" in
    nats-node)
      leader="$(client imagepipe/e2e-client python3 /e2e/compose_e2e.py streams --run x \
        --nats "$IMAGEPIPE_BUS__NATS__URL" | python3 -c 'import json, sys; print(json.load(sys.stdin)["IMAGEPIPE_TASKS"]["leader"])')"
      id="$(container "$leader" 1)"
      log "stopping $leader (leader of IMAGEPIPE_TASKS) for 20 s"
      docker stop "$id" >/dev/null
      sleep 20
      docker start "$id" >/dev/null
      log "started $leader again"
      ;;
    network)
      log "disconnecting $(name_of "$id") from $network for 30 s"
      docker network disconnect "$network" "$id"
      sleep 30
      docker network connect --alias download-worker "$network" "$id"
      log "reconnected $(name_of "$id")"
      ;;
    coordinator)
      id="$(container coordinator 1)"
      log "stopping $(name_of "$id") (docker stop), leaving it stopped"
      docker stop "$id" >/dev/null
      log "$(name_of "$id") exited with $(docker inspect -f '{{.State.ExitCode}}' "$id")"
      ;;
    redis)
      log "killing $primary (docker kill: SIGKILL; $primary_shards of $shards shards), replica $replica;" \
        "$(grep -c '"eventType": "task.completed"' "$work/events-$run.jsonl" || true) tasks completed"
      killed_at=$EPOCHREALTIME
      docker kill "$id" >/dev/null
      wait_promoted "$replica_id" 60
      log "$replica promoted to primary, cluster_state:ok, $(since "$killed_at") s after the kill"
      docker start "$id" >/dev/null
      started_at=$EPOCHREALTIME
      wait_replica "$id" 180
      log "$primary started again $(since "$killed_at") s after the kill; a replica of $replica, link up," \
        "$(since "$started_at") s after its start: $(redis_info "$id")"
      log "Redis Cluster: $(redis_cluster_summary "$replica_id")"
      ;;
    seaweedfs)
      id="$(container seaweedfs 1)"
      log "stopping $(name_of "$id") (docker stop) for 10 s, volume kept"
      docker stop "$id" >/dev/null
      log "$(name_of "$id") exited with $(docker inspect -f '{{.State.ExitCode}}' "$id");" \
        "$(grep -c '"eventType": "task.completed"' "$work/events-$run.jsonl" || true) tasks completed"
      sleep 10
      started_at=$EPOCHREALTIME
      docker start "$id" >/dev/null
      wait_seaweedfs "$id" 120
      log "$(name_of "$id") answers $(since "$started_at") s after its start"
      ;;
  esac
  summary="$(check_run "$run")"
  if [[ "$scenario" == redis ]]; then
    # Besides check's assertions: one task.completed event recorded for each task, none missed.
    python3 -c 'import json, sys; s = json.loads(sys.argv[1]); n = int(sys.argv[2])
bad = s["completedEvents"] != n or s["completedWithoutEvent"]
print("completedEvents %d of %d, without event: %s" % (s["completedEvents"], n, s["completedWithoutEvent"]), file=sys.stderr)
sys.exit(1 if bad else 0)' "$(tail -n1 <<<"$summary")" "$tasks" || { echo "run $run: task.completed events not one per task" >&2; exit 1; }
  fi
  if [[ "$scenario" == network ]]; then
    log "$(name_of "$id") after: $(client imagepipe/e2e-client python3 /e2e/compose_e2e.py metrics --run x --url "$metrics_url")"
  fi
  log "after $scenario: $(client imagepipe/e2e-client python3 /e2e/compose_e2e.py streams --summary --run x \
    --nats "$IMAGEPIPE_BUS__NATS__URL")"
  results+=("$scenario: $summary (scenario $((SECONDS - scenario_started)) s)")
  if [[ "$scenario" == coordinator ]]; then docker start "$id" >/dev/null; fi
  wait_healthy 180 allow-stopped
done

ok=1
log "PASSED in $((SECONDS - started)) s:"
printf '  %s\n' "${results[@]}" >&2
