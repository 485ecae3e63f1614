//! Per-host politeness end to end: two download-worker replicas sharing one Redis limiter fetch
//! from loopback servers on distinct addresses (127.0.0.2, 127.0.0.3: distinct hosts) that
//! count the requests they serve at once. The test plays the coordinator: it sends the
//! commands, reads the step results and sends a deferred command again after its
//! `retry_after`, as the same attempt. No test dials beyond loopback.

mod common;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use common::*;
use imagepipe_bus::nats::NatsBus;
use imagepipe_bus::{Bus, BusConfig, Consumer, ConsumerConfig, NatsConfig};
use imagepipe_contracts::names::queues;
use imagepipe_contracts::{DownloadCommand, ImageSource, StepOutcome, StepResult, decode};
use imagepipe_download_worker::politeness::{
    Admission, HostLimiter, HostPolicy, LimiterError, MemoryLimiter, Politeness, codes,
};
use imagepipe_download_worker::{DownloadError, client_builder, run_with_limiter};
use imagepipe_net::testing::{FixtureServer, LoopbackOnly, Route};
use imagepipe_net::{Limits, StaticResolver};
use imagepipe_runtime::config::StoreKind;
use imagepipe_runtime::step::outgoing;
use imagepipe_runtime::{Settings, Shutdown};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const HOST_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const HOST_B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);

/// One request a [`CountingServer`] served.
#[derive(Debug, Clone)]
struct Served {
    start: Instant,
    end: Instant,
    status: u16,
    agent: String,
}

/// A loopback HTTP server answering every request after `delay` (a JPEG, or once a 429 with a
/// `Retry-After`), counting the requests it is serving at once.
struct CountingServer {
    addr: std::net::SocketAddr,
    state: Arc<ServerState>,
    accept: JoinHandle<()>,
}

struct ServerState {
    delay: Duration,
    body: Bytes,
    in_flight: AtomicUsize,
    most: AtomicUsize,
    throttle_next: Mutex<Option<String>>,
    served: Mutex<Vec<Served>>,
}

impl CountingServer {
    async fn start(ip: Ipv4Addr, delay: Duration) -> Self {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(ServerState {
            delay,
            body: jpeg_with_exif_and_gps().into(),
            in_flight: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
            throttle_next: Mutex::new(None),
            served: Mutex::default(),
        });
        let shared = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        Self { addr, state, accept }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The next request is answered `429` with `Retry-After: <retry_after>`.
    fn throttle_next(&self, retry_after: &str) {
        *self.state.throttle_next.lock().unwrap() = Some(retry_after.to_owned());
    }

    /// Most requests served at once.
    fn most_at_once(&self) -> usize {
        self.state.most.load(Ordering::SeqCst)
    }

    fn served(&self) -> Vec<Served> {
        let mut served = self.state.served.lock().unwrap().clone();
        served.sort_by_key(|s| s.start);
        served
    }
}

impl Drop for CountingServer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn serve(mut stream: tokio::net::TcpStream, state: Arc<ServerState>) {
    let mut head = Vec::new();
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let mut chunk = [0u8; 2048];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
    let start = Instant::now();
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.most.fetch_max(now, Ordering::SeqCst);
    let head = String::from_utf8_lossy(&head).into_owned();
    let agent = head
        .lines()
        .find_map(|line| line.strip_prefix("user-agent: ").or_else(|| line.strip_prefix("User-Agent: ")))
        .unwrap_or_default()
        .to_owned();
    tokio::time::sleep(state.delay).await;
    let throttle = state.throttle_next.lock().unwrap().take();
    let (status, written) = match throttle {
        Some(retry_after) => {
            let head = format!(
                "HTTP/1.1 429 Too Many Requests\r\nRetry-After: {retry_after}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            (429, stream.write_all(head.as_bytes()).await)
        }
        None => {
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: image/jpeg\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                state.body.len()
            );
            let written = match stream.write_all(head.as_bytes()).await {
                Ok(()) => stream.write_all(&state.body).await,
                error => error,
            };
            (200, written)
        }
    };
    let _ = stream.flush().await;
    let end = Instant::now();
    state.in_flight.fetch_sub(1, Ordering::SeqCst);
    if written.is_ok() {
        state.served.lock().unwrap().push(Served { start, end, status, agent });
    }
}

fn command(task_id: &str, url: String) -> DownloadCommand {
    DownloadCommand { task_id: task_id.into(), attempt: 1, source: ImageSource::Url(url), labels: BTreeMap::new() }
}

/// What the replicas reported for a batch of commands.
#[derive(Debug, Default)]
struct Reported {
    /// Each task's last result (anything but a deferral).
    finals: BTreeMap<String, StepResult>,
    /// Every deferral, in order.
    deferred: Vec<StepResult>,
}

impl Reported {
    fn deferral_codes(&self) -> Vec<String> {
        self.deferred
            .iter()
            .map(|r| match &r.outcome {
                StepOutcome::Deferred { reason, .. } => reason.code.clone(),
                other => panic!("{other:?}"),
            })
            .collect()
    }
}

/// Sends `commands`, and each deferred one again after its `retry_after` (the same attempt,
/// under a new message id, as the coordinator does), until every task has a result that is not
/// a deferral. Message ids are the coordinator's (`<task>.download.1`, `.d<n>` per re-send):
/// on NATS, results share the tasks stream, whose deduplication would drop a result whose id
/// (`<task>:download:1`) a command had taken.
async fn drive(bus: &Bus, results: &dyn Consumer, commands: &[DownloadCommand]) -> Reported {
    let send = |bus: Bus, command: DownloadCommand, id: String| async move {
        bus.queues.send(queues::DOWNLOAD, outgoing(&command, &command.task_id, id)).await.unwrap();
    };
    for command in commands {
        send(bus.clone(), command.clone(), format!("{}.download.1", command.task_id)).await;
    }
    let by_task: BTreeMap<&str, &DownloadCommand> = commands.iter().map(|c| (c.task_id.as_str(), c)).collect();
    let mut reported = Reported::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    while reported.finals.len() < commands.len() {
        assert!(Instant::now() < deadline, "results within 60 s: {reported:?}");
        for delivery in results.fetch(32, Duration::from_millis(100)).await.unwrap() {
            let result: StepResult = decode(&delivery.message.payload).unwrap();
            delivery.ack().await.unwrap();
            assert_eq!(result.attempt, 1, "waiting for a host is never charged: {result:?}");
            match &result.outcome {
                StepOutcome::Deferred { retry_after_ms, .. } => {
                    let command = by_task[result.task_id.as_str()].clone();
                    let id = format!("{}.download.1.d{}", command.task_id, reported.deferred.len() + 1);
                    let delay = Duration::from_millis(*retry_after_ms);
                    let bus = bus.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(delay).await;
                        send(bus, command, id).await;
                    });
                    reported.deferred.push(result);
                }
                _ => {
                    let previous = reported.finals.insert(result.task_id.clone(), result);
                    assert!(previous.is_none(), "one final result per task: {previous:?}");
                }
            }
        }
    }
    reported
}

/// Two replicas' settings: 3 deliveries at once each, 2 slots per host, 250 ms in place.
fn replica_settings(blobs: &std::path::Path, prefix: &str, replica: usize) -> Settings {
    let mut settings = Settings::default();
    settings.bus.prefix = prefix.to_owned();
    settings.store.kind = StoreKind::Redis;
    settings.store.redis.url = imagepipe_runtime::config::SecretUrl::new(redis_url());
    settings.blob.dir = blobs.to_owned();
    settings.net.allow_cidrs = vec!["127.0.0.0/8".into()];
    settings.worker.concurrency = 3;
    settings.download.user_agent = format!("replica-{replica}");
    settings.download.per_host.concurrency = 2;
    settings.download.per_host.max_wait = Duration::from_millis(250);
    settings.validate().unwrap();
    settings
}

/// Two download-worker replicas on `buses`, each with its own Redis limiter on `prefix`.
struct Replicas {
    shutdown: Shutdown,
    running: Vec<JoinHandle<()>>,
    dial: LoopbackOnly,
}

impl Replicas {
    async fn start(buses: [Bus; 2], blobs: &std::path::Path, prefix: &str) -> Option<Self> {
        let (shutdown, dial) = (Shutdown::new(), LoopbackOnly::new());
        let mut running = Vec::new();
        for (replica, bus) in buses.into_iter().enumerate() {
            let settings = replica_settings(blobs, prefix, replica);
            let limiter = Arc::new(redis_limiter(prefix, HostPolicy::from_settings(&settings.download)).await?);
            let client = client_builder(&settings).unwrap().dial_check(dial.clone()).build().unwrap();
            let stop = shutdown.clone();
            running.push(tokio::spawn(async move {
                run_with_limiter(bus, &settings, client, limiter, stop).await.unwrap();
            }));
        }
        Some(Self { shutdown, running, dial })
    }

    async fn stop(self) {
        self.shutdown.trigger();
        for replica in self.running {
            tokio::time::timeout(Duration::from_secs(30), replica).await.unwrap().unwrap();
        }
        assert!(self.dial.violations().is_empty(), "{:?}", self.dial.violations());
    }
}

/// Eight tasks on host A and four on host B, queued A first, across two replicas with 2 slots
/// per host: neither host ever serves more than 2 at once, both reach 2 (B gets its full
/// share while A has a queue), waiting tasks are deferred uncharged and sent again, and every
/// task ends downloaded with attempt 1.
async fn replicas_hold_each_host_to_its_concurrency(buses: [Bus; 2], results: Box<dyn Consumer>, prefix: &str) {
    let _cleanup = RedisCleanup(prefix.to_owned());
    let host_a = CountingServer::start(HOST_A, Duration::from_millis(300)).await;
    let host_b = CountingServer::start(HOST_B, Duration::from_millis(600)).await;
    let dir = tempfile::tempdir().unwrap();
    let driver = buses[0].clone();
    let Some(replicas) = Replicas::start(buses, dir.path(), prefix).await else { return };

    let mut commands: Vec<DownloadCommand> =
        (0..8).map(|i| command(&format!("tsk_a{i}"), host_a.url(&format!("/a{i}.jpg")))).collect();
    commands.extend((0..4).map(|i| command(&format!("tsk_b{i}"), host_b.url(&format!("/b{i}.jpg")))));
    let reported = drive(&driver, &*results, &commands).await;
    replicas.stop().await;

    for (task, result) in &reported.finals {
        assert!(matches!(result.outcome, StepOutcome::Ok { .. }), "{task}: {result:?}");
    }
    assert_eq!(host_a.most_at_once(), 2, "host A: at most per_host.concurrency, and all of it");
    assert_eq!(host_b.most_at_once(), 2, "host B: its full share while A has a queue");
    let served_a = host_a.served();
    assert_eq!(served_a.len(), 8, "a deferred download never reached the host: {served_a:?}");
    let agents: std::collections::BTreeSet<&str> = served_a.iter().map(|s| s.agent.as_str()).collect();
    assert_eq!(agents.len(), 2, "both replicas fetched from host A: {agents:?}");
    let codes = reported.deferral_codes();
    assert!(!codes.is_empty(), "eight tasks for two slots: some waited past max_wait");
    assert!(codes.iter().all(|code| code == codes::HOST_BUSY), "{codes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_hold_each_host_to_its_concurrency_on_the_memory_bus() {
    let prefix = unique_prefix("replicas-memory");
    let bus = Bus::connect(&BusConfig { prefix: prefix.clone(), ..BusConfig::default() }).await.unwrap();
    let results = bus.queues.consume(queues::RESULTS, ConsumerConfig::default()).await.unwrap();
    replicas_hold_each_host_to_its_concurrency([bus.clone(), bus], results, &prefix).await;
}

/// The same over NATS JetStream: each replica has its own connection to the shared
/// `tasks.download` consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_hold_each_host_to_its_concurrency_over_nats() {
    let url = std::env::var("IMAGEPIPE_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let prefix = unique_prefix("replicas-nats");
    let config = NatsConfig { url: url.clone(), ..NatsConfig::default() };
    let mut buses = Vec::new();
    for _ in 0..3 {
        match NatsBus::connect(&prefix, &config).await {
            Ok(bus) => buses.push(bus),
            Err(error) => {
                let reason = format!("NATS at {url} is not reachable ({error}): run scripts/nats.sh");
                imagepipe_contracts::testing::environment_missing(&reason);
                return;
            }
        }
    }
    let _streams = DeleteStreams { url, streams: buses[0].stream_names().to_vec() };
    let mut buses = buses.into_iter().map(NatsBus::into_bus);
    let driver = buses.next().unwrap();
    let results = driver.queues.consume(queues::RESULTS, ConsumerConfig::default()).await.unwrap();
    let replicas = [driver, buses.next().unwrap()];
    let _third = buses.next();
    replicas_hold_each_host_to_its_concurrency(replicas, results, &prefix).await;
}

/// Deletes a test's JetStream streams when dropped (from its own thread and runtime, so it works
/// while panicking too).
struct DeleteStreams {
    url: String,
    streams: Vec<String>,
}

impl Drop for DeleteStreams {
    fn drop(&mut self) {
        let (url, streams) = (self.url.clone(), std::mem::take(&mut self.streams));
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async move {
                let Ok(client) = async_nats::connect(&url).await else { return };
                let jetstream = async_nats::jetstream::new(client);
                for stream in streams {
                    let _ = jetstream.delete_stream(&stream).await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

/// Host A answers one request 429 with `Retry-After: 1`: that attempt is still reported
/// retryable with its `Retry-After`; the tasks that follow on A are deferred
/// (`host_throttled`) and reach A only once the second is over, one at a time until a success
/// (A was taken a level down), while host B serves its tasks at full speed meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_slows_that_host_down_and_not_the_other() {
    let prefix = unique_prefix("throttle");
    let _cleanup = RedisCleanup(prefix.clone());
    let host_a = CountingServer::start(HOST_A, Duration::from_millis(200)).await;
    let host_b = CountingServer::start(HOST_B, Duration::from_millis(200)).await;
    let dir = tempfile::tempdir().unwrap();
    let bus = Bus::connect(&BusConfig { prefix: prefix.clone(), ..BusConfig::default() }).await.unwrap();
    let results = bus.queues.consume(queues::RESULTS, ConsumerConfig::default()).await.unwrap();
    let Some(replicas) = Replicas::start([bus.clone(), bus.clone()], dir.path(), &prefix).await else { return };

    host_a.throttle_next("1");
    let first = drive(&bus, &*results, &[command("tsk_429", host_a.url("/first.jpg"))]).await;
    match &first.finals["tsk_429"].outcome {
        StepOutcome::Retryable { error, retry_after_ms } => {
            assert_eq!((error.code.as_str(), *retry_after_ms), ("http_429", Some(1000)));
        }
        other => panic!("the 429 is reported as before: {other:?}"),
    }
    let mut commands: Vec<DownloadCommand> =
        (0..4).map(|i| command(&format!("tsk_a{i}"), host_a.url(&format!("/a{i}.jpg")))).collect();
    commands.extend((0..4).map(|i| command(&format!("tsk_b{i}"), host_b.url(&format!("/b{i}.jpg")))));
    let reported = drive(&bus, &*results, &commands).await;
    replicas.stop().await;

    assert!(reported.finals.values().all(|r| matches!(r.outcome, StepOutcome::Ok { .. })), "{reported:?}");
    let served_a = host_a.served();
    let throttled_at = served_a.iter().find(|s| s.status == 429).expect("the 429").end;
    let after: Vec<&Served> = served_a.iter().filter(|s| s.status == 200).collect();
    assert_eq!(after.len(), 4);
    let resumed = after[0].start - throttled_at;
    assert!(resumed >= Duration::from_secs(1), "A was left alone for its Retry-After: {resumed:?}");
    assert!(after[1].start >= after[0].end, "one slot after the 429 until a success: {after:?}");
    let codes = reported.deferral_codes();
    assert!(codes.iter().any(|code| code == codes::HOST_THROTTLED), "{codes:?}");
    for deferred in &reported.deferred {
        if let StepOutcome::Deferred { reason, retry_after_ms } = &deferred.outcome
            && reason.code == codes::HOST_THROTTLED
        {
            assert!((500..=1250).contains(retry_after_ms), "until the pause ends: {deferred:?}");
            assert!(deferred.task_id.starts_with("tsk_a"), "only A is paused: {deferred:?}");
        }
    }
    let served_b = host_b.served();
    assert_eq!((served_b.len(), host_b.most_at_once()), (4, 2), "B at full speed: {served_b:?}");
    let b_done = served_b.iter().map(|s| s.end).max().unwrap();
    assert!(b_done < after[0].start, "B was served while A was paused");
}

/// `Retry-After` as an HTTP date pauses the host until then, as seconds beyond `throttle_max`
/// pauses it `throttle_max` (the attempt still reports the server's delay, capped at an hour),
/// and without one the pause is 1 s. The host paused is the one that answered, after redirects.
#[tokio::test]
async fn retry_after_dates_seconds_and_absence_set_the_pause() {
    let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(4));
    let dated = FixtureServer::start_on(HOST_A, [("/busy", Route::with_headers(503, &[("Retry-After", &date)]))]);
    let long = FixtureServer::start_on(HOST_B, [("/busy", Route::with_headers(429, &[("Retry-After", "7200")]))]);
    let bare = FixtureServer::start([("/busy", Route::status(429))]);
    let (dated, long, bare) = (dated.await.unwrap(), long.await.unwrap(), bare.await.unwrap());
    let redirecting = FixtureServer::start([("/jump", Route::redirect(&bare.url("/busy")))]).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (handler, _, dial) = handler(dir.path(), &["127.0.0.0/8"], StaticResolver::new(), Limits::default()).await;
    let policy = HostPolicy { throttle_max: Duration::from_secs(10), ..policy_of(&Settings::default()) };
    let handler = handler.with_politeness(Politeness::new(Arc::new(MemoryLimiter::new(policy)), Duration::ZERO));
    let fetch = |url: String| {
        let handler = &handler;
        async move { handler.download(&ImageSource::Url(url)).await }
    };
    let paused = |error: DownloadError| match error {
        DownloadError::Deferred(deferral) if deferral.code == codes::HOST_THROTTLED => deferral.retry_after,
        other => panic!("expected a host_throttled deferral, got {other:?}"),
    };

    let error = fetch(dated.url("/busy")).await.unwrap_err();
    assert_eq!((error.code().as_str(), error.is_retryable()), ("http_503", true));
    let pause = paused(fetch(dated.url("/a.jpg")).await.unwrap_err());
    assert!((Duration::from_secs(2)..=Duration::from_secs(5)).contains(&pause), "until the date: {pause:?}");

    let error = fetch(long.url("/busy")).await.unwrap_err();
    assert_eq!(error.retry_after(), Some(Duration::from_secs(3600)), "the attempt reports the server's delay");
    let pause = paused(fetch(long.url("/a.jpg")).await.unwrap_err());
    assert!((Duration::from_secs(9)..=Duration::from_millis(12_500)).contains(&pause), "throttle_max: {pause:?}");

    let error = fetch(redirecting.url("/jump")).await.unwrap_err();
    assert_eq!(error.code(), "http_429");
    let pause = paused(fetch(bare.url("/a.jpg")).await.unwrap_err());
    assert!((Duration::from_millis(500)..=Duration::from_millis(1250)).contains(&pause), "1 s: {pause:?}");
    let error = fetch(redirecting.url("/elsewhere.jpg")).await.unwrap_err();
    assert_eq!(error.code(), "http_404", "the redirecting host was not paused: {error}");
    assert!(dial.violations().is_empty());
}

fn policy_of(settings: &Settings) -> HostPolicy {
    HostPolicy::from_settings(&settings.download)
}

/// A limiter that must not be asked.
#[derive(Debug, Default)]
struct Untouchable {
    calls: AtomicUsize,
}

#[async_trait]
impl HostLimiter for Untouchable {
    async fn try_acquire(&self, _: &str, _: &str) -> Result<Admission, LimiterError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(Admission::Throttled { wait: Duration::from_secs(60) })
    }

    async fn release(&self, _: &str, _: &str, _: bool) -> Result<(), LimiterError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn throttle(&self, _: &str, _: Option<Duration>) -> Result<Duration, LimiterError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Ok(Duration::ZERO)
    }
}

#[tokio::test]
async fn uploaded_blobs_are_not_limited() {
    let dir = tempfile::tempdir().unwrap();
    let (handler, blobs, _) = handler(dir.path(), &[], StaticResolver::new(), Limits::default()).await;
    let limiter = Arc::new(Untouchable::default());
    let handler = handler.with_politeness(Politeness::new(limiter.clone(), Duration::ZERO));
    let key = imagepipe_blob::BlobStore::put(&*blobs, png_with_alpha().into()).await.unwrap();
    let output = handler.download(&ImageSource::Blob(key.to_string())).await.unwrap();
    assert_eq!(output.format, "png");
    let error = handler.download(&ImageSource::Url("ftp://example.com/a.png".into())).await.unwrap_err();
    assert_eq!(error.code(), "invalid_url", "refused by the client, no slot taken: {error}");
    assert_eq!(limiter.calls.load(Ordering::SeqCst), 0);
}
