#!/usr/bin/env python3
"""Renders docker-compose.yml into a file that Compose v1 (docker-compose 1.29) also runs.

    scripts/compose_render.py [--profile P]... [--ephemeral-ports] [--drop-volume NAME]...
                              [--for v1|v2] [-f FILE] [-o OUT]

docker-compose.yml is written for Compose v2; v1 refuses two of its keys:

- the top-level `name` (v1: the project name comes from `-p`, COMPOSE_PROJECT_NAME or the
  directory): dropped;
- `depends_on.<service>.required` (v2.20+: a dependency of a profile that is not enabled is
  skipped): a dependency with `required: false` is kept, without the key, when its service runs
  with the enabled profiles (--profile, and COMPOSE_PROFILES), and dropped otherwise, as v2 does.

--for v2 keeps both keys (the file stays as a user runs it with Compose v2; with
--ephemeral-ports, only the ports change). Default: v1.

--ephemeral-ports publishes every port on an ephemeral host port of the same address
(`127.0.0.1:8080:8080` becomes `127.0.0.1::8080`; `docker-compose port SERVICE 8080` tells which),
so that a test project never collides with a server of the host or another project.

--drop-volume NAME removes named volume NAME: its mounts from every service and its declaration
(scripts/compose-cluster.sh drops `blobs`, so that no service of the cluster profile, whose blobs
are in S3, keeps a shared directory to fall back on).

Anchors and merge keys are expanded; `${VAR}` interpolation is left to Compose. The result runs
from the repository root (`docker-compose -f OUT --project-directory .`): relative paths are
resolved against it, not against OUT's directory. Needs PyYAML (Debian's python3-yaml, which
docker-compose itself depends on).
"""

import argparse
import os
import sys

import yaml


def enabled(service, profiles):
    wanted = service.get("profiles") or []
    return not wanted or any(p in profiles for p in wanted)


def render(compose, profiles, ephemeral_ports, for_v1=True, drop_volumes=()):
    if for_v1:
        compose.pop("name", None)
    services = compose.get("services") or {}
    for name in drop_volumes:
        drop_volume(compose, name)
    for service in services.values():
        depends = service.get("depends_on")
        if for_v1 and isinstance(depends, dict):
            for dependency in list(depends):
                options = depends[dependency] or {}
                required = options.pop("required", True)
                if not required and not enabled(services.get(dependency, {}), profiles):
                    del depends[dependency]
            if not depends:
                del service["depends_on"]
        if ephemeral_ports and service.get("ports"):
            service["ports"] = [ephemeral(port) for port in service["ports"]]
    return compose


def drop_volume(compose, name):
    """Named volume `name` gone from every service and from the top-level `volumes`."""
    declared = compose.get("volumes") or {}
    if name not in declared:
        raise SystemExit(f"--drop-volume {name}: no such volume is declared")
    del declared[name]
    for service in (compose.get("services") or {}).values():
        if "volumes" in service:
            # A new list: merge keys share one list between the services.
            service["volumes"] = [v for v in service["volumes"] if volume_source(v) != name]
            if not service["volumes"]:
                del service["volumes"]


def volume_source(volume):
    """The source of a mount, short (`src:dst[:mode]`) or long syntax."""
    if isinstance(volume, dict):
        return volume.get("source")
    parts = str(volume).split(":")
    return parts[0] if len(parts) > 1 else None


def ephemeral(port):
    """`[ip:]host:container[/proto]` with the host port left to Docker."""
    if isinstance(port, dict):
        port = dict(port)
        port.pop("published", None)
        return port
    text = str(port)
    parts = text.split(":")
    if len(parts) == 3:
        return f"{parts[0]}::{parts[2]}"
    if len(parts) == 2:
        return parts[1]
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-f", "--file", default=os.path.join(os.path.dirname(__file__), "..", "docker-compose.yml"))
    parser.add_argument("-o", "--output", default="-")
    parser.add_argument("--profile", action="append", default=[])
    parser.add_argument("--ephemeral-ports", action="store_true")
    parser.add_argument("--drop-volume", action="append", default=[])
    parser.add_argument("--for", dest="target", choices=["v1", "v2"], default="v1")
    args = parser.parse_args()
    profiles = set(args.profile)
    profiles.update(p for p in os.environ.get("COMPOSE_PROFILES", "").split(",") if p)
    with open(args.file, encoding="utf-8") as f:
        compose = yaml.safe_load(f)
    text = yaml.safe_dump(render(compose, profiles, args.ephemeral_ports, for_v1=args.target == "v1", drop_volumes=args.drop_volume), sort_keys=False, width=1000)
    if args.output == "-":
        sys.stdout.write(text)
    else:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    main()
