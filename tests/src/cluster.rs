//! The seven imagepipe services as separate OS processes, the way they run in production:
//! each its own binary with its own environment and HTTP port, meeting on a real broker and a
//! real Redis. Processes can be killed with SIGKILL and restarted; their output goes to one log
//! file per process, and the tail of every log is printed when a test panics.
//!
//! A cluster may run several coordinator replicas ([`ClusterConfig::coordinators`]), each a
//! [`Member`] with its own port and log, stopped, paused, resumed or added one by one; and
//! the no-op stages ([`ServiceKind::NoopStages`]) in place of the three workers.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

/// The signals [`Cluster::signal`] sends (SIGSTOP, SIGCONT, SIGTERM…), from `nix`.
pub use nix::sys::signal::Signal;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use tempfile::TempDir;
use tokio::process::{Child, Command};

use crate::backend::{self, Backend};

/// One of the service binaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceKind {
    /// The task coordinator (API, state, timers).
    Coordinator,
    /// The download worker.
    Download,
    /// The metadata worker.
    Metadata,
    /// The AI worker.
    Ai,
    /// The webhook subscriber.
    Notification,
    /// The analytics subscriber.
    Analytics,
    /// The tag-indexer subscriber.
    TagIndexer,
    /// The bench's no-op download, metadata and AI stages in one process (`imagepipe
    /// noop-stages`), in place of the three workers: each command is answered at once, so a
    /// task completes in milliseconds and a test measures the coordinators. Not in
    /// [`ServiceKind::ALL`].
    NoopStages,
}

impl ServiceKind {
    /// Every service, coordinator first.
    pub const ALL: [ServiceKind; 7] = [
        Self::Coordinator,
        Self::Download,
        Self::Metadata,
        Self::Ai,
        Self::Notification,
        Self::Analytics,
        Self::TagIndexer,
    ];

    /// The binary's name.
    pub fn binary(self) -> &'static str {
        match self {
            Self::Coordinator => "imagepipe-coordinator",
            Self::Download => "imagepipe-download-worker",
            Self::Metadata => "imagepipe-metadata-worker",
            Self::Ai => "imagepipe-ai-worker",
            Self::Notification => "imagepipe-notification-worker",
            Self::Analytics => "imagepipe-analytics-worker",
            Self::TagIndexer => "imagepipe-tag-indexer-worker",
            Self::NoopStages => "imagepipe",
        }
    }

    /// The arguments the binary runs with.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            Self::NoopStages => &["noop-stages"],
            _ => &[],
        }
    }

    /// The name of its processes in logs and reports: the binary's, or `imagepipe-noop-stages`.
    pub fn name(self) -> &'static str {
        match self {
            Self::NoopStages => "imagepipe-noop-stages",
            _ => self.binary(),
        }
    }
}

/// One process of a cluster: a service, and which of its replicas (0, the first, for every
/// service but the coordinator when [`ClusterConfig::coordinators`] asks for more). A
/// [`ServiceKind`] converts to its first replica.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Member {
    /// The service.
    pub kind: ServiceKind,
    /// Which replica, from 0 in the order started.
    pub replica: usize,
}

impl Member {
    /// Replica `replica` of `kind`.
    pub fn new(kind: ServiceKind, replica: usize) -> Self {
        Self { kind, replica }
    }

    /// Its log files' name (before `.<start>.log`): the service's name, with `-<replica>`
    /// after the first replica.
    fn log_name(self) -> String {
        match self.replica {
            0 => self.kind.name().to_owned(),
            n => format!("{}-{n}", self.kind.name()),
        }
    }
}

impl From<ServiceKind> for Member {
    fn from(kind: ServiceKind) -> Self {
        Self { kind, replica: 0 }
    }
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.replica {
            0 => write!(f, "{:?}", self.kind),
            n => write!(f, "{:?}#{n}", self.kind),
        }
    }
}

/// A cluster could not start, or a process misbehaved.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A service binary is not in the build directory.
    #[error("binary {0} not found; build the workspace binaries first (`cargo build --workspace --bins`)")]
    MissingBinary(PathBuf),
    /// A process could not be spawned.
    #[error("spawning {binary}")]
    Spawn {
        /// The binary.
        binary: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A process exited while it should be running.
    #[error("{binary} exited with {status}; log tail:\n{log}")]
    Exited {
        /// The binary.
        binary: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The end of its log.
        log: String,
    },
    /// A process did not report ready in time.
    #[error("{binary} not ready on port {port} within {waited:?}; log tail:\n{log}")]
    NotReady {
        /// The binary.
        binary: String,
        /// Its HTTP port.
        port: u16,
        /// How long we waited.
        waited: Duration,
        /// The end of its log.
        log: String,
    },
    /// A temporary directory or log file could not be created.
    #[error("preparing the cluster's files")]
    Files(#[source] std::io::Error),
}

/// What a cluster runs on.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The broker.
    pub backend: Backend,
    /// `bus.prefix` of every service: subjects, topics, streams and Redis keys; unique per test.
    pub prefix: String,
    /// The services to start.
    pub services: Vec<ServiceKind>,
    /// How many coordinator replicas to start (when [`Self::services`] has the coordinator):
    /// 1 unless [`Self::coordinators`] says otherwise.
    pub coordinator_replicas: usize,
    /// Extra environment for every service (after the defaults, so it overrides them).
    pub env: Vec<(String, String)>,
}

impl ClusterConfig {
    /// All seven services on `backend` with a fresh prefix `e2e_<label>_<random>`.
    pub fn new(backend: Backend, label: &str) -> Self {
        let random = uuid::Uuid::new_v4().simple().to_string();
        Self {
            backend,
            prefix: format!("e2e_{label}_{}", &random[..12]),
            services: ServiceKind::ALL.to_vec(),
            coordinator_replicas: 1,
            env: Vec::new(),
        }
    }

    /// Adds an environment variable for every service.
    pub fn env(mut self, key: &str, value: impl Into<String>) -> Self {
        self.env.push((key.to_owned(), value.into()));
        self
    }

    /// Runs only `services`.
    pub fn services(mut self, services: &[ServiceKind]) -> Self {
        self.services = services.to_vec();
        self
    }

    /// Runs `n` coordinator replicas (at least one), each with its own HTTP port and log,
    /// announcing its own URL (`coordinator.advertise_url`).
    pub fn coordinators(mut self, n: usize) -> Self {
        self.coordinator_replicas = n.max(1);
        self
    }
}

/// One service process and how to start it again.
struct ServiceProcess {
    member: Member,
    port: u16,
    child: Option<Child>,
    starts: u32,
}

/// Running services; every process is killed when the cluster is dropped.
pub struct Cluster {
    config: ClusterConfig,
    dir: TempDir,
    bin_dir: PathBuf,
    http: reqwest::Client,
    processes: BTreeMap<Member, ServiceProcess>,
}

/// How long a service may take to report ready: a restarted Kafka member waits for its killed
/// predecessor's session to expire and for the rebalance.
const READY_WITHIN: Duration = Duration::from_secs(120);

impl Cluster {
    /// Starts every service of `config` and waits until each reports ready.
    pub async fn start(config: ClusterConfig) -> Result<Self, ClusterError> {
        let bin_dir = bin_dir();
        for kind in &config.services {
            let path = bin_dir.join(kind.binary());
            if !path.is_file() {
                return Err(ClusterError::MissingBinary(path));
            }
        }
        remember_panics();
        let dir = tempfile::Builder::new().prefix("imagepipe-e2e-").tempdir().map_err(ClusterError::Files)?;
        std::fs::create_dir_all(dir.path().join("blobs")).map_err(ClusterError::Files)?;
        let mut processes = BTreeMap::new();
        for &kind in &config.services {
            let replicas = if kind == ServiceKind::Coordinator { config.coordinator_replicas.max(1) } else { 1 };
            for replica in 0..replicas {
                let member = Member::new(kind, replica);
                let port = free_port().map_err(ClusterError::Files)?;
                processes.insert(member, ServiceProcess { member, port, child: None, starts: 0 });
            }
        }
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("HTTP client");
        let mut cluster = Self { config, dir, bin_dir, http, processes };
        let members: Vec<_> = cluster.processes.keys().copied().collect();
        for &member in &members {
            cluster.spawn(member)?;
        }
        for member in members {
            cluster.wait_ready(member).await?;
        }
        Ok(cluster)
    }

    /// The members of `kind` this cluster has started, running or not, in order.
    pub fn members(&self, kind: ServiceKind) -> Vec<Member> {
        self.processes.keys().copied().filter(|m| m.kind == kind).collect()
    }

    /// Whether `member`'s process is running (started and not killed, stopped or exited; a
    /// paused one is running).
    pub fn is_running(&mut self, member: Member) -> bool {
        let Some(child) = self.processes.get_mut(&member).and_then(|p| p.child.as_mut()) else { return false };
        matches!(child.try_wait(), Ok(None))
    }

    /// Starts one more replica of `kind` on a port of its own and waits until it is ready.
    pub async fn add_replica(&mut self, kind: ServiceKind) -> Result<Member, ClusterError> {
        let replica = self.processes.keys().filter(|m| m.kind == kind).map(|m| m.replica + 1).max().unwrap_or(0);
        let member = Member::new(kind, replica);
        let port = free_port().map_err(ClusterError::Files)?;
        self.processes.insert(member, ServiceProcess { member, port, child: None, starts: 0 });
        self.spawn(member)?;
        self.wait_ready(member).await?;
        Ok(member)
    }

    /// Sends `signal` to `member`'s process (SIGSTOP pauses it, SIGCONT resumes it); an error
    /// when it is not running or the signal could not be sent.
    pub fn signal(&self, member: impl Into<Member>, signal: Signal) -> Result<(), String> {
        let member = member.into();
        let pid = self.pid(member).ok_or_else(|| format!("{member:?} is not running"))?;
        kill(Pid::from_raw(pid as i32), signal).map_err(|e| format!("{signal} to {member:?} (pid {pid}): {e}"))
    }

    /// The process id of `member`, while it runs.
    pub fn pid(&self, member: impl Into<Member>) -> Option<u32> {
        self.processes.get(&member.into()).and_then(|p| p.child.as_ref()).and_then(Child::id)
    }

    /// Stops `member` with SIGTERM (after a SIGCONT, in case it is paused) and waits up to
    /// `grace` for it to exit; its exit status, or why there is none.
    pub async fn terminate(&mut self, member: impl Into<Member>, grace: Duration) -> Result<ExitStatus, String> {
        let member = member.into();
        let _ = self.signal(member, Signal::SIGCONT);
        self.signal(member, Signal::SIGTERM)?;
        let process = self.processes.get_mut(&member).expect("member of this cluster");
        let child = process.child.as_mut().expect("signalled, so running");
        let status = match tokio::time::timeout(grace, child.wait()).await {
            Ok(Ok(status)) => Ok(status),
            Ok(Err(e)) => Err(format!("waiting for {member:?}: {e}")),
            Err(_) => Err(format!("{member:?} still running {grace:?} after SIGTERM")),
        };
        if status.is_ok() {
            process.child = None;
        }
        status
    }

    /// The bus prefix of this cluster.
    pub fn prefix(&self) -> &str {
        &self.config.prefix
    }

    /// The directory of the shared local blob store.
    pub fn blob_dir(&self) -> PathBuf {
        self.dir.path().join("blobs")
    }

    /// `http://127.0.0.1:<port>` of a service's first replica or of one member (its health,
    /// metrics and API).
    pub fn url(&self, member: impl Into<Member>) -> String {
        format!("http://127.0.0.1:{}", self.processes[&member.into()].port)
    }

    /// A GET on a service's API, parsed as JSON; `None` on any failure.
    pub async fn get_json(&self, member: impl Into<Member>, path: &str) -> Option<serde_json::Value> {
        self.fetch_json(member, path).await.ok()
    }

    /// [`get_json`](Self::get_json) that says why it got nothing: the error, or the status and
    /// body of a refusal.
    pub async fn fetch_json(&self, member: impl Into<Member>, path: &str) -> Result<serde_json::Value, String> {
        fetch_json(&self.http, &format!("{}{path}", self.url(member))).await
    }

    /// A GET of a text body (such as `/metrics`); the error, or the status and body of a
    /// refusal.
    pub async fn fetch_text(&self, member: impl Into<Member>, path: &str) -> Result<String, String> {
        let response = self.http.get(format!("{}{path}", self.url(member))).send().await.map_err(|e| e.to_string())?;
        let status = response.status();
        let text = response.text().await.map_err(|e| e.to_string())?;
        if status.is_success() { Ok(text) } else { Err(format!("{status}: {text}")) }
    }

    /// [`fetch_json`](Self::fetch_json) of something that must be there, asked up to three
    /// times (a request may time out on a loaded machine); panics with every reason.
    pub async fn must_get_json(&self, member: impl Into<Member>, path: &str) -> serde_json::Value {
        let member = member.into();
        let mut reasons = Vec::new();
        for _ in 0..3 {
            match self.fetch_json(member, path).await {
                Ok(value) => return value,
                Err(reason) => reasons.push(reason),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        panic!("GET {path} from the {member:?}: {reasons:?}")
    }

    /// GETs every path of `paths` from `member`, `concurrency` at a time, each asked up to
    /// three times like [`must_get_json`](Self::must_get_json); the answers in the order of
    /// `paths`, each the JSON or every reason it was refused.
    pub async fn fetch_all_json(
        &self,
        member: impl Into<Member>,
        paths: &[String],
        concurrency: usize,
    ) -> Vec<Result<serde_json::Value, String>> {
        let base = self.url(member);
        let mut answers: Vec<Option<Result<serde_json::Value, String>>> = vec![None; paths.len()];
        let mut running = tokio::task::JoinSet::new();
        let mut next = 0;
        while next < paths.len() || !running.is_empty() {
            while next < paths.len() && running.len() < concurrency.max(1) {
                let (http, url, index) = (self.http.clone(), format!("{base}{}", paths[next]), next);
                running.spawn(async move {
                    let mut reasons = Vec::new();
                    for _ in 0..3 {
                        match fetch_json(&http, &url).await {
                            Ok(value) => return (index, Ok(value)),
                            Err(reason) => reasons.push(reason),
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    (index, Err(format!("GET {url}: {reasons:?}")))
                });
                next += 1;
            }
            if let Some(joined) = running.join_next().await {
                let (index, answer) = joined.expect("a GET task does not panic");
                answers[index] = Some(answer);
            }
        }
        answers.into_iter().map(|a| a.expect("every path answered")).collect()
    }

    /// Kills a service's first replica, or one member, with SIGKILL (no chance to finish, ack
    /// or flush) and reaps it.
    pub async fn kill9(&mut self, member: impl Into<Member>) {
        let process = self.processes.get_mut(&member.into()).expect("service of this cluster");
        if let Some(mut child) = process.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Starts a stopped or killed service (or member) again on the same port and waits until
    /// it is ready.
    pub async fn restart(&mut self, member: impl Into<Member>) -> Result<(), ClusterError> {
        let member = member.into();
        self.kill9(member).await;
        self.spawn(member)?;
        self.wait_ready(member).await
    }

    /// Sends SIGTERM to every service (SIGCONT first, in case one is paused) and waits for
    /// each to exit; returns the members that did not exit with status 0 within `grace`, with
    /// their status.
    pub async fn stop(mut self, grace: Duration) -> Vec<(Member, String)> {
        for process in self.processes.values() {
            if let Some(pid) = process.child.as_ref().and_then(Child::id) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGCONT);
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            }
        }
        let mut failures = Vec::new();
        for process in self.processes.values_mut() {
            let Some(child) = process.child.as_mut() else { continue };
            match tokio::time::timeout(grace, child.wait()).await {
                Ok(Ok(status)) if status.success() => {}
                Ok(Ok(status)) => failures.push((process.member, status.to_string())),
                Ok(Err(e)) => failures.push((process.member, e.to_string())),
                Err(_) => failures.push((process.member, format!("still running after {grace:?}"))),
            }
            process.child = None;
        }
        failures
    }

    /// The last `lines` lines of every log of a service's first replica, or of one member
    /// (every start).
    pub fn log_tail(&self, member: impl Into<Member>, lines: usize) -> String {
        let member = member.into();
        let process = &self.processes[&member];
        (1..=process.starts)
            .map(|start| {
                let path = self.log_path(member, start);
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let all: Vec<&str> = text.lines().collect();
                let tail = all[all.len().saturating_sub(lines)..].join("\n");
                format!("--- {} (start {start}) ---\n{tail}", member.log_name())
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn log_path(&self, member: Member, start: u32) -> PathBuf {
        self.dir.path().join(format!("{}.{start}.log", member.log_name()))
    }

    fn environment(&self, member: Member, port: u16) -> Vec<(String, String)> {
        let kind = member.kind;
        let config = &self.config;
        let mut env = config.backend.service_env();
        env.extend([
            ("IMAGEPIPE_BUS__PREFIX".into(), config.prefix.clone()),
            ("IMAGEPIPE_STORE__KIND".into(), "redis".into()),
            ("IMAGEPIPE_STORE__REDIS__URL".into(), backend::redis_url()),
            ("IMAGEPIPE_BLOB__DIR".into(), self.blob_dir().display().to_string()),
            ("IMAGEPIPE_HTTP__BIND".into(), "127.0.0.1".into()),
            ("IMAGEPIPE_HTTP__PORT".into(), port.to_string()),
            ("IMAGEPIPE_NET__ALLOW_CIDRS".into(), "127.0.0.1/32".into()),
            ("RUST_LOG".into(), "info".into()),
        ]);
        if kind == ServiceKind::Coordinator {
            // The front door, as in compose: search and stats forwarded to this cluster's services.
            for (service, key) in [
                (ServiceKind::TagIndexer, "IMAGEPIPE_COORDINATOR__SEARCH_URL"),
                (ServiceKind::Analytics, "IMAGEPIPE_COORDINATOR__STATS_URL"),
            ] {
                if self.processes.contains_key(&service.into()) {
                    env.push((key.into(), self.url(service)));
                }
            }
            // What `/v1/cluster` shows as this replica's address, and how a test tells them apart.
            env.push(("IMAGEPIPE_COORDINATOR__ADVERTISE_URL".into(), self.url(member)));
        }
        env.extend(config.env.iter().cloned());
        env
    }

    fn spawn(&mut self, member: Member) -> Result<(), ClusterError> {
        let kind = member.kind;
        let port = self.processes[&member].port;
        let start = self.processes[&member].starts + 1;
        let log = std::fs::File::create(self.log_path(member, start)).map_err(ClusterError::Files)?;
        let err = log.try_clone().map_err(ClusterError::Files)?;
        let mut command = Command::new(self.bin_dir.join(kind.binary()));
        command
            .args(kind.args())
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.environment(member, port))
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(true);
        let child =
            command.spawn().map_err(|source| ClusterError::Spawn { binary: kind.binary().to_owned(), source })?;
        let process = self.processes.get_mut(&member).expect("service of this cluster");
        process.child = Some(child);
        process.starts = start;
        Ok(())
    }

    async fn wait_ready(&mut self, member: Member) -> Result<(), ClusterError> {
        let url = format!("{}/readyz", self.url(member));
        let until = tokio::time::Instant::now() + READY_WITHIN;
        loop {
            let exited = self
                .processes
                .get_mut(&member)
                .and_then(|p| p.child.as_mut())
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                return Err(ClusterError::Exited { binary: member.log_name(), status, log: self.log_tail(member, 30) });
            }
            if let Ok(response) = self.http.get(&url).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= until {
                return Err(ClusterError::NotReady {
                    binary: member.log_name(),
                    port: self.processes[&member].port,
                    waited: READY_WITHIN,
                    log: self.log_tail(member, 30),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for member in self.processes.keys() {
                eprintln!("{}", self.log_tail(*member, 40));
            }
            let keep = self.dir.path().to_owned();
            eprintln!("logs kept in {}", keep.display());
            std::mem::forget(std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir")));
            if let Some(failure) = FAILURE.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
                eprintln!("the failure again, after the logs (a shortened test output keeps its end): {failure}");
            }
        }
    }
}

/// The last panic of this test process: the test's failure, repeated after the logs the
/// cluster prints, which push it out of a test output cut to its start and end.
static FAILURE: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Records every panic in [`FAILURE`] before the usual report (once per process).
fn remember_panics() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let report = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            *FAILURE.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(info.to_string());
            report(info);
        }));
    });
}

/// Where the service binaries are: `IMAGEPIPE_E2E_BIN_DIR`, else the profile directory this
/// test binary was built into (`target/<profile>`, the parent of `deps/`).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("IMAGEPIPE_E2E_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().unwrap_or(Path::new("."));
    if deps.ends_with("deps") { deps.parent().unwrap_or(deps).to_owned() } else { deps.to_owned() }
}

/// A GET of `url` with `http`, parsed as JSON: the error, or the status and body of a refusal.
async fn fetch_json(http: &reqwest::Client, url: &str) -> Result<serde_json::Value, String> {
    let response = http.get(url).send().await.map_err(|e| e.to_string())?;
    let status = response.status();
    if !status.is_success() {
        return Err(format!("{status}: {}", response.text().await.unwrap_or_default()));
    }
    response.json().await.map_err(|e| e.to_string())
}

/// A port nothing listens on right now, below the ephemeral range, for a service to bind
/// ([`imagepipe_contracts::testing::spare_port`]).
pub fn free_port() -> std::io::Result<u16> {
    imagepipe_contracts::testing::spare_port()
}

/// The prepared AI model directory: `IMAGEPIPE_TEST_MODEL_DIR`, else `.imagepipe/models` of
/// the repository. When neither is prepared the test fails, or gets `None` (and skips) when
/// `IMAGEPIPE_TEST_ALLOW_SKIP=1` (`imagepipe_contracts::testing`).
pub fn model_dir() -> Option<PathBuf> {
    let dir = std::env::var_os("IMAGEPIPE_TEST_MODEL_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.imagepipe/models"));
    if dir.join("manifest.json").is_file() {
        return Some(dir);
    }
    imagepipe_contracts::testing::environment_missing(&format!(
        "no prepared model in {} (run scripts/prepare-model.sh, or set IMAGEPIPE_TEST_MODEL_DIR to a prepared directory)",
        dir.display()
    ));
    None
}
