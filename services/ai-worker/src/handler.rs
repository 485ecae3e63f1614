//! The analyze step's [`StepHandler`]: read the metadata step's preview (or, for a command
//! without one, the original) from the blob store and analyse it on the blocking pool.

use std::sync::Arc;

use async_trait::async_trait;
use imagepipe_blob::BlobStore;
use imagepipe_contracts::command::AnalyzeCommand;
use imagepipe_contracts::step::AnalysisOutput;
use imagepipe_runtime::step::{StepFailure, StepHandler, with_blob};

use crate::classifier::Classifier;
use crate::metrics;

/// Handles `tasks.ai` commands (see the module docs).
pub struct AiHandler {
    blobs: Arc<dyn BlobStore>,
    classifier: Classifier,
}

impl AiHandler {
    /// A handler reading images from `blobs` and analysing them with `classifier`.
    pub fn new(blobs: Arc<dyn BlobStore>, classifier: Classifier) -> Self {
        Self { blobs, classifier }
    }
}

#[async_trait]
impl StepHandler for AiHandler {
    type Command = AnalyzeCommand;

    async fn process(&self, command: &AnalyzeCommand) -> Result<AnalysisOutput, StepFailure> {
        let key = command.preview_key.as_deref().unwrap_or(&command.blob_key);
        with_blob(self.blobs.as_ref(), key, |bytes| async move {
            self.classifier.analyze(bytes).await.map_err(|error| {
                ::metrics::counter!(metrics::IMAGES_FAILED, metrics::CODE => error.code()).increment(1);
                if error.is_retryable() {
                    StepFailure::retryable(error.code(), error.to_string())
                } else {
                    StepFailure::permanent(error.code(), error.to_string())
                }
            })
        })
        .await
    }
}
