#!/usr/bin/env bash
# The Python tools the contract tests check imagepipe's messages with, pinned, in a venv outside
# the repository (${IMAGEPIPE_CACHE_DIR:-~/.cache/imagepipe}/contract-venv):
#   - cloudevents 2.2.0 (PyPI, the CloudEvents Python SDK): tests/tests/cloudevents.rs hands it the
#     raw messages read back from NATS and Kafka (scripts/contract_check.py cloudevents);
#   - jsonschema 4.26.0: shared/contracts/tests/asyncapi_validation.rs validates the golden
#     messages against the payload schemas of docs/asyncapi.yaml (scripts/contract_check.py asyncapi).
# Source it, then `ensure_contract_tools`: exports IMAGEPIPE_TEST_CONTRACT_PYTHON, the venv's
# python, which those tests run (without it they fail, unless IMAGEPIPE_TEST_ALLOW_SKIP=1).
# Needs python3 with venv (Debian's python3-venv is installed when it is missing).

CONTRACT_TOOLS_REQUIREMENTS="cloudevents==2.2.0 jsonschema==4.26.0"

ensure_contract_tools() {
  local venv="${IMAGEPIPE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/imagepipe}/contract-venv"
  if [[ ! -x "$venv/bin/python" || "$(cat "$venv/.requirements" 2>/dev/null)" != "$CONTRACT_TOOLS_REQUIREMENTS" ]]; then
    echo "==> installing $CONTRACT_TOOLS_REQUIREMENTS (PyPI) into $venv" >&2
    if ! python3 -m venv --clear "$venv" >&2; then
      echo "==> installing python3-venv (Debian)" >&2
      source "$(dirname "${BASH_SOURCE[0]}")/apt.sh"
      apt_install python3-venv
      python3 -m venv --clear "$venv" >&2
    fi
    # shellcheck disable=SC2086 # the requirements are words
    "$venv/bin/pip" install -q --disable-pip-version-check $CONTRACT_TOOLS_REQUIREMENTS >&2
    echo "$CONTRACT_TOOLS_REQUIREMENTS" > "$venv/.requirements"
  fi
  export IMAGEPIPE_TEST_CONTRACT_PYTHON="$venv/bin/python"
}
