//! Your own event subscriber, in full: a durable group on the event topics that logs every
//! finished task. Copy it and replace the side effect.
//!
//! Run it next to a pipeline on NATS:
//! `IMAGEPIPE_BUS__KIND=nats cargo run -p imagepipe-runtime --example archive_subscriber`

use imagepipe_bus::{Bus, Delivery, Selector, Subscription};
use imagepipe_contracts::payload::TaskCompleted;
use imagepipe_contracts::{Event, decode};
use imagepipe_runtime::{ConfigArgs, Handler, LoopConfig, Outcome, Shutdown, Worker};

/// The side effect: here, one log line per completed task.
struct Archive;

#[async_trait::async_trait]
impl Handler for Archive {
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        let event: Event<TaskCompleted> = match decode(&delivery.message.payload) {
            Ok(event) => event,
            // A malformed event is dead-lettered with the reason, never dropped.
            Err(err) => return Outcome::reject(err),
        };
        // Delivery is at-least-once: a real side effect deduplicates by `event.event_id` first.
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
    let subscription = Subscription::new("archive", Selector::parse("task.completed")?)
        .with_consumer(settings.worker.consumer_config());
    let consumer = bus.events.subscribe(subscription).await?;
    let config = LoopConfig::from_settings("archive", &settings.worker);
    Worker::new(consumer, Archive, config).run(Shutdown::on_signals()?).await?;
    Ok(())
}
