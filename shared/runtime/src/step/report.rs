//! How a pipeline worker reports a step attempt: on success it publishes its `image.*` event (with the
//! deterministic event id) and sends the [`StepResult`] to the coordinator, both at once (the
//! event handed to the bus first) and confirmed before it returns; on failure it sends only the
//! result. A report that fails is an error and the step is retried: both messages carry
//! deterministic ids, so the repeat is deduplicated. Every message carries the schema version,
//! the current trace and its CloudEvents attributes ([`imagepipe_contracts::cloudevents`]).

use std::sync::Arc;

use imagepipe_bus::{Bus, BusError, Message};
use imagepipe_contracts::names::{headers, queues};
use imagepipe_contracts::{
    CloudEvent, CommandType, Event, EventPayload, Priority, SCHEMA_VERSION, Step, StepCommand, StepError, StepOutcome,
    StepOutput, StepResult, TraceId,
};
use serde::Serialize;

use crate::clock::Clock;
use crate::telemetry::{current_trace_id, inject_traceparent};

/// One step attempt a worker is handling: which task, which step, which attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The task.
    pub task_id: String,
    /// The step.
    pub step: Step,
    /// The attempt, from 1.
    pub attempt: u32,
    /// The lane the command came in on: its result goes back on the same lane of
    /// `tasks.results`.
    pub priority: Priority,
    /// The partition of `tasks.results` its result goes to: the task's shard, as the
    /// command's [`headers::SHARD`] named it (none: the queue itself, where any coordinator
    /// takes it and hands it to the shard's owner).
    pub shard: Option<u16>,
}

impl Attempt {
    /// The attempt `command` asks for, its result on the `normal` lane.
    pub fn of<C: StepCommand>(command: &C) -> Self {
        Self {
            task_id: command.task_id().to_owned(),
            step: command.step(),
            attempt: command.attempt(),
            priority: Priority::Normal,
            shard: None,
        }
    }

    /// The same attempt, its result sent to partition `shard` of `tasks.results`.
    pub fn in_shard(mut self, shard: Option<u16>) -> Self {
        self.shard = shard;
        self
    }

    /// The same attempt, reported on `priority`'s lane.
    pub fn in_lane(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }
}

/// The shard a stage command names for its result ([`headers::SHARD`]), if it names one.
pub fn command_shard(message: &imagepipe_bus::Message) -> Option<u16> {
    message.headers.get(headers::SHARD).and_then(|s| s.parse().ok())
}

/// Sends a worker's events and step results (see the module docs).
#[derive(Clone)]
pub struct StepReporter {
    bus: Bus,
    source: String,
    clock: Arc<dyn Clock>,
}

impl StepReporter {
    /// A reporter publishing as `source` (the service name, the envelope's `source`).
    pub fn new(bus: Bus, source: impl Into<String>, clock: Arc<dyn Clock>) -> Self {
        Self { bus, source: source.into(), clock }
    }

    /// The step succeeded: publishes `payload` as the step's event (if it has one: a custom
    /// stage's success is announced by the coordinator) and sends the result, without waiting
    /// for the event's confirmation before sending the result (one round trip instead of two).
    /// Call it only once the output is durable (blobs written).
    pub async fn succeeded<P: EventPayload>(
        &self,
        attempt: &Attempt,
        payload: Option<P>,
        output: StepOutput,
    ) -> Result<(), BusError> {
        let Some(payload) = payload else {
            return self.report(attempt, StepOutcome::Ok { output }).await;
        };
        let trace_id = current_trace_id().unwrap_or_else(TraceId::random);
        let event =
            Event::for_task(&attempt.task_id, attempt.attempt, trace_id, self.clock.unix_ms(), &self.source, payload);
        let message = event_message(&event, &attempt.task_id);
        let (published, reported) = tokio::join!(
            self.bus.events.publish(P::EVENT_TYPE.as_str(), message),
            self.report(attempt, StepOutcome::Ok { output }),
        );
        published.and(reported)
    }

    /// The step failed in a way a later attempt may fix; `retry_after` is the least delay.
    pub async fn retryable(
        &self,
        attempt: &Attempt,
        error: StepError,
        retry_after: Option<std::time::Duration>,
    ) -> Result<(), BusError> {
        let retry_after_ms = retry_after.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.report(attempt, StepOutcome::Retryable { error, retry_after_ms }).await
    }

    /// The step can never succeed for this input; the coordinator fails the task.
    pub async fn permanent(&self, attempt: &Attempt, error: StepError) -> Result<(), BusError> {
        self.report(attempt, StepOutcome::Permanent { error }).await
    }

    /// The step was not started; the coordinator sends the same attempt again after
    /// `retry_after`. Its message id is unique: the attempt's final result comes later under
    /// the attempt's own id, which a deferral must not take from it.
    pub async fn deferred(
        &self,
        attempt: &Attempt,
        reason: StepError,
        retry_after: std::time::Duration,
    ) -> Result<(), BusError> {
        let retry_after_ms = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX);
        let id = format!("{}:{}:{}:deferred:{}", attempt.task_id, attempt.step, attempt.attempt, uuid::Uuid::new_v4());
        self.send(attempt, StepOutcome::Deferred { reason, retry_after_ms }, id).await
    }

    async fn report(&self, attempt: &Attempt, outcome: StepOutcome) -> Result<(), BusError> {
        let id = format!("{}:{}:{}", attempt.task_id, attempt.step, attempt.attempt);
        self.send(attempt, outcome, id).await
    }

    async fn send(&self, attempt: &Attempt, outcome: StepOutcome, id: String) -> Result<(), BusError> {
        let result =
            StepResult { task_id: attempt.task_id.clone(), step: attempt.step, attempt: attempt.attempt, outcome };
        let attributes =
            CloudEvent::of_command(CommandType::StepResult, &id, &attempt.task_id, &self.source, self.clock.unix_ms());
        let mut message = outgoing(&result, &attempt.task_id, id).with_cloud_event(&attributes);
        message.partition = attempt.shard;
        self.bus.queues.send(&attempt.priority.lane(queues::RESULTS), message).await
    }
}

/// `event` as a message keyed by `key` (its task, or what orders it), deduplicated by its
/// event id, with the schema version, the current span's `traceparent` and its CloudEvents
/// attributes ([`CloudEvent::of_event`]) in its headers: how every service publishes an event.
pub fn event_message<P: Serialize>(event: &Event<P>, key: &str) -> Message {
    outgoing(event, key, event.event_id.to_string()).with_cloud_event(&CloudEvent::of_event(event))
}

/// A JSON message keyed by `task_id`, deduplicated by `id`, with the schema version and the
/// current span's `traceparent` in its headers. No CloudEvents attributes: an event goes out
/// through [`event_message`], a command or step result adds its own
/// ([`CloudEvent::of_command`], [`Message::with_cloud_event`]).
pub fn outgoing(body: &impl Serialize, task_id: &str, id: String) -> Message {
    let payload = serde_json::to_vec(body).expect("contract types serialize infallibly");
    let mut message = Message::new(payload).with_key(task_id).with_id(id).with_header(headers::SCHEMA, SCHEMA_VERSION);
    inject_traceparent(&mut message.headers);
    message
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use imagepipe_bus::{BusConfig, ConsumerConfig, Selector, Subscription};
    use imagepipe_contracts::payload::ImageDownloaded;
    use imagepipe_contracts::step::DownloadOutput;
    use imagepipe_contracts::{EventType, decode, event_id};

    use super::*;
    use crate::clock::ManualClock;

    fn output() -> DownloadOutput {
        DownloadOutput {
            blob_key: "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into(),
            size: 4,
            sha256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into(),
            format: "png".into(),
            final_url: None,
        }
    }

    #[tokio::test]
    async fn success_publishes_the_event_then_the_result() {
        let bus = Bus::connect(&BusConfig::default()).await.unwrap();
        let events = bus.events.subscribe(Subscription::new("t", Selector::all())).await.unwrap();
        let results = bus.queues.consume(queues::RESULTS, ConsumerConfig::default()).await.unwrap();
        let reporter = StepReporter::new(bus, "download-worker", Arc::new(ManualClock::at_unix_ms(1_000)));
        let attempt = Attempt {
            task_id: "tsk_1".into(),
            step: Step::Download,
            attempt: 2,
            priority: Priority::Normal,
            shard: None,
        };
        let payload = ImageDownloaded { image: output(), labels: Default::default() };
        reporter.succeeded(&attempt, Some(payload), StepOutput::Download(output())).await.unwrap();

        let delivered = events.fetch(1, Duration::from_secs(1)).await.unwrap().pop().unwrap();
        let event: Event<ImageDownloaded> = decode(&delivered.message.payload).unwrap();
        assert_eq!(event.event_id, event_id("tsk_1", EventType::ImageDownloaded, 2));
        assert_eq!((event.timestamp, event.source.as_str()), (1_000, "download-worker"));
        assert_eq!(delivered.message.headers.get(headers::SCHEMA), Some(SCHEMA_VERSION));
        assert_eq!(delivered.message.id.as_deref(), Some(event.event_id.to_string().as_str()));
        let attributes = delivered.message.headers.cloud_event().unwrap();
        assert_eq!(attributes, CloudEvent::of_event(&event));
        assert_eq!(attributes.source, "/imagepipe/download-worker");

        let delivered = results.fetch(1, Duration::from_secs(1)).await.unwrap().pop().unwrap();
        let result: StepResult = decode(&delivered.message.payload).unwrap();
        assert_eq!((result.task_id.as_str(), result.step, result.attempt), ("tsk_1", Step::Download, 2));
        assert!(matches!(result.outcome, StepOutcome::Ok { output: StepOutput::Download(_) }));
        assert_eq!(delivered.message.key.as_deref(), Some("tsk_1"));
        let attributes = delivered.message.headers.cloud_event().unwrap();
        assert_eq!(
            attributes,
            CloudEvent::of_command(CommandType::StepResult, "tsk_1:download:2", "tsk_1", "download-worker", 1_000)
        );
    }

    #[tokio::test]
    async fn failures_send_only_the_result() {
        let bus = Bus::connect(&BusConfig::default()).await.unwrap();
        let events = bus.events.subscribe(Subscription::new("t", Selector::all())).await.unwrap();
        let results = bus.queues.consume(queues::RESULTS, ConsumerConfig::default()).await.unwrap();
        let reporter = StepReporter::new(bus, "download-worker", Arc::new(ManualClock::at_unix_ms(0)));
        let attempt = Attempt {
            task_id: "tsk_2".into(),
            step: Step::Download,
            attempt: 1,
            priority: Priority::Normal,
            shard: None,
        };
        reporter.retryable(&attempt, StepError::new("http_503", "busy"), Some(Duration::from_secs(3))).await.unwrap();
        let next = Attempt { attempt: 2, ..attempt.clone() };
        reporter.permanent(&next, StepError::new("http_404", "gone")).await.unwrap();
        // A repeated report of one attempt is deduplicated by its message id.
        reporter.permanent(&next, StepError::new("http_404", "gone")).await.unwrap();

        let delivered = results.fetch(3, Duration::from_millis(200)).await.unwrap();
        assert_eq!(delivered.len(), 2);
        let outcomes: Vec<StepOutcome> =
            delivered.iter().map(|d| decode::<StepResult>(&d.message.payload).unwrap().outcome).collect();
        assert!(matches!(&outcomes[0], StepOutcome::Retryable { retry_after_ms: Some(3000), .. }));
        assert!(matches!(&outcomes[1], StepOutcome::Permanent { error } if error.code == "http_404"));
        assert!(events.fetch(1, Duration::from_millis(50)).await.unwrap().is_empty());
    }
}
