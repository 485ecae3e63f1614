//! The stats store on every backend (memory, embedded, Redis), and the worker end to end on the
//! memory bus with `/v1/stats` over real HTTP.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use imagepipe_analytics_worker::api::StatsResponse;
use imagepipe_analytics_worker::histogram::bucket_of;
use imagepipe_analytics_worker::{
    BUCKETS_MS, EmbeddedStore, GROUP, MemoryStore, RedisStore, Span, Stage, StatsStore, TaskOutcome, Update, api, run,
    serve, subscription,
};
use imagepipe_bus::{Bus, BusConfig, ConsumerConfig, Message};
use imagepipe_contracts::names::{self, headers};
use imagepipe_contracts::payload::{ImageDownloaded, TaskCreated, TaskFailed};
use imagepipe_contracts::step::DownloadOutput;
use imagepipe_contracts::{Event, EventType, ImageSource, Step, StepError, TraceId};
use imagepipe_runtime::clock::ManualClock;
use imagepipe_runtime::dedup::{Dedup, EmbeddedDedup};
use imagepipe_runtime::embedded::EmbeddedDb;
use imagepipe_runtime::http::testing;
use imagepipe_runtime::{Service, Settings, Shutdown};

fn update(event_type: EventType, task_id: &str, timestamp: u64) -> Update {
    let (format, bytes) = match event_type {
        EventType::ImageDownloaded => (Some("jpeg".to_owned()), 1_000),
        _ => (None, 0),
    };
    Update {
        event_id: format!("{event_type}-{task_id}-{timestamp}"),
        event_type,
        task_id: task_id.to_owned(),
        timestamp,
        stage: Stage::of(event_type),
        outcome: TaskOutcome::of(event_type),
        format,
        bytes,
    }
}

/// An event of a task at a time, and the latencies recording it completes.
type Recording<'a> = (EventType, &'a str, u64, &'a [(Span, u64)]);

/// Records three tasks (in order with a retried download; out of order; failed) and checks
/// counters, latencies (returned and stored) and buckets.
async fn suite(store: &dyn StatsStore) {
    use EventType::*;
    let steps: [Recording; 16] = [
        (TaskCreated, "a", 1_000, &[]),
        (ImageDownloaded, "a", 1_100, &[(Span::Download, 100)]),
        (ImageDownloaded, "a", 1_150, &[]),
        (ImageMetadataExtracted, "a", 1_300, &[(Span::Metadata, 200)]),
        (ImageAnalyzed, "a", 2_300, &[(Span::Analysis, 1_000)]),
        (TaskCompleted, "a", 2_400, &[(Span::Completion, 100), (Span::EndToEnd, 1_400)]),
        (TaskCompleted, "b", 10_000, &[]),
        (ImageAnalyzed, "b", 9_000, &[(Span::Completion, 1_000)]),
        (ImageMetadataExtracted, "b", 5_000, &[(Span::Analysis, 4_000)]),
        (TaskRetrying, "b", 900, &[]),
        (TaskCreated, "b", 0, &[(Span::EndToEnd, 10_000)]),
        (ImageDownloaded, "b", 1_000, &[(Span::Download, 1_000), (Span::Metadata, 4_000)]),
        (TaskCreated, "c", 50, &[]),
        (ImageDownloaded, "c", 40, &[(Span::Download, 0)]),
        (TaskFailed, "c", 500, &[]),
        (TaskCancelled, "d", 600, &[]),
    ];
    for (event_type, task, at, expected) in steps {
        let mut recorded = store.record(&update(event_type, task, at)).await.unwrap();
        recorded.sort();
        assert_eq!(recorded, expected, "{event_type} of {task} at {at}");
    }

    let stats = store.snapshot().await.unwrap();
    let count = |map: &std::collections::BTreeMap<String, u64>, key: &str| map.get(key).copied().unwrap_or(0);
    assert_eq!(count(&stats.events, "task.created"), 3);
    assert_eq!(count(&stats.events, "image.downloaded"), 4);
    assert_eq!(count(&stats.events, "task.retrying"), 1);
    assert_eq!(count(&stats.events, "task.completed"), 2);
    assert_eq!(count(&stats.events, "task.failed"), 1);
    assert_eq!(count(&stats.events, "task.cancelled"), 1);
    assert_eq!(count(&stats.tasks, "completed"), 2);
    assert_eq!(count(&stats.tasks, "failed"), 1);
    assert_eq!(count(&stats.tasks, "cancelled"), 1);
    assert_eq!(count(&stats.formats, "jpeg"), 4);
    assert_eq!(stats.bytes_downloaded, 4_000);

    let samples = [
        (Span::Download, vec![100, 1_000, 0]),
        (Span::Metadata, vec![200, 4_000]),
        (Span::Analysis, vec![1_000, 4_000]),
        (Span::Completion, vec![100, 1_000]),
        (Span::EndToEnd, vec![1_400, 10_000]),
    ];
    for (span, values) in samples {
        let histogram = &stats.latencies[&span];
        assert_eq!(histogram.count, values.len() as u64, "{span:?}");
        assert_eq!(histogram.sum_ms, values.iter().sum::<u64>(), "{span:?}");
        assert_eq!(histogram.min_ms, *values.iter().min().unwrap(), "{span:?}");
        assert_eq!(histogram.max_ms, *values.iter().max().unwrap(), "{span:?}");
        let mut buckets = vec![0; BUCKETS_MS.len() + 1];
        for value in values {
            buckets[bucket_of(value)] += 1;
        }
        assert_eq!(histogram.buckets, buckets, "{span:?}");
    }
}

#[tokio::test]
async fn the_memory_store_measures_latencies_in_any_order_and_forgets_finished_tasks() {
    let store = MemoryStore::new(Duration::from_secs(3600));
    suite(&store).await;
    assert_eq!(store.tasks_tracked(), 0, "completed, failed and cancelled tasks are forgotten");
}

/// A task's stage times expire 600 s after its last event (every event renews them), and
/// expired times measure nothing; `advance` moves the store's clock, `tracked` counts the tasks
/// whose times it holds.
async fn expiry<A, T>(store: &dyn StatsStore, advance: impl Fn(Duration) -> A, tracked: impl Fn() -> T)
where
    A: Future<Output = ()>,
    T: Future<Output = usize>,
{
    store.record(&update(EventType::TaskCreated, "stuck", 0)).await.unwrap();
    advance(Duration::from_secs(599)).await;
    store.record(&update(EventType::ImageDownloaded, "stuck", 1)).await.unwrap();
    advance(Duration::from_secs(599)).await;
    assert_eq!(tracked().await, 1, "every event renews the TTL");
    advance(Duration::from_secs(61)).await;
    assert_eq!(tracked().await, 0);
    let recorded = store.record(&update(EventType::ImageMetadataExtracted, "stuck", 2)).await.unwrap();
    assert!(recorded.is_empty(), "expired times measure nothing");
}

#[tokio::test(start_paused = true)]
async fn the_memory_store_expires_unfinished_tasks() {
    let store = MemoryStore::new(Duration::from_secs(600));
    expiry(&store, tokio::time::advance, || std::future::ready(store.tasks_tracked())).await;
}

/// Any fixed time, Unix ms.
const T0: u64 = 1_763_800_000_000;

/// An embedded store in `dir` (the analytics group's file there) on `clock`, and its dedup set.
async fn embedded(dir: &Path, task_ttl: Duration, clock: &ManualClock) -> (EmbeddedStore, EmbeddedDedup) {
    let db = EmbeddedDb::open(&dir.join("analytics.redb")).unwrap();
    let dedup = EmbeddedDedup::open(db, Duration::from_secs(60), 1_000, Arc::new(clock.clone())).await.unwrap();
    (EmbeddedStore::open(dedup.clone(), task_ttl, Arc::new(clock.clone())).await.unwrap(), dedup)
}

#[tokio::test]
async fn the_embedded_store_measures_latencies_in_any_order_and_forgets_finished_tasks() {
    let (dir, clock) = (tempfile::tempdir().unwrap(), ManualClock::at_unix_ms(T0));
    let (store, _) = embedded(dir.path(), Duration::from_secs(3600), &clock).await;
    suite(&store).await;
    assert_eq!(store.tasks_tracked().await.unwrap(), 0, "completed, failed and cancelled tasks are forgotten");
}

#[tokio::test]
async fn the_embedded_store_expires_unfinished_tasks() {
    let (dir, clock) = (tempfile::tempdir().unwrap(), ManualClock::at_unix_ms(T0));
    let (store, _) = embedded(dir.path(), Duration::from_secs(600), &clock).await;
    let advance = |by| {
        clock.advance(by);
        std::future::ready(())
    };
    expiry(&store, advance, || async { store.tasks_tracked().await.unwrap() }).await;
}

#[tokio::test]
async fn the_embedded_store_keeps_counts_latencies_and_stage_times_across_a_restart() {
    let (dir, clock) = (tempfile::tempdir().unwrap(), ManualClock::at_unix_ms(T0));
    let (store, _) = embedded(dir.path(), Duration::from_secs(600), &clock).await;
    store.record(&update(EventType::TaskCreated, "a", 1_000)).await.unwrap();
    store.record(&update(EventType::ImageDownloaded, "a", 1_080)).await.unwrap();
    store.record(&update(EventType::TaskCreated, "b", 2_000)).await.unwrap();
    let before = store.snapshot().await.unwrap();
    drop(store);

    let (reopened, _) = embedded(dir.path(), Duration::from_secs(600), &clock).await;
    assert_eq!(reopened.snapshot().await.unwrap(), before);
    assert_eq!(reopened.tasks_tracked().await.unwrap(), 2);
    let recorded = reopened.record(&update(EventType::ImageDownloaded, "b", 2_030)).await.unwrap();
    assert_eq!(recorded, [(Span::Download, 30)], "b's creation time was kept");
    let download = &reopened.snapshot().await.unwrap().latencies[&Span::Download];
    assert_eq!((download.count, download.min_ms, download.max_ms), (2, 30, 80));
}

/// Records an event twice (a retry after a reply the caller lost): it counts and measures once.
/// Returns the event, which the store marked handled.
async fn counts_a_recorded_again_event_once(store: &dyn StatsStore) -> Update {
    let created = update(EventType::TaskCreated, "once", 1_000);
    let downloaded = update(EventType::ImageDownloaded, "once", 1_250);
    store.record(&created).await.unwrap();
    assert_eq!(store.record(&downloaded).await.unwrap(), [(Span::Download, 250)]);
    assert!(store.record(&downloaded).await.unwrap().is_empty(), "the retry measures nothing");
    let stats = store.snapshot().await.unwrap();
    assert_eq!(stats.events.get("image.downloaded"), Some(&1), "{stats:?}");
    assert_eq!(stats.bytes_downloaded, 1_000);
    downloaded
}

#[tokio::test]
async fn the_embedded_store_counts_an_event_once_and_marks_it_where_the_dedup_layer_looks() {
    let (dir, clock) = (tempfile::tempdir().unwrap(), ManualClock::at_unix_ms(T0));
    let (store, dedup) = embedded(dir.path(), Duration::from_secs(600), &clock).await;
    let downloaded = counts_a_recorded_again_event_once(&store).await;
    assert!(dedup.is_done(&downloaded.event_id).await.unwrap(), "marked in the group's dedup set");
    clock.advance(Duration::from_secs(60));
    assert!(!dedup.is_done(&downloaded.event_id).await.unwrap(), "the mark expires with dedup.ttl");
}

async fn redis_keys(prefix: &str) -> (redis::aio::MultiplexedConnection, Vec<String>) {
    let client = redis::Client::open("redis://127.0.0.1:6379").unwrap();
    let mut connection = client.get_multiplexed_async_connection().await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}:*")).query_async(&mut connection).await.unwrap();
    (connection, keys)
}

#[tokio::test]
async fn the_redis_store_measures_latencies_in_any_order_and_forgets_finished_tasks() {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let prefix = format!("imagepipe-test-analytics-{}-{nanos}", std::process::id());
    let store =
        RedisStore::connect("redis://127.0.0.1:6379", &prefix, Duration::from_secs(600), Duration::from_secs(60))
            .await
            .expect("Redis on 127.0.0.1:6379");
    suite(&store).await;
    let (_, keys) = redis_keys(&prefix).await;
    let mut kept: Vec<&String> = keys.iter().filter(|k| k.starts_with(&format!("{prefix}:analytics:"))).collect();
    kept.sort();
    assert_eq!(kept, [&format!("{prefix}:analytics:counters"), &format!("{prefix}:analytics:latencies:v2")]);

    store.record(&update(EventType::TaskCreated, "pending", 0)).await.unwrap();
    let (mut connection, keys) = redis_keys(&prefix).await;
    let ttl: i64 =
        redis::cmd("PTTL").arg(format!("{prefix}:analytics:task:pending")).query_async(&mut connection).await.unwrap();
    assert!((1..=600_000).contains(&ttl), "an unfinished task's times expire: {ttl}");
    let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut connection).await.unwrap();
}

#[tokio::test]
async fn the_redis_store_counts_an_event_once_even_when_recorded_again_after_a_lost_reply() {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let prefix = format!("imagepipe-test-analytics-once-{}-{nanos}", std::process::id());
    let store =
        RedisStore::connect("redis://127.0.0.1:6379", &prefix, Duration::from_secs(600), Duration::from_secs(60))
            .await
            .expect("Redis on 127.0.0.1:6379");
    let downloaded = counts_a_recorded_again_event_once(&store).await;

    let (mut connection, keys) = redis_keys(&prefix).await;
    let mark = format!("{}:{}", imagepipe_runtime::dedup::redis_prefix(&prefix, "analytics"), downloaded.event_id);
    assert!(keys.contains(&mark), "the event is marked where the handler's dedup looks: {keys:?}");
    let ttl: i64 = redis::cmd("PTTL").arg(&mark).query_async(&mut connection).await.unwrap();
    assert!((1..=60_000).contains(&ttl), "the mark expires with dedup.ttl: {ttl}");
    let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut connection).await.unwrap();
}

fn created(task_id: &str, at: u64) -> Vec<u8> {
    let payload = TaskCreated {
        source: ImageSource::Url("https://example.com/a.jpg".into()),
        callback_url: None,
        labels: Default::default(),
    };
    Event::for_task(task_id, 0, TraceId::random(), at, "coordinator", payload).to_json()
}

fn downloaded(task_id: &str, at: u64, format: &str, size: u64) -> Vec<u8> {
    let image = DownloadOutput {
        blob_key: "sha256:00".into(),
        size,
        sha256: "00".into(),
        format: format.into(),
        final_url: None,
    };
    let payload = ImageDownloaded { image, labels: Default::default() };
    Event::for_task(task_id, 1, TraceId::random(), at, "download-worker", payload).to_json()
}

fn failed(task_id: &str, at: u64) -> Vec<u8> {
    let error = StepError::new("http_404", "not found");
    let payload =
        TaskFailed { step: Step::Download, attempt: 1, error, callback_url: None, labels: Default::default() };
    Event::for_task(task_id, 1, TraceId::random(), at, "coordinator", payload).to_json()
}

async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let answer = testing::get(addr, path).await;
    (answer.status, answer.body)
}

/// The analytics worker as its binary runs it ([`serve`]), with `http.auth_token` set:
/// `/v1/stats` needs the token like every `/v1` route.
#[tokio::test]
async fn the_standalone_worker_answers_stats_only_with_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::default();
    settings.store.path = dir.path().to_owned();
    settings.http.bind = std::net::Ipv4Addr::LOCALHOST.into();
    settings.http.port = 0;
    settings.http.auth_token = Some("stats-t0ken".to_owned().into());
    let service = Service::start_with("analytics-worker", settings, Shutdown::new()).await.unwrap();
    let addr = service.http_addr();
    let checks = async {
        let answer = testing::get_until(addr, "/v1/stats", Some("stats-t0ken"), |a| a.status != 404).await;
        assert_eq!(answer.status, 200, "the stats route is served: {answer:?}");
        let anonymous = testing::get(addr, "/v1/stats").await;
        assert_eq!(anonymous.status, 401, "{anonymous:?}");
        assert!(anonymous.body.contains(r#""error":"unauthorized""#), "{anonymous:?}");
        assert_eq!(testing::request(addr, "GET", "/v1/stats", Some("wrong")).await.status, 401);
        service.shutdown.trigger();
    };
    let (served, ()) = tokio::join!(serve(&service), checks);
    served.unwrap();
    service.stop().await.unwrap();
}

#[tokio::test]
async fn events_are_counted_once_and_served_as_stats() {
    let metrics = imagepipe_runtime::metrics::install().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::default();
    settings.store.path = dir.path().to_owned();
    let bus = Bus::connect(&BusConfig::default()).await.unwrap();
    drop(bus.events.subscribe(subscription(&settings)).await.unwrap());
    let store: Arc<dyn StatsStore> = Arc::new(MemoryStore::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum::serve(listener, api::routes(store.clone())).into_future());
    let shutdown = Shutdown::new();
    let worker = tokio::spawn({
        let (bus, settings, shutdown, store) = (bus.clone(), settings.clone(), shutdown.clone(), store.clone());
        async move { run(bus, &settings, store, shutdown).await.unwrap() }
    });

    let publish = |event_type: &'static str, task_id: &'static str, body: Vec<u8>| {
        let bus = bus.clone();
        async move { bus.events.publish(event_type, Message::new(body).with_key(task_id)).await.unwrap() }
    };
    publish("image.downloaded", "tsk_a", downloaded("tsk_a", 1_250, "png", 2_048)).await;
    publish("task.created", "tsk_a", created("tsk_a", 1_000)).await;
    publish("image.downloaded", "tsk_a", downloaded("tsk_a", 1_250, "png", 2_048)).await;
    publish("task.created", "tsk_b", created("tsk_b", 5_000)).await;
    publish("image.downloaded", "tsk_b", downloaded("tsk_b", 5_020, "jpeg", 100)).await;
    publish("task.failed", "tsk_b", failed("tsk_b", 6_000)).await;
    publish("image.downloaded", "tsk_c", b"{\"eventType\": \"image.downloaded\"}".to_vec()).await;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let stats = loop {
        let (status, body) = get(addr, "/v1/stats").await;
        assert_eq!(status, 200, "{body}");
        let stats: StatsResponse = serde_json::from_str(&body).unwrap();
        if stats.tasks["failed"] == 1 && stats.events["image.downloaded"] == 2 && stats.latencies["download"].count == 2
        {
            break stats;
        }
        assert!(tokio::time::Instant::now() < deadline, "not counted: {body}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(stats.events["task.created"], 2);
    assert_eq!(stats.events["image.downloaded"], 2, "the redelivered event counts once");
    assert_eq!(stats.events["task.completed"], 0, "every event type is listed");
    assert_eq!(stats.tasks["completed"], 0);
    assert_eq!(stats.formats.get("png"), Some(&1));
    assert_eq!(stats.formats.get("jpeg"), Some(&1));
    assert_eq!(stats.bytes_downloaded, 2_148);
    let download = &stats.latencies["download"];
    assert_eq!((download.from.as_str(), download.to.as_str()), ("task.created", "image.downloaded"));
    assert_eq!((download.count, download.sum_ms, download.min_ms, download.max_ms), (2, 270, Some(20), Some(250)));
    let buckets: Vec<(Option<u64>, u64)> = download.buckets.iter().map(|b| (b.le_ms, b.count)).collect();
    let holding_250 = BUCKETS_MS[bucket_of(250)];
    assert_eq!(buckets, [(Some(20), 1), (Some(holding_250), 2), (None, 2)], "cumulative, where samples are");
    assert_eq!(download.p50_ms, Some(20.0));
    assert!(download.p99_ms.unwrap() > 240.0 && download.p99_ms.unwrap() <= 250.0, "{download:?}");
    assert_eq!(stats.latencies["end_to_end"].count, 0);
    assert_eq!(stats.latencies["end_to_end"].p50_ms, None);
    assert_eq!(stats.latencies["end_to_end"].buckets.len(), 1, "only +Inf");

    let text = metrics.render();
    for line in [
        r#"imagepipe_analytics_events_total{event_type="image.downloaded"} 2"#,
        r#"imagepipe_analytics_tasks_total{outcome="failed"} 1"#,
        r#"imagepipe_analytics_images_total{format="png"} 1"#,
        "imagepipe_analytics_downloaded_bytes_total 2148",
        r#"imagepipe_subscriber_duplicates_total{source="analytics"} 1"#,
        r#"imagepipe_analytics_stage_latency_seconds_bucket{span="download",le="0.025"} 1"#,
        r#"imagepipe_analytics_stage_latency_seconds_count{span="download"} 2"#,
    ] {
        assert!(text.contains(line), "{line} in {text}");
    }

    let dlq = bus.queues.consume(&names::dead_letter_queue_of_group(GROUP), ConsumerConfig::default()).await.unwrap();
    let dead = dlq.fetch(1, Duration::from_secs(5)).await.unwrap().pop().expect("the malformed event");
    assert!(dead.message.headers.get(headers::DLQ_REASON).unwrap().contains("eventId"));
    dead.ack().await.unwrap();

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(10), worker).await.unwrap().unwrap();
}
