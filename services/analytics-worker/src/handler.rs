//! The analytics [`Handler`]: every event → its [`Update`] into the store, once per `eventId`,
//! and the same counts and latencies as Prometheus metrics.

use std::sync::Arc;

use async_trait::async_trait;
use imagepipe_bus::Delivery;
use imagepipe_contracts::{Event, decode};
use imagepipe_runtime::dedup::Dedup;
use imagepipe_runtime::{Handler, Outcome};
use serde_json::Value;

use crate::metrics;
use crate::store::StatsStore;
use crate::update::{Span, Update};

/// Records every event (see the module docs).
pub struct StatsHandler {
    store: Arc<dyn StatsStore>,
    dedup: Box<dyn Dedup>,
}

impl StatsHandler {
    /// A handler recording into `store`, remembering handled events in `dedup`.
    pub fn new(store: Arc<dyn StatsStore>, dedup: Box<dyn Dedup>) -> Self {
        Self { store, dedup }
    }
}

/// The Prometheus side of one recorded update.
fn observe(update: &Update, latencies: &[(Span, u64)]) {
    ::metrics::counter!(metrics::EVENTS, metrics::EVENT_TYPE => update.event_type.as_str()).increment(1);
    if let Some(outcome) = update.outcome {
        ::metrics::counter!(metrics::TASKS, metrics::OUTCOME => outcome.as_str()).increment(1);
    }
    if let Some(format) = &update.format {
        ::metrics::counter!(metrics::IMAGES, metrics::FORMAT => format.clone()).increment(1);
    }
    if update.bytes > 0 {
        ::metrics::counter!(metrics::BYTES_DOWNLOADED).increment(update.bytes);
    }
    for (span, ms) in latencies {
        ::metrics::histogram!(metrics::STAGE_LATENCY, metrics::SPAN => span.as_str()).record(*ms as f64 / 1000.0);
    }
}

#[async_trait]
impl Handler for StatsHandler {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        let event: Event<Value> = match decode(&delivery.message.payload) {
            Ok(event) => event,
            Err(error) => return Outcome::reject(error),
        };
        let event_id = event.event_id.to_string();
        match self.dedup.is_done(&event_id).await {
            Ok(true) => {
                ::metrics::counter!(metrics::DUPLICATES).increment(1);
                return Outcome::Ack;
            }
            Ok(false) => {}
            Err(error) => return Outcome::retry(crate::error_chain(&error)),
        }
        let update = match Update::from_event(event) {
            Ok(update) => update,
            Err(error) => return Outcome::reject(crate::error_chain(&error)),
        };
        let latencies = match self.store.record(&update).await {
            Ok(latencies) => latencies,
            Err(error) => return Outcome::retry(crate::error_chain(&error)),
        };
        observe(&update, &latencies);
        tracing::debug!(event_id, event_type = %update.event_type, task_id = update.task_id, "event counted");
        match self.dedup.mark_done(&event_id).await {
            Ok(_) => Outcome::Ack,
            Err(error) => Outcome::retry(crate::error_chain(&error)),
        }
    }
}
