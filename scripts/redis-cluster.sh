#!/usr/bin/env bash
# Makes sure a Redis Cluster of 3 primaries and 3 replicas answers on 127.0.0.1:7001-7006 (Debian's
# redis-server in cluster mode, installed by scripts/redis.sh's way if missing; no persistence:
# tests never rely on old data), and exports its seed URL for the tests:
#
#   IMAGEPIPE_TEST_REDIS_CLUSTER_URL=redis+cluster://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003
#
# (the form `store.redis.url` and every other Redis URL of imagepipe take for a cluster: the
# scheme `redis+cluster://`, or `rediss+cluster://` for TLS, then one or more seed nodes
# separated by commas). Idempotent: a cluster that answers with `cluster_state:ok` is left as
# it is; nodes that are down are started, and a cluster never created is created.
# Source it and call ensure_redis_cluster, or run it.
set -euo pipefail

REDIS_CLUSTER_PORTS=(7001 7002 7003 7004 7005 7006)
REDIS_CLUSTER_DIR="${REDIS_CLUSTER_DIR:-/var/lib/imagepipe-redis-cluster}"

source "$(dirname "${BASH_SOURCE[0]}")/net.sh"

redis_cluster_ok() {
  redis-cli -p "${REDIS_CLUSTER_PORTS[0]}" cluster info 2>/dev/null | grep -q '^cluster_state:ok'
}

ensure_redis_cluster() {
  local port ports=() ok=0
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "==> installing redis-server"
    source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"
    apt_install redis-server
  fi
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do
    ports+=("127.0.0.1:$port")
    port_open "$port" && continue
    echo "==> starting redis-server (cluster mode) on 127.0.0.1:$port"
    mkdir -p "$REDIS_CLUSTER_DIR/$port"
    redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --cluster-enabled yes \
      --cluster-config-file "$REDIS_CLUSTER_DIR/$port/nodes.conf" --cluster-node-timeout 5000 \
      --save "" --appendonly no --dir "$REDIS_CLUSTER_DIR/$port" --logfile "$REDIS_CLUSTER_DIR/$port/redis.log"
  done
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do
    for _ in $(seq 1 50); do port_open "$port" && break; sleep 0.1; done
    if ! port_open "$port"; then
      echo "redis-server did not come up on $port; see $REDIS_CLUSTER_DIR/$port/redis.log" >&2
      return 1
    fi
  done
  # A node that knows only itself has never joined a cluster: create it (a node restarted from
  # its nodes.conf rejoins on its own).
  if ! redis_cluster_ok && [[ "$(redis-cli -p "${REDIS_CLUSTER_PORTS[0]}" cluster info | grep '^cluster_known_nodes:' | tr -dc 0-9)" == 1 ]]; then
    echo "==> creating the Redis Cluster (3 primaries, 3 replicas)"
    redis-cli --cluster create "${ports[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
  fi
  # Slots covered is not enough: every node must agree, and every replica be attached, before a
  # test relies on WAIT reaching one.
  for _ in $(seq 1 300); do
    if redis_cluster_ok && [[ "$(redis_cluster_replicas)" == 3 ]]; then ok=1; break; fi
    sleep 0.1
  done
  if ((ok == 0)); then
    echo "the Redis Cluster on ${ports[*]} is not ok (redis-cli -p ${REDIS_CLUSTER_PORTS[0]} cluster nodes):" >&2
    redis-cli -p "${REDIS_CLUSTER_PORTS[0]}" cluster nodes >&2 || true
    return 1
  fi
  export IMAGEPIPE_TEST_REDIS_CLUSTER_URL="redis+cluster://${ports[0]},${ports[1]},${ports[2]}"
}

# How many replicas are attached to a primary, connected and in sync.
redis_cluster_replicas() {
  local port count=0
  for port in "${REDIS_CLUSTER_PORTS[@]}"; do
    if redis-cli -p "$port" info replication 2>/dev/null | grep -q '^role:slave' &&
      redis-cli -p "$port" info replication 2>/dev/null | grep -q '^master_link_status:up'; then
      count=$((count + 1))
    fi
  done
  echo "$count"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  ensure_redis_cluster
  echo "IMAGEPIPE_TEST_REDIS_CLUSTER_URL=$IMAGEPIPE_TEST_REDIS_CLUSTER_URL"
fi
