//! Analysing images on a blocking pool: one [`Model`] per process, at most `ai.threads`
//! inferences at once, each on its own blocking thread.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use imagepipe_contracts::step::AnalysisOutput;
use imagepipe_runtime::config::AiConfig;
use tokio::sync::Semaphore;

use crate::error::{AnalyzeError, ModelError};
use crate::metrics;
use crate::model::Model;
use crate::preprocess::preprocess;

/// What an analysis reports, from the `ai` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct AnalysisOptions {
    /// Classes reported.
    pub top_k: usize,
    /// Least score of a reported tag.
    pub tag_min_score: f64,
    /// Most pixels an image may have.
    pub max_pixels: u64,
}

impl From<&AiConfig> for AnalysisOptions {
    fn from(ai: &AiConfig) -> Self {
        Self { top_k: ai.top_k, tag_min_score: ai.tag_min_score, max_pixels: ai.max_pixels }
    }
}

/// Runs [`analyze`] for async callers on a bounded blocking pool. Cheap to clone.
#[derive(Clone)]
pub struct Classifier {
    model: Arc<Model>,
    settings: Arc<AnalysisOptions>,
    slots: Arc<Semaphore>,
}

impl Classifier {
    /// A classifier over `model` running at most `threads` analyses at once.
    pub fn new(model: Arc<Model>, settings: AnalysisOptions, threads: usize) -> Self {
        Self { model, settings: Arc::new(settings), slots: Arc::new(Semaphore::new(threads.max(1))) }
    }

    /// Loads the model of `ai.model_dir` (on a blocking thread) and sizes the pool by
    /// `ai.threads`.
    pub async fn load(ai: &AiConfig) -> Result<Self, ModelError> {
        let dir = ai.model_dir.clone();
        let started = Instant::now();
        let model = tokio::task::spawn_blocking(move || Model::load(&dir))
            .await
            .unwrap_or_else(|join| std::panic::resume_unwind(join.into_panic()))?;
        tracing::info!(model = model.name(), dir = %ai.model_dir.display(), load_ms = started.elapsed().as_millis(),
            threads = ai.threads, "model loaded");
        Ok(Self::new(Arc::new(model), AnalysisOptions::from(ai), ai.threads))
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// Analyses an image's bytes on the blocking pool, waiting for a free slot. An analysis
    /// abandoned by its caller keeps its slot until it ends.
    pub async fn analyze(&self, bytes: Bytes) -> Result<AnalysisOutput, AnalyzeError> {
        let slot = self.slots.clone().acquire_owned().await.expect("the slot semaphore is never closed");
        let (model, settings) = (self.model.clone(), self.settings.clone());
        let started = Instant::now();
        let analysis = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            analyze(&model, &settings, &bytes)
        })
        .await;
        ::metrics::histogram!(metrics::ANALYZE_DURATION).record(started.elapsed().as_secs_f64());
        match analysis {
            Ok(result) => result,
            Err(join) if join.is_panic() => {
                tracing::error!("the analysis panicked");
                Err(AnalyzeError::Panicked)
            }
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }
}

/// Decodes, preprocesses and classifies one image, and tags it. CPU-bound.
pub fn analyze(model: &Model, settings: &AnalysisOptions, bytes: &[u8]) -> Result<AnalysisOutput, AnalyzeError> {
    let input = preprocess(bytes, settings.max_pixels)?;
    let probabilities = model.probabilities(input)?;
    let (predictions, tags) = model.taxonomy().analyze(&probabilities, settings.top_k, settings.tag_min_score);
    Ok(AnalysisOutput { model: model.name().to_owned(), predictions, tags })
}
