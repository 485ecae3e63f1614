//! imagepipe-stage-rendition: an example stage of users' own (`pipeline.stages`), in Rust. It
//! takes [`StageCommand`](imagepipe_contracts::StageCommand)s from `<prefix>.tasks.rendition`,
//! reads the task's preview (or, without one, its original) from the shared blob store, makes a
//! watermarked rendition of it (scaled to fit `--max-side`, a darkened band along the bottom
//! with a checker stamp and `--text` drawn into the pixels), stores it content-addressed and
//! reports `{"key", "width", "height", "format", "bytes", "source"}`, which the coordinator
//! keeps under `outputs.rendition` of the task.
//!
//! - [`render`]: the pixel work, pure CPU; [`font`]: the 5×7 font of its text.
//! - [`handler`]: the step's [`StepHandler`](imagepipe_runtime::step::StepHandler).
//! - [`run`]: the worker loop on a connected bus, for the binary and tests.

pub mod font;
pub mod handler;
pub mod render;

use imagepipe_blob::BlobConfigError;
use imagepipe_bus::Bus;
use imagepipe_contracts::{InvalidStageName, StageName};
use imagepipe_runtime::step::{StepRunError, run_step};
use imagepipe_runtime::{Settings, Shutdown};

pub use handler::RenditionHandler;
pub use render::{OutputFormat, Rendition, RenditionSpec};

/// The service's name: its name in logs, traces and step results.
pub const SERVICE: &str = "stage-rendition";

/// The stage's name in `pipeline.stages` unless `--stage` says otherwise.
pub const DEFAULT_STAGE: &str = "rendition";

/// The stage's own options, beside `--config` (each also an environment variable; none of them
/// is a key of the shared configuration).
#[derive(Debug, Clone, clap::Args)]
pub struct RenditionArgs {
    /// The stage's name in `pipeline.stages`: its commands come from `<prefix>.tasks.<stage>`.
    #[arg(long, env = "IMAGEPIPE_RENDITION_STAGE", default_value = DEFAULT_STAGE)]
    pub stage: String,
    /// The longest side of a rendition in pixels (16 to 8192); smaller images keep their size.
    #[arg(long, env = "IMAGEPIPE_RENDITION_MAX_SIDE", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(16..=8192))]
    pub max_side: u32,
    /// The watermark's text (letters, digits and `-_.,:/@&!`; others are drawn as `?`).
    #[arg(long, env = "IMAGEPIPE_RENDITION_TEXT", default_value = "imagepipe")]
    pub text: String,
    /// The renditions' encoding.
    #[arg(long, env = "IMAGEPIPE_RENDITION_FORMAT", value_enum, default_value_t = OutputFormat::Jpeg)]
    pub format: OutputFormat,
    /// JPEG quality (1 to 100).
    #[arg(long, env = "IMAGEPIPE_RENDITION_QUALITY", default_value_t = 85,
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub quality: u8,
    /// The most pixels (width × height) of a source image the stage decodes.
    #[arg(long, env = "IMAGEPIPE_RENDITION_MAX_PIXELS", default_value_t = 64_000_000)]
    pub max_pixels: u64,
}

impl RenditionArgs {
    /// The rendition these options ask for.
    pub fn spec(&self) -> RenditionSpec {
        RenditionSpec {
            max_side: self.max_side,
            text: self.text.clone(),
            format: self.format,
            quality: self.quality,
            max_pixels: self.max_pixels,
        }
    }
}

/// The worker could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// `--stage` is not a valid name for a stage of users' own.
    #[error("--stage")]
    Stage(#[source] InvalidStageName),
    /// The blob store of `blob.*` could not be opened.
    #[error("opening the blob store")]
    BlobStore(#[source] BlobConfigError),
    /// The worker stopped with an error.
    #[error(transparent)]
    Step(#[from] StepRunError),
}

/// Consumes the commands of stage `stage` on `bus` with the blob store of `settings`, making
/// renditions as `spec` says, until `shutdown` fires and in-flight ones are finished.
pub async fn run(
    bus: Bus,
    settings: &Settings,
    stage: &str,
    spec: RenditionSpec,
    shutdown: Shutdown,
) -> Result<(), RunError> {
    let stage = StageName::new(stage).map_err(RunError::Stage)?;
    let blobs = settings.blob.open().map_err(RunError::BlobStore)?;
    tracing::info!(
        queue = stage.queue(),
        max_side = spec.max_side,
        format = spec.format.as_str(),
        "making watermarked renditions"
    );
    let handler = RenditionHandler::new(blobs, spec);
    Ok(run_step(bus, settings, stage.queue(), SERVICE, handler, shutdown).await?)
}
