//! The seven imagepipe services as separate OS processes, the way they run in production:
//! each its own binary with its own environment and HTTP port, meeting on a real broker and a
//! real Redis. Processes can be killed with SIGKILL and restarted; their output goes to one log
//! file per process, and the tail of every log is printed when a test panics.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
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
}

/// One service process and how to start it again.
struct ServiceProcess {
    kind: ServiceKind,
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
    processes: BTreeMap<ServiceKind, ServiceProcess>,
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
            processes.insert(
                kind,
                ServiceProcess { kind, port: free_port().map_err(ClusterError::Files)?, child: None, starts: 0 },
            );
        }
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("HTTP client");
        let mut cluster = Self { config, dir, bin_dir, http, processes };
        let kinds: Vec<_> = cluster.processes.keys().copied().collect();
        for &kind in &kinds {
            cluster.spawn(kind)?;
        }
        for kind in kinds {
            cluster.wait_ready(kind).await?;
        }
        Ok(cluster)
    }

    /// The bus prefix of this cluster.
    pub fn prefix(&self) -> &str {
        &self.config.prefix
    }

    /// The directory of the shared local blob store.
    pub fn blob_dir(&self) -> PathBuf {
        self.dir.path().join("blobs")
    }

    /// `http://127.0.0.1:<port>` of a service (its health, metrics and API).
    pub fn url(&self, kind: ServiceKind) -> String {
        format!("http://127.0.0.1:{}", self.processes[&kind].port)
    }

    /// A GET on a service's API, parsed as JSON; `None` on any failure.
    pub async fn get_json(&self, kind: ServiceKind, path: &str) -> Option<serde_json::Value> {
        self.fetch_json(kind, path).await.ok()
    }

    /// [`get_json`](Self::get_json) that says why it got nothing: the error, or the status and
    /// body of a refusal.
    pub async fn fetch_json(&self, kind: ServiceKind, path: &str) -> Result<serde_json::Value, String> {
        let response = self.http.get(format!("{}{path}", self.url(kind))).send().await.map_err(|e| e.to_string())?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("{status}: {}", response.text().await.unwrap_or_default()));
        }
        response.json().await.map_err(|e| e.to_string())
    }

    /// [`fetch_json`](Self::fetch_json) of something that must be there, asked up to three
    /// times (a request may time out on a loaded machine); panics with every reason.
    pub async fn must_get_json(&self, kind: ServiceKind, path: &str) -> serde_json::Value {
        let mut reasons = Vec::new();
        for _ in 0..3 {
            match self.fetch_json(kind, path).await {
                Ok(value) => return value,
                Err(reason) => reasons.push(reason),
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        panic!("GET {path} from the {kind:?}: {reasons:?}")
    }

    /// Kills a service with SIGKILL (no chance to finish, ack or flush) and reaps it.
    pub async fn kill9(&mut self, kind: ServiceKind) {
        let process = self.processes.get_mut(&kind).expect("service of this cluster");
        if let Some(mut child) = process.child.take() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }

    /// Starts a stopped or killed service again on the same port and waits until it is ready.
    pub async fn restart(&mut self, kind: ServiceKind) -> Result<(), ClusterError> {
        self.kill9(kind).await;
        self.spawn(kind)?;
        self.wait_ready(kind).await
    }

    /// Sends SIGTERM to every service and waits for each to exit; returns the services that
    /// did not exit with status 0 within `grace`, with their status.
    pub async fn stop(mut self, grace: Duration) -> Vec<(ServiceKind, String)> {
        for process in self.processes.values() {
            if let Some(pid) = process.child.as_ref().and_then(Child::id) {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
            }
        }
        let mut failures = Vec::new();
        for process in self.processes.values_mut() {
            let Some(child) = process.child.as_mut() else { continue };
            match tokio::time::timeout(grace, child.wait()).await {
                Ok(Ok(status)) if status.success() => {}
                Ok(Ok(status)) => failures.push((process.kind, status.to_string())),
                Ok(Err(e)) => failures.push((process.kind, e.to_string())),
                Err(_) => failures.push((process.kind, format!("still running after {grace:?}"))),
            }
            process.child = None;
        }
        failures
    }

    /// The last `lines` lines of every log of `kind` (every start).
    pub fn log_tail(&self, kind: ServiceKind, lines: usize) -> String {
        let process = &self.processes[&kind];
        (1..=process.starts)
            .map(|start| {
                let path = self.log_path(kind, start);
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let all: Vec<&str> = text.lines().collect();
                let tail = all[all.len().saturating_sub(lines)..].join("\n");
                format!("--- {} (start {start}) ---\n{tail}", kind.binary())
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn log_path(&self, kind: ServiceKind, start: u32) -> PathBuf {
        self.dir.path().join(format!("{}.{start}.log", kind.binary()))
    }

    fn environment(&self, kind: ServiceKind, port: u16) -> Vec<(String, String)> {
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
                if self.processes.contains_key(&service) {
                    env.push((key.into(), self.url(service)));
                }
            }
        }
        env.extend(config.env.iter().cloned());
        env
    }

    fn spawn(&mut self, kind: ServiceKind) -> Result<(), ClusterError> {
        let port = self.processes[&kind].port;
        let start = self.processes[&kind].starts + 1;
        let log = std::fs::File::create(self.log_path(kind, start)).map_err(ClusterError::Files)?;
        let err = log.try_clone().map_err(ClusterError::Files)?;
        let mut command = Command::new(self.bin_dir.join(kind.binary()));
        command
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.environment(kind, port))
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(true);
        let child =
            command.spawn().map_err(|source| ClusterError::Spawn { binary: kind.binary().to_owned(), source })?;
        let process = self.processes.get_mut(&kind).expect("service of this cluster");
        process.child = Some(child);
        process.starts = start;
        Ok(())
    }

    async fn wait_ready(&mut self, kind: ServiceKind) -> Result<(), ClusterError> {
        let url = format!("{}/readyz", self.url(kind));
        let until = tokio::time::Instant::now() + READY_WITHIN;
        loop {
            let exited =
                self.processes.get_mut(&kind).and_then(|p| p.child.as_mut()).and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                return Err(ClusterError::Exited {
                    binary: kind.binary().into(),
                    status,
                    log: self.log_tail(kind, 30),
                });
            }
            if let Ok(response) = self.http.get(&url).send().await
                && response.status().is_success()
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= until {
                return Err(ClusterError::NotReady {
                    binary: kind.binary().into(),
                    port: self.processes[&kind].port,
                    waited: READY_WITHIN,
                    log: self.log_tail(kind, 30),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for kind in self.processes.keys() {
                eprintln!("{}", self.log_tail(*kind, 40));
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

/// A port nothing listens on right now (the OS picks it; the service binds it again).
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
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
