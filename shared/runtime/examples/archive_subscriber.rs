//! Your own event subscriber, in full: a durable group on the event topics that logs every
//! finished task, once per `eventId`. Copy it and replace the side effect.
//!
//! Run it next to a pipeline on NATS:
//! `IMAGEPIPE_BUS__KIND=nats cargo run -p imagepipe-runtime --example archive_subscriber`

use imagepipe_bus::{Bus, Selector, Subscription};
use imagepipe_contracts::Event;
use imagepipe_contracts::payload::TaskCompleted;
use imagepipe_runtime::dedup::{EventHandler, Seen, Subscriber, run_subscriber};
use imagepipe_runtime::{ConfigArgs, Outcome, Shutdown};
use serde_json::Value;

/// The subscriber group: every replica of it shares the work, and remembers handled events.
const GROUP: &str = "archive";

/// The side effect: here, one log line per completed task.
struct Archive;

#[async_trait::async_trait]
impl EventHandler for Archive {
    async fn apply(&self, event: Event<Value>, _: &Seen<'_>) -> Outcome {
        let event = match event.into_typed::<TaskCompleted>() {
            Ok(event) => event,
            // A malformed event is dead-lettered with the reason, never dropped.
            Err(err) => return Outcome::reject(err),
        };
        let task = event.task_id.as_deref().unwrap_or("?");
        let top = event.payload.analysis.predictions.first().map_or("-", |p| p.label.as_str());
        println!("{task}: {top} ({} ms, event {})", event.payload.duration_ms, event.event_id);
        Outcome::Ack
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let settings = ConfigArgs::default().load()?;
    let bus = Bus::connect(&settings.bus).await?;
    let subscription =
        Subscription::new(GROUP, Selector::parse("task.completed")?).with_consumer(settings.worker.consumer_config());
    // Deliveries are at-least-once: the dedup layer applies each `eventId` once (Redis when
    // `store.kind = redis`, shared by every replica; the group's file under `store.path`
    // otherwise).
    let subscriber = Subscriber::new(subscription, Archive, &settings.worker);
    run_subscriber(bus, &settings, subscriber, Shutdown::on_signals()?).await?;
    Ok(())
}
