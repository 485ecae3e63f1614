//! The indexer [`EventHandler`]: `image.analyzed` → the task's tags into the index;
//! `image.metadata_extracted` → the task's thumbnail key. It runs inside the dedup layer, and
//! its writes are idempotent anyway, so a redelivered event changes nothing.

use std::sync::Arc;

use async_trait::async_trait;
use imagepipe_contracts::payload::{ImageAnalyzed, ImageMetadataExtracted};
use imagepipe_contracts::{Event, EventType};
use imagepipe_runtime::Outcome;
use imagepipe_runtime::dedup::{EventHandler, Seen};
use serde_json::Value;

use crate::index::TagIndex;

/// Handles `image.analyzed` and `image.metadata_extracted` events (see the module docs).
pub struct IndexHandler {
    index: Arc<dyn TagIndex>,
}

impl IndexHandler {
    /// A handler writing into `index`.
    pub fn new(index: Arc<dyn TagIndex>) -> Self {
        Self { index }
    }

    async fn index_event(&self, event: Event<Value>) -> Result<(), Outcome> {
        let task_id =
            event.task_id.clone().ok_or_else(|| Outcome::reject(format!("{} without a taskId", event.event_type)))?;
        match event.event_type {
            EventType::ImageAnalyzed => {
                let analyzed = event.into_typed::<ImageAnalyzed>().map_err(Outcome::reject)?;
                let tags: Vec<(String, f64)> = analyzed
                    .payload
                    .analysis
                    .tags
                    .iter()
                    .map(|tag| (crate::normalize_tag(&tag.label), tag.score))
                    .filter(|(tag, _)| !tag.is_empty())
                    .collect();
                let at = analyzed.timestamp;
                self.index.index(&task_id, &tags, at).await.map_err(|e| Outcome::retry(crate::error_chain(&e)))?;
                tracing::debug!(task_id, tags = tags.len(), "tags indexed");
            }
            EventType::ImageMetadataExtracted => {
                let extracted = event.into_typed::<ImageMetadataExtracted>().map_err(Outcome::reject)?;
                let (key, at) = (&extracted.payload.metadata.thumbnail_key, extracted.timestamp);
                self.index
                    .set_thumbnail(&task_id, key, at)
                    .await
                    .map_err(|e| Outcome::retry(crate::error_chain(&e)))?;
            }
            other => return Err(Outcome::reject(format!("{other} is not an event the tag indexer handles"))),
        }
        Ok(())
    }
}

#[async_trait]
impl EventHandler for IndexHandler {
    async fn apply(&self, event: Event<Value>, _: &Seen<'_>) -> Outcome {
        match self.index_event(event).await {
            Ok(()) => Outcome::Ack,
            Err(outcome) => outcome,
        }
    }
}
