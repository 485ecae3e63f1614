//! Records every event of a run through a subscriber group of its own, so a test can check
//! what each task went through and how often.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use imagepipe_bus::kafka::KafkaBus;
use imagepipe_bus::{Bus, BusConfig, BusError, BusKind, Selector, StartPosition, Subscription};
use serde_json::Value;
use tokio::task::JoinHandle;

/// One event as the recorder saw it (a redelivered event appears again).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// `eventId`.
    pub event_id: String,
    /// `eventType`.
    pub event_type: String,
    /// `taskId`.
    pub task_id: String,
    /// `traceId`.
    pub trace_id: String,
    /// The whole envelope.
    pub body: Value,
}

/// A subscriber group that records every event from the beginning of the prefix's topics.
pub struct EventRecorder {
    seen: Arc<Mutex<Vec<Seen>>>,
    task: JoinHandle<()>,
    /// On Kafka, the backend itself, to leave the group and close its clients on stop.
    kafka: Option<KafkaBus>,
}

impl EventRecorder {
    /// Subscribes group `e2e-recorder` to every event of `config.prefix`, from the beginning.
    pub async fn start(config: &BusConfig) -> Result<Self, BusError> {
        let (bus, kafka) = match config.kind {
            BusKind::Kafka => {
                let kafka = KafkaBus::connect(&config.prefix, &config.kafka).await?;
                (kafka.clone().into_bus(), Some(kafka))
            }
            _ => (Bus::connect(config).await?, None),
        };
        let subscription = Subscription::new("e2e-recorder", Selector::all()).starting(StartPosition::Beginning);
        let consumer = bus.events.subscribe(subscription).await?;
        let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
        let sink = seen.clone();
        let task = tokio::spawn(async move {
            let _bus = bus;
            loop {
                let Ok(batch) = consumer.fetch(256, Duration::from_millis(500)).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                for delivery in batch {
                    if let Ok(body) = serde_json::from_slice::<Value>(&delivery.message.payload) {
                        let field = |name: &str| body[name].as_str().unwrap_or_default().to_owned();
                        let seen = Seen {
                            event_id: field("eventId"),
                            event_type: field("eventType"),
                            task_id: field("taskId"),
                            trace_id: field("traceId"),
                            body,
                        };
                        sink.lock().expect("recorder lock").push(seen);
                    }
                    let _ = delivery.ack().await;
                }
            }
        });
        Ok(Self { seen, task, kafka })
    }

    /// Every event seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("recorder lock").clone()
    }

    /// What `look` makes of every event seen so far, read in place (no copy of the events:
    /// cheap enough to poll through runs of thousands of tasks).
    pub fn inspect<R>(&self, look: impl FnOnce(&[Seen]) -> R) -> R {
        look(&self.seen.lock().expect("recorder lock"))
    }

    /// How many of `tasks` have a terminal event (`task.completed`, `task.failed`,
    /// `task.cancelled`), counted in place.
    pub fn terminal_among(&self, tasks: &BTreeSet<String>) -> usize {
        self.inspect(|seen| {
            seen.iter()
                .filter(|s| matches!(s.event_type.as_str(), "task.completed" | "task.failed" | "task.cancelled"))
                .filter(|s| tasks.contains(&s.task_id))
                .map(|s| s.task_id.as_str())
                .collect::<BTreeSet<_>>()
                .len()
        })
    }

    /// Distinct event ids of `event_type`, per task.
    pub fn distinct_ids(&self, event_type: &str) -> BTreeMap<String, BTreeSet<String>> {
        let mut by_task: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for seen in self.seen().into_iter().filter(|s| s.event_type == event_type) {
            by_task.entry(seen.task_id).or_default().insert(seen.event_id);
        }
        by_task
    }

    /// Tasks with a terminal event (`task.completed`, `task.failed`, `task.cancelled`).
    pub fn terminal_tasks(&self) -> BTreeSet<String> {
        self.seen()
            .into_iter()
            .filter(|s| matches!(s.event_type.as_str(), "task.completed" | "task.failed" | "task.cancelled"))
            .map(|s| s.task_id)
            .collect()
    }

    /// Waits until `done` holds for the recorded events, checking every 200 ms, or `deadline`
    /// passes; returns whether it held.
    pub async fn wait_until(&self, deadline: Duration, mut done: impl FnMut(&EventRecorder) -> bool) -> bool {
        let until = tokio::time::Instant::now() + deadline;
        loop {
            if done(self) {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl EventRecorder {
    /// Stops recording, leaves the subscriber group and closes the bus's clients, so that the
    /// run's topics can be deleted without a client of this process still reading them (a
    /// librdkafka client that reads a deleted topic's metadata can crash the process).
    pub async fn stop(mut self) {
        self.task.abort();
        let _ = (&mut self.task).await;
        if let Some(kafka) = self.kafka.take() {
            kafka.shutdown().await;
        }
    }
}

impl Drop for EventRecorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}
