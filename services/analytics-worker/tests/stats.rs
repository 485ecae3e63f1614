//! The stats store on both backends, and the worker end to end on the memory bus with
//! `/v1/stats` over real HTTP.

use std::sync::Arc;
use std::time::Duration;

use imagepipe_analytics_worker::api::StatsResponse;
use imagepipe_analytics_worker::{
    BUCKETS_MS, GROUP, MemoryStore, RedisStore, Span, Stage, StatsStore, TaskOutcome, Update, api, run, serve,
    subscription,
};
use imagepipe_bus::{Bus, BusConfig, ConsumerConfig, Message};
use imagepipe_contracts::names::{self, headers};
use imagepipe_contracts::payload::{ImageDownloaded, TaskCreated, TaskFailed};
use imagepipe_contracts::step::DownloadOutput;
use imagepipe_contracts::{Event, EventType, ImageSource, Step, StepError, TraceId};
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

fn bucket(ms: u64) -> usize {
    BUCKETS_MS.iter().position(|b| ms <= *b).unwrap()
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
        let mut buckets = vec![0; BUCKETS_MS.len() + 1];
        for value in values {
            buckets[bucket(value)] += 1;
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

#[tokio::test(start_paused = true)]
async fn the_memory_store_expires_unfinished_tasks() {
    let store = MemoryStore::new(Duration::from_secs(600));
    store.record(&update(EventType::TaskCreated, "stuck", 0)).await.unwrap();
    tokio::time::advance(Duration::from_secs(599)).await;
    store.record(&update(EventType::ImageDownloaded, "stuck", 1)).await.unwrap();
    tokio::time::advance(Duration::from_secs(599)).await;
    assert_eq!(store.tasks_tracked(), 1, "every event renews the TTL");
    tokio::time::advance(Duration::from_secs(61)).await;
    assert_eq!(store.tasks_tracked(), 0);
    let recorded = store.record(&update(EventType::ImageMetadataExtracted, "stuck", 2)).await.unwrap();
    assert!(recorded.is_empty(), "expired times measure nothing");
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
    assert_eq!(kept, [&format!("{prefix}:analytics:counters"), &format!("{prefix}:analytics:latencies")]);

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
    let created = update(EventType::TaskCreated, "once", 1_000);
    let downloaded = update(EventType::ImageDownloaded, "once", 1_250);
    store.record(&created).await.unwrap();
    assert_eq!(store.record(&downloaded).await.unwrap(), [(Span::Download, 250)]);
    assert!(store.record(&downloaded).await.unwrap().is_empty(), "the retry measures nothing");
    let stats = store.snapshot().await.unwrap();
    assert_eq!(stats.events.get("image.downloaded"), Some(&1), "{stats:?}");
    assert_eq!(stats.bytes_downloaded, 1_000);

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
    let mut settings = Settings::default();
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
    let settings = Settings::default();
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
    assert_eq!((download.count, download.sum_ms), (2, 270));
    let le = |bound: u64| download.buckets.iter().find(|b| b.le_ms == Some(bound)).unwrap().count;
    assert_eq!((le(10), le(25), le(250), le(3_600_000)), (0, 1, 2, 2), "cumulative buckets");
    assert_eq!(download.buckets.last().unwrap().le_ms, None);
    assert_eq!(download.buckets.last().unwrap().count, 2);
    assert_eq!(download.p50_ms, Some(25.0));
    assert!(download.p99_ms.unwrap() > 240.0 && download.p99_ms.unwrap() <= 250.0, "{download:?}");
    assert_eq!(stats.latencies["end_to_end"].count, 0);
    assert_eq!(stats.latencies["end_to_end"].p50_ms, None);

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
