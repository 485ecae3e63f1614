//! The indexer [`EventHandler`]: `image.metadata_extracted` → the task's perceptual hash and
//! thumbnail; `image.analyzed` → its embedding. Once a task has both, the earlier images near it
//! are found ([`LiveIndex::pairs_for`]) and kept with it, and when one of them is a
//! near-duplicate by `similarity.*`, `image.duplicate_detected` is published (the closest
//! one), its event id derived from the event that completed the task, so a redelivery publishes
//! the same id and a new generation of the task a new one. It runs inside the dedup layer.

use std::sync::Arc;

use async_trait::async_trait;
use imagepipe_bus::Bus;
use imagepipe_contracts::payload::{ImageAnalyzed, ImageDuplicateDetected, ImageMetadataExtracted};
use imagepipe_contracts::{Event, EventPayload, EventType, derived_event_id};
use imagepipe_runtime::Outcome;
use imagepipe_runtime::clock::Clock;
use imagepipe_runtime::dedup::{EventHandler, Seen};
use imagepipe_runtime::step::event_message;
use imagepipe_similarity::parse_phash;
use serde_json::Value;

use crate::live::LiveIndex;
use crate::store::{Change, Entry, SimilarityStore};

/// Handles `image.metadata_extracted` and `image.analyzed` events (see the module docs).
pub struct IndexHandler {
    store: Arc<dyn SimilarityStore>,
    live: Arc<LiveIndex>,
    /// Where `image.duplicate_detected` goes; `None` indexes without announcing (a rebuild).
    announce: Option<(Bus, Arc<dyn Clock>)>,
}

impl IndexHandler {
    /// A handler writing into `store`, comparing with `live`, announcing duplicates on `bus`.
    pub fn new(store: Arc<dyn SimilarityStore>, live: Arc<LiveIndex>, bus: Bus, clock: Arc<dyn Clock>) -> Self {
        Self { store, live, announce: Some((bus, clock)) }
    }

    /// A handler that indexes without announcing anything (a rebuild replays old events).
    pub fn quiet(store: Arc<dyn SimilarityStore>, live: Arc<LiveIndex>) -> Self {
        Self { store, live, announce: None }
    }

    /// Indexes `event`; the error is how to settle it.
    pub async fn index(&self, event: Event<Value>) -> Result<(), Outcome> {
        let task_id =
            event.task_id.clone().ok_or_else(|| Outcome::reject(format!("{} without a taskId", event.event_type)))?;
        let cause = event.event_id;
        let trace_id = event.trace_id;
        let (at, change) = match event.event_type {
            EventType::ImageMetadataExtracted => {
                let extracted = event.into_typed::<ImageMetadataExtracted>().map_err(Outcome::reject)?;
                let metadata = extracted.payload.metadata;
                let phash = parse_phash(&metadata.phash);
                if phash.is_none() {
                    tracing::warn!(task_id, phash = %metadata.phash, "not a 64-bit perceptual hash; indexed without");
                }
                let labels = extracted.payload.labels;
                (extracted.timestamp, Change::Metadata { phash, thumbnail_key: metadata.thumbnail_key, labels })
            }
            EventType::ImageAnalyzed => {
                let analyzed = event.into_typed::<ImageAnalyzed>().map_err(Outcome::reject)?;
                let Some(embedding) = analyzed.payload.analysis.embedding else {
                    tracing::debug!(task_id, "image.analyzed without an embedding: nothing to index");
                    return Ok(());
                };
                embedding.to_unit().map_err(|e| Outcome::reject(format!("payload.embedding: {e}")))?;
                (analyzed.timestamp, Change::Embedding { embedding, labels: analyzed.payload.labels })
            }
            other => return Err(Outcome::reject(format!("{other} is not an event the similarity indexer handles"))),
        };
        let entry = self.store.update(&task_id, at, change).await.map_err(|e| retry(&e))?;
        if !entry.is_complete() {
            return Ok(());
        }
        self.live.sync(self.store.as_ref()).await.map_err(|e| retry(&e))?;
        let later = self.live.later_near(&entry);
        self.pair(entry, cause, &trace_id).await?;
        // A later image compared before this one had its embedding: it may be this one's
        // near-duplicate. Announced once: only when its earlier pairs did not already make it one.
        for task_id in later {
            let Some(other) = self.store.entry(&task_id).await.map_err(|e| retry(&e))? else { continue };
            if self.live.duplicate_of(&other.pairs).is_none() {
                self.pair(other, cause, &trace_id).await?;
            }
        }
        Ok(())
    }

    /// Finds the earlier images near `entry`, keeps them with it and announces its
    /// near-duplicate, if any (the announcement's id derived from `cause`).
    async fn pair(
        &self,
        entry: Entry,
        cause: uuid::Uuid,
        trace_id: &imagepipe_contracts::TraceId,
    ) -> Result<(), Outcome> {
        let pairs = self.live.pairs_for(&entry);
        let duplicate = self.live.duplicate_of(&pairs).cloned();
        if pairs != entry.pairs {
            self.store.update(&entry.task_id, entry.at, Change::Pairs(pairs)).await.map_err(|e| retry(&e))?;
        }
        if let (Some(duplicate), Some((bus, clock))) = (duplicate, &self.announce) {
            let payload = ImageDuplicateDetected {
                duplicate_thumbnail_key: self.live.thumbnail_key(&duplicate.task_id),
                duplicate_of: duplicate.task_id,
                phash_distance: duplicate.phash_distance,
                cosine: duplicate.cosine,
                labels: entry.labels.clone(),
            };
            announce(bus, clock.as_ref(), &entry, cause, *trace_id, payload).await?;
        }
        Ok(())
    }
}

/// Publishes `image.duplicate_detected` for `entry` (see the module docs).
async fn announce(
    bus: &Bus,
    clock: &dyn Clock,
    entry: &Entry,
    cause: uuid::Uuid,
    trace_id: imagepipe_contracts::TraceId,
    payload: ImageDuplicateDetected,
) -> Result<(), Outcome> {
    let event_type = ImageDuplicateDetected::EVENT_TYPE;
    tracing::info!(task_id = %entry.task_id, duplicate_of = %payload.duplicate_of, cosine = ?payload.cosine,
        phash_distance = ?payload.phash_distance, "near-duplicate found");
    let event = Event {
        event_id: derived_event_id(cause, event_type, &payload.duplicate_of),
        event_type,
        task_id: Some(entry.task_id.clone()),
        trace_id,
        timestamp: clock.unix_ms(),
        source: crate::SERVICE.to_owned(),
        payload,
    };
    let message = event_message(&event, &entry.task_id);
    bus.events.publish(event_type.as_str(), message).await.map_err(|e| retry(&e))
}

fn retry(error: &(dyn std::error::Error + 'static)) -> Outcome {
    Outcome::retry(imagepipe_runtime::error_chain(error))
}

#[async_trait]
impl EventHandler for IndexHandler {
    async fn apply(&self, event: Event<Value>, _: &Seen<'_>) -> Outcome {
        match self.index(event).await {
            Ok(()) => Outcome::Ack,
            Err(outcome) => outcome,
        }
    }
}
