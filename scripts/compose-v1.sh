#!/usr/bin/env bash
# docker-compose.yml with Compose v1 (Debian 12's docker-compose 1.29), which refuses the file as
# it is (`name`, `depends_on.required`: Compose v2 keys). Renders a v1 copy for the profiles
# enabled (--profile before the command, or COMPOSE_PROFILES) with scripts/compose_render.py and
# runs docker-compose on it from the repository root, as project `imagepipe` unless -p or
# COMPOSE_PROJECT_NAME says otherwise. Every argument goes to docker-compose unchanged:
#
#   scripts/compose-v1.sh up -d --no-build
#   IMAGEPIPE_BUS__KIND=kafka scripts/compose-v1.sh --profile kafka up -d --no-build
#   scripts/compose-v1.sh down -v
#
# With local images (no registry): eval "$(scripts/images.sh --print-env | sed 's/^/export /')"
# first. v1 builds with the legacy builder, which deploy/docker/Dockerfile (BuildKit cache
# mounts) does not build: pass --no-build, or build with `docker buildx build` / scripts/images.sh.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

profiles=()
project=()
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[i]}" in
    --profile) profiles+=(--profile "${args[i + 1]:-}"); i=$((i + 1)) ;;
    --profile=*) profiles+=(--profile "${args[i]#--profile=}") ;;
    -p | --project-name) project=(x); i=$((i + 1)) ;;
    --project-name=*) project=(x) ;;
    -f | --file | --env-file | --project-directory | -H | --host | -c | --context | --log-level | --ansi) i=$((i + 1)) ;;
    -*) ;;
    *) break ;; # the command: what follows is its own
  esac
done
if ((${#project[@]} == 0)) && [[ -z "${COMPOSE_PROJECT_NAME:-}" ]]; then
  set -- -p imagepipe "$@"
fi

rendered="$(mktemp --suffix=.yml "${TMPDIR:-/tmp}/imagepipe-compose-v1.XXXXXX")"
trap 'rm -f "$rendered"' EXIT
python3 "$ROOT/scripts/compose_render.py" -f "$ROOT/docker-compose.yml" -o "$rendered" "${profiles[@]}"
cd "$ROOT"
docker-compose -f "$rendered" --project-directory "$ROOT" "$@"
