//! The analyze step's [`Handler`]: read the image from the blob store, analyse it on the
//! blocking pool, then report (`image.analyzed`, then the step result).

use std::sync::Arc;

use async_trait::async_trait;
use imagepipe_blob::{BlobError, BlobKey, BlobStore};
use imagepipe_bus::Delivery;
use imagepipe_contracts::command::AnalyzeCommand;
use imagepipe_contracts::payload::ImageAnalyzed;
use imagepipe_contracts::step::AnalysisOutput;
use imagepipe_contracts::{Step, StepError, StepOutput, decode};
use imagepipe_runtime::step::{Attempt, StepReporter};
use imagepipe_runtime::{Handler, Outcome};

use crate::classifier::Classifier;
use crate::error::codes;
use crate::{error_chain, metrics};

/// Handles `tasks.ai` commands (see the module docs).
pub struct AiHandler {
    blobs: Arc<dyn BlobStore>,
    reporter: StepReporter,
    classifier: Classifier,
}

/// How an attempt failed.
enum Failure {
    Permanent(StepError),
    Retryable(StepError),
}

impl AiHandler {
    /// A handler reading images from `blobs`, analysing them with `classifier` and reporting
    /// through `reporter`.
    pub fn new(blobs: Arc<dyn BlobStore>, reporter: StepReporter, classifier: Classifier) -> Self {
        Self { blobs, reporter, classifier }
    }

    async fn process(&self, command: &AnalyzeCommand) -> Result<AnalysisOutput, Failure> {
        let key: BlobKey = command.blob_key.parse().map_err(|e| {
            Failure::Permanent(StepError::new(codes::INVALID_BLOB_KEY, format!("the command's blob key: {e}")))
        })?;
        let bytes = self.blobs.get(&key).await.map_err(blob_failure)?;
        self.classifier.analyze(bytes).await.map_err(|error| {
            ::metrics::counter!(metrics::IMAGES_FAILED, metrics::CODE => error.code()).increment(1);
            let step_error = StepError::new(error.code(), error.to_string());
            if error.is_retryable() { Failure::Retryable(step_error) } else { Failure::Permanent(step_error) }
        })
    }
}

fn blob_failure(error: BlobError) -> Failure {
    match &error {
        BlobError::NotFound(_) => Failure::Permanent(StepError::new(codes::BLOB_NOT_FOUND, error.to_string())),
        BlobError::Corrupt { .. } => Failure::Permanent(StepError::new(codes::BLOB_CORRUPT, error.to_string())),
        BlobError::Io { .. } => Failure::Retryable(StepError::new(codes::BLOB_IO, error_chain(&error))),
    }
}

#[async_trait]
impl Handler for AiHandler {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        let command: AnalyzeCommand = match decode(&delivery.message.payload) {
            Ok(command) => command,
            Err(error) => return Outcome::reject(error),
        };
        let attempt = Attempt { task_id: command.task_id.clone(), step: Step::Analyze, attempt: command.attempt };
        let reported = match self.process(&command).await {
            Ok(analysis) => {
                let payload = ImageAnalyzed {
                    blob_key: command.blob_key.clone(),
                    analysis: analysis.clone(),
                    labels: command.labels.clone(),
                };
                self.reporter.succeeded(&attempt, payload, StepOutput::Analyze(analysis)).await
            }
            Err(Failure::Permanent(error)) => {
                tracing::info!(task_id = %attempt.task_id, %error, "analyze step failed permanently");
                self.reporter.permanent(&attempt, error).await
            }
            Err(Failure::Retryable(error)) => {
                tracing::warn!(task_id = %attempt.task_id, %error, "analyze step failed; the coordinator retries it");
                self.reporter.retryable(&attempt, error, None).await
            }
        };
        match reported {
            Ok(()) => Outcome::Ack,
            Err(error) => Outcome::retry(format!("reporting the analyze step: {}", error_chain(&error))),
        }
    }
}
