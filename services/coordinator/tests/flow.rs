//! The coordinator end to end over the memory bus, with a manual clock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use common::*;
use imagepipe_bus::{Bus, BusError, Consumer, ConsumerConfig, EventBus, Message, Selector, Subscription, TaskQueue};
use imagepipe_contracts::names::{self, headers, queues};
use imagepipe_contracts::payload::TaskRetrying;
use imagepipe_contracts::{
    DownloadCommand, Event, MetadataCommand, Step, StepError, StepOutcome, StepResult, SubmitTask,
};
use imagepipe_coordinator::consumers::{CappedConsumer, ResultHandler, SubmitHandler};
use imagepipe_coordinator::engine::{Handled, Origin};
use imagepipe_coordinator::store::TaskStore;
use imagepipe_coordinator::store::embedded::EmbeddedStore;
use imagepipe_coordinator::store::redis::RedisStore;
use imagepipe_coordinator::task::{HistoryEvent, TaskState, TimerKind};
use imagepipe_coordinator::{Ignored, Input};
use imagepipe_runtime::clock::{Clock, ManualClock};
use imagepipe_runtime::config::WorkerConfig;
use imagepipe_runtime::shutdown::Shutdown;
use imagepipe_runtime::worker::{Handler, LoopConfig, Outcome, Worker};

const GRACE: Duration = Duration::from_secs(10);

fn embedded(dir: &std::path::Path) -> Arc<dyn TaskStore> {
    Arc::new(EmbeddedStore::open(dir, GRACE).unwrap())
}

async fn events_of(bus: &Bus, group: &str) -> Box<dyn Consumer> {
    bus.events.subscribe(Subscription::new(group, Selector::all())).await.unwrap()
}

fn event_types(messages: &[Message]) -> Vec<String> {
    messages.iter().map(|m| Event::<serde_json::Value>::from_json(&m.payload).unwrap().event_type.to_string()).collect()
}

#[tokio::test]
async fn a_bus_submission_runs_every_step_and_completes_once() {
    let dir = tempfile::tempdir().unwrap();
    let bus = memory_bus();
    let clock = ManualClock::at_unix_ms(T0);
    let engine = engine(embedded(dir.path()), &bus, &clock, 10);
    let events = events_of(&bus, "watch").await;
    let submit = SubmitHandler::new(engine.clone());
    let results = ResultHandler::new(engine.clone());

    let body = serde_json::to_vec(&SubmitTask {
        task_id: Some("tsk_flow".into()),
        ..SubmitTask::url("https://example.com/cat.jpg")
    })
    .unwrap();
    let delivery = deliver(&bus, queues::SUBMIT, body).await;
    assert_eq!(submit.handle(&delivery).await, Outcome::Ack);
    delivery.ack().await.unwrap();

    let downloads = bus.queues.consume(queues::DOWNLOAD, consumer_config()).await.unwrap();
    let commands = drain(downloads.as_ref()).await;
    assert_eq!(commands.len(), 1);
    let command: DownloadCommand = serde_json::from_slice(&commands[0].payload).unwrap();
    assert_eq!((command.task_id.as_str(), command.attempt), ("tsk_flow", 1));
    assert_eq!(commands[0].key.as_deref(), Some("tsk_flow"));
    assert!(commands[0].headers.get(headers::TRACEPARENT).is_some());
    let attributes = commands[0].headers.cloud_event().unwrap();
    assert_eq!(
        (attributes.event_type.as_str(), attributes.source.as_str()),
        ("command.download", "/imagepipe/coordinator")
    );
    assert_eq!(
        (attributes.id.as_str(), attributes.subject.as_deref()),
        (commands[0].id.as_deref().unwrap(), Some("tsk_flow"))
    );
    assert_eq!(attributes.time_ms, clock.unix_ms());

    for step in Step::ALL {
        clock.advance(Duration::from_secs(1));
        let delivery = deliver(&bus, queues::RESULTS, serde_json::to_vec(&ok("tsk_flow", step, 1)).unwrap()).await;
        assert_eq!(results.handle(&delivery).await, Outcome::Ack);
        // a redelivered result is acknowledged and changes nothing
        assert_eq!(results.handle(&delivery).await, Outcome::Ack);
        delivery.ack().await.unwrap();
    }
    let metadata = bus.queues.consume(queues::METADATA, consumer_config()).await.unwrap();
    let command: MetadataCommand = serde_json::from_slice(&drain(metadata.as_ref()).await[0].payload).unwrap();
    assert_eq!(command.blob_key, BLOB);

    let task = engine.store().get("tsk_flow").await.unwrap().unwrap();
    assert_eq!(task.state, TaskState::Completed);
    assert_eq!(engine.store().history("tsk_flow").await.unwrap().len(), 5);
    let published = drain(events.as_ref()).await;
    assert_eq!(event_types(&published), ["task.created", "task.completed"]);
    for message in &published {
        let event = Event::<serde_json::Value>::from_json(&message.payload).unwrap();
        assert_eq!(message.headers.cloud_event().unwrap(), imagepipe_contracts::CloudEvent::of_event(&event));
    }
    assert!(engine.store().outbox("tsk_flow").await.unwrap().is_empty(), "every entry relayed and removed");
}

#[tokio::test]
async fn malformed_and_invalid_submissions_are_dead_lettered_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let bus = memory_bus();
    let clock = ManualClock::at_unix_ms(T0);
    let engine = engine(embedded(dir.path()), &bus, &clock, 10);
    let consumer = bus.queues.consume(queues::SUBMIT, consumer_config()).await.unwrap();
    let mut config = LoopConfig::from_settings(queues::SUBMIT, &WorkerConfig::default());
    config.fetch_wait = Duration::from_millis(20);
    let shutdown = Shutdown::new();
    let worker = tokio::spawn(Worker::new(consumer, SubmitHandler::new(engine.clone()), config).run(shutdown.clone()));

    bus.queues.send(queues::SUBMIT, Message::new(&b"{not json"[..])).await.unwrap();
    bus.queues.send(queues::SUBMIT, Message::new(&br#"{"taskId":"tsk_x","labels":{}}"#[..])).await.unwrap();
    let with_user_info = br#"{"taskId":"tsk_y","url":"http://user:secret@example.com/a.jpg"}"#;
    bus.queues.send(queues::SUBMIT, Message::new(&with_user_info[..])).await.unwrap();
    let first = SubmitTask { task_id: Some("tsk_z".into()), ..SubmitTask::url("https://example.com/a.jpg") };
    engine.submit(&first, Origin::Http, String::new).await.unwrap();
    let other_source = br#"{"taskId":"tsk_z","url":"https://example.com/b.jpg"}"#;
    bus.queues.send(queues::SUBMIT, Message::new(&other_source[..])).await.unwrap();
    bus.queues.send(queues::SUBMIT, Message::new(&br#"["tsk_w", "https://example.com/c.jpg"]"#[..])).await.unwrap();
    let dlq = bus.queues.consume(&names::dead_letter_queue(queues::SUBMIT), consumer_config()).await.unwrap();
    let mut reasons = Vec::new();
    while reasons.len() < 5 {
        for d in dlq.fetch(2, Duration::from_secs(5)).await.unwrap() {
            reasons.push(d.message.headers.get(headers::DLQ_REASON).unwrap().to_owned());
            d.ack().await.unwrap();
        }
    }
    shutdown.trigger();
    worker.await.unwrap().unwrap();
    // The worker settles concurrently: the dead letters arrive in any order.
    reasons.sort();
    let expected = [
        "invalid SubmitTask at `?`: key must be a string",
        "invalid SubmitTask: the body must be a JSON object",
        "invalid submit command: `url` must not carry user info",
        "invalid submit command: one of `url` or `blob` is required",
        "task tsk_z already exists with another source (https://example.com/a.jpg)",
    ];
    for (reason, expected) in reasons.iter().zip(expected) {
        assert!(reason.starts_with(expected), "{expected:?} in {reasons:?}");
    }
    assert!(reasons.iter().all(|r| !r.contains("secret")), "{reasons:?}");
    for id in ["tsk_x", "tsk_y"] {
        assert!(engine.store().get(id).await.unwrap().is_none(), "{id}");
    }
    assert!(engine.store().get("tsk_w").await.unwrap().is_none());
}

#[tokio::test]
async fn an_outbox_message_too_large_for_the_bus_fails_its_task_and_is_dead_lettered_once() {
    let dir = tempfile::tempdir().unwrap();
    let bus = memory_bus().with_max_message_bytes(1500);
    let clock = ManualClock::at_unix_ms(T0);
    let engine = engine(embedded(dir.path()), &bus, &clock, 10);
    let events = events_of(&bus, "watch").await;
    let big = SubmitTask {
        task_id: Some("tsk_big".into()),
        labels: [("note".to_owned(), "n".repeat(1000)), ("more".to_owned(), "m".repeat(600))].into(),
        ..SubmitTask::url("https://example.com/cat.jpg")
    };
    let small = SubmitTask { task_id: Some("tsk_small".into()), ..SubmitTask::url("https://example.com/cat.jpg") };
    engine.submit(&big, Origin::Http, String::new).await.unwrap();
    engine.submit(&small, Origin::Http, String::new).await.unwrap();
    assert_eq!(engine.start_queued().await.unwrap(), 1, "only the small task is still queued");

    let task = engine.store().get("tsk_big").await.unwrap().unwrap();
    assert_eq!(task.state, TaskState::Failed);
    let failure = task.failure.unwrap();
    assert_eq!((failure.step, failure.error.code.as_str()), (Step::Download, "message_too_large"));
    assert!(failure.error.message.contains("larger than the 1500 bytes"), "{}", failure.error.message);
    assert!(engine.store().outbox("tsk_big").await.unwrap().is_empty(), "nothing left for the relay to loop on");
    assert_eq!(engine.relay("tsk_big").await.unwrap(), 0);

    // task.created, then task.failed (it carries the same labels): both archived, neither sent.
    let letters = engine.store().dead_letters(10, None).await.unwrap().entries;
    let mut sources: Vec<_> = letters.iter().map(|l| (l.source.as_str(), l.dlq.as_str())).collect();
    sources.sort();
    assert_eq!(sources, [("task.created", "dlq.events.task"), ("task.failed", "dlq.events.task")]);
    assert!(letters.iter().all(|l| l.reason.contains("larger than") && l.key.as_deref() == Some("tsk_big")));
    let bodies: Vec<_> = drain(events.as_ref()).await;
    assert_eq!(event_types(&bodies), ["task.created"], "only the small task's event went out");
    let downloads = bus.queues.consume(queues::DOWNLOAD, consumer_config()).await.unwrap();
    let commands = drain(downloads.as_ref()).await;
    assert_eq!(commands.iter().map(|c| c.key.as_deref()).collect::<Vec<_>>(), [Some("tsk_small")]);
    assert_eq!(engine.store().get("tsk_small").await.unwrap().unwrap().state, TaskState::Downloading);
}

#[tokio::test]
async fn deadlines_and_retries_run_on_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    let bus = memory_bus();
    let clock = ManualClock::at_unix_ms(T0);
    let engine = engine(embedded(dir.path()), &bus, &clock, 10);
    let events = events_of(&bus, "watch").await;
    let downloads = bus.queues.consume(queues::DOWNLOAD, consumer_config()).await.unwrap();
    let submit = SubmitTask { task_id: Some("tsk_slow".into()), ..SubmitTask::url("https://example.com/a.jpg") };
    engine.submit(&submit, Origin::Http, || unreachable!()).await.unwrap();
    assert_eq!(engine.start_queued().await.unwrap(), 1);
    assert_eq!(drain(downloads.as_ref()).await.len(), 1);

    clock.advance(Duration::from_secs(299));
    engine.sweep().await.unwrap();
    assert_eq!(engine.store().get("tsk_slow").await.unwrap().unwrap().steps.download.attempts, 1, "not yet");

    clock.advance(Duration::from_secs(1));
    engine.sweep().await.unwrap();
    let task = engine.store().get("tsk_slow").await.unwrap().unwrap();
    let timer = task.timer.unwrap();
    assert_eq!((timer.kind, timer.attempt), (TimerKind::Retry, 2));
    assert_eq!(task.steps.download.last_error.unwrap().code, "deadline_exceeded");
    let published = drain(events.as_ref()).await;
    let retrying = Event::<serde_json::Value>::from_json(&published.last().unwrap().payload).unwrap();
    let retrying = retrying.into_typed::<TaskRetrying>().unwrap();
    assert_eq!((retrying.payload.step, retrying.payload.attempt), (Step::Download, 1));

    clock.advance(Duration::from_millis(timer.due_at - clock_ms(&clock)));
    engine.sweep().await.unwrap();
    let commands = drain(downloads.as_ref()).await;
    let command: DownloadCommand = serde_json::from_slice(&commands[0].payload).unwrap();
    assert_eq!(command.attempt, 2);
}

#[tokio::test]
async fn a_command_still_in_its_queue_is_not_charged_its_deadline() {
    use imagepipe_runtime::clock::{Clock, SystemClock};
    let dir = tempfile::tempdir().unwrap();
    let bus = memory_bus();
    // The memory bus dates its messages by the wall clock: the engine's clock starts from it.
    let clock = ManualClock::at_unix_ms(SystemClock.unix_ms());
    let engine = engine(embedded(dir.path()), &bus, &clock, 10);
    let downloads = bus.queues.consume(queues::DOWNLOAD, consumer_config()).await.unwrap();
    let submit = SubmitTask { task_id: Some("tsk_backlog".into()), ..SubmitTask::url("https://example.com/a.jpg") };
    engine.submit(&submit, Origin::Http, || unreachable!()).await.unwrap();
    assert_eq!(engine.start_queued().await.unwrap(), 1);

    // No worker took the command: a whole deadline later it still waits in the queue.
    clock.advance(Duration::from_secs(300));
    engine.sweep().await.unwrap();
    let task = engine.store().get("tsk_backlog").await.unwrap().unwrap();
    assert_eq!(task.steps.download.attempts, 1);
    assert!(task.steps.download.last_error.is_none(), "no attempt was charged: {task:?}");
    let history = engine.store().history("tsk_backlog").await.unwrap();
    let last = history.last().unwrap();
    assert_eq!(last.event, HistoryEvent::DeadlinePostponed, "{history:?}");
    assert!(
        last.detail.as_deref().unwrap().contains("still waits in the download queue or the results queue"),
        "{last:?}"
    );

    // A worker took it and went silent: the next deadline counts.
    assert_eq!(drain(downloads.as_ref()).await.len(), 1);
    clock.advance(Duration::from_secs(300));
    engine.sweep().await.unwrap();
    let task = engine.store().get("tsk_backlog").await.unwrap().unwrap();
    assert_eq!(task.steps.download.last_error.unwrap().code, "deadline_exceeded");
    assert_eq!(task.timer.map(|t| (t.kind, t.attempt)), Some((TimerKind::Retry, 2)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn start_passes_asked_for_at_once_start_each_task_once_up_to_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let bus = memory_bus();
    let clock = ManualClock::at_unix_ms(T0);
    let engine = engine(embedded(dir.path()), &bus, &clock, 10);
    for i in 0..20 {
        let submit =
            SubmitTask { task_id: Some(format!("tsk_rush{i:02}")), ..SubmitTask::url("https://example.com/a.jpg") };
        engine.submit(&submit, Origin::Http, || unreachable!()).await.unwrap();
    }
    // Eight loops ask at once: one pass runs, the others leave their request to it.
    let passes = (0..8).map(|_| {
        let engine = engine.clone();
        tokio::spawn(async move { engine.start_queued().await.unwrap() })
    });
    let started: usize = futures::future::join_all(passes).await.into_iter().map(Result::unwrap).sum();
    assert_eq!(started, 10, "the cap's room, once");
    let store = engine.store();
    assert_eq!(store.count_in_flight().await.unwrap(), 10);
    assert_eq!(store.count_queued().await.unwrap(), 10);
    // At the cap, a later pass starts nothing more.
    assert_eq!(engine.start_queued().await.unwrap(), 0, "still at the cap");
    let downloads = bus.queues.consume(queues::DOWNLOAD, consumer_config()).await.unwrap();
    assert_eq!(drain(downloads.as_ref()).await.len(), 10, "one command per started task");
}

fn clock_ms(clock: &ManualClock) -> u64 {
    use imagepipe_runtime::clock::Clock;
    clock.unix_ms()
}

/// A bus whose every send fails, as if the coordinator died right after its state write.
struct DeadBus;

#[async_trait]
impl TaskQueue for DeadBus {
    async fn send(&self, _queue: &str, _message: Message) -> Result<(), BusError> {
        Err(BusError::Closed)
    }
    async fn consume(&self, _queue: &str, _config: ConsumerConfig) -> Result<Box<dyn Consumer>, BusError> {
        Err(BusError::Closed)
    }
}

#[async_trait]
impl EventBus for DeadBus {
    async fn publish(&self, _event_type: &str, _message: Message) -> Result<(), BusError> {
        Err(BusError::Closed)
    }
    async fn subscribe(&self, _subscription: Subscription) -> Result<Box<dyn Consumer>, BusError> {
        Err(BusError::Closed)
    }
}

fn dead_bus() -> Bus {
    Bus::from_parts(Arc::new(DeadBus), Arc::new(DeadBus), Arc::new(|| false))
}

async fn crash_then_restart(before: Arc<dyn TaskStore>, after: impl FnOnce() -> Arc<dyn TaskStore>) {
    let clock = ManualClock::at_unix_ms(T0);
    {
        let crashed = engine(before, &dead_bus(), &clock, 10);
        let submit = SubmitTask { task_id: Some("tsk_crash".into()), ..SubmitTask::url("https://example.com/a.jpg") };
        assert!(crashed.submit(&submit, Origin::Http, || unreachable!()).await.unwrap().created);
        crashed.start_queued().await.unwrap();
        assert_eq!(crashed.store().outbox("tsk_crash").await.unwrap().len(), 2, "written, never published");
    }
    let bus = memory_bus();
    let events = events_of(&bus, "watch").await;
    let downloads = bus.queues.consume(queues::DOWNLOAD, consumer_config()).await.unwrap();
    let restarted = engine(after(), &bus, &clock, 10);
    restarted.sweep().await.unwrap();
    assert!(drain(events.as_ref()).await.is_empty(), "the fast path gets its grace period first");
    clock.advance(GRACE);
    restarted.sweep().await.unwrap();
    assert_eq!(event_types(&drain(events.as_ref()).await), ["task.created"]);
    let commands = drain(downloads.as_ref()).await;
    assert_eq!(commands.len(), 1);
    assert_eq!(commands[0].id.as_deref(), Some("tsk_crash.download.1"));
    assert!(restarted.store().outbox("tsk_crash").await.unwrap().is_empty());
}

#[tokio::test]
async fn a_crash_between_write_and_publish_is_published_on_restart_embedded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_owned();
    crash_then_restart(embedded(&path), move || embedded(&path)).await;
}

#[tokio::test]
async fn a_crash_between_write_and_publish_is_published_on_restart_redis() {
    let prefix = unique_prefix("crash");
    let _cleanup = RedisCleanup(prefix.clone());
    let before: Arc<dyn TaskStore> = Arc::new(RedisStore::connect(REDIS, &prefix, GRACE).await.unwrap());
    let after: Arc<dyn TaskStore> = Arc::new(RedisStore::connect(REDIS, &prefix, GRACE).await.unwrap());
    crash_then_restart(before, move || after).await;
}

#[tokio::test]
async fn two_replicas_on_one_redis_never_apply_a_transition_twice() {
    let prefix = unique_prefix("replicas");
    let _cleanup = RedisCleanup(prefix.clone());
    let bus = memory_bus();
    let clock = ManualClock::at_unix_ms(T0);
    let a = engine(Arc::new(RedisStore::connect(REDIS, &prefix, GRACE).await.unwrap()), &bus, &clock, 1_000);
    let b = engine(Arc::new(RedisStore::connect(REDIS, &prefix, GRACE).await.unwrap()), &bus, &clock, 1_000);
    let metadata = bus.queues.consume(queues::METADATA, consumer_config()).await.unwrap();
    let events = events_of(&bus, "watch").await;
    const TASKS: usize = 12;
    for i in 0..TASKS {
        let submit = SubmitTask { task_id: Some(format!("tsk_r{i}")), ..SubmitTask::url("https://example.com/a.jpg") };
        a.submit(&submit, Origin::Http, || unreachable!()).await.unwrap();
    }
    let (x, y) = tokio::join!(a.start_queued(), b.start_queued());
    assert_eq!(x.unwrap() + y.unwrap(), TASKS, "each task started once");

    for i in 0..TASKS {
        let id = format!("tsk_r{i}");
        let input = || Input::Result(Box::new(ok(&id, Step::Download, 1)));
        let (x, y) = tokio::join!(a.handle(&id, input()), b.handle(&id, input()),);
        let applied = [x.unwrap(), y.unwrap()].iter().filter(|h| matches!(h, Handled::Applied(_))).count();
        assert_eq!(applied, 1, "{id}: the same result fed to both replicas applies once");
    }
    assert_eq!(drain(metadata.as_ref()).await.len(), TASKS, "one metadata command per task");

    // both replicas sweep the same due deadlines at once
    clock.advance(Duration::from_secs(300) + GRACE);
    let (x, y) = tokio::join!(a.sweep(), b.sweep());
    assert_eq!(x.unwrap() + y.unwrap(), TASKS, "every due task claimed by exactly one replica");
    let retrying = event_types(&drain(events.as_ref()).await).into_iter().filter(|t| t == "task.retrying").count();
    assert_eq!(retrying, TASKS);
    for i in 0..TASKS {
        let history = a.store().history(&format!("tsk_r{i}")).await.unwrap();
        let events: Vec<_> = history.iter().map(|h| h.event).collect();
        assert_eq!(
            events,
            [HistoryEvent::Created, HistoryEvent::Started, HistoryEvent::StepSucceeded, HistoryEvent::RetryScheduled]
        );
    }
}

#[tokio::test]
async fn an_idempotency_key_returns_the_existing_task() {
    let dir = tempfile::tempdir().unwrap();
    let bus = memory_bus();
    let clock = ManualClock::at_unix_ms(T0);
    let engine = engine(embedded(dir.path()), &bus, &clock, 10);
    let submit =
        SubmitTask { idempotency_key: Some("order-7781".into()), ..SubmitTask::url("https://example.com/a.jpg") };
    let first = engine.submit(&submit, Origin::Http, || "tsk_first".into()).await.unwrap();
    let again = engine.submit(&submit, Origin::Bus, || "tsk_second".into()).await.unwrap();
    assert!(first.created && !again.created);
    assert_eq!(again.task.id, "tsk_first");
    assert!(engine.store().get("tsk_second").await.unwrap().is_none());
}

#[tokio::test]
async fn above_the_in_flight_cap_submissions_wait_in_their_queue() {
    let dir = tempfile::tempdir().unwrap();
    let bus = memory_bus();
    let clock = ManualClock::at_unix_ms(T0);
    let engine = engine(embedded(dir.path()), &bus, &clock, 1);
    let one = SubmitTask { task_id: Some("tsk_one".into()), ..SubmitTask::url("https://example.com/a.jpg") };
    engine.submit(&one, Origin::Http, || unreachable!()).await.unwrap();
    engine.start_queued().await.unwrap();
    assert!(!engine.has_room().await.unwrap());

    let gated = CappedConsumer::new(
        bus.queues.consume(queues::SUBMIT, consumer_config()).await.unwrap(),
        engine.clone(),
        Duration::from_millis(10),
    );
    let two = SubmitTask { task_id: Some("tsk_two".into()), ..SubmitTask::url("https://example.com/b.jpg") };
    bus.queues.send(queues::SUBMIT, Message::new(serde_json::to_vec(&two).unwrap())).await.unwrap();
    assert!(gated.fetch(10, Duration::from_millis(50)).await.unwrap().is_empty(), "full: nothing pulled");

    let failed = StepResult {
        task_id: "tsk_one".into(),
        step: Step::Download,
        attempt: 1,
        outcome: StepOutcome::Permanent { error: StepError::new("http_404", "gone") },
    };
    engine.handle("tsk_one", Input::Result(Box::new(failed))).await.unwrap();
    let pulled = gated.fetch(10, Duration::from_secs(5)).await.unwrap();
    assert_eq!(pulled.len(), 1, "room again: the waiting submission is pulled");
    let handler = SubmitHandler::new(engine.clone());
    assert_eq!(handler.handle(&pulled[0]).await, Outcome::Ack);
    assert_eq!(engine.store().get("tsk_two").await.unwrap().unwrap().state, TaskState::Downloading);
}

#[tokio::test]
async fn results_for_unknown_tasks_or_future_steps_are_refused_not_applied() {
    let dir = tempfile::tempdir().unwrap();
    let bus = memory_bus();
    let clock = ManualClock::at_unix_ms(T0);
    let engine = engine(embedded(dir.path()), &bus, &clock, 10);
    let handler = ResultHandler::new(engine.clone());
    let unknown =
        deliver(&bus, queues::RESULTS, serde_json::to_vec(&ok("tsk_nobody", Step::Download, 1)).unwrap()).await;
    assert!(matches!(handler.handle(&unknown).await, Outcome::Reject { reason } if reason.contains("unknown task")));

    let submit = SubmitTask { task_id: Some("tsk_f".into()), ..SubmitTask::url("https://example.com/a.jpg") };
    engine.submit(&submit, Origin::Http, || unreachable!()).await.unwrap();
    engine.start_queued().await.unwrap();
    let future = deliver(&bus, queues::RESULTS, serde_json::to_vec(&ok("tsk_f", Step::Analyze, 1)).unwrap()).await;
    assert!(matches!(handler.handle(&future).await, Outcome::Reject { .. }));
    let stale = engine.handle("tsk_f", Input::Start).await.unwrap();
    assert_eq!(stale, Handled::Ignored(Ignored::AlreadyStarted));
    assert_eq!(engine.store().get("tsk_f").await.unwrap().unwrap().version, 2);
}
