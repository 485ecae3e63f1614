//! imagepipe download-worker: consumes `tasks.download`, fetches each task's image over HTTP(S)
//! through the SSRF-guarded client of `imagepipe-net` (or validates an already uploaded blob),
//! checks by its magic bytes that it is an image, stores it in the blob store under its sha256,
//! publishes `image.downloaded` and reports the step.
//!
//! - [`sniff`](imagepipe_blob::sniff): what the bytes are (JPEG, PNG, GIF, WebP, BMP, TIFF,
//!   AVIF, HEIC, ICO), never trusting `Content-Type`; shared with the upload API.
//! - [`error`]: failures, their stable codes, and which are retryable.
//! - [`handler`]: the step's [`StepHandler`](imagepipe_runtime::step::StepHandler).
//! - [`run`]: the worker loop on a connected bus, for the binary, `imagepipe run` and tests.

pub mod error;
pub mod handler;

use imagepipe_blob::BlobConfigError;
use imagepipe_bus::Bus;
use imagepipe_contracts::names::queues;
use imagepipe_net::{BuildError, ClientBuilder, GuardedClient};
use imagepipe_runtime::config::{ConfigError, Outbound};
use imagepipe_runtime::step::{StepRunError, run_step};
use imagepipe_runtime::{Service, Settings, Shutdown, error_chain};

pub use error::DownloadError;
pub use handler::DownloadHandler;
pub use imagepipe_blob::sniff::{ImageFormat, Sniffed, sniff};

/// The service's name: the `source` of its events, and its name in logs and traces.
pub const SERVICE: &str = "download-worker";

/// Metric names of the download worker.
pub mod metrics {
    /// Seconds one download or blob validation took, by `source`.
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

    /// Gives each of these metrics its `# HELP` text (at start; again is harmless).
    pub fn describe() {
        use ::metrics::{Unit, describe_counter, describe_histogram};
        describe_histogram!(DOWNLOAD_DURATION, Unit::Seconds, "Time one download or blob validation took, by source.");
        describe_counter!(DOWNLOADED_BYTES, Unit::Bytes, "Bytes of images stored, by source.");
        describe_counter!(FAILURES, Unit::Count, "Downloads that failed, by code.");
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

/// The service as its binary runs it, on a started [`Service`]: consumes `tasks.download` until
/// the service's shutdown.
pub async fn serve(service: &Service) -> Result<(), RunError> {
    run(service.bus.clone(), &service.settings, service.shutdown.clone()).await
}

/// Consumes `tasks.download` on `bus` with the client, blob store and limits of `settings`
/// until `shutdown` fires and in-flight downloads are finished.
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
    metrics::describe();
    let step = DownloadHandler::new(client, settings.blob.open().map_err(RunError::BlobStore)?);
    Ok(run_step(bus, settings, queues::DOWNLOAD, SERVICE, step, shutdown).await?)
}
