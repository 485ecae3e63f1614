//! The analytics [`EventHandler`]: every event → its [`Update`] into the store, and the same
//! counts and latencies as Prometheus metrics. Run it inside [`Deduplicated`] (as [`crate::run`]
//! does), which applies each `eventId` once.
//!
//! [`Deduplicated`]: imagepipe_runtime::dedup::Deduplicated

use std::sync::Arc;

use async_trait::async_trait;
use imagepipe_contracts::Event;
use imagepipe_runtime::Outcome;
use imagepipe_runtime::dedup::{EventHandler, Seen};
use serde_json::Value;

use crate::metrics;
use crate::store::StatsStore;
use crate::update::{Span, Update};

/// Records every event (see the module docs).
pub struct StatsHandler {
    store: Arc<dyn StatsStore>,
}

impl StatsHandler {
    /// A handler recording into `store`.
    pub fn new(store: Arc<dyn StatsStore>) -> Self {
        Self { store }
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
impl EventHandler for StatsHandler {
    async fn apply(&self, event: Event<Value>, _: &Seen<'_>) -> Outcome {
        let event_id = event.event_id;
        let update = match Update::from_event(event) {
            Ok(update) => update,
            Err(error) => return Outcome::reject(crate::error_chain(&error)),
        };
        let latencies = match self.store.record(&update).await {
            Ok(latencies) => latencies,
            Err(error) => return Outcome::retry(crate::error_chain(&error)),
        };
        observe(&update, &latencies);
        tracing::debug!(%event_id, event_type = %update.event_type, task_id = update.task_id.as_deref(), "event counted");
        Outcome::Ack
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    use imagepipe_bus::{AckHandle, BusError, Delivery, Message};
    use imagepipe_contracts::payload::{QueueChanged, QueuePaused, QueueResumed, TaskCreated};
    use imagepipe_contracts::{ImageSource, TraceId};
    use imagepipe_runtime::Handler;
    use imagepipe_runtime::dedup::{Deduplicated, MemoryDedup};

    use super::*;
    use crate::store::{MemoryStore, Stats, StoreError};

    struct Unsettled;

    #[async_trait]
    impl AckHandle for Unsettled {
        async fn ack(&self) -> Result<(), BusError> {
            Ok(())
        }
        async fn nack(&self, _: Duration) -> Result<(), BusError> {
            Ok(())
        }
        async fn progress(&self) -> Result<(), BusError> {
            Ok(())
        }
        async fn dead_letter(&self, _: &Message, _: u32, _: &str) -> Result<(), BusError> {
            Ok(())
        }
        fn position(&self) -> String {
            "test".into()
        }
    }

    fn delivery(body: Vec<u8>) -> Delivery {
        Delivery::new(Message::new(body), 1, 5, "events.analytics".into(), Box::new(Unsettled))
    }

    fn created(task_id: &str) -> Vec<u8> {
        let payload = TaskCreated {
            source: ImageSource::Blob("sha256:00".into()),
            callback_url: None,
            labels: Default::default(),
        };
        Event::for_task(task_id, 0, TraceId::random(), 1_000, "coordinator", payload).to_json()
    }

    /// A store that fails while `down` is set.
    struct Flaky {
        down: AtomicBool,
        inner: MemoryStore,
    }

    #[async_trait]
    impl StatsStore for Flaky {
        async fn record(&self, update: &Update) -> Result<Vec<(Span, u64)>, StoreError> {
            if self.down.load(Ordering::SeqCst) {
                return Err(StoreError::Corrupt { what: "test", value: "store down".into() });
            }
            self.inner.record(update).await
        }
        async fn snapshot(&self) -> Result<Stats, StoreError> {
            self.inner.snapshot().await
        }
    }

    fn handler() -> (Arc<Flaky>, Deduplicated<StatsHandler>) {
        let store = Arc::new(Flaky { down: AtomicBool::new(false), inner: MemoryStore::default() });
        let dedup = Box::new(MemoryDedup::new(Duration::from_secs(60), 100));
        (store.clone(), Deduplicated::new(StatsHandler::new(store), dedup, crate::GROUP))
    }

    async fn created_count(store: &Flaky) -> u64 {
        store.snapshot().await.unwrap().events.get("task.created").copied().unwrap_or(0)
    }

    #[tokio::test]
    async fn a_redelivered_event_counts_once() {
        let (store, handler) = handler();
        assert_eq!(handler.handle(&delivery(created("t1"))).await, Outcome::Ack);
        assert_eq!(handler.handle(&delivery(created("t1"))).await, Outcome::Ack);
        assert_eq!(created_count(&store).await, 1);
        assert_eq!(handler.handle(&delivery(created("t2"))).await, Outcome::Ack);
        assert_eq!(created_count(&store).await, 2);
    }

    #[tokio::test]
    async fn a_store_failure_is_retried_and_counted_once_it_recovers() {
        let (store, handler) = handler();
        store.down.store(true, Ordering::SeqCst);
        let outcome = handler.handle(&delivery(created("t1"))).await;
        assert!(matches!(&outcome, Outcome::Retry { reason, .. } if reason.contains("store down")), "{outcome:?}");
        store.down.store(false, Ordering::SeqCst);
        assert_eq!(handler.handle(&delivery(created("t1"))).await, Outcome::Ack);
        assert_eq!(created_count(&store).await, 1);
    }

    #[tokio::test]
    async fn queue_events_are_subscribed_to_and_counted_without_a_task() {
        let selector = imagepipe_bus::Selector::parse(crate::SELECTOR).unwrap();
        assert!(selector.matches("queue.paused") && selector.matches("queue.resumed"));
        let (store, handler) = handler();
        for (i, paused) in [true, false, true, false].into_iter().enumerate() {
            let change = QueueChanged { queue: "tasks.metadata".into(), reason: None };
            let mut event = if paused {
                Event::for_task("-", 0, TraceId::random(), 1_000, "coordinator", QueuePaused(change)).to_json()
            } else {
                Event::for_task("-", 0, TraceId::random(), 1_000, "coordinator", QueueResumed(change)).to_json()
            };
            let mut json: serde_json::Value = serde_json::from_slice(&event).unwrap();
            json.as_object_mut().unwrap().remove("taskId");
            json["eventId"] = format!("00000000-0000-4000-8000-00000000000{i}").into();
            event = serde_json::to_vec(&json).unwrap();
            assert_eq!(handler.handle(&delivery(event)).await, Outcome::Ack);
        }
        let stats = store.snapshot().await.unwrap();
        assert_eq!((stats.events.get("queue.paused"), stats.events.get("queue.resumed")), (Some(&2), Some(&2)));
        assert_eq!(store.inner.tasks_tracked(), 0, "they measure nothing");
    }

    #[tokio::test]
    async fn malformed_events_are_rejected_with_the_reason() {
        let (store, handler) = handler();
        let outcome = handler.handle(&delivery(b"not json".to_vec())).await;
        assert!(matches!(outcome, Outcome::Reject { .. }), "{outcome:?}");

        let mut no_task: serde_json::Value = serde_json::from_slice(&created("t1")).unwrap();
        no_task.as_object_mut().unwrap().remove("taskId");
        let outcome = handler.handle(&delivery(serde_json::to_vec(&no_task).unwrap())).await;
        assert_eq!(outcome, Outcome::reject("task.created without a taskId"));

        let mut bad_payload: serde_json::Value = serde_json::from_slice(&created("t1")).unwrap();
        bad_payload["eventType"] = "image.downloaded".into();
        let outcome = handler.handle(&delivery(serde_json::to_vec(&bad_payload).unwrap())).await;
        assert!(matches!(&outcome, Outcome::Reject { reason } if reason.contains("payload")), "{outcome:?}");
        let stats = store.snapshot().await.unwrap();
        assert_eq!(Stats { last_hour: Default::default(), ..stats.clone() }, Stats::default(), "nothing counted");
        assert!(stats.last_hour.minutes.is_empty(), "nothing counted in the last hour");
    }
}
