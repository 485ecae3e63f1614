//! The metadata step's [`StepHandler`]: read the image from the blob store, extract its
//! metadata on the blocking pool, store the thumbnail.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use imagepipe_blob::BlobStore;
use imagepipe_contracts::command::MetadataCommand;
use imagepipe_contracts::step::MetadataOutput;
use imagepipe_runtime::config::MetadataConfig;
use imagepipe_runtime::step::{StepFailure, StepHandler, read_blob};
use tokio::sync::Semaphore;

use crate::error::{ExtractError, codes};
use crate::extract::{Extracted, extract};
use crate::metrics;

/// Handles `tasks.metadata` commands (see the module docs).
pub struct MetadataHandler {
    blobs: Arc<dyn BlobStore>,
    settings: Arc<MetadataConfig>,
    decoders: Arc<Semaphore>,
}

impl MetadataHandler {
    /// A handler reading images from and writing thumbnails to `blobs`, decoding at most
    /// `max_decoding` images at once (the worker's concurrency: a handler abandoned after its
    /// timeout keeps its decoder slot until the decode ends).
    pub fn new(blobs: Arc<dyn BlobStore>, settings: MetadataConfig, max_decoding: usize) -> Self {
        Self { blobs, settings: Arc::new(settings), decoders: Arc::new(Semaphore::new(max_decoding.max(1))) }
    }

    /// Runs [`extract`] on the blocking pool, holding a decoder slot.
    async fn extract(&self, bytes: Bytes) -> Result<Extracted, StepFailure> {
        let slot = self.decoders.clone().acquire_owned().await.expect("the decoder semaphore is never closed");
        let settings = self.settings.clone();
        let started = Instant::now();
        let extracted = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            extract(&bytes, &settings)
        })
        .await;
        ::metrics::histogram!(metrics::EXTRACT_DURATION).record(started.elapsed().as_secs_f64());
        let failed = match extracted {
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
}

#[async_trait]
impl StepHandler for MetadataHandler {
    type Command = MetadataCommand;

    async fn process(&self, command: &MetadataCommand) -> Result<MetadataOutput, StepFailure> {
        let bytes = read_blob(self.blobs.as_ref(), &command.blob_key).await?;
        let Extracted { mut metadata, thumbnail } = self.extract(bytes).await?;
        metadata.thumbnail_key = self.blobs.put(thumbnail).await?.to_string();
        Ok(metadata)
    }
}
