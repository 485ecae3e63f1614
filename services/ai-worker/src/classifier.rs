//! Analysing images on a blocking pool: one [`Model`] per process, at most `ai.threads`
//! inferences at once, each on its own blocking thread and holding a core of the process-wide
//! CPU gate, their decoded pixels within the memory budget (`ai.memory_budget`). One run of the
//! model gives an image's predictions, tags and embedding (its pooled features, L2-normalised
//! and int8-quantised: [`Embedding`]).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use imagepipe_contracts::Embedding;
use imagepipe_contracts::step::AnalysisOutput;
use imagepipe_runtime::budget::MemoryBudget;
use imagepipe_runtime::config::AiConfig;
use imagepipe_runtime::gate::PriorityGate;
use tokio::task::JoinError;

use crate::error::{AnalyzeError, ModelError};
use crate::metrics;
use crate::model::Model;
use crate::preprocess::memory_needed;
use crate::runtime::RuntimeOptions;

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
    slots: PriorityGate,
    budget: MemoryBudget,
}

impl Classifier {
    /// A classifier over `model` running at most `threads` analyses at once, each holding its
    /// image's share of `budget` (see [`memory_needed`]).
    pub fn new(model: Arc<Model>, settings: AnalysisOptions, threads: usize, budget: MemoryBudget) -> Self {
        Self { model, settings: Arc::new(settings), slots: PriorityGate::new(threads.max(1)), budget }
    }

    /// Loads the model of `ai.model_dir` into the runtime of `ai.runtime` (on a blocking thread),
    /// sizes the pool by `ai.threads` and the memory budget by `ai.memory_budget`.
    pub async fn load(ai: &AiConfig) -> Result<Self, ModelError> {
        let (dir, options) = (ai.model_dir.clone(), RuntimeOptions::from(ai));
        let model = tokio::task::spawn_blocking(move || Model::load_with(&dir, &options))
            .await
            .unwrap_or_else(|join| std::panic::resume_unwind(join.into_panic()))?;
        let budget = MemoryBudget::new(metrics::BUDGET, ai.memory_budget);
        Ok(Self::new(Arc::new(model), AnalysisOptions::from(ai), ai.threads, budget))
    }

    /// The model.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The gate of its analysis slots (`ai.threads`), shared by its clones.
    pub fn slots(&self) -> &PriorityGate {
        &self.slots
    }

    /// Analyses an image's bytes on the blocking pool, waiting for a free slot, then (its header
    /// read on the blocking pool) for its share of the memory budget; a header over the limits
    /// fails without waiting. An analysis abandoned by its caller keeps its slot and share until
    /// it ends.
    pub async fn analyze(&self, bytes: Bytes) -> Result<AnalysisOutput, AnalyzeError> {
        self.analyze_by(bytes, None).await
    }

    /// [`Classifier::analyze`] for a caller who cannot wait long (a search by image): when the
    /// slot, the memory and the core it needs are not all taken within `wait`,
    /// [`AnalyzeError::Busy`], having taken nothing.
    pub async fn analyze_within(&self, bytes: Bytes, wait: Duration) -> Result<AnalysisOutput, AnalyzeError> {
        self.analyze_by(bytes, Some(wait)).await
    }

    /// [`Classifier::analyze`], waiting for the slot, the memory and a core until `wait` has
    /// passed, when given.
    async fn analyze_by(&self, bytes: Bytes, wait: Option<Duration>) -> Result<AnalysisOutput, AnalyzeError> {
        let deadline = wait.map(|wait| (tokio::time::Instant::now() + wait, wait));
        let slot = within(deadline, self.slots.acquire()).await?;
        let needed = tokio::task::spawn_blocking({
            let (bytes, max_pixels, model) = (bytes.clone(), self.settings.max_pixels, self.model.clone());
            move || memory_needed(&bytes, max_pixels, model.input())
        })
        .await
        .map_err(crashed)??;
        let memory = within(deadline, self.budget.acquire(needed)).await?;
        let cpu = within(deadline, imagepipe_runtime::gate::cpu().acquire()).await?;
        let (model, settings) = (self.model.clone(), self.settings.clone());
        let started = Instant::now();
        let analysis = tokio::task::spawn_blocking(move || {
            let _held = (slot, memory, cpu);
            analyze(&model, &settings, &bytes)
        })
        .await;
        ::metrics::histogram!(metrics::ANALYZE_DURATION).record(started.elapsed().as_secs_f64());
        analysis.map_err(crashed)?
    }
}

/// `wait`'s output, or [`AnalyzeError::Busy`] when `deadline` (with the wait it ends) passes
/// first.
async fn within<F: Future>(
    deadline: Option<(tokio::time::Instant, Duration)>,
    wait: F,
) -> Result<F::Output, AnalyzeError> {
    match deadline {
        None => Ok(wait.await),
        Some((at, waited)) => tokio::time::timeout_at(at, wait).await.map_err(|_| AnalyzeError::Busy { waited }),
    }
}

/// The error of a blocking task that did not return: a panic is [`AnalyzeError::Panicked`];
/// cancellation (the runtime shutting down) is resumed as a panic.
fn crashed(join: JoinError) -> AnalyzeError {
    if !join.is_panic() {
        std::panic::resume_unwind(join.into_panic());
    }
    tracing::error!("the analysis panicked");
    AnalyzeError::Panicked
}

/// Decodes, preprocesses and classifies one image, tags it, and makes its embedding from the
/// same run of the model (none when the model directory has no embedding). CPU-bound.
pub fn analyze(model: &Model, settings: &AnalysisOptions, bytes: &[u8]) -> Result<AnalysisOutput, AnalyzeError> {
    let input = model.preprocess(bytes, settings.max_pixels)?;
    let inference = model.infer(input)?;
    let (predictions, tags) =
        model.taxonomy().analyze(&inference.probabilities, settings.top_k, settings.tag_min_score);
    let embedding = match (model.embedding_version(), &inference.features) {
        (Some(version), Some(features)) => Some(
            Embedding::from_features(version, features)
                .map_err(|reason| AnalyzeError::Embedding { version: version.to_owned(), reason })?,
        ),
        _ => None,
    };
    Ok(AnalysisOutput { model: model.name().to_owned(), predictions, tags, embedding })
}
