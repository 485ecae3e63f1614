#!/usr/bin/env bash
# What a CI run may not change: sourced by scripts/test.sh, whose `ci_guard "$@"` comes first.
#
# Under CI (CI set and not `false` or `0`; .ci/run sets CI=true) the run is the documented one:
#   - a variable of CI_REFUSED (each skips, shrinks or swaps a check) is refused: ci_guard names
#     it, says what it would do and returns 1 (scripts/test.sh exits with it);
#   - so is an argument, since scripts/test.sh passes its arguments to nextest (a filter);
#   - a variable of CI_PROVIDED (a server, binary or model the tests use, which scripts/test.sh
#     provides itself) is unset, so the tests use what scripts/test.sh starts.
# Outside CI, ci_guard does nothing: a developer may skip or shrink on purpose.
# scripts/ci-guard-test.sh tests it.

# NAME=what setting it does, one a line.
CI_REFUSED='IMAGEPIPE_TEST_CLUSTER=skips the cluster scenarios (scripts/compose-cluster.sh)
IMAGEPIPE_TEST_CLUSTER_TASKS=changes the number of tasks of each cluster scenario
IMAGEPIPE_E2E_SKIP_IMAGES=runs the containers on existing images, not on the binaries just built
IMAGEPIPE_E2E_IMAGE=runs the containers on another imagepipe image than the one just built
IMAGEPIPE_SCHEMATHESIS_EXAMPLES=changes the number of schemathesis examples per operation
IMAGEPIPE_SCHEMATHESIS_SEED=swaps the fixed schemathesis seed
IMAGEPIPE_UPDATE_SCHEMAS=rewrites drifted JSON schemas instead of failing on them
NEXTEST_RETRIES=passes a failing test that passes on a retry'

# Provided by scripts/test.sh (or defaulting to what it starts); unset under CI.
CI_PROVIDED=(IMAGEPIPE_TEST_ALLOW_SKIP IMAGEPIPE_TEST_MODEL_DIR IMAGEPIPE_TEST_REDIS_URL IMAGEPIPE_TEST_REDIS_CLUSTER_URL IMAGEPIPE_TEST_NATS_URL
  IMAGEPIPE_TEST_NATS_LATEST_URL IMAGEPIPE_TEST_NATS_LATEST_BIN IMAGEPIPE_TEST_KAFKA_BROKERS
  IMAGEPIPE_TEST_CHROMIUM IMAGEPIPE_TEST_CHROMEDRIVER IMAGEPIPE_TEST_S3_ENDPOINT IMAGEPIPE_TEST_S3_BUCKET
  IMAGEPIPE_TEST_S3_ACCESS_KEY_ID IMAGEPIPE_TEST_S3_SECRET_ACCESS_KEY IMAGEPIPE_TEST_SEAWEEDFS_BIN
  IMAGEPIPE_TEST_CONTRACT_PYTHON IMAGEPIPE_TEST_PREPARE_PYTHON IMAGEPIPE_TEST_FACES_PYTHON)

# Whether this is a CI run.
ci_run() {
  case "${CI:-}" in
    "" | false | 0) return 1 ;;
    *) return 0 ;;
  esac
}

# ci_guard [ARG...]: under CI, refuses the arguments and CI_REFUSED, unsets CI_PROVIDED.
ci_guard() {
  ci_run || return 0
  local refused=0 name what line
  if (($#)); then
    echo "CI=$CI: scripts/test.sh takes no arguments in CI (they would narrow the run): $*" >&2
    refused=1
  fi
  while IFS= read -r line; do
    name="${line%%=*}" what="${line#*=}"
    if [[ -n "${!name+set}" ]]; then
      echo "CI=$CI: $name is set (to '${!name}'), which $what; unset it" >&2
      refused=1
    fi
  done <<<"$CI_REFUSED"
  ((refused == 0)) || return 1
  unset "${CI_PROVIDED[@]}"
}
