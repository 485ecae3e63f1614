#!/usr/bin/env bash
# What scripts/compose-e2e.sh and scripts/compose-cluster.sh share; source it after setting
# `project` (the compose project name), `rendered` (the path of the compose file to run) and
# `profiles` (an array such as (--profile kafka), possibly empty), and optionally `render_args`
# (more arguments of scripts/compose_render.py, such as (--drop-volume blobs)).
#
# The Compose tool: `docker compose` (v2) when the CLI has it (scripts/docker-plugins.sh installs
# it), `docker-compose` (v1) otherwise; IMAGEPIPE_COMPOSE=v1 or v2 insists on one.
#
#   compose_render               writes docker-compose.yml to $rendered as that tool runs it,
#                                every port published on an ephemeral host port
#                                (scripts/compose_render.py: for v1, without the v2-only keys;
#                                plus render_args)
#   compose ARGS...              the Compose tool on that file and project
#   wait_healthy SECS [allow-stopped]
#                                waits until every container with a health check is healthy and
#                                the others run (allow-stopped: a stopped one is fine too); a
#                                one-shot container (restart policy none: the cluster profile's
#                                init services) is done once it exited 0

case "${IMAGEPIPE_COMPOSE:-}" in
  v1) compose_version=v1 ;;
  v2) docker compose version >/dev/null 2>&1 || { echo "IMAGEPIPE_COMPOSE=v2: \`docker compose\` does not answer" >&2; exit 1; }
    compose_version=v2 ;;
  "") if docker compose version >/dev/null 2>&1; then compose_version=v2; else compose_version=v1; fi ;;
  *) echo "IMAGEPIPE_COMPOSE: v1 or v2" >&2; exit 2 ;;
esac
if [[ "$compose_version" == v2 ]]; then compose_cmd=(docker compose); else compose_cmd=(docker-compose); fi

compose_render() {
  python3 "$ROOT/scripts/compose_render.py" -f "$ROOT/docker-compose.yml" -o "$rendered" \
    --ephemeral-ports --for "$compose_version" "${profiles[@]}" ${render_args[@]+"${render_args[@]}"}
}

compose() { "${compose_cmd[@]}" -f "$rendered" --project-directory "$ROOT" -p "$project" "${profiles[@]}" "$@"; }

wait_healthy() {
  local deadline=$((SECONDS + $1)) id state pending
  while true; do
    pending=()
    for id in $(compose ps -q); do
      state="$(docker inspect -f '{{.Name}} {{.State.Status}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}} restart={{.HostConfig.RestartPolicy.Name}} exit={{.State.ExitCode}}' "$id")"
      case "$state" in
        *" running healthy "* | *" running none "*) ;;
        *" exited none restart= exit=0" | *" exited none restart=no exit=0") ;; # a one-shot that finished
        *" exited "* | *" created "*) [[ "${2:-}" == allow-stopped ]] || pending+=("$state") ;;
        *) pending+=("$state") ;;
      esac
    done
    ((${#pending[@]} == 0)) && return 0
    if ((SECONDS > deadline)); then
      echo "not healthy after $1 s: ${pending[*]}" >&2
      return 1
    fi
    sleep 2
  done
}
