//! The indexer [`Handler`]: `image.analyzed` → the task's tags into the index;
//! `image.metadata_extracted` → the task's thumbnail key. Handled event ids are remembered, and
//! writes are idempotent anyway, so a redelivered event changes nothing.

use std::sync::Arc;

use async_trait::async_trait;
use imagepipe_bus::Delivery;
use imagepipe_contracts::payload::{ImageAnalyzed, ImageMetadataExtracted};
use imagepipe_contracts::{Event, EventType, decode};
use imagepipe_runtime::dedup::Dedup;
use imagepipe_runtime::{Handler, Outcome};
use serde_json::Value;

use crate::index::TagIndex;

/// Handles `image.analyzed` and `image.metadata_extracted` events (see the module docs).
pub struct IndexHandler {
    index: Arc<dyn TagIndex>,
    dedup: Box<dyn Dedup>,
}

impl IndexHandler {
    /// A handler writing into `index`, remembering handled events in `dedup`.
    pub fn new(index: Arc<dyn TagIndex>, dedup: Box<dyn Dedup>) -> Self {
        Self { index, dedup }
    }

    async fn apply(&self, event: Event<Value>) -> Result<(), Outcome> {
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
                self.index.index(&task_id, &tags).await.map_err(|e| Outcome::retry(crate::error_chain(&e)))?;
                tracing::debug!(task_id, tags = tags.len(), "tags indexed");
            }
            EventType::ImageMetadataExtracted => {
                let extracted = event.into_typed::<ImageMetadataExtracted>().map_err(Outcome::reject)?;
                let key = &extracted.payload.metadata.thumbnail_key;
                self.index.set_thumbnail(&task_id, key).await.map_err(|e| Outcome::retry(crate::error_chain(&e)))?;
            }
            other => return Err(Outcome::reject(format!("{other} is not an event the tag indexer handles"))),
        }
        Ok(())
    }
}

#[async_trait]
impl Handler for IndexHandler {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        let event: Event<Value> = match decode(&delivery.message.payload) {
            Ok(event) => event,
            Err(error) => return Outcome::reject(error),
        };
        let event_id = event.event_id.to_string();
        match self.dedup.is_done(&event_id).await {
            Ok(true) => return Outcome::Ack,
            Ok(false) => {}
            Err(error) => return Outcome::retry(crate::error_chain(&error)),
        }
        if let Err(outcome) = self.apply(event).await {
            return outcome;
        }
        match self.dedup.mark_done(&event_id).await {
            Ok(_) => Outcome::Ack,
            Err(error) => Outcome::retry(crate::error_chain(&error)),
        }
    }
}
