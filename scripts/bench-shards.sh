#!/usr/bin/env bash
# Issue 32's replica benchmark: `imagepipe bench` (no-op stages, NATS + Redis) against 1, 2 and 3
# coordinator processes (the imagepipe-coordinator binary), each held to the same CPU quota in a
# cgroup v1 cpu group of its own, so that what a second and third replica buy is measured
# without them taking the cores the broker, Redis, the stages and the driver need.
#
# For each of $RUNS rounds and each N in $REPLICAS, with a fresh bus prefix (state never piles up):
#   1. N coordinators start under that prefix, each in /sys/fs/cgroup/cpu/imagepipe-bench/c<i>
#      (cpu.cfs_period_us = $PERIOD, cpu.cfs_quota_us = $QUOTA; QUOTA=-1: no limit);
#   2. the script waits until GET /v1/cluster shows N replicas, every shard owned and the
#      shares within one of each other;
#   3. `imagepipe bench --external-coordinators --submit-to $SUBMIT_TO --runs 1` runs the no-op
#      stages and the driver against them ($TASKS tasks at full load, $LOW tasks at low load);
#   4. the coordinators get SIGTERM, and `imagepipe bench --clean-up-prefix` deletes the
#      prefix's streams and keys.
# Then it prints tasks/s per run, the medians, the ratios to N = 1 (targets: 2 ≥ 1.6×, 3 ≥
# 2.4×), the coordinators' CPU per task and how often their quota throttled them.
#
# The quota: 4 ms per 100 ms (4 % of a core) by default. On the project's 2-core VM a task costs
# about 0.35-0.45 ms of coordinator CPU and ~2 ms more in nats-server, Redis, the stages and the
# driver, so 3 coordinators at 4 % move ~300 tasks/s while the rest of the pipeline needs ~0.7 of
# the 2 cores; at 8 % the 3-coordinator runs were no longer held by their quota (throttled in
# under a quarter of their periods) but by the machine (docs/performance.md, "Shards").
# Needs root (cgroups), release binaries in $BIN (default $CARGO_TARGET_DIR/release), curl, jq.
# Starts Redis and NATS (scripts/redis.sh, scripts/nats.sh) if they are down.
# Usage: [QUOTA=4000] [REPLICAS="1 2 3"] [RUNS=3] [TASKS=5000] [LOW=100] scripts/bench-shards.sh
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-$here/../target}/release}
QUOTA=${QUOTA:-4000}
PERIOD=${PERIOD:-100000}
REPLICAS=${REPLICAS:-"1 2 3"}
RUNS=${RUNS:-3}
TASKS=${TASKS:-5000}
LOW=${LOW:-100}
SUBMIT_TO=${SUBMIT_TO:-shard}
BASE_PORT=${BASE_PORT:-18300}
SETTLE_TIMEOUT=${SETTLE_TIMEOUT:-60}
NATS_URL=${NATS_URL:-nats://127.0.0.1:4222}
REDIS_URL=${REDIS_URL:-redis://127.0.0.1:6379}
CG=/sys/fs/cgroup/cpu/imagepipe-bench
OUT=${OUT:-$(mktemp -d /tmp/bench-shards.XXXXXX)}
mkdir -p "$OUT"

source "$here/redis.sh"
source "$here/nats.sh"
ensure_redis
ensure_nats

for b in imagepipe imagepipe-coordinator; do
  [[ -x "$BIN/$b" ]] || { echo "no $BIN/$b: cargo build --release -p imagepipe -p imagepipe-coordinator" >&2; exit 1; }
done
command -v jq >/dev/null && command -v curl >/dev/null || { echo "needs jq and curl" >&2; exit 1; }
[[ -d /sys/fs/cgroup/cpu ]] || { echo "no cgroup v1 cpu controller at /sys/fs/cgroup/cpu" >&2; exit 1; }

mkdir -p "$CG"
max_n=0
for n in $REPLICAS; do ((n > max_n)) && max_n=$n; done
for i in $(seq 1 "$max_n"); do
  mkdir -p "$CG/c$i"
  echo "$PERIOD" >"$CG/c$i/cpu.cfs_period_us"
  echo "$QUOTA" >"$CG/c$i/cpu.cfs_quota_us"
done

pids=()
stop_coordinators() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap stop_coordinators EXIT

# The environment of every process of prefix $1 (coordinators, the bench, the clean-up).
common_env() {
  echo IMAGEPIPE_BUS__KIND=nats IMAGEPIPE_BUS__NATS__URL="$NATS_URL" IMAGEPIPE_STORE__KIND=redis \
    IMAGEPIPE_STORE__REDIS__URL="$REDIS_URL" IMAGEPIPE_BUS__PREFIX="$1"
}

# Starts coordinator $2 of prefix $1 in cgroup c$2; its log in $OUT.
start_coordinator() {
  local prefix=$1 i=$2 port=$((BASE_PORT + $2))
  (
    echo "$BASHPID" >"$CG/c$i/cgroup.procs"
    # shellcheck disable=SC2046
    exec env $(common_env "$prefix") IMAGEPIPE_HTTP__BIND=127.0.0.1 IMAGEPIPE_HTTP__PORT="$port" \
      IMAGEPIPE_BLOB__DIR="$OUT/blobs" RUST_LOG="${COORDINATOR_LOG:-warn}" "$BIN/imagepipe-coordinator"
  ) >"$OUT/$prefix.c$i.log" 2>&1 &
  pids+=($!)
}

# Waits until coordinator 1 of the N=$1 running ones shows every shard owned, N replicas and
# shares within one; prints the shares.
wait_balanced() {
  local n=$1 deadline=$((SECONDS + SETTLE_TIMEOUT)) view
  while ((SECONDS < deadline)); do
    if view=$(curl -sf "http://127.0.0.1:$((BASE_PORT + 1))/v1/cluster") \
      && jq -e --argjson n "$n" '(.replicas | length) == $n and all(.shards[]; .owner != null)
           and ((.replicas | map(.shards) | max) - (.replicas | map(.shards) | min) <= 1)' <<<"$view" >/dev/null; then
      jq -r '[.replicas[].shards] | map(tostring) | join("/")' <<<"$view"
      return 0
    fi
    sleep 0.5
  done
  echo "the cluster did not settle within ${SETTLE_TIMEOUT}s; last view:" >&2
  [[ -n "${view:-}" ]] && jq -c '{replicas: [.replicas[] | {id, shards}],
    unowned: [.shards[] | select(.owner == null) | .shard]}' <<<"$view" >&2 || echo "(no answer)" >&2
  return 1
}

# nr_periods nr_throttled throttled_time(ns) of cgroup c$1.
throttling() { awk '{v[$1] = $2} END {print v["nr_periods"], v["nr_throttled"], v["throttled_time"]}' "$CG/c$1/cpu.stat"; }

echo "==> $(nproc) cores, $(uname -r); coordinators held to ${QUOTA}/${PERIOD} µs of CPU each (QUOTA=-1: none);" \
  "submits to the $SUBMIT_TO; $TASKS tasks at full load, $LOW at low load; results in $OUT"
results="$OUT/results.tsv"
printf 'replicas\trun\ttasks_per_s\tcoordinator_cpu_ms_per_task\tbench_cpu\tnats_cpu\tredis_cpu\tthrottled_share\tshares\n' \
  >"$results"
# Runs interleave (1, 2, 3, 1, 2, 3, ...) so that a change in the machine's load over the
# minutes of the benchmark falls on every N alike.
for run in $(seq 1 "$RUNS"); do
  for n in $REPLICAS; do
    prefix="bench-shards-$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    for i in $(seq 1 "$n"); do start_coordinator "$prefix" "$i"; done
    if ! shares=$(wait_balanced "$n"); then
      tail -n 20 "$OUT/$prefix".c*.log >&2 || true
      exit 1
    fi
    declare -A before=()
    for i in $(seq 1 "$n"); do before[$i]=$(throttling "$i"); done
    # shellcheck disable=SC2046
    env $(common_env "$prefix") RUST_LOG=warn "$BIN/imagepipe" bench --bus nats --store redis --external-coordinators \
      --coordinator-pids "$(IFS=,; echo "${pids[*]}")" --submit-to "$SUBMIT_TO" --runs 1 --tasks "$TASKS" \
      --low-load-tasks "$LOW" --no-idle-rss --json >"$OUT/$prefix.json" 2>"$OUT/$prefix.bench.log" || {
      echo "the bench failed (N=$n, run $run): $OUT/$prefix.bench.log" >&2
      tail -n 20 "$OUT/$prefix.bench.log" >&2
      exit 1
    }
    periods=0 throttled=0
    for i in $(seq 1 "$n"); do
      read -r p0 t0 _ <<<"${before[$i]}"
      read -r p1 t1 _ <<<"$(throttling "$i")"
      periods=$((periods + p1 - p0)) throttled=$((throttled + t1 - t0))
    done
    stop_coordinators
    # shellcheck disable=SC2046
    env $(common_env "$prefix") RUST_LOG=warn "$BIN/imagepipe" bench --bus nats --store redis --clean-up-prefix \
      >>"$OUT/$prefix.bench.log" 2>&1 || echo "warning: prefix $prefix not fully cleaned (see its bench log)" >&2
    tps=$(jq -r '.median.fullLoad.tasksPerS' "$OUT/$prefix.json")
    cpu=$(jq -r '.median.cpuMsPerTask.coordinators // "n/a"' "$OUT/$prefix.json")
    others=$(jq -r '.median.cpuMsPerTask | [.imagepipe // "n/a", .broker // "n/a", .store // "n/a"] | map(tostring)
      | join("\t")' "$OUT/$prefix.json")
    share=$(awk -v p="$periods" -v t="$throttled" 'BEGIN {printf "%.2f", p ? t / p : 0}')
    printf '%s\t%s\t%.0f\t%s\t%s\t%s\t%s\n' "$n" "$run" "$tps" "$cpu" "$others" "$share" "$shares" >>"$results"
    printf '  N=%s run %s: %.0f tasks/s; coordinators %s ms CPU per task; throttled in %s of their periods; shares %s\n' \
      "$n" "$run" "$tps" "$cpu" "$share" "$shares"
  done
done

echo
python3 - "$results" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
by_n = {}
for r in rows:
    by_n.setdefault(int(r["replicas"]), []).append(r)
med = {n: statistics.median(float(r["tasks_per_s"]) for r in rs) for n, rs in by_n.items()}
targets = {2: 1.6, 3: 2.4}
def med_of(rs, key):
    xs = [float(r[key]) for r in rs if r[key] not in ("n/a", "")]
    return f"{statistics.median(xs):.3f}" if xs else "n/a"
print("| coordinators | tasks/s, each run | median | ratio to 1 | target | CPU ms/task: coordinators, bench (stages, driver), nats-server, redis | throttled periods |")
print("|---|---|---|---|---|---|---|")
for n in sorted(by_n):
    runs = ", ".join(f"{float(r['tasks_per_s']):,.0f}" for r in by_n[n])
    cpu = ", ".join(med_of(by_n[n], k) for k in ("coordinator_cpu_ms_per_task", "bench_cpu", "nats_cpu", "redis_cpu"))
    thr = statistics.median(float(r["throttled_share"]) for r in by_n[n])
    ratio = f"{med[n] / med[1]:.2f}×" if 1 in med and med[1] else "n/a"
    target = f"≥ {targets[n]}×" if n in targets else ""
    print(f"| {n} | {runs} | {med[n]:,.0f} | {ratio} | {target} | {cpu} | {thr:.0%} |")
PY
