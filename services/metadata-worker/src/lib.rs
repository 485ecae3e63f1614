//! imagepipe metadata-worker: consumes `tasks.metadata`, decodes each downloaded image once
//! under pixel limits (a JPEG at the smallest DCT scale its derivatives need), extracts its
//! format, dimensions, EXIF, colours and hashes, writes its derivatives (`metadata.thumbnails`:
//! a WebP thumbnail and the JPEG preview the AI worker reads) to the blob store, publishes
//! `image.metadata_extracted` and reports the step.
//!
//! - [`decode`]: format detection and decoding under limits (pixel bombs fail before allocating).
//! - [`heif`]: HEIC and AVIF through libheif, under the same limits, upright; [`bmff`] reads
//!   the boxes it checks before libheif parses the file.
//! - [`exif`], [`frames`], [`colors`], [`phash`], [`thumbnail`]: one fact each.
//! - [`extract`]: all of them from an image's bytes, pure CPU work.
//! - [`handler`]: the step's [`StepHandler`](imagepipe_runtime::step::StepHandler): blob
//!   store, blocking pool and memory budget (`metadata.memory_budget`).
//! - [`run`]: the worker loop on a connected bus, for the binary, `imagepipe run` and tests.

pub mod bmff;
pub mod colors;
pub mod decode;
pub mod error;
pub mod exif;
pub mod extract;
pub mod frames;
pub mod handler;
pub mod heif;
pub mod phash;
pub mod thumbnail;

use imagepipe_blob::BlobConfigError;
use imagepipe_bus::Bus;
use imagepipe_contracts::names::queues;
use imagepipe_runtime::step::{StepRunError, run_step};
use imagepipe_runtime::{Service, Settings, Shutdown};

pub use error::ExtractError;
pub use extract::{Extracted, extract, extract_with};
pub use handler::MetadataHandler;

/// The service's name: the `source` of its events, and its name in logs and traces.
pub const SERVICE: &str = "metadata-worker";

/// Metric names of the metadata worker.
pub mod metrics {
    /// Seconds decoding and extracting one image took on the blocking pool.
    pub const EXTRACT_DURATION: &str = "imagepipe_metadata_extract_seconds";
    /// Images being decoded and extracted now, each holding its share of the memory budget.
    pub const DECODING: &str = "imagepipe_metadata_decoding";
    /// Images that could not be processed, by `code`.
    pub const IMAGES_FAILED: &str = "imagepipe_metadata_images_failed_total";
    /// Label: the error code.
    pub const CODE: &str = "code";
    /// The `budget` label of the worker's [memory budget
    /// metrics](imagepipe_runtime::budget::metrics).
    pub const BUDGET: &str = "metadata";

    /// Gives each of these metrics its `# HELP` text (at start; again is harmless).
    pub fn describe() {
        use ::metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
        describe_histogram!(EXTRACT_DURATION, Unit::Seconds, "Time decoding and extracting one image took.");
        describe_gauge!(DECODING, Unit::Count, "Images being decoded and extracted now.");
        describe_counter!(IMAGES_FAILED, Unit::Count, "Images that could not be processed, by code.");
    }
}

/// The worker could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The blob store of `blob.*` could not be opened.
    #[error("opening the blob store")]
    BlobStore(#[source] BlobConfigError),
    /// The worker stopped with an error.
    #[error(transparent)]
    Step(#[from] StepRunError),
}

/// The service as its binary runs it, on a started [`Service`]: consumes `tasks.metadata` until
/// the service's shutdown.
pub async fn serve(service: &Service) -> Result<(), RunError> {
    run(service.bus.clone(), &service.settings, service.shutdown.clone()).await
}

/// Consumes `tasks.metadata` on `bus` with the blob store and limits of `settings` until
/// `shutdown` fires and in-flight images are finished.
pub async fn run(bus: Bus, settings: &Settings, shutdown: Shutdown) -> Result<(), RunError> {
    metrics::describe();
    heif::log_decoders();
    let blobs = settings.blob.open().map_err(RunError::BlobStore)?;
    let step = MetadataHandler::new(blobs, settings.metadata.clone(), settings.worker.concurrency);
    Ok(run_step(bus, settings, queues::METADATA, SERVICE, step, shutdown).await?)
}
