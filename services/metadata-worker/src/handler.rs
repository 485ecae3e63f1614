//! The metadata step's [`StepHandler`]: read the image from the blob store, extract its
//! metadata on the blocking pool within the memory budget (while the image is checked against
//! its key beside it), store its derivatives (thumbnails and the preview the AI worker reads)
//! at once.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use imagepipe_blob::BlobStore;
use imagepipe_contracts::command::MetadataCommand;
use imagepipe_contracts::step::MetadataOutput;
use imagepipe_runtime::budget::MemoryBudget;
use imagepipe_runtime::config::MetadataConfig;
use imagepipe_runtime::gate::{self, GateSlot, PriorityGate};
use imagepipe_runtime::step::{StepFailure, StepHandler, with_blob};
use tokio::task::JoinError;

use crate::error::{ExtractError, codes};
use crate::extract::{Extracted, extract_with, memory_needed};
use crate::metrics;

/// Handles `tasks.metadata` commands (see the module docs).
pub struct MetadataHandler {
    blobs: Arc<dyn BlobStore>,
    settings: Arc<MetadataConfig>,
    decoders: PriorityGate,
    budget: MemoryBudget,
}

impl MetadataHandler {
    /// A handler reading images from and writing thumbnails to `blobs`, decoding at most
    /// `max_decoding` images at once (a handler abandoned after its timeout keeps its decoder
    /// slot until the decode ends), the highest-priority step first, and no more than
    /// `settings.memory_budget` bytes of pixels at once.
    pub fn new(blobs: Arc<dyn BlobStore>, settings: MetadataConfig, max_decoding: usize) -> Self {
        let budget = MemoryBudget::new(metrics::BUDGET, settings.memory_budget);
        Self { blobs, settings: Arc::new(settings), decoders: PriorityGate::new(max_decoding.max(1)), budget }
    }

    /// Runs [`extract_with`] on the blocking pool (and on a spare core when one is free), holding
    /// a decoder slot and the image's share of the memory budget.
    async fn extract(&self, bytes: Bytes) -> Result<Extracted, StepFailure> {
        let slot = self.decoders.acquire().await;
        let failed = match self.extract_within_budget(bytes, slot).await {
            Ok(Ok(extracted)) => return Ok(extracted),
            Ok(Err(error)) => error,
            Err(join) if join.is_panic() => {
                tracing::error!("the decoder panicked; the image is reported as undecodable");
                ExtractError::DecoderPanicked
            }
            Err(join) => {
                return Err(StepFailure::retryable(codes::INTERRUPTED, format!("decoding was cancelled: {join}")));
            }
        };
        ::metrics::counter!(metrics::IMAGES_FAILED, metrics::CODE => failed.code()).increment(1);
        Err(StepFailure::Permanent(failed.to_step_error()))
    }

    /// Reads the header on the blocking pool, waits for the bytes its decoding needs, then
    /// extracts on the blocking pool holding them and `slot`. A header over the limits fails
    /// without waiting.
    async fn extract_within_budget(
        &self,
        bytes: Bytes,
        slot: GateSlot,
    ) -> Result<Result<Extracted, ExtractError>, JoinError> {
        let needed = tokio::task::spawn_blocking({
            let (bytes, settings) = (bytes.clone(), self.settings.clone());
            move || memory_needed(&bytes, &settings)
        })
        .await?;
        let needed = match needed {
            Ok(needed) => needed,
            Err(error) => return Ok(Err(error)),
        };
        let memory = self.budget.acquire(needed).await;
        let cpu = gate::cpu().acquire().await;
        let priority = gate::current_priority();
        let settings = self.settings.clone();
        let started = Instant::now();
        let extracted = tokio::task::spawn_blocking(move || {
            let decoding = Decoding::start();
            let extracted = extract_with(&bytes, &settings, || gate::cpu().try_acquire_as(priority));
            drop(decoding);
            drop((slot, memory, cpu));
            extracted
        })
        .await;
        ::metrics::histogram!(metrics::EXTRACT_DURATION).record(started.elapsed().as_secs_f64());
        extracted
    }
}

/// One image in [`metrics::DECODING`] while it lives.
struct Decoding;

impl Decoding {
    fn start() -> Self {
        ::metrics::gauge!(metrics::DECODING).increment(1.0);
        Self
    }
}

impl Drop for Decoding {
    fn drop(&mut self) {
        ::metrics::gauge!(metrics::DECODING).decrement(1.0);
    }
}

#[async_trait]
impl StepHandler for MetadataHandler {
    type Command = MetadataCommand;

    async fn process(&self, command: &MetadataCommand) -> Result<MetadataOutput, StepFailure> {
        let Extracted { metadata, derivatives } =
            with_blob(self.blobs.as_ref(), &command.blob_key, |bytes| self.extract(bytes)).await?;
        futures::future::try_join_all(derivatives.into_iter().map(|derivative| self.blobs.put(derivative))).await?;
        Ok(metadata)
    }
}
