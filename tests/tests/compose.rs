//! The container setup, checked without a container engine: `docker-compose.yml` is a valid
//! Compose project in every documented mode (default NATS, profile `kafka`, profile `tracing`),
//! each pipeline service runs a workspace binary that `deploy/docker/Dockerfile` builds and
//! ships, and each one's environment — the image's `ENV` under the compose file's — loads
//! through the real config loader and points at the brokers, store and volumes the file
//! declares. The example stages' compose overrides add their worker and hand the coordinator a
//! pipeline file, mounted from the repository, that loads and names their stage. What needs an
//! engine (the build, image pulls, health check timing) is not covered.

#[path = "compose/dockerfile.rs"]
mod dockerfile;
#[path = "compose/interpolate.rs"]
mod interpolate;
#[path = "compose/workspace.rs"]
mod workspace;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use compose_spec::service::build::{Context, Dockerfile};
use compose_spec::service::healthcheck::{Healthcheck, Test};
use compose_spec::service::volumes::{ShortOptions, ShortVolume, Source};
use compose_spec::service::{Command, Condition};
use compose_spec::{Compose, Service, ShortOrLong};
use imagepipe_bus::BusKind;
use imagepipe_runtime::Settings;
use imagepipe_runtime::config::StoreKind;

use self::dockerfile::Stage;
use self::workspace::Workspace;

const COMPOSE_FILE: &str = "docker-compose.yml";
const DOCKERFILE: &str = "deploy/docker/Dockerfile";
/// The command-line tool: in the image for health checks and operators, not a service.
const CLI: &str = "imagepipe";
/// Where the image puts its binaries.
const BIN_DIR: &str = "/usr/local/bin/";
/// The variable the tracing mode sets for the services.
const OTLP_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// The documented ways to start everything; the README and the compose file's header say each
/// one verbatim.
const MODES: [&str; 3] = [
    "docker compose up --build",
    "IMAGEPIPE_BUS__KIND=kafka docker compose --profile kafka up --build",
    "OTEL_EXPORTER_OTLP_ENDPOINT=http://jaeger:4318 docker compose --profile tracing up --build",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is inside the workspace").to_owned()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("reading {path}: {e}"))
}

/// A documented command: the shell variables before it and the profiles it enables.
#[derive(Debug)]
struct Mode {
    command: &'static str,
    shell: BTreeMap<String, String>,
    profiles: BTreeSet<String>,
}

impl Mode {
    fn parse(command: &'static str) -> Mode {
        let words: Vec<&str> = command.split_whitespace().collect();
        let docker = words.iter().position(|w| *w == "docker").expect("the command runs docker");
        let shell = words[..docker]
            .iter()
            .map(|w| w.split_once('=').expect("VAR=value before docker"))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let profiles = words.windows(2).filter(|pair| pair[0] == "--profile").map(|pair| pair[1].to_owned()).collect();
        Mode { command, shell, profiles }
    }

    fn all() -> Vec<Mode> {
        MODES.into_iter().map(Mode::parse).collect()
    }
}

/// The compose file as `docker compose` reads it in one mode.
struct Project {
    mode: Mode,
    compose: Compose,
    /// Services the mode starts: those without profiles and those of an enabled profile.
    active: BTreeSet<String>,
}

impl Project {
    fn load(mode: Mode) -> Project {
        let text = interpolate::interpolate(&read(COMPOSE_FILE), &mode.shell)
            .unwrap_or_else(|e| panic!("{}: interpolating {COMPOSE_FILE}: {e}", mode.command));
        let compose = Compose::options()
            .apply_merge(true)
            .from_yaml_str(&text)
            .unwrap_or_else(|e| panic!("{}: {COMPOSE_FILE} is not a valid Compose file: {e}", mode.command));
        compose.validate_all().unwrap_or_else(|e| panic!("{}: {e}", mode.command));
        let active = compose
            .services
            .iter()
            .filter(|(_, s)| s.profiles.is_empty() || s.profiles.iter().any(|p| mode.profiles.contains(p.as_str())))
            .map(|(name, _)| name.as_str().to_owned())
            .collect();
        Project { mode, compose, active }
    }

    fn all() -> Vec<Project> {
        Mode::all().into_iter().map(Project::load).collect()
    }

    fn service(&self, name: &str) -> &Service {
        self.compose.services.iter().find(|(n, _)| n.as_str() == name).map(|(_, s)| s).expect("a known service")
    }

    /// The active services built from the Dockerfile: the pipeline.
    fn pipeline(&self) -> Vec<(&str, &Service)> {
        self.compose
            .services
            .iter()
            .filter(|(name, s)| self.active.contains(name.as_str()) && builds_the_dockerfile(s))
            .map(|(name, s)| (name.as_str(), s))
            .collect()
    }

    /// A pipeline service's environment in this mode: the image's `ENV` overlaid by the
    /// compose file's.
    fn environment(&self, image: &Image, service: &Service) -> BTreeMap<String, String> {
        self.compose_environment(service, image.env.clone())
    }

    /// `env` overlaid by `service`'s compose environment (a variable without a value comes
    /// from the shell, or is unset).
    fn compose_environment(&self, service: &Service, mut env: BTreeMap<String, String>) -> BTreeMap<String, String> {
        let map = service.environment.clone().into_map().expect("environment keys are valid");
        for (key, value) in map {
            let key = key.as_str().to_owned();
            match value.map(|v| v.to_string()).or_else(|| self.mode.shell.get(&key).cloned()) {
                Some(value) => env.insert(key, value),
                None => env.remove(&key),
            };
        }
        env
    }
}

fn builds_the_dockerfile(service: &Service) -> bool {
    let Some(build) = &service.build else { return false };
    let build = build.clone().into_long();
    let context = match build.context {
        Some(Context::Path(path)) => path,
        Some(other) => panic!("build context {other:?} is not a path"),
        None => PathBuf::from("."),
    };
    let dockerfile = match build.dockerfile {
        Some(Dockerfile::File(file)) => file,
        Some(other) => panic!("dockerfile {other:?} is not a file"),
        None => PathBuf::from("Dockerfile"),
    };
    let context = root().join(context);
    assert!(context.is_dir(), "build context {} does not exist", context.display());
    let dockerfile = context.join(dockerfile);
    assert!(dockerfile.is_file(), "dockerfile {} does not exist", dockerfile.display());
    dockerfile.canonicalize().unwrap() == root().join(DOCKERFILE).canonicalize().unwrap()
}

/// The words of a service's `command` (list form only: no shell in between).
fn command(name: &str, service: &Service) -> Vec<String> {
    match &service.command {
        Some(Command::List(words)) => words.clone(),
        other => panic!("{name}: command {other:?} should be a list naming a binary"),
    }
}

/// What the Dockerfile builds.
struct Image {
    stages: Vec<Stage>,
    /// The runtime (last) stage's `ENV`.
    env: BTreeMap<String, String>,
    /// Binaries copied into [`BIN_DIR`] from the build stage.
    bins: BTreeSet<String>,
}

impl Image {
    fn load() -> Image {
        let stages = dockerfile::parse(&read(DOCKERFILE)).unwrap_or_else(|e| panic!("{DOCKERFILE}: {e}"));
        let runtime = stages.last().expect("at least one stage");
        let env = runtime.env().unwrap_or_else(|e| panic!("{DOCKERFILE}: {e}")).into_iter().collect();
        let build = Image::stage_named(&stages, Image::cargo_stage(&stages));
        let mut bins = BTreeSet::new();
        for copy in runtime.copies().unwrap() {
            if copy.from.as_deref() == build.name.as_deref() && copy.dest == BIN_DIR {
                bins.extend(copy.sources.iter().map(|s| s.rsplit('/').next().unwrap().to_owned()));
            }
        }
        Image { stages, env, bins }
    }

    /// The name of the stage running `cargo build`.
    fn cargo_stage(stages: &[Stage]) -> &str {
        let stage = stages
            .iter()
            .find(|s| s.all("RUN").any(|run| dockerfile::cargo_build(run).is_some()))
            .expect("a stage runs cargo build");
        stage.name.as_deref().expect("the cargo stage is named, for COPY --from")
    }

    fn stage_named<'a>(stages: &'a [Stage], name: &str) -> &'a Stage {
        stages.iter().find(|s| s.name.as_deref() == Some(name)).unwrap_or_else(|| panic!("no stage {name}"))
    }

    fn cargo_build(&self) -> dockerfile::CargoBuild {
        let stage = Image::stage_named(&self.stages, Image::cargo_stage(&self.stages));
        stage.all("RUN").find_map(dockerfile::cargo_build).unwrap()
    }

    fn runtime(&self) -> &Stage {
        self.stages.last().unwrap()
    }
}

/// `host:port` of a `scheme://[user@]host:port[/...]` URL or a bare `host:port`.
fn host_port(address: &str) -> (String, u16) {
    let rest = address.split_once("://").map_or(address, |(_, rest)| rest);
    let authority = rest.split('/').next().unwrap();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let (host, port) = authority.rsplit_once(':').unwrap_or_else(|| panic!("{address}: no port"));
    (host.to_owned(), port.parse().unwrap_or_else(|_| panic!("{address}: bad port")))
}

/// Mounts of a service: container path → what is mounted there (a named volume or a host path).
fn mounts(service: &Service) -> BTreeMap<String, Source> {
    service
        .volumes
        .iter()
        .filter_map(|volume| {
            let ShortVolume { container_path, options } = match volume.clone() {
                ShortOrLong::Short(short) => short,
                ShortOrLong::Long(mount) => mount.into_short().expect("a volume in short syntax"),
            };
            options.map(|ShortOptions { source, .. }| (container_path.as_path().display().to_string(), source))
        })
        .collect()
}

/// Named-volume mounts of a service: container path → volume name.
fn named_mounts(service: &Service) -> BTreeMap<String, String> {
    mounts(service)
        .into_iter()
        .filter_map(|(path, source)| match source {
            Source::Volume(name) => Some((path, name.as_str().to_owned())),
            Source::HostPath(_) => None,
        })
        .collect()
}

/// Container ports a service publishes on the host, with the host port.
fn published(service: &Service) -> Vec<(Option<u16>, u16)> {
    service
        .ports
        .iter()
        .flat_map(|port| match port.clone() {
            ShortOrLong::Short(short) => short.ranges.into_iter().collect::<Vec<_>>(),
            ShortOrLong::Long(long) => vec![(long.published.map(|r| r.start()), long.target)],
        })
        .collect()
}

#[test]
fn the_compose_file_is_a_valid_project_in_every_documented_mode() {
    for project in Project::all() {
        let mode = project.mode.command;
        let mut host_ports = BTreeMap::new();
        for name in &project.active {
            let service = project.service(name);
            assert!(service.image.is_some() || service.build.is_some(), "{mode}: {name} has no image");
            if service.build.is_some() {
                assert!(builds_the_dockerfile(service), "{mode}: {name} builds another Dockerfile");
            }
            for (dependency, required, condition) in dependencies(service) {
                let known = project.compose.services.keys().any(|s| s.as_str() == dependency);
                assert!(known, "{mode}: {name} depends on {dependency}, which is not a service");
                assert!(
                    !required || project.active.contains(&dependency),
                    "{mode}: {name} requires {dependency}, which this mode does not start"
                );
                if condition == Condition::ServiceHealthy {
                    let health = &project.service(&dependency).healthcheck;
                    assert!(
                        matches!(health, Some(Healthcheck::Command(c)) if c.test.is_some()),
                        "{mode}: {name} waits for {dependency} to be healthy, which has no health check"
                    );
                }
            }
            for (host, _) in published(service) {
                let host = host.unwrap_or_else(|| panic!("{mode}: {name} publishes a port on a random host port"));
                if let Some(other) = host_ports.insert(host, name.clone()) {
                    panic!("{mode}: {name} and {other} both publish host port {host}");
                }
            }
        }
    }
}

fn dependencies(service: &Service) -> Vec<(String, bool, Condition)> {
    match service.depends_on.clone() {
        ShortOrLong::Short(names) => {
            names.into_iter().map(|n| (n.as_str().to_owned(), true, Condition::ServiceStarted)).collect()
        }
        ShortOrLong::Long(map) => {
            map.into_iter().map(|(n, d)| (n.as_str().to_owned(), d.required, d.condition)).collect()
        }
    }
}

#[test]
fn the_services_are_the_workspaces_binaries_and_the_image_ships_every_one() {
    let workspace = Workspace::load(&root());
    let bins: BTreeSet<String> = workspace.bins().into_keys().collect();
    let image = Image::load();
    assert_eq!(image.bins, bins, "{DOCKERFILE} should copy every workspace binary into {BIN_DIR}");
    let build = image.cargo_build();
    assert!(build.release && build.locked, "{DOCKERFILE}: cargo build --release --locked");
    assert_eq!(build.bins.iter().cloned().collect::<BTreeSet<_>>(), bins, "{DOCKERFILE}: one --bin per binary");

    for project in Project::all() {
        let mode = project.mode.command;
        let mut running = BTreeSet::new();
        for (name, service) in project.pipeline() {
            let words = command(name, service);
            assert!(image.bins.contains(&words[0]), "{mode}: {name} runs {:?}, which the image lacks", words[0]);
            running.insert(words[0].clone());
            let Some(Healthcheck::Command(check)) = &service.healthcheck else { panic!("{name}: no health check") };
            let Some(Test::Command(test)) = &check.test else { panic!("{name}: the health check is not a list") };
            assert_eq!(test.first().map(String::as_str), Some(CLI), "{name}: the health check runs {CLI}");
            assert!(image.bins.contains(CLI), "the image lacks {CLI}, which the health checks run");
        }
        let services: BTreeSet<String> = bins.iter().filter(|b| *b != CLI).cloned().collect();
        assert_eq!(running, services, "{mode}: every service binary runs, each once");
    }
}

#[test]
fn every_pipeline_services_environment_loads_and_points_at_what_the_mode_starts() {
    let image = Image::load();
    for project in Project::all() {
        let mode = project.mode.command;
        let mut blob_volumes = BTreeSet::new();
        for (name, service) in project.pipeline() {
            let env = project.environment(&image, service);
            let settings = Settings::load_from(None, env.clone())
                .unwrap_or_else(|e| panic!("{mode}: {name}'s environment does not load: {e}"));
            let depends: BTreeMap<String, (bool, Condition)> =
                dependencies(service).into_iter().map(|(d, required, c)| (d, (required, c))).collect();
            let waits_for = |host: &str, what: &str| {
                assert!(project.active.contains(host), "{mode}: {name}'s {what} is {host}, which is not started");
                assert_eq!(
                    depends.get(host).map(|(_, c)| *c),
                    Some(Condition::ServiceHealthy),
                    "{mode}: {name} should wait for {host} to be healthy"
                );
            };

            let expected_kind = match project.mode.shell.get("IMAGEPIPE_BUS__KIND").map(String::as_str) {
                Some("kafka") => BusKind::Kafka,
                Some(other) => panic!("{mode}: undocumented bus kind {other}"),
                None => BusKind::Nats,
            };
            assert_eq!(settings.bus.kind, expected_kind, "{mode}: {name}'s bus");
            match settings.bus.kind {
                BusKind::Nats => {
                    for url in settings.bus.nats.url.split(',') {
                        waits_for(&host_port(url).0, "NATS server");
                    }
                }
                BusKind::Kafka => {
                    for broker in settings.bus.kafka.brokers.split(',') {
                        let (host, port) = host_port(broker);
                        waits_for(&host, "Kafka broker");
                        let listeners = project.compose_environment(project.service(&host), BTreeMap::new());
                        let advertised = listeners.get("KAFKA_ADVERTISED_LISTENERS").cloned().unwrap_or_default();
                        assert!(
                            advertised.split(',').any(|l| host_port(l) == (host.clone(), port)),
                            "{mode}: {name} uses broker {broker}, which {host} does not advertise ({advertised})"
                        );
                    }
                }
                BusKind::Memory => panic!("{mode}: {name} runs on the in-process bus"),
            }
            assert_eq!(settings.store.kind, StoreKind::Redis, "{mode}: {name}'s store");
            waits_for(&host_port(settings.store.redis.url.expose()).0, "Redis");

            match (project.mode.shell.get(OTLP_ENDPOINT), env.get(OTLP_ENDPOINT)) {
                (Some(expected), Some(actual)) => {
                    assert_eq!(actual, expected, "{mode}: {name}'s {OTLP_ENDPOINT}");
                    let (host, _) = host_port(actual);
                    assert!(project.active.contains(&host), "{mode}: traces go to {host}, which is not started");
                }
                (None, None) => {}
                (expected, actual) => panic!("{mode}: {name}'s {OTLP_ENDPOINT} is {actual:?}, expected {expected:?}"),
            }

            let port = settings.http.port;
            let Some(Healthcheck::Command(check)) = &service.healthcheck else { panic!("{name}: no health check") };
            let Some(Test::Command(test)) = &check.test else { panic!("{name}: the health check is not a list") };
            let url = test.windows(2).find(|w| w[0] == "--url").map(|w| w[1].clone());
            if let Some(url) = url {
                assert_eq!(url, format!("http://127.0.0.1:{port}/readyz"), "{mode}: {name}'s health check");
            }
            for (_, container) in published(service) {
                assert_eq!(container, port, "{mode}: {name} publishes a port it does not listen on");
            }

            let mounts = named_mounts(service);
            let blob_dir = settings.blob.dir.display().to_string();
            let volume =
                mounts.get(&blob_dir).unwrap_or_else(|| panic!("{mode}: {name}: blob.dir {blob_dir} is not a volume"));
            blob_volumes.insert(volume.clone());
            assert_eq!(
                settings.ai.model_dir.display().to_string(),
                image.env["IMAGEPIPE_AI__MODEL_DIR"],
                "{mode}: {name} overrides the image's model directory"
            );
        }
        assert_eq!(blob_volumes.len(), 1, "{mode}: the services share one blob volume ({blob_volumes:?})");
    }
}

#[test]
fn the_coordinator_forwards_search_stats_and_similarity_to_the_services_that_serve_them() {
    let image = Image::load();
    for project in Project::all() {
        let mode = project.mode.command;
        let pipeline = project.pipeline();
        let running = |binary: &str| {
            let found = pipeline.iter().find(|(name, service)| command(name, service)[0] == binary);
            found.copied().unwrap_or_else(|| panic!("{mode}: no service runs {binary}"))
        };
        let settings = |service: &Service| {
            Settings::load_from(None, project.environment(&image, service)).expect("checked by the test above")
        };
        let coordinator = settings(running("imagepipe-coordinator").1).coordinator;
        for (key, url, binary) in [
            ("coordinator.search_url", coordinator.search_url, "imagepipe-tag-indexer-worker"),
            ("coordinator.stats_url", coordinator.stats_url, "imagepipe-analytics-worker"),
            ("coordinator.similarity_url", coordinator.similarity_url, "imagepipe-similarity-indexer"),
        ] {
            let url = url.unwrap_or_else(|| panic!("{mode}: {key} unset: that route on the coordinator's port is 404"));
            let (host, port) = host_port(&url);
            let (name, service) = running(binary);
            assert_eq!(host, name, "{mode}: {key} = {url} should name the service running {binary}");
            assert_eq!(port, settings(service).http.port, "{mode}: {key} = {url}: {name} listens elsewhere");
        }
    }
}

#[test]
fn the_image_ships_the_prepared_model_where_its_environment_says() {
    let image = Image::load();
    let model_stage = image
        .stages
        .iter()
        .find(|s| s.all("RUN").any(|run| run.contains("scripts/prepare-model.sh")))
        .expect("a stage runs scripts/prepare-model.sh");
    let run = model_stage.all("RUN").find(|run| run.contains("scripts/prepare-model.sh")).unwrap();
    let words: Vec<&str> = run.split_whitespace().collect();
    let out = words.windows(2).find(|w| w[0] == "--out").map(|w| w[1]).expect("prepare-model.sh --out DIR");
    let model_dir = &image.env["IMAGEPIPE_AI__MODEL_DIR"];
    let shipped = image.runtime().copies().unwrap().into_iter().any(|copy| {
        copy.from == model_stage.name
            && copy.sources == [out.to_owned()]
            && copy.dest.trim_end_matches('/') == model_dir
    });
    assert!(shipped, "{DOCKERFILE}: the runtime stage should COPY --from the model stage {out} to {model_dir}");
}

#[test]
fn the_image_copies_only_what_the_context_holds_and_runs_as_a_user() {
    let image = Image::load();
    let dockerignore = read(".dockerignore");
    for stage in &image.stages {
        for copy in stage.copies().unwrap().into_iter().filter(|c| c.from.is_none()) {
            for source in &copy.sources {
                assert!(root().join(source).exists(), "{DOCKERFILE}: COPY {source}: no such path");
                assert!(!dockerfile::ignored(&dockerignore, source), "{DOCKERFILE}: COPY {source} is in .dockerignore");
            }
        }
    }
    for path in ["Cargo.toml", "Cargo.lock", "scripts/prepare-model.sh"] {
        assert!(!dockerfile::ignored(&dockerignore, path), ".dockerignore excludes {path}, which the build needs");
    }
    for path in ["target/release/imagepipe", ".git/HEAD", ".imagepipe/models/model.onnx"] {
        assert!(dockerfile::ignored(&dockerignore, path), ".dockerignore should exclude {path}");
    }
    let user = image.runtime().user().expect("the runtime stage sets USER");
    let name = user.split(':').next().unwrap();
    assert!(name != "root" && name != "0", "the image runs as {user}");
}

#[test]
fn the_image_has_the_bus_backend_of_every_documented_mode() {
    let workspace = Workspace::load(&root());
    let image = Image::load();
    let bins: BTreeSet<String> = workspace.bins().into_keys().collect();
    let enabled = workspace.bus_features(&bins, &image.cargo_build().features);
    let declared = workspace.bus_feature_names();
    for project in Project::all() {
        for (name, service) in project.pipeline() {
            let env = project.environment(&image, service);
            let kind = Settings::load_from(None, env).unwrap().bus.kind;
            let feature = serde_json::to_value(kind).unwrap().as_str().unwrap().to_owned();
            assert!(
                declared.contains(&feature),
                "{}: {name} uses bus.kind {feature}, a backend imagepipe-bus lacks",
                project.mode.command
            );
            assert!(
                enabled.contains(&feature),
                "{}: {name} uses bus.kind {feature}, but the image builds imagepipe-bus with {enabled:?} only",
                project.mode.command
            );
        }
    }
}

#[test]
fn the_readme_and_the_compose_file_state_every_documented_command() {
    let readme = read("README.md");
    let compose = read(COMPOSE_FILE);
    for command in MODES {
        assert!(readme.contains(command), "README.md should document `{command}`");
        assert!(compose.contains(command), "{COMPOSE_FILE}'s header should state `{command}`");
    }
    let project = Project::load(Mode::parse(MODES[0]));
    let scale = readme
        .lines()
        .find_map(|line| line.split("--scale ").nth(1))
        .expect("README.md shows --scale")
        .split(|c: char| c.is_whitespace() || c == '`')
        .next()
        .unwrap();
    let (name, _) = scale.split_once('=').expect("--scale NAME=N");
    let service = project.service(name);
    assert!(published(service).is_empty(), "README scales {name}, whose published host port would clash");
}

/// The example stages' compose overrides (run as `docker compose -f docker-compose.yml -f
/// <override> up --build`), each with the service of its stage's worker and the stage's name.
const STAGE_OVERRIDES: [(&str, &str, &str); 2] = [
    ("examples/stages/faces/docker-compose.faces.yml", "faces-stage", "faces"),
    ("examples/stages/rendition/docker-compose.rendition.yml", "stage-rendition", "rendition"),
];

#[test]
fn each_example_stage_override_adds_its_worker_and_a_coordinator_pipeline_with_its_stage() {
    let image = Image::load();
    let base = Project::load(Mode::parse(MODES[0]));
    for (file, worker_name, stage) in STAGE_OVERRIDES {
        let text = interpolate::interpolate(&read(file), &base.mode.shell)
            .unwrap_or_else(|e| panic!("{file}: interpolating: {e}"));
        let overlay = Compose::options()
            .apply_merge(true)
            .from_yaml_str(&text)
            .unwrap_or_else(|e| panic!("{file} is not a valid Compose file: {e}"));
        let service = |name: &str| {
            overlay
                .services
                .iter()
                .find(|(n, _)| n.as_str() == name)
                .map(|(_, s)| s)
                .unwrap_or_else(|| panic!("{file}: no service {name}"))
        };

        // The coordinator runs the pipeline file the override mounts, and that pipeline has the stage.
        let coordinator = service("coordinator");
        let env = base.compose_environment(coordinator, base.environment(&image, base.service("coordinator")));
        let config =
            env.get("IMAGEPIPE_CONFIG").unwrap_or_else(|| panic!("{file}: the coordinator gets no IMAGEPIPE_CONFIG"));
        let source = match mounts(coordinator).remove(config.as_str()) {
            Some(Source::HostPath(path)) => root().join(path.as_path()),
            other => panic!("{file}: {config} is not a file of the repository mounted into the coordinator: {other:?}"),
        };
        assert!(source.is_file(), "{file}: {} is not a file", source.display());
        let without_file = env.clone().into_iter().filter(|(k, _)| k != "IMAGEPIPE_CONFIG");
        let settings = Settings::load_from(Some(&source), without_file)
            .unwrap_or_else(|e| panic!("{file}: the coordinator's config {} does not load: {e}", source.display()));
        let stages: Vec<&str> = settings.pipeline.stages.iter().map(|s| s.name.as_str()).collect();
        assert!(stages.contains(&stage), "{file}: the coordinator's pipeline {stages:?} has no {stage}");

        // The worker is a new service, built from a Dockerfile the repository holds, waiting for
        // services the base project starts, on its broker.
        assert!(!base.active.contains(worker_name), "{file}: {worker_name} is already a service of {COMPOSE_FILE}");
        let worker = service(worker_name);
        let build = worker.build.clone().unwrap_or_else(|| panic!("{file}: {worker_name} is not built")).into_long();
        let context = match build.context {
            Some(Context::Path(path)) => root().join(path),
            other => panic!("{file}: {worker_name}'s build context {other:?} is not a path"),
        };
        let dockerfile = match build.dockerfile {
            Some(Dockerfile::File(path)) => root().join(path),
            None => context.join("Dockerfile"),
            Some(other) => panic!("{file}: {worker_name}'s dockerfile {other:?} is not a file"),
        };
        assert!(
            context.is_dir() && dockerfile.is_file(),
            "{file}: {worker_name} builds {} in {}",
            dockerfile.display(),
            context.display()
        );
        for (dependency, required, _) in dependencies(worker) {
            assert!(
                base.active.contains(&dependency) || !required,
                "{file}: {worker_name} waits for {dependency}, which {COMPOSE_FILE} does not start"
            );
        }
        let worker_env = base.compose_environment(worker, BTreeMap::new());
        let nats = worker_env
            .get("IMAGEPIPE_BUS__NATS__URL")
            .unwrap_or_else(|| panic!("{file}: {worker_name} has no NATS URL"));
        let (host, _) = host_port(nats);
        assert!(base.active.contains(&host), "{file}: {worker_name}'s NATS server {host} is not started");
        for (container, volume) in named_mounts(worker) {
            assert!(
                base.compose.volumes.keys().any(|v| v.as_str() == volume),
                "{file}: {worker_name} mounts volume {volume} at {container}, which {COMPOSE_FILE} does not declare"
            );
        }
        if let Some(url) = worker_env.get("FACES_COORDINATOR_URL") {
            assert_eq!(
                host_port(url),
                ("coordinator".to_owned(), settings.http.port),
                "{file}: {worker_name} fetches blobs from {url}, where the coordinator does not listen"
            );
        }
    }
}
