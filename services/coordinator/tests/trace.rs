//! One task is one trace: every message the coordinator sends for a task continues the trace
//! its submission started, whether it is sent while handling that task's messages, while
//! handling another task's, or from a timer.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use imagepipe_bus::{Bus, Delivery, Message, Selector, Subscription};
use imagepipe_contracts::names::{headers, queues};
use imagepipe_contracts::{Event, Step, StepError, StepOutcome, StepResult, SubmitTask, TraceId};
use imagepipe_coordinator::consumers::{ResultHandler, SubmitHandler};
use imagepipe_coordinator::store::embedded::EmbeddedStore;
use imagepipe_runtime::clock::ManualClock;
use imagepipe_runtime::config::LogFormat;
use imagepipe_runtime::telemetry::{env_filter, message_span, subscriber};
use imagepipe_runtime::worker::{Handler, Outcome};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use std::sync::Mutex;
use tracing::Instrument;

const SUBMITTER_SPAN: &str = "00f067aa0ba902b7";

fn traceparent(trace: TraceId, span: &str) -> String {
    format!("00-{trace}-{span}-01")
}

/// Sends `payload` to `queue` with a `traceparent` and fetches it back.
async fn deliver_traced(bus: &Bus, queue: &str, payload: Vec<u8>, traceparent: String) -> Delivery {
    let consumer = bus.queues.consume(queue, consumer_config()).await.unwrap();
    bus.queues.send(queue, Message::new(payload).with_header(headers::TRACEPARENT, traceparent)).await.unwrap();
    consumer.fetch(1, Duration::from_secs(5)).await.unwrap().pop().expect("the message just sent")
}

/// Handles `delivery` the way the worker loop does: inside its message span.
async fn handle_traced(handler: &impl Handler, delivery: &Delivery) -> Outcome {
    handler.handle(delivery).instrument(message_span(delivery)).await
}

/// Ended spans, collected in memory.
#[derive(Debug, Clone, Default)]
struct Ended(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Ended {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        self.0.lock().unwrap().extend(batch);
        Ok(())
    }
}

impl Ended {
    /// The span of this process that `message`'s `traceparent` names as its parent.
    fn parent_of(&self, message: &Message) -> Option<SpanData> {
        let span_id = message.headers.traceparent()?.split('-').nth(2)?.to_owned();
        let spans = self.0.lock().unwrap();
        spans.iter().find(|s| s.span_context.span_id().to_string() == span_id).cloned()
    }
}

fn trace_of(message: &Message) -> Option<TraceId> {
    message.headers.traceparent().and_then(TraceId::from_traceparent)
}

fn submit(task_id: &str) -> Vec<u8> {
    serde_json::to_vec(&SubmitTask { task_id: Some(task_id.into()), ..SubmitTask::url("https://example.com/a.jpg") })
        .unwrap()
}

#[tokio::test]
async fn every_message_of_a_task_continues_the_trace_of_its_submission() {
    let ended = Ended::default();
    let provider = SdkTracerProvider::builder().with_simple_exporter(ended.clone()).build();
    let (subscriber, _telemetry) =
        subscriber(LogFormat::Text, env_filter(None, "info").unwrap(), provider, std::io::sink);
    let _guard = tracing::subscriber::set_default(subscriber);

    let dir = tempfile::tempdir().unwrap();
    let bus = memory_bus();
    let clock = ManualClock::at_unix_ms(T0);
    let engine = engine(Arc::new(EmbeddedStore::open(dir.path(), Duration::from_secs(10)).unwrap()), &bus, &clock, 1);
    let events = bus.events.subscribe(Subscription::new("watch", Selector::all())).await.unwrap();
    let downloads = bus.queues.consume(queues::DOWNLOAD, consumer_config()).await.unwrap();
    let (submits, results) = (SubmitHandler::new(engine.clone()), ResultHandler::new(engine.clone()));
    let (first, second) = (TraceId::random(), TraceId::random());

    let delivery = deliver_traced(&bus, queues::SUBMIT, submit("tsk_first"), traceparent(first, SUBMITTER_SPAN)).await;
    assert_eq!(handle_traced(&submits, &delivery).await, Outcome::Ack);
    assert_eq!(engine.store().get("tsk_first").await.unwrap().unwrap().trace_id, first);
    let command = drain(downloads.as_ref()).await.pop().expect("download command");
    assert_eq!(trace_of(&command), Some(first));
    let parent = ended.parent_of(&command).expect("the parent is a span of the coordinator");
    assert_eq!(parent.name, "task transition start");
    assert_eq!(parent.span_context.trace_id().to_string(), first.to_string());

    // Over the cap: queued in its own trace, started later while the first task's result is handled.
    let delivery =
        deliver_traced(&bus, queues::SUBMIT, submit("tsk_second"), traceparent(second, SUBMITTER_SPAN)).await;
    assert_eq!(handle_traced(&submits, &delivery).await, Outcome::Ack);
    assert!(drain(downloads.as_ref()).await.is_empty());

    let failed = StepResult {
        task_id: "tsk_first".into(),
        step: Step::Download,
        attempt: 1,
        outcome: StepOutcome::Permanent { error: StepError::new("http_404", "gone") },
    };
    let worker_span = "1111111111111111";
    let delivery =
        deliver_traced(&bus, queues::RESULTS, serde_json::to_vec(&failed).unwrap(), traceparent(first, worker_span))
            .await;
    assert_eq!(handle_traced(&results, &delivery).await, Outcome::Ack);
    let started = drain(downloads.as_ref()).await.pop().expect("the queued task started");
    assert_eq!(trace_of(&started), Some(second), "started while handling the first task's result");
    assert!(ended.parent_of(&started).is_some());

    // A deadline, then a retry, fired by sweeps outside any message.
    clock.advance(Duration::from_secs(300));
    engine.sweep().await.unwrap();
    clock.advance(Duration::from_secs(120));
    engine.sweep().await.unwrap();
    let retried = drain(downloads.as_ref()).await.pop().expect("the retry's command");
    assert_eq!(trace_of(&retried), Some(second));
    assert_eq!(ended.parent_of(&retried).expect("a span of the sweep").name, "task transition timer");

    let published = drain(events.as_ref()).await;
    assert!(published.len() >= 4, "created ×2, failed, retrying: {}", published.len());
    for message in &published {
        let event = Event::<serde_json::Value>::from_json(&message.payload).unwrap();
        let task_trace = if event.task_id.as_deref() == Some("tsk_first") { first } else { second };
        assert_eq!(event.trace_id, task_trace, "{}", event.event_type);
        assert_eq!(trace_of(message), Some(task_trace), "{}", event.event_type);
        assert!(ended.parent_of(message).is_some(), "{}", event.event_type);
    }
}
