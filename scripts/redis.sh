#!/usr/bin/env bash
# Makes sure a Redis server answers on 127.0.0.1:6379: installs Debian's redis-server if it is
# missing and starts it (no persistence: tests never rely on old data) if it is down.
# Source it, or run it.
set -euo pipefail

redis_up() { (exec 3<>/dev/tcp/127.0.0.1/6379) 2>/dev/null; }

ensure_redis() {
  if redis_up; then return 0; fi
  if ! command -v redis-server >/dev/null 2>&1; then
    echo "==> installing redis-server"
    source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"
    apt_install redis-server
  fi
  echo "==> starting redis-server on 127.0.0.1:6379"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 50); do redis_up && return 0; sleep 0.1; done
  echo "redis-server did not come up; see /var/log/redis/ci.log" >&2
  return 1
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then ensure_redis; fi
