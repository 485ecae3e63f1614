#!/bin/sh
# The one-shot init of docker-compose.yml's profile `cluster` (service redis-cluster-init): makes
# the six Redis nodes (redis-1 .. redis-6, each redis-server in cluster mode) one Redis Cluster of
# three primaries and three replicas, and waits until it serves.
#
#   sh redis-cluster-init.sh HOST:PORT...      (compose: redis-1:6379 ... redis-6:6379)
#
# `redis-cli --cluster create` needs addresses (CLUSTER MEET takes no host names), so each node's
# address on the compose network is read from the node itself: CLIENT INFO's `laddr`, where this
# connection reached it. The nodes announce their host names (`--cluster-announce-hostname`,
# `--cluster-preferred-endpoint-type hostname`), so clients follow CLUSTER SLOTS and MOVED to
# redis-N, which Docker's DNS resolves, also after a node came back on another address.
# Idempotent: a cluster already created (the first node knows others) is only waited for.
# Exits 0 once every node says cluster_state:ok and every replica's link to its primary is up,
# within REDIS_CLUSTER_WAIT seconds (default 120); 1 otherwise. POSIX sh: runs in Debian's and
# in the public alpine image alike.
set -eu

# redis-cli against node HOST:PORT.
cli() {
  node="$1"
  shift
  redis-cli -h "${node%:*}" -p "${node##*:}" "$@"
}

# The value of field $1 of an INFO-style reply on stdin.
field() { tr -d '\r' | sed -n "s/^$1://p"; }

# The address (IP:port) node $1 answered this connection on.
address() { cli "$1" client info | tr ' ' '\n' | sed -n 's/^laddr=//p'; }

# Whether every node is up, in a cluster that is ok, with one replica per primary attached.
ready() {
  replicas=0
  for node in "$@"; do
    [ "$(cli "$node" cluster info 2>/dev/null | field cluster_state)" = ok ] || return 1
    info="$(cli "$node" info replication 2>/dev/null)" || return 1
    if [ "$(echo "$info" | field role)" = slave ]; then
      [ "$(echo "$info" | field master_link_status)" = up ] || return 1
      replicas=$((replicas + 1))
    fi
  done
  [ "$replicas" -eq $(($# / 2)) ]
}

# Waits up to $1 seconds for `ready` on the other arguments.
wait_ready() {
  deadline=$(($(date +%s) + $1))
  shift
  until ready "$@"; do
    if [ "$(date +%s)" -gt "$deadline" ]; then return 1; fi
    sleep 0.5
  done
}

main() {
  wait="${REDIS_CLUSTER_WAIT:-120}"
  for node in "$@"; do
    until [ "$(cli "$node" ping 2>/dev/null)" = PONG ]; do sleep 0.5; done
  done
  if [ "$(cli "$1" cluster info | field cluster_known_nodes)" = 1 ]; then
    addresses=""
    for node in "$@"; do addresses="$addresses $(address "$node")"; done
    echo "redis-cluster-init: creating the cluster of$addresses ($*)"
    # shellcheck disable=SC2086 # one word per address
    redis-cli --cluster create $addresses --cluster-replicas 1 --cluster-yes
  else
    echo "redis-cluster-init: $1 knows $(cli "$1" cluster info | field cluster_known_nodes) nodes already: not created again"
  fi
  started="$(date +%s)"
  if ! wait_ready "$wait" "$@"; then
    echo "redis-cluster-init: the cluster is not ok, or a replica not attached, after $wait s:" >&2
    cli "$1" cluster nodes >&2 || true
    exit 1
  fi
  echo "redis-cluster-init: cluster_state:ok, every replica attached ($(($(date +%s) - started)) s after the create):"
  cli "$1" cluster nodes
}

main "$@"
