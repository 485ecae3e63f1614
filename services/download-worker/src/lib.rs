//! imagepipe download-worker: consumes `tasks.download`, fetches each task's image over HTTP(S)
//! through the SSRF-guarded client of `imagepipe-net` (or validates an already uploaded blob),
//! checks by its magic bytes that it is an image, stores it in the blob store under its sha256,
//! publishes `image.downloaded` and reports the step.
//!
//! - [`sniff`](imagepipe_blob::sniff): what the bytes are (JPEG, PNG, GIF, WebP, BMP, TIFF,
//!   AVIF, HEIC, ICO), never trusting `Content-Type`; shared with the upload API.
//! - [`error`]: failures, their stable codes, and which are retryable.
//! - [`handler`]: the step's [`StepHandler`](imagepipe_runtime::step::StepHandler).
//! - [`politeness`]: per-host limits shared by every replica (`download.per_host.*`):
//!   concurrency, rate, and pauses after 429/503; a download waiting for its host is deferred,
//!   not charged.
//! - [`run`]: the worker loop on a connected bus, for the binary, `imagepipe run` and tests.

pub mod error;
pub mod handler;
pub mod politeness;

use std::sync::Arc;

use imagepipe_blob::BlobConfigError;
use imagepipe_bus::Bus;
use imagepipe_contracts::names::queues;
use imagepipe_net::{BuildError, ClientBuilder, GuardedClient};
use imagepipe_runtime::config::{ConfigError, Outbound};
use imagepipe_runtime::service::checks;
use imagepipe_runtime::step::{StepRunError, run_step};
use imagepipe_runtime::{Service, Settings, Shutdown, error_chain};
use politeness::LimiterError;

pub use error::DownloadError;
pub use handler::DownloadHandler;
pub use imagepipe_blob::sniff::{ImageFormat, Sniffed, sniff};
pub use politeness::{HostLimiter, MemoryLimiter, Politeness, RedisLimiter, open_limiter};

/// The service's name: the `source` of its events, and its name in logs and traces.
pub const SERVICE: &str = "download-worker";

/// Metric names of the download worker.
pub mod metrics {
    /// Seconds one download or blob validation took, by `source` (a wait for the host's slot
    /// included; deferred downloads are not counted).
    pub const DOWNLOAD_DURATION: &str = "imagepipe_download_seconds";
    /// Bytes of images stored, by `source`.
    pub const DOWNLOADED_BYTES: &str = "imagepipe_download_bytes_total";
    /// Downloads that failed, by `code`.
    pub const FAILURES: &str = "imagepipe_download_failures_total";
    /// Label: where the image came from ([`SOURCE_URL`] or [`SOURCE_BLOB`]).
    pub const SOURCE: &str = "source";
    /// Label: the error code.
    pub const CODE: &str = "code";
    /// `source` of an image fetched from a URL.
    pub const SOURCE_URL: &str = "url";
    /// `source` of an uploaded blob.
    pub const SOURCE_BLOB: &str = "blob";
    /// Seconds a download waited for its host's slot, by `outcome` ([`GRANTED`] or
    /// [`DEFERRED`]); no host label, so the series stay few whatever the hosts.
    pub const HOST_WAIT: &str = "imagepipe_download_host_wait_seconds";
    /// Downloads deferred because of their host's limits, by `reason` (`host_busy`,
    /// `host_throttled`).
    pub const DEFERRALS: &str = "imagepipe_download_deferrals_total";
    /// 429 and 503 answers that paused their host, by `status`.
    pub const THROTTLES: &str = "imagepipe_download_host_throttles_total";
    /// Calls to the per-host limiter that failed or timed out (the download went ahead
    /// unlimited, or a slot was left to its lease).
    pub const POLITENESS_ERRORS: &str = "imagepipe_download_politeness_errors_total";
    /// Label: how a wait for a host's slot ended.
    pub const OUTCOME: &str = "outcome";
    /// `outcome` of a wait that got the slot.
    pub const GRANTED: &str = "granted";
    /// `outcome` of a wait that ended in a deferral.
    pub const DEFERRED: &str = "deferred";
    /// Label: why a download was deferred.
    pub const REASON: &str = "reason";
    /// Label: the HTTP status.
    pub const STATUS: &str = "status";

    /// Gives each of these metrics its `# HELP` text (at start; again is harmless).
    pub fn describe() {
        use ::metrics::{Unit, describe_counter, describe_histogram};
        describe_histogram!(DOWNLOAD_DURATION, Unit::Seconds, "Time one download or blob validation took, by source.");
        describe_counter!(DOWNLOADED_BYTES, Unit::Bytes, "Bytes of images stored, by source.");
        describe_counter!(FAILURES, Unit::Count, "Downloads that failed, by code.");
        describe_histogram!(
            HOST_WAIT,
            Unit::Seconds,
            "Time a download waited for its host's slot, by outcome (granted or deferred)."
        );
        describe_counter!(DEFERRALS, Unit::Count, "Downloads deferred by their host's limits, by reason.");
        describe_counter!(THROTTLES, Unit::Count, "429 and 503 answers that paused their host, by status.");
        describe_counter!(
            POLITENESS_ERRORS,
            Unit::Count,
            "Per-host limiter calls that failed or timed out (downloads went ahead unlimited)."
        );
    }
}

/// The worker could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The blob store of `blob.*` could not be opened.
    #[error("opening the blob store")]
    BlobStore(#[source] BlobConfigError),
    /// `download.allow_cidrs` (or, while it is unset, `net.allow_cidrs`) does not parse.
    #[error("reading the download allowlist")]
    Allowlist(#[source] Box<ConfigError>),
    /// The HTTP client could not be built.
    #[error(transparent)]
    Client(#[from] BuildError),
    /// The per-host limiter (Redis, when `store.kind = redis`) could not be opened.
    #[error("opening the per-host limiter")]
    Limiter(#[source] LimiterError),
    /// The worker stopped with an error.
    #[error(transparent)]
    Step(#[from] StepRunError),
}

/// The HTTP client `settings` describe (`download.*` limits, `download.allow_cidrs` or else
/// `net.allow_cidrs`), with the system resolver; tests replace the resolver and add a dial check
/// before building it.
pub fn client_builder(settings: &Settings) -> Result<ClientBuilder, RunError> {
    let download = &settings.download;
    settings
        .client_builder(Outbound::Download, download.limits(), download.user_agent.clone())
        .map_err(|e| RunError::Allowlist(Box::new(e)))
}

/// The service as its binary runs it, on a started [`Service`]: opens the per-host limiter
/// (retrying while its Redis is unreachable, `/readyz` naming `store` meanwhile), then consumes
/// `tasks.download` until the service's shutdown.
pub async fn serve(service: &Service) -> Result<(), RunError> {
    let settings = &service.settings;
    let opened = service.connect(checks::STORE, LimiterError::is_unreachable, || open_limiter(settings)).await;
    let Some(limiter) = opened.map_err(RunError::Limiter)? else { return Ok(()) };
    let client = client_builder(settings)?.build()?;
    run_with_limiter(service.bus.clone(), settings, client, limiter, service.shutdown.clone()).await
}

/// Consumes `tasks.download` on `bus` with the client, blob store, limits and per-host limiter
/// ([`open_limiter`]) of `settings` until `shutdown` fires and in-flight downloads are
/// finished.
pub async fn run(bus: Bus, settings: &Settings, shutdown: Shutdown) -> Result<(), RunError> {
    let client = client_builder(settings)?.build()?;
    run_with_client(bus, settings, client, shutdown).await
}

/// [`run`] with a client built by the caller.
pub async fn run_with_client(
    bus: Bus,
    settings: &Settings,
    client: GuardedClient,
    shutdown: Shutdown,
) -> Result<(), RunError> {
    let limiter = open_limiter(settings).await.map_err(RunError::Limiter)?;
    run_with_limiter(bus, settings, client, limiter, shutdown).await
}

/// [`run`] with a client and a per-host limiter chosen by the caller: replicas given one
/// limiter (a [`MemoryLimiter`] shared through its `Arc` in one process, or limiters on one
/// Redis) hold every host to one set of limits together.
pub async fn run_with_limiter(
    bus: Bus,
    settings: &Settings,
    client: GuardedClient,
    limiter: Arc<dyn HostLimiter>,
    shutdown: Shutdown,
) -> Result<(), RunError> {
    metrics::describe();
    let step = DownloadHandler::new(client, settings.blob.open().map_err(RunError::BlobStore)?)
        .with_politeness(Politeness::from_settings(limiter, settings));
    Ok(run_step(bus, settings, queues::DOWNLOAD, SERVICE, step, shutdown).await?)
}
