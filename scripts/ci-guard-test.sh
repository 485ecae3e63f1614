#!/usr/bin/env bash
# Tests scripts/ci-guard.sh (scripts/test.sh runs it first; a second, no servers): under CI every
# variable of CI_REFUSED and any argument makes `scripts/test.sh --check-env` fail naming it,
# CI_PROVIDED is unset, and outside CI nothing is refused. Each case runs in a clean environment.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/ci-guard.sh

failures=0
fail() { echo "ci-guard-test: $*" >&2; failures=$((failures + 1)); }

# run ENV... -- ARG...: scripts/test.sh --check-env ARG... in an environment of only PATH, HOME
# and ENV; sets `rc` and `err` (its stderr).
run() {
  local env=(PATH="$PATH" HOME="$HOME")
  while (($#)) && [[ "$1" != -- ]]; do env+=("$1"); shift; done
  shift
  rc=0
  err="$(env -i "${env[@]}" timeout 60 scripts/test.sh --check-env "$@" 2>&1 >/dev/null)" || rc=$?
}

while IFS= read -r line; do
  name="${line%%=*}"
  for value in 0 1 ""; do
    run CI=true "$name=$value" --
    ((rc != 0)) || fail "CI=true $name='$value': not refused"
    [[ "$err" == *"$name is set"* ]] || fail "CI=true $name='$value': the message does not name it: $err"
    run "$name=$value" --
    ((rc == 0)) || fail "$name='$value' outside CI: refused: $err"
  done
done <<<"$CI_REFUSED"

run CI=true IMAGEPIPE_TEST_CLUSTER=0 IMAGEPIPE_E2E_IMAGE=x --
[[ "$err" == *IMAGEPIPE_TEST_CLUSTER\ is\ set* && "$err" == *IMAGEPIPE_E2E_IMAGE\ is\ set* ]] \
  || fail "two refused variables: not both named: $err"
run CI=1 IMAGEPIPE_TEST_CLUSTER_TASKS=1 --
((rc != 0)) || fail "CI=1: not taken as CI"
run CI=false IMAGEPIPE_TEST_CLUSTER_TASKS=1 --
((rc == 0)) || fail "CI=false: taken as CI: $err"
run CI=true -- -E 'test(/nothing/)'
((rc != 0)) && [[ "$err" == *"takes no arguments"* ]] || fail "CI=true with a nextest filter: not refused: $err"
run CI=true --
((rc == 0)) || fail "CI=true, nothing set: refused: $err"

# Under CI the provided variables are unset, outside CI kept.
for name in "${CI_PROVIDED[@]}"; do
  left="$(env -i PATH="$PATH" CI=true "$name=elsewhere" bash -c \
    'source scripts/ci-guard.sh; ci_guard; echo "${!1-unset}"' _ "$name")"
  [[ "$left" == unset ]] || fail "CI=true $name: left as '$left'"
  left="$(env -i PATH="$PATH" "$name=elsewhere" bash -c \
    'source scripts/ci-guard.sh; ci_guard; echo "${!1-unset}"' _ "$name")"
  [[ "$left" == elsewhere ]] || fail "$name outside CI: changed to '$left'"
done

# .ci/run, what CI calls, runs as CI.
grep -qx 'export CI=true' .ci/run || fail ".ci/run does not export CI=true"

if ((failures)); then
  echo "ci-guard-test: $failures failed" >&2
  exit 1
fi
echo "ci-guard-test: passed ($(wc -l <<<"$CI_REFUSED") refused variables, ${#CI_PROVIDED[@]} provided)"
