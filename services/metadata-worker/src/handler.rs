//! The metadata step's [`Handler`]: read the image from the blob store, extract its metadata on
//! the blocking pool, store the thumbnail, then report (event, then step result).

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use imagepipe_blob::{BlobError, BlobKey, BlobStore};
use imagepipe_bus::Delivery;
use imagepipe_contracts::command::MetadataCommand;
use imagepipe_contracts::payload::ImageMetadataExtracted;
use imagepipe_contracts::step::MetadataOutput;
use imagepipe_contracts::{Step, StepError, StepOutput, decode};
use imagepipe_runtime::config::MetadataSettings;
use imagepipe_runtime::step::{Attempt, StepReporter};
use imagepipe_runtime::{Handler, Outcome};
use tokio::sync::Semaphore;

use crate::error::{ExtractError, codes};
use crate::extract::{Extracted, extract};
use crate::metrics;

/// Handles `tasks.metadata` commands (see the module docs).
pub struct MetadataHandler {
    blobs: Arc<dyn BlobStore>,
    reporter: StepReporter,
    settings: Arc<MetadataSettings>,
    decoders: Arc<Semaphore>,
}

/// How an attempt failed.
enum Failure {
    Permanent(StepError),
    Retryable(StepError),
}

impl MetadataHandler {
    /// A handler reading images from and writing thumbnails to `blobs`, reporting through
    /// `reporter`, decoding at most `max_decoding` images at once (the worker's concurrency: a
    /// handler abandoned after its timeout keeps its decoder slot until the decode ends).
    pub fn new(
        blobs: Arc<dyn BlobStore>,
        reporter: StepReporter,
        settings: MetadataSettings,
        max_decoding: usize,
    ) -> Self {
        Self { blobs, reporter, settings: Arc::new(settings), decoders: Arc::new(Semaphore::new(max_decoding.max(1))) }
    }

    async fn process(&self, command: &MetadataCommand) -> Result<MetadataOutput, Failure> {
        let key: BlobKey = command.blob_key.parse().map_err(|e| {
            Failure::Permanent(StepError::new(codes::INVALID_BLOB_KEY, format!("the command's blob key: {e}")))
        })?;
        let bytes = self.blobs.get(&key).await.map_err(blob_failure)?;
        let Extracted { mut metadata, thumbnail } = self.extract(bytes).await?;
        metadata.thumbnail_key = self.blobs.put(thumbnail).await.map_err(blob_failure)?.to_string();
        Ok(metadata)
    }

    /// Runs [`extract`] on the blocking pool, holding a decoder slot.
    async fn extract(&self, bytes: Bytes) -> Result<Extracted, Failure> {
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
                return Err(Failure::Retryable(StepError::new(
                    codes::INTERRUPTED,
                    format!("decoding was cancelled: {join}"),
                )));
            }
        };
        ::metrics::counter!(metrics::IMAGES_FAILED, metrics::CODE => failed.code()).increment(1);
        Err(Failure::Permanent(failed.to_step_error()))
    }
}

fn blob_failure(error: BlobError) -> Failure {
    match &error {
        BlobError::NotFound(_) => Failure::Permanent(StepError::new(codes::BLOB_NOT_FOUND, error.to_string())),
        BlobError::Corrupt { .. } => Failure::Permanent(StepError::new(codes::BLOB_CORRUPT, error.to_string())),
        BlobError::Io { .. } => Failure::Retryable(StepError::new(codes::BLOB_IO, crate::error_chain(&error))),
    }
}

#[async_trait]
impl Handler for MetadataHandler {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        let command: MetadataCommand = match decode(&delivery.message.payload) {
            Ok(command) => command,
            Err(error) => return Outcome::reject(error),
        };
        let attempt = Attempt { task_id: command.task_id.clone(), step: Step::Metadata, attempt: command.attempt };
        let reported = match self.process(&command).await {
            Ok(metadata) => {
                let payload = ImageMetadataExtracted {
                    blob_key: command.blob_key.clone(),
                    metadata: metadata.clone(),
                    labels: command.labels.clone(),
                };
                self.reporter.succeeded(&attempt, payload, StepOutput::Metadata(metadata)).await
            }
            Err(Failure::Permanent(error)) => {
                tracing::info!(task_id = %attempt.task_id, %error, "metadata step failed permanently");
                self.reporter.permanent(&attempt, error).await
            }
            Err(Failure::Retryable(error)) => {
                tracing::warn!(task_id = %attempt.task_id, %error, "metadata step failed; the coordinator retries it");
                self.reporter.retryable(&attempt, error, None).await
            }
        };
        match reported {
            Ok(()) => Outcome::Ack,
            Err(error) => Outcome::retry(format!("reporting the metadata step: {}", crate::error_chain(&error))),
        }
    }
}
