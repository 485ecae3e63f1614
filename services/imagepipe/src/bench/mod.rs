//! `imagepipe bench`: the real coordinator and the real bus under load, measured.
//!
//! Each run gets a prefix of its own (`bus.prefix`, also the Redis key prefix), starts the
//! coordinator and the three stage workers in this process on the chosen bus and store —
//! [`noop`] stages in no-op mode, the real download, metadata and AI handlers on the bundled
//! sample photos in real mode — and drives them through the submit queue ([`driver`]):
//!
//! 1. a warm-up of a few tasks (not counted);
//! 2. full load: every task submitted as fast as the bus takes them; tasks/s, submit →
//!    `task.completed` latency, broker messages, CPU time;
//! 3. low load: one task at a time; latency, and each stage's time from the task records.
//!
//! Afterwards it deletes the run's streams and keys ([`backend`]). Figures are reported per run
//! and as medians across runs ([`report`]); idle memory of the real service binaries is
//! measured once ([`idle`]). With `--photos DIR` the real stages run on those photos, and each
//! stage is also measured on its own per image ([`photos`]), optionally beside Pillow and
//! onnxruntime ([`compare`]). The [`similarity`] scenario measures the similarity index instead.

pub mod backend;
pub mod compare;
pub mod counting;
pub mod driver;
pub mod idle;
pub mod noop;
pub mod photos;
pub mod priority;
pub mod process;
pub mod report;
pub mod similarity;
pub mod stats;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use imagepipe_ai_worker::{Classifier, ModelError};
use imagepipe_bus::{Bus, BusError, BusKind};
use imagepipe_contracts::{Priority, Step, SubmitTask};
use imagepipe_coordinator::Task;
use imagepipe_coordinator::app::{Coordinator, open_store};
use imagepipe_coordinator::store::{StoreError, TaskStore};
use imagepipe_runtime::clock::SystemClock;
use imagepipe_runtime::config::StoreKind;
use imagepipe_runtime::{Settings, Shutdown};
use tokio::task::JoinSet;

use self::backend::{BrokerCounts, RunBackend, broker_delta};
use self::driver::{DriverError, Observer};
use self::idle::IdleRss;
use self::process::{MemoryField, Pid};
use self::report::{CpuFigures, LoadFigures, MessageFigures, Report, RunFigures};
use self::stats::Percentiles;
use crate::samples::SAMPLES;

/// Tasks of the warm-up before each run's measurements.
const WARM_UP_TASKS: usize = 20;
/// How long the services of a run may take to stop.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// What the stage workers do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stages {
    /// No-op stages: orchestration only.
    Noop,
    /// The real download, metadata and AI handlers on the sample photos.
    Real,
}

/// Which measurement a run makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scenario {
    /// Full load, then low load: throughput and latency.
    Throughput,
    /// A `high` task's latency idle and behind `tasks` queued `low` ones ([`priority`]).
    Priority,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Which measurement.
    pub scenario: Scenario,
    /// Stage workers.
    pub mode: Stages,
    /// Tasks of the full-load phase (the priority scenario: low tasks of the backlog).
    pub tasks: usize,
    /// Tasks of the low-load phase (the priority scenario: high tasks timed per phase).
    pub low_load_tasks: usize,
    /// Runs to take the medians of.
    pub runs: usize,
    /// Longest time one phase may take.
    pub timeout: Duration,
    /// Real mode: the photos to submit instead of the bundled samples.
    pub photos: Option<std::path::PathBuf>,
}

/// Where the run's coordinator is and how the driver addresses it; the default is the
/// coordinator in this process, under a prefix of each run's own, submits to the queue.
#[derive(Debug, Clone, Default)]
pub struct Setup {
    /// Coordinator processes started by someone else (`scripts/bench-shards.sh`), on the bus
    /// prefix of the settings; `None`: the coordinator runs in this process.
    pub external: Option<External>,
    /// Where the driver sends its submits.
    pub route: driver::SubmitRoute,
}

/// Coordinators in processes of their own.
#[derive(Debug, Clone, Default)]
pub struct External {
    /// Their pids, to read their CPU time (may be empty).
    pub pids: Vec<u32>,
}

/// A run could not be completed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The bus could not be connected.
    #[error("connecting the bus")]
    Bus(#[source] BusError),
    /// The store could not be opened.
    #[error("opening the task store")]
    Store(#[source] StoreError),
    /// The AI model could not be loaded (real mode).
    #[error("loading the AI model")]
    Model(#[source] ModelError),
    /// A temporary directory or the blob store failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A phase did not finish.
    #[error("{phase} phase{}", if services.0.is_empty() { String::new() } else { format!(" ({services})") })]
    Driver {
        /// Which phase.
        phase: &'static str,
        /// What went wrong.
        #[source]
        source: DriverError,
        /// Services that stopped with an error meanwhile.
        services: ServiceErrors,
    },
    /// A service stopped with an error.
    #[error(transparent)]
    Services(ServiceErrors),
}

/// Errors of the run's services, one per line.
#[derive(Debug, Default, thiserror::Error)]
#[error("{}", if .0.is_empty() { "no service failed".to_owned() } else { .0.join("; ") })]
pub struct ServiceErrors(pub Vec<String>);

/// Runs the benchmark on the bus and store of `settings`; measures the idle memory of the
/// service binaries too when `idle` says where they are.
pub async fn report(
    settings: &Settings,
    options: &BenchOptions,
    idle: Option<idle::Launch>,
) -> Result<Report, BenchError> {
    report_with(settings, options, &Setup::default(), idle).await
}

/// [`report`] with the coordinator where `setup` says.
pub async fn report_with(
    settings: &Settings,
    options: &BenchOptions,
    setup: &Setup,
    idle: Option<idle::Launch>,
) -> Result<Report, BenchError> {
    let mut left_behind = Vec::new();
    let runs = run_with(settings, options, setup, &mut left_behind).await?;
    let idle_rss = match idle {
        Some(launch) => measure_idle(settings, launch, &mut left_behind).await,
        None => Vec::new(),
    };
    Ok(Report {
        photos: options.photos.as_ref().map(|dir| dir.display().to_string()),
        stages: Vec::new(),
        comparison: None,
        mode: options.mode,
        bus: kind_name(&settings.bus.kind),
        store: kind_name(&settings.store.kind),
        cores: std::thread::available_parallelism().map_or(1, usize::from),
        external_coordinators: setup.external.as_ref().map(|e| e.pids.len()),
        submit_to: match setup.route {
            driver::SubmitRoute::Queue => "queue".to_owned(),
            driver::SubmitRoute::Shard(_) => "shard".to_owned(),
        },
        median: RunFigures::median(&runs),
        runs,
        idle_rss,
        left_behind,
    })
}

/// Idle memory of each binary under a prefix of its own, then that prefix's streams and keys
/// deleted.
async fn measure_idle(settings: &Settings, mut launch: idle::Launch, left_behind: &mut Vec<String>) -> Vec<IdleRss> {
    let prefix = format!("bench-idle-{}", run_id());
    launch.env.extend([
        ("IMAGEPIPE_BUS__KIND".to_owned(), kind_name(&settings.bus.kind)),
        ("IMAGEPIPE_BUS__PREFIX".to_owned(), prefix.clone()),
        ("IMAGEPIPE_STORE__KIND".to_owned(), kind_name(&settings.store.kind)),
    ]);
    let measured = idle::measure(&launch).await;
    let nats = match settings.bus.kind {
        BusKind::Nats => imagepipe_bus::nats::NatsBus::connect(&prefix, &settings.bus.nats).await.ok(),
        _ => None,
    };
    let redis = (settings.store.kind == StoreKind::Redis).then(|| settings.store.redis.url.expose().to_owned());
    left_behind.extend(backend::clean_up(nats.as_ref(), &prefix, redis.as_deref()).await);
    if settings.bus.kind == BusKind::Kafka {
        // The binaries' topics are known to no client of this process.
        left_behind.push(format!("Kafka topics of prefix {prefix}, created by the service binaries"));
    }
    measured
}

/// `memory`, `nats`, `redis`, ...: a config enum's value as written in the config.
fn kind_name(kind: &impl serde::Serialize) -> String {
    serde_json::to_value(kind).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
}

/// Runs `options.runs` runs on the bus and store of `settings` and returns each run's figures.
/// `left_behind` collects what a run could not clean up.
pub async fn run(
    settings: &Settings,
    options: &BenchOptions,
    left_behind: &mut Vec<String>,
) -> Result<Vec<RunFigures>, BenchError> {
    run_with(settings, options, &Setup::default(), left_behind).await
}

/// [`run`] with the coordinator where `setup` says. With external coordinators every run uses
/// their prefix (`bus.prefix` of `settings`) and leaves its streams and keys for whoever
/// started them to delete once they stopped ([`clean_up_prefix`]).
pub async fn run_with(
    settings: &Settings,
    options: &BenchOptions,
    setup: &Setup,
    left_behind: &mut Vec<String>,
) -> Result<Vec<RunFigures>, BenchError> {
    let classifier = match options.mode {
        Stages::Noop => None,
        Stages::Real => Some(Classifier::load(&settings.ai).await.map_err(BenchError::Model)?),
    };
    let mut runs = Vec::with_capacity(options.runs);
    for _ in 0..options.runs {
        runs.push(one_run(settings, options, setup, classifier.clone(), left_behind).await?);
    }
    Ok(runs)
}

/// A short id unique to this run.
pub fn run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

/// Deletes the streams, topics and Redis keys of bus prefix `settings.bus.prefix` (what runs
/// with external coordinators leave); returns what could not be cleaned. Call it once the
/// coordinators of that prefix have stopped.
pub async fn clean_up_prefix(settings: &Settings) -> Result<Vec<String>, BenchError> {
    let backend = RunBackend::connect(settings).await.map_err(BenchError::Bus)?;
    Ok(backend.clean_up(settings).await)
}

async fn one_run(
    settings: &Settings,
    options: &BenchOptions,
    setup: &Setup,
    classifier: Option<Classifier>,
    left_behind: &mut Vec<String>,
) -> Result<RunFigures, BenchError> {
    let id = run_id();
    let work =
        tempfile::tempdir().map_err(|e| BenchError::Io { what: "creating a work directory", source: e.into() })?;
    let mut settings = settings.clone();
    if setup.external.is_none() {
        settings.bus.prefix = format!("bench-{id}");
        settings.store.path = work.path().join("store");
    }
    settings.blob.dir = work.path().join("blobs");
    let backend = RunBackend::connect(&settings).await.map_err(BenchError::Bus)?;
    let measured = measure(&settings, options, setup, classifier, &backend, &id).await;
    if setup.external.is_none() {
        left_behind.extend(backend.clean_up(&settings).await);
    }
    measured
}

async fn measure(
    settings: &Settings,
    options: &BenchOptions,
    setup: &Setup,
    classifier: Option<Classifier>,
    backend: &RunBackend,
    id: &str,
) -> Result<RunFigures, BenchError> {
    // The peak memory of this run, not of every run before it.
    let peak_reset = process::reset_peak_memory();
    if !peak_reset {
        tracing::warn!("the peak RSS cannot be reset (/proc/self/clear_refs): not reported");
    }
    let bus = &backend.bus;
    // With external coordinators the store is opened only to read the tasks' stage times.
    let store = open_store(settings).await.map_err(BenchError::Store)?;
    let coordinator =
        setup.external.is_none().then(|| Coordinator::new(settings, store.clone(), bus.clone(), Arc::new(SystemClock)));
    let pids: &[u32] = setup.external.as_ref().map_or(&[], |e| &e.pids);
    let mut observer = Observer::start(bus, &format!("bench-observer-{id}"))
        .await
        .map_err(|source| BenchError::Driver { phase: "start", source, services: ServiceErrors::default() })?;
    let stop = Shutdown::new();
    let mut services: JoinSet<Result<(), String>> = JoinSet::new();
    if let Some(coordinator) = coordinator {
        let coordinator_stop = stop.clone();
        services
            .spawn(async move { coordinator.run(coordinator_stop).await.map_err(|e| error_text("coordinator", &e)) });
    }
    let route = setup.route;
    let sources = match classifier {
        None => {
            noop::spawn(bus, settings, &stop, &mut services).await.map_err(BenchError::Bus)?;
            vec![noop::BLOB_KEY.to_owned()]
        }
        Some(classifier) => {
            spawn_real(bus, settings, classifier, &stop, &mut services);
            upload_samples(settings, options.photos.as_deref()).await?
        }
    };
    let submits = Submits { run: id.to_owned(), sources };

    let phases = async {
        let timeout = options.timeout;
        driver::one_at_a_time(bus, &mut observer, submits.batch("w", WARM_UP_TASKS, Priority::Normal), route, timeout)
            .await
            .map_err(|e| ("warm-up", e))?;
        if options.scenario == Scenario::Priority {
            let probes = priority::Probes {
                idle: submits.batch("hi", options.low_load_tasks, Priority::High),
                backlog: submits.batch("lo", options.tasks, Priority::Low),
                under_backlog: submits.batch("hb", options.low_load_tasks, Priority::High),
            };
            let ids: Vec<String> = probes.under_backlog.iter().filter_map(|s| s.task_id.clone()).collect();
            let before = Snapshot::take(backend, settings, pids).await;
            let (figures, backlog) =
                priority::phases(bus, &mut observer, probes, timeout).await.map_err(|e| ("priority", e))?;
            let after = Snapshot::take(backend, settings, pids).await;
            return Ok((backlog, driver::Phase::default(), before, after, ids, Some(figures)));
        }
        let before = Snapshot::take(backend, settings, pids).await;
        let full_submits = submits.batch("f", options.tasks, Priority::Normal);
        let full =
            driver::full_load(bus, &mut observer, full_submits, route, timeout).await.map_err(|e| ("full-load", e))?;
        let after = Snapshot::take(backend, settings, pids).await;
        let low_ids = submits.batch("l", options.low_load_tasks, Priority::Normal);
        let ids: Vec<String> = low_ids.iter().filter_map(|s| s.task_id.clone()).collect();
        let low =
            driver::one_at_a_time(bus, &mut observer, low_ids, route, timeout).await.map_err(|e| ("low-load", e))?;
        Ok::<_, (&'static str, DriverError)>((full, low, before, after, ids, None))
    }
    .await;

    observer.stop().await;
    stop.trigger();
    let service_errors = join_services(&mut services).await;
    let (full, low, before, after, low_ids, priority) = match phases {
        Ok(measured) => measured,
        Err((phase, source)) => return Err(BenchError::Driver { phase, source, services: service_errors }),
    };
    if !service_errors.0.is_empty() {
        return Err(BenchError::Services(service_errors));
    }
    let stage_ms = stage_times(store.as_ref(), &low_ids).await.map_err(BenchError::Store)?;
    Ok(RunFigures {
        full_load: LoadFigures::of(&full),
        low_load: LoadFigures::of(&low),
        stage_ms,
        messages: messages(&before, &after, full.submitted),
        cpu_ms_per_task: cpu(&before, &after, full.submitted),
        peak_rss_bytes: peak_reset.then(|| process::memory(Pid::Current, MemoryField::Peak)).flatten(),
        priority,
    })
}

/// The run's submit commands.
struct Submits {
    run: String,
    sources: Vec<String>,
}

impl Submits {
    /// `n` submits of phase `phase` at `priority`, cycling over the sources (blob keys).
    fn batch(&self, phase: &str, n: usize, priority: Priority) -> Vec<SubmitTask> {
        (0..n)
            .map(|i| SubmitTask {
                task_id: Some(format!("tsk_bench_{}_{phase}{i}", self.run)),
                blob: Some(self.sources[i % self.sources.len()].clone()),
                priority,
                ..SubmitTask::default()
            })
            .collect()
    }
}

/// Counters read just before and after the full-load phase.
struct Snapshot {
    bus: BTreeMap<String, u64>,
    broker: BrokerCounts,
    cpu: Option<Duration>,
    broker_cpu: Option<Duration>,
    store_cpu: Option<Duration>,
    coordinators_cpu: Option<Duration>,
}

impl Snapshot {
    /// The counters now; `coordinators`: the pids of external coordinator processes.
    async fn take(backend: &RunBackend, settings: &Settings, coordinators: &[u32]) -> Self {
        let broker = backend.broker_counts().await.unwrap_or_else(|error| {
            tracing::warn!(error = %imagepipe_runtime::error_chain(&error), "broker message counts unavailable");
            None
        });
        let (broker_pid, store_pid) = servers(settings);
        Self {
            bus: backend.counts.snapshot(),
            broker,
            cpu: process::cpu_time(Pid::Current),
            broker_cpu: broker_pid.and_then(|p| process::cpu_time(Pid::Other(p))),
            store_cpu: store_pid.and_then(|p| process::cpu_time(Pid::Other(p))),
            coordinators_cpu: (!coordinators.is_empty())
                .then(|| coordinators.iter().map(|p| process::cpu_time(Pid::Other(*p))).sum::<Option<Duration>>())
                .flatten(),
        }
    }
}

/// The local nats-server and redis-server processes of the run, when each is unambiguous.
fn servers(settings: &Settings) -> (Option<u32>, Option<u32>) {
    let port_of = |url: &str| url::Url::parse(url.split(',').next().unwrap_or_default()).ok()?.port();
    let broker = match settings.bus.kind {
        BusKind::Nats => port_of(&settings.bus.nats.url).and_then(|p| process::find_server("nats-server", p)),
        BusKind::Kafka => {
            let first = settings.bus.kafka.brokers.split(',').next().unwrap_or_default();
            let port = first.rsplit_once(':').and_then(|(_, p)| p.parse().ok());
            port.and_then(|p| process::find_server("tansu", p))
        }
        BusKind::Memory => None,
    };
    let store = match settings.store.kind {
        StoreKind::Redis => {
            port_of(settings.store.redis.url.expose()).and_then(|p| process::find_server("redis-server", p))
        }
        StoreKind::Embedded => None,
    };
    (broker, store)
}

fn messages(before: &Snapshot, after: &Snapshot, tasks: usize) -> MessageFigures {
    let per_task = |n: u64| n as f64 / tasks.max(1) as f64;
    let by_destination: BTreeMap<String, f64> =
        counting::delta(&before.bus, &after.bus).into_iter().map(|(d, n)| (d, per_task(n))).collect();
    let bus_per_task = by_destination.values().sum();
    let broker = broker_delta(&before.broker, &after.broker)
        .map(|streams| streams.into_iter().map(|(s, n)| (s, per_task(n))).collect::<BTreeMap<_, _>>());
    let (per_task, counted_by) = match &broker {
        Some(streams) => (streams.values().sum(), "broker"),
        None => (bus_per_task, "bus"),
    };
    MessageFigures { per_task, counted_by: counted_by.into(), broker_by_stream: broker, bus_per_task, by_destination }
}

fn cpu(before: &Snapshot, after: &Snapshot, tasks: usize) -> CpuFigures {
    let per_task = |a: Option<Duration>, b: Option<Duration>| {
        Some(b?.saturating_sub(a?).as_secs_f64() * 1e3 / tasks.max(1) as f64)
    };
    CpuFigures {
        imagepipe: per_task(before.cpu, after.cpu),
        broker: per_task(before.broker_cpu, after.broker_cpu),
        store: per_task(before.store_cpu, after.store_cpu),
        coordinators: per_task(before.coordinators_cpu, after.coordinators_cpu),
    }
}

/// Each step's time (first dispatch to its result, ms) over the tasks `ids`.
async fn stage_times(store: &dyn TaskStore, ids: &[String]) -> Result<BTreeMap<String, Percentiles>, StoreError> {
    let mut samples: BTreeMap<Step, Vec<Duration>> = BTreeMap::new();
    for id in ids {
        let Some(task) = store.get(id).await? else { continue };
        for step in [Step::Download, Step::Metadata, Step::Analyze] {
            if let Some(ms) = step_ms(&task, step) {
                samples.entry(step).or_default().push(Duration::from_millis(ms));
            }
        }
    }
    Ok(samples.into_iter().map(|(step, sample)| (step.as_str().to_owned(), Percentiles::of(&sample))).collect())
}

fn step_ms(task: &Task, step: Step) -> Option<u64> {
    let record = task.steps.get(step);
    Some(record.finished_at?.saturating_sub(record.started_at?))
}

fn spawn_real(
    bus: &Bus,
    settings: &Settings,
    classifier: Classifier,
    stop: &Shutdown,
    services: &mut JoinSet<Result<(), String>>,
) {
    let settings = Arc::new(settings.clone());
    let (b, s, st) = (bus.clone(), settings.clone(), stop.clone());
    services.spawn(async move {
        imagepipe_download_worker::run(b, &s, st).await.map_err(|e| error_text("download worker", &e))
    });
    let (b, s, st) = (bus.clone(), settings.clone(), stop.clone());
    services.spawn(async move {
        imagepipe_metadata_worker::run(b, &s, st).await.map_err(|e| error_text("metadata worker", &e))
    });
    let (b, s, st) = (bus.clone(), settings, stop.clone());
    services.spawn(async move {
        imagepipe_ai_worker::run(b, &s, classifier, st).await.map_err(|e| error_text("ai worker", &e))
    });
}

/// Stores the photos of `photos` (or else the bundled sample photos) in the run's blob store;
/// returns their keys.
async fn upload_samples(settings: &Settings, photos: Option<&std::path::Path>) -> Result<Vec<String>, BenchError> {
    let blobs =
        settings.blob.open().map_err(|e| BenchError::Io { what: "opening the blob store", source: e.into() })?;
    let images: Vec<Bytes> = match photos {
        Some(dir) => photos::load(dir)
            .map_err(|e| BenchError::Io { what: "reading the photos", source: e.into() })?
            .into_iter()
            .map(|(_, bytes)| bytes)
            .collect(),
        None => SAMPLES.iter().map(|sample| Bytes::from_static(sample.bytes)).collect(),
    };
    let mut keys = Vec::with_capacity(images.len());
    for image in images {
        let key = blobs.put(image).await.map_err(|e| BenchError::Io { what: "storing a photo", source: e.into() })?;
        keys.push(key.to_string());
    }
    Ok(keys)
}

async fn join_services(services: &mut JoinSet<Result<(), String>>) -> ServiceErrors {
    let mut errors = Vec::new();
    let joined = tokio::time::timeout(STOP_TIMEOUT, async {
        while let Some(joined) = services.join_next().await {
            match joined {
                Ok(Ok(())) => {}
                Ok(Err(error)) => errors.push(error),
                Err(error) => errors.push(format!("a service panicked: {error}")),
            }
        }
    })
    .await;
    if joined.is_err() {
        errors.push(format!("services still running {STOP_TIMEOUT:?} after the stop"));
        services.abort_all();
    }
    ServiceErrors(errors)
}

fn error_text(service: &str, error: &(dyn std::error::Error + 'static)) -> String {
    format!("the {service} stopped: {}", imagepipe_runtime::error_chain(error))
}
