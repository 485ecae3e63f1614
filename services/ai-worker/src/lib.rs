//! imagepipe ai-worker: consumes `tasks.ai`, labels each downloaded image with EfficientNet-Lite0
//! (ImageNet-1k, an ONNX graph run by onnxruntime, or by `tract` as the fallback; offline; or
//! with any ONNX image classifier the model directory's manifest describes: [`model`]), tags
//! it with the labels' broader WordNet names, publishes `image.analyzed` with the image's
//! embedding (the same run's pooled features, int8-quantised, for similarity search; the step
//! result leaves it out) and reports the step.
//!
//! - [`model`]: the prepared model directory (`scripts/prepare-model.sh`), loaded once.
//! - [`runtime`]: onnxruntime or tract, the runtime running the model (`ai.runtime`).
//! - [`preprocess`]: bytes → decoded image → the model's `[1,3,size,size]` input (224 for the
//!   bundled model; the model directory's manifest says).
//! - [`taxonomy`]: class names, tag ancestors, top-k and tag scores.
//! - [`classifier`]: analysis on a blocking pool of `ai.threads`, within `ai.memory_budget`.
//! - [`handler`]: the step's [`StepHandler`](imagepipe_runtime::step::StepHandler): blob
//!   store and analysis.
//! - [`run`]: the worker loop on a connected bus, for the binary, `imagepipe run` and tests.

pub mod classifier;
pub mod error;
pub mod handler;
pub mod model;
pub mod preprocess;
pub mod runtime;
pub mod taxonomy;

use imagepipe_blob::BlobConfigError;
use imagepipe_bus::Bus;
use imagepipe_contracts::names::queues;
use imagepipe_runtime::step::{StepRunError, run_step};
use imagepipe_runtime::{Service, Settings, Shutdown};

pub use classifier::{AnalysisOptions, Classifier, analyze};
pub use error::{AnalyzeError, ModelError, PREPARE_COMMAND};
pub use handler::AiHandler;
pub use model::{EmbeddingSpec, Inference, Model};
pub use preprocess::ModelInput;
pub use runtime::{AiRuntime, RuntimeKind, RuntimeOptions};

/// The service's name: the `source` of its events, and its name in logs and traces.
pub const SERVICE: &str = "ai-worker";

/// Metric names of the AI worker.
pub mod metrics {
    /// Seconds decoding, preprocessing and classifying one image took on the blocking pool.
    pub const ANALYZE_DURATION: &str = "imagepipe_ai_analyze_seconds";
    /// Images that could not be analysed, by `code`.
    pub const IMAGES_FAILED: &str = "imagepipe_ai_images_failed_total";
    /// Label: the error code.
    pub const CODE: &str = "code";
    /// The `budget` label of the worker's [memory budget
    /// metrics](imagepipe_runtime::budget::metrics).
    pub const BUDGET: &str = "ai";

    /// Gives each of these metrics its `# HELP` text (at start; again is harmless).
    pub fn describe() {
        use ::metrics::{Unit, describe_counter, describe_histogram};
        describe_histogram!(
            ANALYZE_DURATION,
            Unit::Seconds,
            "Time decoding, preprocessing and classifying one image took."
        );
        describe_counter!(IMAGES_FAILED, Unit::Count, "Images that could not be analysed, by code.");
    }
}

/// The worker could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The model of `ai.model_dir` could not be loaded.
    #[error("loading the model")]
    Model(#[source] ModelError),
    /// The blob store of `blob.*` could not be opened.
    #[error("opening the blob store")]
    BlobStore(#[source] BlobConfigError),
    /// The worker stopped with an error.
    #[error(transparent)]
    Step(#[from] StepRunError),
}

/// The service as its binary runs it, on a started [`Service`]: loads the model of `ai.model_dir`
/// (a missing model names `scripts/prepare-model.sh`), then consumes `tasks.ai` until the
/// service's shutdown.
pub async fn serve(service: &Service) -> Result<(), RunError> {
    let classifier = Classifier::load(&service.settings.ai).await.map_err(RunError::Model)?;
    tracing::info!(model = classifier.model().name(), runtime = %classifier.model().runtime(),
        dir = %service.settings.ai.model_dir.display(), threads = service.settings.ai.threads, "model ready");
    run(service.bus.clone(), &service.settings, classifier, service.shutdown.clone()).await
}

/// Consumes `tasks.ai` on `bus`, analysing with `classifier` (see [`Classifier::load`]) and
/// reading images from the blob store of `settings`, until `shutdown` fires and in-flight
/// images are finished.
pub async fn run(bus: Bus, settings: &Settings, classifier: Classifier, shutdown: Shutdown) -> Result<(), RunError> {
    metrics::describe();
    let step = AiHandler::new(settings.blob.open().map_err(RunError::BlobStore)?, classifier);
    Ok(run_step(bus, settings, queues::AI, SERVICE, step, shutdown).await?)
}
