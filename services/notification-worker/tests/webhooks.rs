//! The notification worker end to end on the memory bus: finished-task events in, webhooks
//! signed the Standard Webhooks way out to loopback fixture servers (per-target keys, the
//! warning about unsigned targets, redacted URLs); retries, dead letters and the SSRF guard.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use imagepipe_bus::{Bus, BusConfig, Consumer, ConsumerConfig, Message};
use imagepipe_contracts::names::{self, headers};
use imagepipe_contracts::payload::{TaskCompleted, TaskFailed};
use imagepipe_contracts::step::{AnalysisOutput, DownloadOutput, StepError};
use imagepipe_contracts::{Event, Step, TraceId};
use imagepipe_net::StaticResolver;
use imagepipe_net::testing::{FixtureServer, LoopbackOnly, Recorded, Route};
use imagepipe_notification_worker::sign::{
    EVENT_TYPE_HEADER, ID_HEADER, SIGNATURE_HEADER, Signed, TIMESTAMP_HEADER, VerifyError, WebhookSecret, unix_seconds,
    verify,
};
use imagepipe_notification_worker::{GROUP, client_builder, run_with_client, subscription};
use imagepipe_runtime::config::WebhookTarget;
use imagepipe_runtime::metrics::{MESSAGES_HANDLED, SUBSCRIBER_DUPLICATES, labels, outcome};
use imagepipe_runtime::{Settings, Shutdown};
use tokio::task::JoinHandle;

/// `notification.secret` of these tests, in the Standard Webhooks form.
const SECRET: &str = "whsec_d2ViaG9vay10ZXN0LXNlY3JldA==";

fn key(text: &str) -> WebhookSecret {
    WebhookSecret::parse(text).unwrap()
}

struct Running {
    bus: Bus,
    dial: LoopbackOnly,
    shutdown: Shutdown,
    worker: JoinHandle<()>,
    /// The metrics recorder is process-wide: tests sharing a process run one at a time.
    _serial: tokio::sync::MutexGuard<'static, ()>,
    /// The counters when the worker started.
    baseline: Counters,
    /// `store.path`: the group's dedup file, this test's own.
    _store: tempfile::TempDir,
}

/// What the worker counted: deliveries settled by outcome, events skipped as duplicates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Counters {
    acked: u64,
    retried: u64,
    rejected: u64,
    duplicates: u64,
}

impl Counters {
    /// This process's counters, from the rendered Prometheus text.
    fn now() -> Self {
        let text = imagepipe_runtime::metrics::install().unwrap().render();
        let sum = |name: &str, label: Option<&str>| -> u64 {
            text.lines()
                .filter_map(|line| line.rsplit_once(' '))
                .filter(|(series, _)| series.split('{').next() == Some(name))
                .filter(|(series, _)| label.is_none_or(|label| series.contains(label)))
                .map(|(_, value)| value.parse::<f64>().unwrap() as u64)
                .sum()
        };
        let handled = |outcome: &str| sum(MESSAGES_HANDLED, Some(&format!("{}=\"{outcome}\"", labels::OUTCOME)));
        Self {
            acked: handled(outcome::ACK),
            retried: handled(outcome::RETRY),
            rejected: handled(outcome::REJECT),
            duplicates: sum(SUBSCRIBER_DUPLICATES, Some(&format!("{}=\"{GROUP}\"", labels::SOURCE))),
        }
    }
}

impl Running {
    async fn start(mut settings: Settings) -> Self {
        static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let serial = SERIAL.lock().await;
        let baseline = Counters::now();
        let store = tempfile::tempdir().unwrap();
        settings.store.path = store.path().to_owned();
        settings.validate().unwrap();
        let dial = LoopbackOnly::new();
        let resolver = StaticResolver::new()
            .with("hooks.test", [IpAddr::V4(Ipv4Addr::LOCALHOST)])
            .with("metadata.test", [IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254))]);
        let client = client_builder(&settings).unwrap().resolver(resolver).dial_check(dial.clone()).build().unwrap();
        let bus = Bus::connect(&BusConfig::default()).await.unwrap();
        // Create the durable group now, so events published before the worker joins reach it.
        drop(bus.events.subscribe(subscription(&settings)).await.unwrap());
        let shutdown = Shutdown::new();
        let worker = tokio::spawn({
            let (bus, shutdown) = (bus.clone(), shutdown.clone());
            async move { run_with_client(bus, &settings, client, shutdown).await.unwrap() }
        });
        Self { bus, dial, shutdown, worker, _serial: serial, baseline, _store: store }
    }

    /// What the worker counted since it started.
    fn counted(&self) -> Counters {
        let (now, base) = (Counters::now(), self.baseline);
        Counters {
            acked: now.acked - base.acked,
            retried: now.retried - base.retried,
            rejected: now.rejected - base.rejected,
            duplicates: now.duplicates - base.duplicates,
        }
    }

    async fn publish(&self, event_type: &str, body: Vec<u8>) {
        self.bus.events.publish(event_type, Message::new(body)).await.unwrap();
    }

    async fn dead_letters(&self) -> Box<dyn Consumer> {
        let queue = names::dead_letter_queue_of_group(GROUP);
        self.bus.queues.consume(&queue, ConsumerConfig::default()).await.unwrap()
    }

    async fn stop(self) {
        assert!(self.dial.violations().is_empty(), "dialled beyond loopback: {:?}", self.dial.violations());
        self.shutdown.trigger();
        tokio::time::timeout(Duration::from_secs(10), self.worker).await.unwrap().unwrap();
    }
}

fn settings(subscribers: Vec<String>) -> Settings {
    let mut settings = Settings::default();
    settings.net.allow_cidrs = vec!["127.0.0.1/32".into()];
    settings.notification.subscribers = subscribers.into_iter().map(WebhookTarget::new).collect();
    settings.notification.secret = vec![key(SECRET)];
    settings.notification.retry_min = Duration::from_millis(10);
    settings.notification.retry_max = Duration::from_millis(20);
    settings.worker.ack_wait = Duration::from_secs(5);
    settings
}

fn completed(task_id: &str, callback_url: Option<String>) -> Vec<u8> {
    let payload = TaskCompleted {
        duration_ms: 1234,
        download: DownloadOutput {
            sha256: "ab".repeat(32),
            blob_key: format!("sha256:{}", "ab".repeat(32)),
            size: 1000,
            format: "jpeg".into(),
            final_url: None,
        },
        metadata: serde_json::from_value(serde_json::json!({
            "format": "jpeg", "width": 4, "height": 3, "colorType": "rgb8", "bitDepth": 8, "hasAlpha": false,
            "frameCount": 1, "hasIccProfile": false, "dominantColors": [], "meanBrightness": 0.5,
            "phash": "00", "blurhash": "LEHV6nWB2yk8", "thumbnailKey": "sha256:00"
        }))
        .unwrap(),
        analysis: AnalysisOutput { model: "m".into(), predictions: vec![], tags: vec![], embedding: None },
        stages: Default::default(),
        callback_url,
        labels: Default::default(),
    };
    Event::for_task(task_id, 1, TraceId::random(), 1_763_800_000_000, "coordinator", payload).to_json()
}

fn failed(task_id: &str, callback_url: &str) -> Vec<u8> {
    let payload = TaskFailed {
        step: Step::Download,
        attempt: 1,
        error: StepError { code: "http_404".into(), message: "not found".into() },
        callback_url: Some(callback_url.into()),
        labels: Default::default(),
    };
    Event::for_task(task_id, 1, TraceId::random(), 1_763_800_000_000, "coordinator", payload).to_json()
}

fn header<'a>(request: &'a Recorded, name: &str) -> Option<&'a str> {
    request.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
}

/// What a receiver checks: `request` carries the event's id, a fresh timestamp and a signature
/// that `key` verifies.
fn verified(request: &Recorded, key: &WebhookSecret) -> Result<(), VerifyError> {
    let body: serde_json::Value = serde_json::from_slice(&request.body).unwrap();
    let id = header(request, ID_HEADER).expect("webhook-id");
    assert_eq!(Some(id), body["eventId"].as_str(), "webhook-id is the eventId");
    let timestamp = header(request, TIMESTAMP_HEADER).expect("webhook-timestamp");
    let sent: u64 = timestamp.parse().unwrap();
    assert!(unix_seconds(SystemTime::now()).abs_diff(sent) <= 60, "webhook-timestamp {sent} is now");
    let signature = header(request, SIGNATURE_HEADER).expect("webhook-signature");
    verify(key, &Signed { id, timestamp, signature }, &request.body, SystemTime::now())
}

/// Log lines written while it is the thread's default subscriber (the worker runs on the test's
/// thread: `#[tokio::test]` is single-threaded).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt().with_ansi(false).with_writer(move || writer.clone()).finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn one_dead_letter(dlq: &dyn Consumer) -> Message {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(delivery) = dlq.fetch(1, Duration::from_millis(200)).await.unwrap().pop() {
            let message = delivery.message.clone();
            delivery.ack().await.unwrap();
            return message;
        }
        assert!(tokio::time::Instant::now() < deadline, "no dead letter");
    }
}

#[tokio::test]
async fn a_completed_task_is_posted_signed_to_its_callback_and_subscribers_once() {
    let server = FixtureServer::start([("/callback", Route::status(204)), ("/all", Route::status(200))]).await.unwrap();
    let port = server.addr().port();
    let running = Running::start(settings(vec![format!("http://hooks.test:{port}/all")])).await;

    let body = completed("tsk_notify_ok", Some(server.url("/callback")));
    running.publish("task.completed", body.clone()).await;
    wait_for("two webhooks", || server.requests().len() == 2).await;
    wait_for("the event acknowledged", || running.counted().acked == 1).await;

    let event_id = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["eventId"].as_str().unwrap().to_owned();
    let mut targets: Vec<String> = server.requests().iter().map(|r| r.target.clone()).collect();
    targets.sort();
    assert_eq!(targets, ["/all", "/callback"]);
    for request in server.requests() {
        assert_eq!(request.method, "POST");
        assert_eq!(request.body.as_ref(), body.as_slice(), "the body is the event JSON as published");
        assert_eq!(header(&request, "content-type"), Some("application/json"));
        assert_eq!(header(&request, "webhook-id"), Some(event_id.as_str()));
        assert_eq!(header(&request, EVENT_TYPE_HEADER), Some("task.completed"));
        let signature = header(&request, "webhook-signature").expect("signed");
        assert!(signature.starts_with("v1,") && !signature.contains(' '), "one v1 signature: {signature}");
        assert_eq!(verified(&request, &key(SECRET)), Ok(()));
        assert_eq!(verified(&request, &key("another secret")), Err(VerifyError::Mismatch));
    }

    running.publish("task.completed", body).await;
    running.publish("task.created", b"{\"not\": \"selected\"}".to_vec()).await;
    let other = failed("tsk_notify_other", &server.url("/callback"));
    running.publish("task.failed", other).await;
    // Settled: the repeat acknowledged as a duplicate, the failed task's event after its two
    // webhooks; `task.created` is not selected, so never delivered.
    wait_for("the repeat and the next event acknowledged", || running.counted().acked == 3).await;
    let counted = running.counted();
    assert_eq!(counted, Counters { acked: 3, duplicates: 1, ..Counters::default() });
    assert_eq!(server.requests().len(), 4, "the redelivered event was not posted again");
    running.stop().await;
}

/// A receiver answering 500 to its first `failures` requests and 200 after; it counts the
/// calls and keeps each one's `webhook-id`.
async fn flaky_receiver(failures: usize) -> (SocketAddr, Arc<AtomicUsize>, Arc<Mutex<Vec<String>>>) {
    let (calls, ids) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Vec::new())));
    let (counter, seen) = (calls.clone(), ids.clone());
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: axum::http::HeaderMap| {
            let (counter, seen) = (counter.clone(), seen.clone());
            async move {
                let id = headers.get(ID_HEADER).and_then(|id| id.to_str().ok()).unwrap_or_default();
                seen.lock().unwrap().push(id.to_owned());
                let n = counter.fetch_add(1, Ordering::SeqCst);
                if n < failures { axum::http::StatusCode::INTERNAL_SERVER_ERROR } else { axum::http::StatusCode::OK }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, calls, ids)
}

#[tokio::test]
async fn a_500_is_retried_with_backoff_until_the_receiver_accepts() {
    let (addr, calls, ids) = flaky_receiver(2).await;
    let subscriber = format!("http://{addr}/hook");
    let delivered = FixtureServer::start([("/ok", Route::status(200))]).await.unwrap();
    let running = Running::start(settings(vec![subscriber])).await;
    let dlq = running.dead_letters().await;

    let event = failed("tsk_notify_flaky", &delivered.url("/ok"));
    let event_id = serde_json::from_slice::<serde_json::Value>(&event).unwrap()["eventId"].as_str().unwrap().to_owned();
    running.publish("task.failed", event).await;
    wait_for("the event acknowledged", || running.counted().acked == 1).await;
    assert_eq!(calls.load(Ordering::SeqCst), 3, "no call after the 200");
    assert_eq!(*ids.lock().unwrap(), [event_id.as_str(); 3], "every attempt carries the eventId as webhook-id");
    assert_eq!(running.counted(), Counters { acked: 1, retried: 2, ..Counters::default() }, "one retry per 500");
    assert_eq!(delivered.requests().len(), 1, "the target that answered at once was not posted again");
    assert!(dlq.fetch(1, Duration::from_millis(100)).await.unwrap().is_empty());
    running.stop().await;
}

#[tokio::test]
async fn after_max_attempts_the_event_is_dead_lettered_with_the_reason() {
    let server = FixtureServer::start([("/down", Route::status(503))]).await.unwrap();
    let mut settings = settings(vec![]);
    settings.notification.max_attempts = 3;
    let running = Running::start(settings).await;
    let dlq = running.dead_letters().await;

    running.publish("task.failed", failed("tsk_notify_down", &server.url("/down"))).await;
    let dead = one_dead_letter(&*dlq).await;
    assert_eq!(server.requests().len(), 3);
    let reason = dead.headers.get(headers::DLQ_REASON).unwrap();
    assert!(reason.contains("max deliveries (3)") && reason.contains("503"), "{reason}");
    running.stop().await;
}

#[tokio::test]
async fn private_targets_are_refused_without_connecting() {
    let server = FixtureServer::start_on(Ipv4Addr::new(127, 0, 0, 2), [("/hook", Route::status(200))]).await.unwrap();
    let mut settings = settings(vec![]);
    settings.net.allow_cidrs.clear();
    let running = Running::start(settings).await;
    let dlq = running.dead_letters().await;

    for (task, url) in [
        ("tsk_private_loopback", server.url("/hook")),
        ("tsk_private_ten", "http://10.1.2.3/hook".to_owned()),
        ("tsk_private_metadata", "http://metadata.test/latest".to_owned()),
    ] {
        running.publish("task.failed", failed(task, &url)).await;
        let dead = one_dead_letter(&*dlq).await;
        let reason = dead.headers.get(headers::DLQ_REASON).unwrap();
        assert!(reason.contains("webhook target refused") && reason.contains("not allowed"), "{reason}");
    }
    assert!(server.requests().is_empty(), "nothing reached the private server");
    running.stop().await;
}

#[tokio::test]
async fn a_malformed_event_is_dead_lettered_at_once() {
    let running = Running::start(settings(vec![])).await;
    let dlq = running.dead_letters().await;
    running.publish("task.completed", b"{\"eventType\": \"task.completed\"}".to_vec()).await;
    let dead = one_dead_letter(&*dlq).await;
    assert_eq!(dead.headers.get(headers::DLQ_DELIVERY_COUNT), Some("1"));
    assert!(dead.headers.get(headers::DLQ_REASON).unwrap().contains("eventId"));
    running.stop().await;
}

#[tokio::test]
async fn each_subscriber_is_signed_with_its_own_keys_and_the_others_with_every_global_key() {
    let (logs, _logging) = Logs::capture();
    let routes = [("/callback", Route::status(200)), ("/own", Route::status(200)), ("/global", Route::status(200))];
    let server = FixtureServer::start(routes).await.unwrap();
    let port = server.addr().port();
    let (own, rotated_in) = (key("whsec_b3duLWtleQ=="), key("rotated-in-key"));
    let mut settings = settings(vec![]);
    settings.notification.secret.push(rotated_in.clone());
    settings.notification.subscribers = vec![
        WebhookTarget::new(format!("http://hooks.test:{port}/own")).with_secret(own.clone()),
        WebhookTarget::new(format!("http://hooks.test:{port}/global")),
    ];
    let running = Running::start(settings).await;

    running.publish("task.completed", completed("tsk_notify_keys", Some(server.url("/callback")))).await;
    wait_for("three webhooks", || server.requests().len() == 3).await;
    wait_for("the event acknowledged", || running.counted().acked == 1).await;
    for request in server.requests() {
        let path = request.target.as_str();
        let signature = header(&request, SIGNATURE_HEADER).unwrap();
        if path == "/own" {
            assert_eq!(verified(&request, &own), Ok(()), "{path}: {signature}");
            assert_eq!(verified(&request, &key(SECRET)), Err(VerifyError::Mismatch), "{path}: only its own key signs");
        } else {
            assert_eq!(signature.split(' ').count(), 2, "{path}: one signature per global key: {signature}");
            assert_eq!(verified(&request, &key(SECRET)), Ok(()), "{path}");
            assert_eq!(verified(&request, &rotated_in), Ok(()), "{path}");
            assert_eq!(verified(&request, &own), Err(VerifyError::Mismatch), "{path}");
        }
    }
    assert!(!logs.text().contains("not signed"), "every target is signed:\n{}", logs.text());
    running.stop().await;
}

#[tokio::test]
async fn unsigned_targets_are_named_redacted_in_one_warning_at_start() {
    let (logs, _logging) = Logs::capture();
    let server = FixtureServer::start([("/open", Route::status(200)), ("/keyed", Route::status(200))]).await.unwrap();
    let port = server.addr().port();
    let mut settings = settings(vec![]);
    settings.notification.secret.clear();
    settings.notification.subscribers = vec![
        WebhookTarget::new(format!("http://hooks.test:{port}/open?token=s3cr3t")),
        WebhookTarget::new(format!("http://hooks.test:{port}/keyed")).with_secret(key("keyed-key")),
    ];
    let running = Running::start(settings).await;
    wait_for("the warning", || logs.text().contains("not signed")).await;

    let warnings: Vec<String> =
        logs.text().lines().filter(|line| line.contains("not signed")).map(str::to_owned).collect();
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let warning = &warnings[0];
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("every task's callbackUrl"), "{warning}");
    assert!(warning.contains(&format!("http://hooks.test:{port}/open")), "{warning}");
    assert!(!warning.contains("s3cr3t") && !warning.contains("/keyed"), "{warning}");

    running.publish("task.completed", completed("tsk_notify_unsigned", None)).await;
    wait_for("two webhooks", || server.requests().len() == 2).await;
    let open = server.requests().into_iter().find(|r| r.target.starts_with("/open")).unwrap();
    assert!(header(&open, ID_HEADER).is_some() && header(&open, TIMESTAMP_HEADER).is_some(), "{open:?}");
    assert_eq!(header(&open, SIGNATURE_HEADER), None, "no key, no signature");
    let keyed = server.requests().into_iter().find(|r| r.target == "/keyed").unwrap();
    assert_eq!(verified(&keyed, &key("keyed-key")), Ok(()));
    running.stop().await;
}

#[tokio::test]
async fn urls_reach_logs_and_dead_letters_without_their_query() {
    let (logs, _logging) = Logs::capture();
    let server = FixtureServer::start([("/down", Route::status(503))]).await.unwrap();
    let port = server.addr().port();
    let closed = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap().local_addr().unwrap().port();
    let mut settings = settings(vec![format!("http://127.0.0.1:{closed}/gone?key=s3cr3t-too")]);
    settings.notification.max_attempts = 2;
    let running = Running::start(settings).await;
    let dlq = running.dead_letters().await;

    running
        .publish("task.failed", failed("tsk_notify_redacted", &format!("http://hooks.test:{port}/down?token=s3cr3t")))
        .await;
    let dead = one_dead_letter(&*dlq).await;
    let reason = dead.headers.get(headers::DLQ_REASON).unwrap();
    assert!(reason.contains(&format!("http://hooks.test:{port}/down")), "{reason}");
    assert!(reason.contains(&format!("http://127.0.0.1:{closed}/gone")), "{reason}");
    let text = logs.text();
    assert!(text.contains("webhook retry"), "{text}");
    for shown in [reason, text.as_str()] {
        assert!(!shown.contains("s3cr3t") && !shown.contains("token=") && !shown.contains("key="), "{shown}");
    }
    running.stop().await;
}
