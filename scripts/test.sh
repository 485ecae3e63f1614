#!/usr/bin/env bash
# The whole test suite, on a fresh machine or a used one: installs and starts what the tests
# need (Redis, a Redis Cluster of 3 primaries and 3 replicas (scripts/redis-cluster.sh), NATS 2.9
# with JetStream, a current NATS, a Kafka-compatible broker and what building librdkafka needs,
# SeaweedFS's S3 gateway (scripts/seaweedfs.sh), the image libraries and the HEIC/AVIF encoders of
# scripts/image-libs.sh, Chromium and chromedriver for the dashboard's browser tests, the
# CloudEvents SDK and jsonschema of the contract tests (scripts/contract-tools.sh), the Python of
# the example stages of examples/stages/ (scripts/stage-examples.sh)), then
# runs every test of the workspace with every backend compiled in, schemathesis against the
# coordinator's OpenAPI document (scripts/schemathesis.sh), and the pipeline in containers
# (compose end to end on NATS and Kafka, the cluster under failures). `.ci/run` calls exactly this.
#
# Under CI (.ci/run sets CI=true) it takes no arguments and refuses every variable that would skip,
# shrink or swap a check (scripts/ci-guard.sh); `scripts/test.sh --check-env` only checks that.
set -euo pipefail
cd "$(dirname "$0")/.."

source scripts/ci-guard.sh
if [[ "${1:-}" == --check-env ]]; then
  shift
  ci_guard "$@"
  exit 0
fi
ci_guard "$@"
scripts/ci-guard-test.sh

source scripts/redis.sh
ensure_redis
source scripts/redis-cluster.sh
ensure_redis_cluster
source scripts/image-libs.sh
ensure_image_libs
ensure_image_tools
if [[ -f scripts/nats.sh ]]; then
  source scripts/nats.sh
  ensure_nats
  ensure_nats_latest
fi
if [[ -f scripts/kafka.sh ]]; then
  source scripts/kafka.sh
  ensure_kafka_build_deps
  ensure_kafka
fi
source scripts/seaweedfs.sh
ensure_seaweedfs
source scripts/chromium.sh
ensure_chromium
source scripts/contract-tools.sh
ensure_contract_tools
# nats-py, confluent-kafka and OpenCV for the faces stage in Python (examples/stages/faces), which
# tests/tests/stages.rs runs as a custom stage's worker: exports IMAGEPIPE_TEST_FACES_PYTHON.
source scripts/stage-examples.sh
ensure_stage_examples
export IMAGEPIPE_TEST_MODEL_DIR; IMAGEPIPE_TEST_MODEL_DIR="$(scripts/prepare-model.sh --print-dir)"
# The preparation's venv (numpy, onnx, onnxruntime), set up by prepare-model.sh: the custom-model
# test prepares a second classifier with it.
export IMAGEPIPE_TEST_PREPARE_PYTHON="${IMAGEPIPE_CACHE_DIR:-$HOME/.cache/imagepipe}/venv-prepare/bin/python"
# Everything a test needs is provided above: a test that finds it missing fails, never skips.
unset IMAGEPIPE_TEST_ALLOW_SKIP

if ! cargo nextest --version >/dev/null 2>&1; then
  echo "==> installing cargo-nextest"
  cargo install cargo-nextest --locked
fi

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> deploy kit (kustomize, Kubernetes and KEDA schemas, Prometheus, Grafana)"
scripts/validate-deploy.sh

echo "==> cargo nextest run"
cargo nextest run --workspace --all-features --profile ci "$@"

echo "==> schemathesis against the coordinator's OpenAPI document"
scripts/schemathesis.sh

# The pipeline in containers (docs/containers.md), where a Docker engine answers: local images
# (no registry needed) around the binaries the tests just built; NATS and Kafka end to end, and
# the cluster profile (3 NATS servers, R3 streams, a Redis Cluster, SeaweedFS's S3, two replicas
# of every service) through a stopped NATS node, a cut-off download worker, a stopped
# coordinator, a Redis primary killed and failed over, and a stopped SeaweedFS.
if docker info >/dev/null 2>&1; then
  export IMAGEPIPE_IMAGES_BINARIES="${CARGO_TARGET_DIR:-target}/debug"
  # Compose v2 and buildx (Debian 13's packages): the images build with BuildKit, NATS runs under
  # Compose v2 as a user runs the file, Kafka under the machine's Compose v1 (scripts/compose-v1.sh's
  # rendering), so both tools stay proven.
  source scripts/docker-plugins.sh
  ensure_docker_plugins
  echo "==> docker compose end to end (scripts/compose-e2e.sh)"
  IMAGEPIPE_COMPOSE=v2 scripts/compose-e2e.sh nats
  IMAGEPIPE_COMPOSE=v1 scripts/compose-e2e.sh kafka
  # 100 tasks per scenario: the debug binaries move 1-2 tasks/s through the cluster profile's 31
  # containers (six Redis nodes, SeaweedFS) on two cores, so 250 took 22 min for the five
  # scenarios and the documented 1,000 (scripts/compose-cluster.sh's default) would take hours.
  # Outside CI, IMAGEPIPE_TEST_CLUSTER_TASKS sets another count and IMAGEPIPE_TEST_CLUSTER=0 skips
  # the scenarios.
  if [[ "${IMAGEPIPE_TEST_CLUSTER:-1}" != 0 ]]; then
    echo "==> the cluster profile under failures (scripts/compose-cluster.sh)"
    scripts/compose-cluster.sh --tasks "${IMAGEPIPE_TEST_CLUSTER_TASKS:-100}"
  else
    echo "==> IMAGEPIPE_TEST_CLUSTER=0: the cluster scenarios (scripts/compose-cluster.sh) did not run"
  fi
else
  echo "==> no Docker engine answers (docker info): the container tests did not run" >&2
  exit 1
fi
