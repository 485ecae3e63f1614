//! The worker loop against the in-memory bus, in paused tokio time.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use imagepipe_bus::{Bus, BusConfig, BusError, Consumer, ConsumerConfig, Delivery, Message};
use imagepipe_contracts::names::{self, headers};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

use super::*;
use crate::backoff::Jitter;
use crate::control::{ControlStore, MemoryControl};
use imagepipe_contracts::Step;

const ACK_WAIT: Duration = Duration::from_secs(10);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn config(queue: &str, concurrency: usize) -> LoopConfig {
    LoopConfig {
        name: queue.into(),
        scheduling: Scheduling::Concurrent,
        concurrency,
        ack_wait: ACK_WAIT,
        handler_timeout: secs(120),
        shutdown_grace: secs(30),
        fetch_wait: secs(1),
        retry_backoff: ExponentialBackoff::new(secs(1), secs(60), Jitter::None).unwrap(),
        fetch_backoff: ExponentialBackoff::new(Duration::from_millis(100), secs(1), Jitter::None).unwrap(),
    }
}

fn consumer_config(max_deliveries: u32) -> ConsumerConfig {
    ConsumerConfig { ack_wait: ACK_WAIT, max_deliveries }
}

/// What a handler saw of one delivery.
#[derive(Debug, Clone)]
struct Seen {
    body: String,
    key: Option<String>,
    count: u32,
    at: Instant,
}

impl Seen {
    fn of(delivery: &Delivery) -> Self {
        Self {
            body: String::from_utf8_lossy(&delivery.message.payload).into_owned(),
            key: delivery.message.key.clone(),
            count: delivery.delivery_count,
            at: Instant::now(),
        }
    }
}

/// A handler from a closure over what it saw.
struct FnHandler<F>(F);

#[async_trait]
impl<F, Fut> Handler for FnHandler<F>
where
    F: Fn(Seen) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send,
{
    async fn handle(&self, delivery: &Delivery) -> Outcome {
        (self.0)(Seen::of(delivery)).await
    }
}

/// A handler that reports every delivery on a channel, then does what `then` says.
fn reporting<F, Fut>(then: F) -> (impl Handler, mpsc::UnboundedReceiver<Seen>)
where
    F: Fn(Seen) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let (tx, rx) = mpsc::unbounded_channel();
    let then = Arc::new(then);
    let handler = FnHandler(move |seen: Seen| {
        tx.send(seen.clone()).expect("test receiver alive");
        then(seen)
    });
    (handler, rx)
}

struct Running {
    bus: Bus,
    shutdown: Shutdown,
    worker: JoinHandle<Result<(), WorkerError>>,
}

async fn start(handler: impl Handler, config: LoopConfig, consumer: ConsumerConfig, messages: Vec<Message>) -> Running {
    let bus = Bus::connect(&BusConfig::default()).await.unwrap();
    let queue = config.name.clone();
    bus.queues.send_batch(&queue, messages).await.unwrap();
    let consumer = bus.queues.consume(&queue, consumer).await.unwrap();
    start_with(bus, consumer, handler, config)
}

fn start_with(bus: Bus, consumer: Box<dyn Consumer>, handler: impl Handler, config: LoopConfig) -> Running {
    let shutdown = Shutdown::new();
    let worker = tokio::spawn(Worker::new(consumer, handler, config).run(shutdown.clone()));
    Running { bus, shutdown, worker }
}

impl Running {
    /// Triggers shutdown and waits for the worker to return `Ok`.
    async fn stop(self) -> Bus {
        self.shutdown.trigger();
        timeout(secs(600), self.worker).await.expect("worker stops").unwrap().expect("worker returns Ok");
        self.bus
    }
}

/// The next `n` reports, failing if they do not come within an hour of (paused) time.
async fn next(rx: &mut mpsc::UnboundedReceiver<Seen>, n: usize) -> Vec<Seen> {
    let mut seen = Vec::new();
    for _ in 0..n {
        seen.push(timeout(secs(3600), rx.recv()).await.expect("handler called in time").unwrap());
    }
    seen
}

/// Every message still on `queue` once in-flight deadlines have passed, via a fresh consumer.
async fn left_on(bus: &Bus, queue: &str) -> Vec<Delivery> {
    let consumer =
        bus.queues.consume(queue, ConsumerConfig { ack_wait: secs(3600), max_deliveries: 100 }).await.unwrap();
    sleep(ACK_WAIT * 2).await;
    consumer.fetch(1000, secs(1)).await.unwrap()
}

fn messages(bodies: &[&str]) -> Vec<Message> {
    bodies.iter().map(|b| Message::new(b.to_string())).collect()
}

#[tokio::test(start_paused = true)]
async fn a_handled_message_is_acked_and_never_redelivered() {
    let queue = "tasks.ack";
    let (handler, mut rx) = reporting(|_| async { Outcome::Ack });
    let running = start(handler, config(queue, 2), consumer_config(5), messages(&["a", "b"])).await;
    let mut bodies: Vec<_> = next(&mut rx, 2).await.into_iter().map(|s| (s.body, s.count)).collect();
    bodies.sort();
    assert_eq!(bodies, [("a".to_string(), 1), ("b".to_string(), 1)]);

    sleep(ACK_WAIT * 3).await;
    assert!(rx.try_recv().is_err(), "nothing redelivered");
    let bus = running.stop().await;
    assert!(left_on(&bus, queue).await.is_empty());
    assert!(left_on(&bus, &names::dead_letter_queue(queue)).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_retry_with_a_delay_is_redelivered_after_it() {
    let queue = "tasks.retry-delay";
    let (handler, mut rx) = reporting(|seen: Seen| async move {
        if seen.count == 1 { Outcome::retry_after(secs(7), "not yet") } else { Outcome::Ack }
    });
    let running = start(handler, config(queue, 2), consumer_config(5), messages(&["x"])).await;
    let seen = next(&mut rx, 2).await;
    assert_eq!((seen[0].count, seen[1].count), (1, 2));
    let gap = seen[1].at - seen[0].at;
    assert!(gap >= secs(7) && gap < secs(8), "redelivered after {gap:?}");
    let bus = running.stop().await;
    assert!(left_on(&bus, queue).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_retry_without_a_delay_backs_off_by_delivery_count() {
    let queue = "tasks.retry-backoff";
    let (handler, mut rx) =
        reporting(|seen: Seen| async move { if seen.count < 4 { Outcome::retry("flaky") } else { Outcome::Ack } });
    let running = start(handler, config(queue, 1), consumer_config(5), messages(&["x"])).await;
    let seen = next(&mut rx, 4).await;
    let gaps: Vec<_> = seen.windows(2).map(|w| (w[1].at - w[0].at).as_millis() / 100).collect();
    assert_eq!(gaps, [10, 20, 40], "1 s doubling, in tenths of a second");
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_rejected_message_goes_to_the_dead_letter_queue_at_once() {
    let queue = "tasks.reject";
    let metrics = crate::metrics::install().unwrap();
    let (handler, mut rx) = reporting(|_| async { Outcome::reject("not an image") });
    let running = start(handler, config(queue, 2), consumer_config(5), messages(&["junk"])).await;
    next(&mut rx, 1).await;
    sleep(ACK_WAIT * 3).await;
    assert!(rx.try_recv().is_err(), "a rejected message is not retried");
    let bus = running.stop().await;

    let dead = left_on(&bus, &names::dead_letter_queue(queue)).await;
    assert_eq!(dead.len(), 1);
    let headers = &dead[0].message.headers;
    assert_eq!(headers.get(headers::DLQ_REASON), Some("not an image"));
    assert_eq!(headers.get(headers::DLQ_DELIVERY_COUNT), Some("1"));
    assert_eq!(&dead[0].message.payload[..], b"junk");
    assert!(left_on(&bus, queue).await.is_empty());

    let text = metrics.render();
    for line in [
        r#"imagepipe_messages_handled_total{source="tasks.reject",outcome="reject"} 1"#,
        r#"imagepipe_messages_dead_lettered_total{source="tasks.reject",reason="rejected"} 1"#,
        r#"imagepipe_messages_in_flight{source="tasks.reject"} 0"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_panicking_handler_is_retried_then_dead_lettered_at_max_deliveries() {
    let queue = "tasks.panic";
    let (handler, mut rx) = reporting(|seen: Seen| async move {
        if seen.count > 0 {
            panic!("boom on delivery {}", seen.count);
        }
        Outcome::Ack
    });
    let running = start(handler, config(queue, 2), consumer_config(3), messages(&["p"])).await;
    let counts: Vec<_> = next(&mut rx, 3).await.into_iter().map(|s| s.count).collect();
    assert_eq!(counts, [1, 2, 3]);
    sleep(ACK_WAIT * 3).await;
    assert!(rx.try_recv().is_err(), "no fourth delivery");
    let bus = running.stop().await;

    let dead = left_on(&bus, &names::dead_letter_queue(queue)).await;
    assert_eq!(dead.len(), 1);
    let reason = dead[0].message.headers.get(headers::DLQ_REASON).unwrap();
    assert!(
        reason.contains("max deliveries (3)") && reason.contains("handler panicked: boom on delivery 3"),
        "{reason}"
    );
}

/// Sets its flag when dropped: proves an abandoned handler was stopped.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[tokio::test(start_paused = true)]
async fn a_handler_past_its_timeout_is_stopped_and_its_message_retried() {
    let queue = "tasks.timeout";
    let stopped = Arc::new(AtomicBool::new(false));
    let flag = stopped.clone();
    let (handler, mut rx) = reporting(move |seen: Seen| {
        let guard = DropFlag(flag.clone());
        async move {
            if seen.count == 1 {
                sleep(secs(3600)).await;
            }
            drop(guard);
            Outcome::Ack
        }
    });
    let mut config = config(queue, 2);
    config.handler_timeout = secs(5);
    let running = start(handler, config, consumer_config(5), messages(&["slow"])).await;
    let seen = next(&mut rx, 2).await;
    assert_eq!((seen[0].count, seen[1].count), (1, 2));
    let gap = seen[1].at - seen[0].at;
    assert!(gap >= secs(5) + secs(1) && gap < secs(7), "timeout, then 1 s backoff: {gap:?}");
    assert!(stopped.load(Ordering::SeqCst), "the timed-out handler was dropped");
    let bus = running.stop().await;
    assert!(left_on(&bus, queue).await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn progress_keeps_a_slow_handlers_message_from_redelivery() {
    let queue = "tasks.progress";
    let (handler, mut rx) = reporting(|_| async {
        sleep(ACK_WAIT * 6).await;
        Outcome::Ack
    });
    let running = start(handler, config(queue, 4), consumer_config(5), messages(&["long"])).await;
    assert_eq!(next(&mut rx, 1).await[0].count, 1);
    sleep(ACK_WAIT * 10).await;
    assert!(rx.try_recv().is_err(), "the message was redelivered while its handler ran");
    let bus = running.stop().await;
    assert!(left_on(&bus, queue).await.is_empty(), "acked in the end");
}

#[tokio::test(start_paused = true)]
async fn never_more_than_concurrency_messages_are_handled_at_once() {
    let queue = "tasks.bound";
    let active = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let (a, p) = (active.clone(), peak.clone());
    let (handler, mut rx) = reporting(move |_| {
        let (active, peak) = (a.clone(), p.clone());
        async move {
            let now = active.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            sleep(secs(1)).await;
            active.fetch_sub(1, Ordering::SeqCst);
            Outcome::Ack
        }
    });
    let bodies: Vec<String> = (0..20).map(|i| i.to_string()).collect();
    let bodies: Vec<&str> = bodies.iter().map(String::as_str).collect();
    let running = start(handler, config(queue, 3), consumer_config(5), messages(&bodies)).await;
    next(&mut rx, 20).await;
    let bus = running.stop().await;
    assert_eq!(peak.load(Ordering::SeqCst), 3, "peak in flight");
    assert!(left_on(&bus, queue).await.is_empty());
}

/// What a run over keyed messages observed.
#[derive(Debug, Default)]
struct KeyedRun {
    /// Most deliveries of one key handled at once.
    peak_per_key: usize,
    /// Most deliveries handled at once.
    peak: usize,
    /// Bodies in handling order, per key.
    order: HashMap<String, Vec<String>>,
    /// Deliveries handled more than once.
    redelivered: usize,
}

/// Three keys, five messages each, sent key after key; each takes 4 s to handle, so with four
/// held at once the ones waiting behind their key outlive the 10 s ack wait.
async fn run_keyed(queue: &str, scheduling: Scheduling) -> KeyedRun {
    let run = Arc::new(Mutex::new(KeyedRun::default()));
    let active: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let (r, a) = (run.clone(), active.clone());
    let (handler, mut rx) = reporting(move |seen: Seen| {
        let (run, active) = (r.clone(), a.clone());
        async move {
            let key = seen.key.clone().unwrap();
            {
                let mut active = active.lock().unwrap();
                *active.entry(key.clone()).or_default() += 1;
                let mut run = run.lock().unwrap();
                run.peak_per_key = run.peak_per_key.max(active[&key]);
                run.peak = run.peak.max(active.values().sum());
                run.order.entry(key.clone()).or_default().push(seen.body.clone());
                run.redelivered += usize::from(seen.count > 1);
            }
            sleep(secs(4)).await;
            *active.lock().unwrap().get_mut(&key).unwrap() -= 1;
            Outcome::Ack
        }
    });
    let mut sent = Vec::new();
    for key in ["a", "b", "c"] {
        for i in 0..5 {
            sent.push(Message::new(format!("{key}{i}")).with_key(key));
        }
    }
    let mut config = config(queue, 4);
    config.scheduling = scheduling;
    let running = start(handler, config, consumer_config(5), sent).await;
    next(&mut rx, 15).await;
    sleep(ACK_WAIT * 3).await;
    assert!(rx.try_recv().is_err(), "every message handled once");
    let bus = running.stop().await;
    assert!(left_on(&bus, queue).await.is_empty());
    Arc::try_unwrap(run).unwrap().into_inner().unwrap()
}

#[tokio::test(start_paused = true)]
async fn orderly_mode_handles_one_message_per_key_at_a_time_in_order() {
    let run = run_keyed("tasks.orderly", Scheduling::Orderly).await;
    assert_eq!(run.peak_per_key, 1, "two messages of one key ran at once");
    assert!(run.peak > 1, "different keys ran in parallel");
    for key in ["a", "b", "c"] {
        let want: Vec<String> = (0..5).map(|i| format!("{key}{i}")).collect();
        assert_eq!(run.order[key], want, "order of key {key}");
    }
    assert_eq!(run.redelivered, 0, "waiting messages were kept alive with progress");
}

#[tokio::test(start_paused = true)]
async fn concurrent_mode_does_run_one_keys_messages_at_once() {
    let run = run_keyed("tasks.unordered", Scheduling::Concurrent).await;
    assert!(run.peak_per_key > 1, "the orderly test's check can fail: {run:?}");
}

#[tokio::test(start_paused = true)]
async fn shutdown_lets_fetched_messages_finish_then_returns() {
    let queue = "tasks.drain";
    let (handler, mut rx) = reporting(|_| async {
        sleep(secs(5)).await;
        Outcome::Ack
    });
    let running = start(handler, config(queue, 2), consumer_config(5), messages(&["1", "2"])).await;
    next(&mut rx, 2).await;
    let started = Instant::now();
    let bus = running.stop().await;
    assert!(started.elapsed() >= secs(5), "stopped before the handlers finished");
    assert!(left_on(&bus, queue).await.is_empty(), "both finished and were acked");
}

#[tokio::test(start_paused = true)]
async fn shutdown_past_the_grace_period_leaves_the_message_for_redelivery() {
    let queue = "tasks.abandon";
    let stopped = Arc::new(AtomicBool::new(false));
    let flag = stopped.clone();
    let (handler, mut rx) = reporting(move |_| {
        let guard = DropFlag(flag.clone());
        async move {
            sleep(secs(3600)).await;
            drop(guard);
            Outcome::Ack
        }
    });
    let mut config = config(queue, 2);
    config.shutdown_grace = secs(2);
    let running = start(handler, config, consumer_config(5), messages(&["stuck"])).await;
    next(&mut rx, 1).await;
    let started = Instant::now();
    let bus = running.stop().await;
    assert!(started.elapsed() >= secs(2) && started.elapsed() < secs(3), "{:?}", started.elapsed());
    assert!(stopped.load(Ordering::SeqCst), "the abandoned handler was dropped");
    let left = left_on(&bus, queue).await;
    assert_eq!(left.len(), 1, "the unsettled message is redelivered");
    assert_eq!(left[0].delivery_count, 2);
}

/// Fails its first `failures` fetches, then fetches from `inner`.
struct Flaky {
    inner: Box<dyn Consumer>,
    failures: usize,
    calls: Arc<AtomicUsize>,
}

#[async_trait]
impl Consumer for Flaky {
    async fn fetch(&self, max: usize, wait: Duration) -> Result<Vec<Delivery>, BusError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.failures {
            return Err(BusError::Receive { source_name: "tasks.flaky".into(), source: "broker hiccup".into() });
        }
        self.inner.fetch(max, wait).await
    }
}

#[tokio::test(start_paused = true)]
async fn fetch_errors_are_retried_with_backoff() {
    let queue = "tasks.flaky";
    let bus = Bus::connect(&BusConfig::default()).await.unwrap();
    bus.queues.send(queue, Message::new("m")).await.unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let consumer = Flaky {
        inner: bus.queues.consume(queue, consumer_config(5)).await.unwrap(),
        failures: 3,
        calls: calls.clone(),
    };
    let (handler, mut rx) = reporting(|_| async { Outcome::Ack });
    let started = Instant::now();
    let running = start_with(bus, Box::new(consumer), handler, config(queue, 2));
    let seen = next(&mut rx, 1).await;
    assert_eq!(seen[0].at - started, Duration::from_millis(100 + 200 + 400), "three backoffs");
    assert!(calls.load(Ordering::SeqCst) >= 4);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_closed_bus_stops_the_worker_with_an_error() {
    let bus = Bus::connect(&BusConfig::default()).await.unwrap();
    let consumer = bus.queues.consume("tasks.closing", consumer_config(5)).await.unwrap();
    let (handler, _rx) = reporting(|_| async { Outcome::Ack });
    let worker = tokio::spawn(Worker::new(consumer, handler, config("tasks.closing", 2)).run(Shutdown::new()));
    sleep(secs(2)).await;
    drop(bus);
    let result = timeout(secs(60), worker).await.expect("worker stops").unwrap();
    assert!(matches!(result, Err(WorkerError::Closed { .. })), "{result:?}");
}

#[tokio::test(start_paused = true)]
async fn an_unusable_config_is_refused() {
    let bus = Bus::connect(&BusConfig::default()).await.unwrap();
    let consumer = bus.queues.consume("tasks.refused", consumer_config(5)).await.unwrap();
    let (handler, _rx) = reporting(|_| async { Outcome::Ack });
    let result = Worker::new(consumer, handler, config("tasks.refused", 0)).run(Shutdown::new()).await;
    assert!(matches!(result, Err(WorkerError::Invalid { .. })), "{result:?}");
}

#[tokio::test(start_paused = true)]
async fn the_handler_runs_in_the_trace_of_the_message() {
    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (subscriber, _telemetry) = crate::telemetry::subscriber(
        crate::config::LogFormat::Text,
        crate::telemetry::env_filter(None, "info").unwrap(),
        crate::telemetry::tracer_provider("worker-test", None).unwrap(),
        std::io::sink,
    );
    let _guard = tracing::subscriber::set_default(subscriber);
    let trace_ids = Arc::new(Mutex::new(Vec::new()));
    let ids = trace_ids.clone();
    let (handler, mut rx) = reporting(move |_| {
        let ids = ids.clone();
        async move {
            let mut outgoing = imagepipe_bus::Headers::new();
            crate::telemetry::inject_traceparent(&mut outgoing);
            ids.lock().unwrap().push((crate::telemetry::current_trace_id(), outgoing));
            Outcome::Ack
        }
    });
    let sent = Message::new("traced").with_header(headers::TRACEPARENT, TRACEPARENT);
    let running = start(handler, config("tasks.traced", 1), consumer_config(5), vec![sent]).await;
    next(&mut rx, 1).await;
    running.stop().await;
    let (trace_id, outgoing) = trace_ids.lock().unwrap().pop().unwrap();
    assert_eq!(trace_id.unwrap().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
    let outgoing = imagepipe_contracts::TraceId::from_traceparent(outgoing.traceparent().unwrap()).unwrap();
    assert_eq!(outgoing.to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
}

// --- operator controls ----------------------------------------------------------------------

/// How often the controlled workers below read the control state.
const REFRESH: Duration = Duration::from_millis(50);

fn unix_ms() -> u64 {
    use crate::clock::Clock;
    crate::clock::SystemClock.unix_ms()
}

/// A worker on `queue` following the control state in `store`, on a fresh memory bus.
async fn start_controlled(
    handler: impl Handler,
    config: LoopConfig,
    store: &Arc<MemoryControl>,
    messages: Vec<Message>,
) -> Running {
    let bus = Bus::connect(&BusConfig::default()).await.unwrap();
    let queue = config.name.clone();
    bus.queues.send_batch(&queue, messages).await.unwrap();
    let consumer = bus.queues.consume(&queue, consumer_config(5)).await.unwrap();
    let control = Control::new(store.clone(), queue).with_refresh(REFRESH);
    let shutdown = Shutdown::new();
    let worker = tokio::spawn(Worker::new(consumer, handler, config).controlled(control).run(shutdown.clone()));
    Running { bus, shutdown, worker }
}

/// Counts handlers running at once, and the most seen since the last [`Gauge::reset`].
#[derive(Clone, Default)]
struct Gauge {
    active: Arc<AtomicUsize>,
    peak: Arc<AtomicUsize>,
}

impl Gauge {
    fn enter(&self) {
        let now = self.active.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.active.fetch_sub(1, Ordering::SeqCst);
    }

    fn reset(&self) -> usize {
        self.peak.swap(0, Ordering::SeqCst)
    }
}

async fn depth(bus: &Bus, queue: &str) -> imagepipe_bus::Backlog {
    bus.queues.backlog(queue).await.unwrap().unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn a_paused_queue_takes_no_new_messages_finishes_held_ones_and_resumes_them_all() {
    let queue = "tasks.paused";
    let store = Arc::new(MemoryControl::ephemeral());
    let (handler, mut rx) = reporting(|seen: Seen| async move {
        if seen.body == "held" {
            sleep(secs(5)).await;
        }
        Outcome::Ack
    });
    let running = start_controlled(handler, config(queue, 4), &store, messages(&["held"])).await;
    assert_eq!(next(&mut rx, 1).await[0].body, "held");

    store.set_paused(queue, true, unix_ms()).await.unwrap();
    // within a refresh the worker sees it, and stops once its current fetch (≤ 1 s) ends
    sleep(secs(2)).await;
    running.bus.queues.send_batch(queue, messages(&["a", "b", "c"])).await.unwrap();
    sleep(ACK_WAIT * 3).await;
    assert!(rx.try_recv().is_err(), "a message was taken while the queue was paused");
    let backlog = depth(&running.bus, queue).await;
    assert_eq!((backlog.waiting, backlog.unacked), (3, 0), "three wait, the held one finished and was acked");

    store.set_paused(queue, false, unix_ms()).await.unwrap();
    let mut bodies: Vec<_> = next(&mut rx, 3).await.into_iter().map(|s| (s.body, s.count)).collect();
    bodies.sort();
    assert_eq!(bodies, [("a".into(), 1), ("b".into(), 1), ("c".into(), 1)], "each handled once, first delivery");
    sleep(ACK_WAIT * 3).await;
    assert!(rx.try_recv().is_err(), "nothing redelivered");
    let bus = running.stop().await;
    assert!(left_on(&bus, queue).await.is_empty());
    assert!(left_on(&bus, &names::dead_letter_queue(queue)).await.is_empty(), "nothing dead-lettered");
}

#[tokio::test(start_paused = true)]
async fn a_paused_worker_reports_the_pause_it_obeys_once_no_fetch_is_outstanding() {
    let queue = "tasks.obeys";
    let store = Arc::new(MemoryControl::ephemeral());
    let (handler, mut rx) = reporting(|_| async { Outcome::Ack });
    let running = start_controlled(handler, config(queue, 2), &store, messages(&["a"])).await;
    next(&mut rx, 1).await;
    let activity = |store: Arc<MemoryControl>| async move { store.activity(queue, unix_ms()).await.unwrap() };
    let paused_at = unix_ms();
    store.set_paused(queue, true, paused_at).await.unwrap();
    let control = store.state().await.unwrap().queue(queue);
    let started = Instant::now();
    while !activity(store.clone()).await.pause_in_force(&control) {
        assert!(started.elapsed() < secs(3), "never reported: {:?}", activity(store.clone()).await);
        sleep(Duration::from_millis(10)).await;
    }
    let now = activity(store.clone()).await;
    assert_eq!((now.consumers, now.paused, now.oldest_pause, now.in_flight), (1, 1, paused_at, 0), "{now:?}");
    store.set_paused(queue, false, unix_ms()).await.unwrap();
    let started = Instant::now();
    while activity(store.clone()).await.paused > 0 {
        assert!(started.elapsed() < secs(3), "the resume was never reported");
        sleep(Duration::from_millis(10)).await;
    }
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_pause_while_every_slot_is_busy_stops_the_worker_before_its_next_fetch() {
    let queue = "tasks.paused-busy";
    let store = Arc::new(MemoryControl::ephemeral());
    let (handler, mut rx) = reporting(|seen: Seen| async move {
        if seen.body == "held" {
            sleep(secs(5)).await;
        }
        Outcome::Ack
    });
    // one slot, taken by the held message: the loop waits for room, not in a fetch
    let running = start_controlled(handler, config(queue, 1), &store, messages(&["held", "next"])).await;
    assert_eq!(next(&mut rx, 1).await[0].body, "held");
    store.set_paused(queue, true, unix_ms()).await.unwrap();
    sleep(secs(30)).await;
    assert!(rx.try_recv().is_err(), "the slot freed while paused was used to take a new message");
    assert_eq!(depth(&running.bus, queue).await.waiting, 1);

    store.set_paused(queue, false, unix_ms()).await.unwrap();
    assert_eq!(next(&mut rx, 1).await[0].body, "next");
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn the_per_replica_concurrency_is_followed_live() {
    let queue = "tasks.live-concurrency";
    let store = Arc::new(MemoryControl::ephemeral());
    store.set_concurrency(queue, Some(1), unix_ms()).await.unwrap();
    let gauge = Gauge::default();
    let g = gauge.clone();
    let (handler, mut rx) = reporting(move |_| {
        let gauge = g.clone();
        async move {
            gauge.enter();
            sleep(secs(1)).await;
            gauge.leave();
            Outcome::Ack
        }
    });
    let bodies: Vec<String> = (0..40).map(|i| i.to_string()).collect();
    let bodies: Vec<&str> = bodies.iter().map(String::as_str).collect();
    let running = start_controlled(handler, config(queue, 4), &store, messages(&bodies[..6])).await;
    next(&mut rx, 6).await;
    assert_eq!(gauge.reset(), 1, "set to 1 before the start");

    store.set_concurrency(queue, Some(3), unix_ms()).await.unwrap();
    sleep(secs(2)).await;
    running.bus.queues.send_batch(queue, messages(&bodies[6..18])).await.unwrap();
    next(&mut rx, 12).await;
    assert_eq!(gauge.reset(), 3, "raised to 3");

    store.set_concurrency(queue, None, unix_ms()).await.unwrap();
    sleep(secs(2)).await;
    running.bus.queues.send_batch(queue, messages(&bodies[18..34])).await.unwrap();
    next(&mut rx, 16).await;
    assert_eq!(gauge.reset(), 4, "cleared: back to the loop's own concurrency");

    store.set_concurrency(queue, Some(1), unix_ms()).await.unwrap();
    sleep(secs(2)).await;
    running.bus.queues.send_batch(queue, messages(&bodies[34..])).await.unwrap();
    next(&mut rx, 6).await;
    assert_eq!(gauge.reset(), 1, "lowered to 1 again");
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn raising_the_concurrency_applies_while_every_slot_is_busy() {
    let queue = "tasks.raise-busy";
    let store = Arc::new(MemoryControl::ephemeral());
    store.set_concurrency(queue, Some(1), unix_ms()).await.unwrap();
    let gauge = Gauge::default();
    let g = gauge.clone();
    let (handler, mut rx) = reporting(move |_| {
        let gauge = g.clone();
        async move {
            gauge.enter();
            sleep(secs(60)).await;
            gauge.leave();
            Outcome::Ack
        }
    });
    let running = start_controlled(handler, config(queue, 4), &store, messages(&["1", "2", "3", "4"])).await;
    next(&mut rx, 1).await;
    sleep(secs(5)).await;
    assert_eq!(gauge.active.load(Ordering::SeqCst), 1);
    store.set_concurrency(queue, Some(3), unix_ms()).await.unwrap();
    let started = Instant::now();
    next(&mut rx, 2).await;
    assert!(started.elapsed() < secs(2), "the raise waited for the running handler: {:?}", started.elapsed());
    assert_eq!(gauge.active.load(Ordering::SeqCst), 3);
    running.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_controlled_worker_reports_its_consumer_messages_in_flight_and_rate() {
    let queue = "tasks.beats";
    let store = Arc::new(MemoryControl::ephemeral());
    let (handler, mut rx) = reporting(|seen: Seen| async move {
        if seen.body == "stuck" {
            sleep(secs(3600)).await;
        }
        Outcome::Ack
    });
    let running = start_controlled(handler, config(queue, 3), &store, messages(&["stuck", "a", "b", "c", "d"])).await;
    next(&mut rx, 5).await;
    // the loop reports its in-flight count as it goes round (each fetch waits up to 1 s)
    sleep(secs(2)).await;
    let activity = store.activity(queue, unix_ms()).await.unwrap();
    assert_eq!(activity.consumers, 1, "{activity:?}");
    assert_eq!(activity.in_flight, 1, "the stuck message: {activity:?}");
    assert_eq!(activity.concurrency, 3, "{activity:?}");
    assert!(activity.rate_per_sec > 0.0, "five taken: {activity:?}");
    assert_eq!(store.activity("tasks.other", unix_ms()).await.unwrap().consumers, 0);
    running.stop().await;
}

/// A download step that runs until it is stopped, saying when it started.
struct Endless(mpsc::UnboundedSender<String>);

#[async_trait]
impl crate::step::StepHandler for Endless {
    type Command = imagepipe_contracts::DownloadCommand;

    async fn process(
        &self,
        command: &Self::Command,
    ) -> Result<imagepipe_contracts::step::DownloadOutput, crate::step::StepFailure> {
        self.0.send(command.task_id.clone()).unwrap();
        sleep(secs(3600)).await;
        Err(crate::step::StepFailure::permanent("too_slow", "never finishes"))
    }
}

#[tokio::test(start_paused = true)]
async fn cancelling_a_task_stops_its_running_step_which_reports_cancelled() {
    use imagepipe_contracts::names::queues;
    use imagepipe_contracts::{DownloadCommand, ImageSource, StepOutcome, StepResult};

    let queue = "tasks.download";
    let store = Arc::new(MemoryControl::ephemeral());
    let bus = Bus::connect(&BusConfig::default()).await.unwrap();
    let results = bus.queues.consume(queues::RESULTS, consumer_config(5)).await.unwrap();
    let command = |task_id: &str| {
        let command = DownloadCommand {
            task_id: task_id.into(),
            attempt: 2,
            source: ImageSource::Url("https://example.com/cat.jpg".into()),
            labels: Default::default(),
        };
        Message::new(serde_json::to_vec(&command).unwrap())
    };
    bus.queues.send_batch(queue, vec![command("tsk_stop"), command("tsk_keep")]).await.unwrap();

    let control = Control::new(store.clone(), queue).with_refresh(REFRESH);
    let (tx, mut started) = mpsc::unbounded_channel();
    let reporter = crate::step::StepReporter::new(bus.clone(), "download-worker", Arc::new(crate::clock::SystemClock));
    let handler = crate::step::Reporting::new(Endless(tx), reporter).with_cancels(control.cancels());
    let consumer = bus.queues.consume(queue, consumer_config(5)).await.unwrap();
    let shutdown = Shutdown::new();
    let worker =
        tokio::spawn(Worker::new(consumer, handler, config(queue, 2)).controlled(control).run(shutdown.clone()));
    let mut running = vec![started.recv().await.unwrap(), started.recv().await.unwrap()];
    running.sort();
    assert_eq!(running, ["tsk_keep", "tsk_stop"]);

    store.request_cancel("tsk_stop", unix_ms()).await.unwrap();
    let asked = Instant::now();
    let delivered = results.fetch(1, secs(60)).await.unwrap().pop().expect("a result");
    assert!(asked.elapsed() <= REFRESH * 2, "stopped {:?} after the request", asked.elapsed());
    let result: StepResult = serde_json::from_slice(&delivered.message.payload).unwrap();
    assert_eq!((result.task_id.as_str(), result.step, result.attempt), ("tsk_stop", Step::Download, 2));
    let StepOutcome::Retryable { error, .. } = &result.outcome else { panic!("{:?}", result.outcome) };
    assert_eq!(error.code, crate::step::CANCELLED);
    delivered.ack().await.unwrap();

    // the other task's step runs on, and the stopped step's command was acked
    sleep(secs(5)).await;
    assert!(results.fetch(1, Duration::ZERO).await.unwrap().is_empty(), "tsk_keep still runs");
    assert_eq!(depth(&bus, queue).await.depth(), 1, "only tsk_keep's command is held");
    shutdown.trigger();
    timeout(secs(600), worker).await.expect("worker stops").unwrap().expect("worker returns Ok");
}

#[derive(Debug, thiserror::Error)]
#[error("{text}")]
struct Layer {
    text: String,
    #[source]
    source: Option<Box<Layer>>,
}

fn layers(texts: &[&str]) -> Layer {
    texts
        .iter()
        .rev()
        .fold(None, |source, text| Some(Layer { text: (*text).to_owned(), source: source.map(Box::new) }))
        .expect("at least one layer")
}

#[test]
fn an_error_chain_names_every_cause_once() {
    let plain = layers(&["opening the store", "redis connecting", "connection refused"]);
    assert_eq!(error_chain(&plain), "opening the store: redis connecting: connection refused");

    // reqwest's errors and `{source}` variants carry their source's text already.
    let url = "error sending request for url (http://127.0.0.1:9/v1/tasks)";
    let doubled =
        layers(&[&format!("cannot reach the API: {url}"), url, "client error (Connect)", "connection refused"]);
    assert_eq!(
        error_chain(&doubled),
        format!("cannot reach the API: {url}: client error (Connect): connection refused"),
        "the repeated source is left out, the causes after it are kept"
    );
    assert_eq!(error_chain(&layers(&["same", "same", "same"])), "same");
}
