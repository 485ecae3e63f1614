//! The stats store on every backend (memory, embedded, Redis), and the worker end to end on the
//! memory bus with `/v1/stats` over real HTTP.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use imagepipe_analytics_worker::api::{FailureReasonView, StatsResponse};
use imagepipe_analytics_worker::histogram::bucket_of;
use imagepipe_analytics_worker::window::{MAX_CODES_PER_MINUTE, MINUTE_MS, OTHER_CODE, minute_of};
use imagepipe_analytics_worker::{
    BUCKETS_MS, EmbeddedStore, GROUP, MemoryStore, RedisStore, Span, Stage, StatsStore, TaskOutcome, Update, api, run,
    serve, subscription,
};
use imagepipe_bus::{Bus, BusConfig, ConsumerConfig, Message};
use imagepipe_contracts::names::{self, headers};
use imagepipe_contracts::payload::{ImageDownloaded, QueueChanged, QueuePaused, TaskCreated, TaskFailed};
use imagepipe_contracts::step::DownloadOutput;
use imagepipe_contracts::{Event, EventType, ImageSource, Step, StepError, TraceId};
use imagepipe_runtime::clock::{Clock, ManualClock};
use imagepipe_runtime::dedup::{Dedup, EmbeddedDedup};
use imagepipe_runtime::embedded::EmbeddedDb;
use imagepipe_runtime::http::testing;
use imagepipe_runtime::redis_connection::RedisConnection;
use imagepipe_runtime::{Service, Settings, Shutdown};

fn update(event_type: EventType, task_id: &str, timestamp: u64) -> Update {
    let (format, bytes) = match event_type {
        EventType::ImageDownloaded => (Some("jpeg".to_owned()), 1_000),
        _ => (None, 0),
    };
    Update {
        event_id: format!("{event_type}-{task_id}-{timestamp}"),
        event_type,
        task_id: Some(task_id.to_owned()),
        timestamp,
        stage: Stage::of(event_type),
        outcome: TaskOutcome::of(event_type),
        format,
        bytes,
        failure_code: (event_type == EventType::TaskFailed).then(|| "http_500".to_owned()),
    }
}

/// A `task.failed` of `task_id` at `timestamp` with the error code `code`.
fn failed_with(task_id: &str, timestamp: u64, code: &str) -> Update {
    Update { failure_code: Some(code.to_owned()), ..update(EventType::TaskFailed, task_id, timestamp) }
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

    // Queue events belong to no task: they count, and measure nothing.
    for (i, event_type) in [QueuePaused, QueueResumed, QueuePaused].into_iter().enumerate() {
        let queue_event = Update { event_id: format!("queue-{i}"), task_id: None, ..update(event_type, "-", 3_000) };
        assert_eq!(store.record(&queue_event).await.unwrap(), [], "{event_type}");
    }
    let after = store.snapshot().await.unwrap();
    assert_eq!((count(&after.events, "queue.paused"), count(&after.events, "queue.resumed")), (2, 1));
    assert_eq!(after.latencies, stats.latencies);
}

/// The last hour on a store whose clock is `clock` (standing at [`T0`], 40 s into a minute `M`):
/// events count in the minute of their timestamp (a future one in `M`, one from before the
/// window all-time only), a latency in the minute of the event completing it, 32 codes a
/// minute by name and the rest as `other`; the answer has 60 minutes, the failure reasons most
/// frequent first (ties by code, at most 10); minutes leave the window as the clock moves on.
/// With `redelivered`, every event is recorded twice, for a store that marks events handled
/// (Redis, embedded): the last hour counts it once.
async fn last_hour(store: &dyn StatsStore, clock: &ManualClock, redelivered: bool) {
    const MIN: u64 = 60_000;
    assert_eq!(clock.unix_ms(), T0);
    let m = minute_of(T0);
    let records = [
        update(EventType::TaskCancelled, "c1", T0 - 59 * MIN - 40_000),
        update(EventType::TaskCreated, "w1", T0 - 30 * MIN),
        update(EventType::ImageDownloaded, "w1", T0 - 30 * MIN + 120),
        failed_with("t1", T0 - 10 * MIN, "timeout"),
        failed_with("t2", T0 - 10 * MIN, "timeout"),
        failed_with("h1", T0 - 5 * MIN, "http_404"),
        failed_with("h2", T0 - 5 * MIN, "http_404"),
        failed_with("h3", T0 - 5 * MIN, "http_404"),
        update(EventType::TaskCreated, "w2", T0 - 62 * MIN),
        update(EventType::TaskCompleted, "w2", T0 - 2 * MIN),
        failed_with("d1", T0 - MIN, "dns"),
        failed_with("d2", T0 - MIN, "dns"),
        update(EventType::TaskCompleted, "w3", T0 + 10 * MIN),
        update(EventType::TaskCompleted, "old", T0 - 61 * MIN),
        failed_with("old2", T0 - 120 * MIN, "ancient"),
    ];
    let capped = MAX_CODES_PER_MINUTE + 2;
    let cap_codes = (0..capped).map(|i| failed_with(&format!("cap{i}"), T0 - 3 * MIN, &format!("cap_{i:02}")));
    for record in records.into_iter().chain(cap_codes) {
        store.record(&record).await.unwrap();
        if redelivered {
            store.record(&record).await.unwrap();
        }
    }

    let stats = store.snapshot().await.unwrap();
    assert_eq!(stats.tasks["completed"], 3, "all-time counts the old task too");
    assert_eq!(stats.last_hour.last_minute, m);
    let keys: Vec<u64> = stats.last_hour.minutes.keys().copied().collect();
    let expected: Vec<u64> = [59, 30, 10, 5, 3, 2, 1, 0].into_iter().map(|back| m - back * MIN).collect();
    assert_eq!(keys, expected, "only minutes that counted something, oldest first");
    let cap_minute = &stats.last_hour.minutes[&(m - 3 * MIN)];
    assert_eq!(cap_minute.failures.len(), MAX_CODES_PER_MINUTE + 1, "{:?}", cap_minute.failures);
    assert_eq!(cap_minute.failures[OTHER_CODE], 2);
    assert_eq!(cap_minute.failures["cap_31"], 1);
    assert!(!cap_minute.failures.contains_key("cap_32"));

    let hour = StatsResponse::from(stats).last_hour;
    assert_eq!(hour.window_seconds, 3600);
    assert_eq!(hour.per_minute.len(), 60);
    let starts: Vec<u64> = hour.per_minute.iter().map(|minute| minute.at).collect();
    assert_eq!(starts, (0..60).rev().map(|back| m - back * MIN).collect::<Vec<_>>());
    let row = |back: u64| {
        let minute = hour.per_minute[59 - back as usize];
        (minute.completed, minute.failed, minute.cancelled)
    };
    assert_eq!(row(59), (0, 0, 1), "the window's first minute");
    assert_eq!(row(30), (0, 0, 0), "a minute of events that finish no task");
    assert_eq!(row(10), (0, 2, 0));
    assert_eq!(row(5), (0, 3, 0));
    assert_eq!(row(3), (0, capped as u64, 0));
    assert_eq!(row(2), (1, 0, 0));
    assert_eq!(row(0), (1, 0, 0), "an event from the future counts now");
    assert_eq!((hour.tasks.completed, hour.tasks.failed, hour.tasks.cancelled), (2, 41, 1));
    assert_eq!(hour.tasks_per_second, 44.0 / 3600.0);

    let download = &hour.latencies["download"];
    assert_eq!((download.count, download.p50_ms, download.p95_ms), (1, Some(120.0), Some(120.0)));
    let end_to_end = &hour.latencies["end_to_end"];
    assert_eq!(end_to_end.count, 1, "measured in the window, though it started before");
    assert_eq!(end_to_end.p95_ms, Some(3_600_000.0));
    assert_eq!(hour.latencies.len(), Span::ALL.len(), "every span is listed");
    assert_eq!((hour.latencies["analysis"].count, hour.latencies["analysis"].p50_ms), (0, None));

    let reason = |code: &str, count| FailureReasonView { code: code.to_owned(), count };
    let mut expected = vec![reason("http_404", 3), reason("dns", 2), reason(OTHER_CODE, 2), reason("timeout", 2)];
    expected.extend((0..6).map(|i| reason(&format!("cap_{i:02}"), 1)));
    assert_eq!(hour.failure_reasons, expected, "most frequent first, ties by code, at most 10");

    clock.advance(Duration::from_secs(30 * 60));
    let hour = StatsResponse::from(store.snapshot().await.unwrap()).last_hour;
    assert_eq!(hour.per_minute[0].at, m - 29 * MIN);
    assert_eq!((hour.tasks.completed, hour.tasks.failed, hour.tasks.cancelled), (2, 41, 0));
    assert_eq!(hour.latencies["download"].count, 0, "minute M-30 left the window");
    assert_eq!(hour.per_minute.iter().filter(|minute| minute.failed > 0).count(), 4);

    clock.advance(Duration::from_secs(90 * 60));
    let stats = store.snapshot().await.unwrap();
    assert!(stats.last_hour.minutes.is_empty(), "{:?}", stats.last_hour.minutes.keys());
    let hour = StatsResponse::from(stats).last_hour;
    assert_eq!((hour.tasks.completed, hour.tasks.failed, hour.tasks.cancelled, hour.tasks_per_second), (0, 0, 0, 0.0));
    assert!(hour.failure_reasons.is_empty());
    assert!(hour.per_minute.iter().all(|minute| (minute.completed, minute.failed, minute.cancelled) == (0, 0, 0)));

    let now = clock.unix_ms();
    store.record(&failed_with("late", now, "http_404")).await.unwrap();
    let stats = store.snapshot().await.unwrap();
    assert_eq!(stats.last_hour.minutes.keys().copied().collect::<Vec<_>>(), [minute_of(now)]);
    assert_eq!(stats.tasks["failed"], 43, "all-time keeps everything");
    assert_eq!(minute_of(now) % MINUTE_MS, 0);
}

#[tokio::test]
async fn the_memory_store_keeps_the_last_hour_by_minute() {
    let clock = ManualClock::at_unix_ms(T0);
    let store = MemoryStore::new(Duration::from_secs(3600)).with_clock(Arc::new(clock.clone()));
    last_hour(&store, &clock, false).await;
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
async fn the_embedded_store_keeps_the_last_hour_by_minute_and_drops_older_minutes() {
    let (dir, clock) = (tempfile::tempdir().unwrap(), ManualClock::at_unix_ms(T0));
    let (store, _) = embedded(dir.path(), Duration::from_secs(3600), &clock).await;
    last_hour(&store, &clock, true).await;
    assert_eq!(store.minutes_held().await.unwrap(), 1, "recording dropped the minutes before the hour");

    let (reopened, _) = embedded(dir.path(), Duration::from_secs(3600), &clock).await;
    assert_eq!(reopened.snapshot().await.unwrap().last_hour.minutes.len(), 1, "kept across a restart");
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

async fn redis_keys(url: &str, prefix: &str) -> (RedisConnection, Vec<String>) {
    let mut connection = RedisConnection::open(url).await.unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{prefix}:*")).query_async(&mut connection).await.unwrap();
    (connection, keys)
}

/// Where the store at `prefix` keeps its keys: under the analytics group's hash tag.
fn root(prefix: &str) -> String {
    format!("{prefix}:{{{prefix}:analytics}}")
}

async fn redis_store(url: &str, name: &str) -> (RedisStore, String) {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let prefix = format!("imagepipe-test-analytics-{name}-{}-{nanos}", std::process::id());
    let store = RedisStore::connect(url, &prefix, Duration::from_secs(600), Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("Redis at {url}: {e}"));
    (store, prefix)
}

#[tokio::test]
async fn the_redis_store_measures_latencies_in_any_order_and_forgets_finished_tasks() {
    for (name, url) in imagepipe_contracts::testing::redis_urls() {
        let (store, prefix) = redis_store(&url, "latencies").await;
        suite(&store).await;
        let (_, keys) = redis_keys(&url, &prefix).await;
        let root = root(&prefix);
        let mut kept: Vec<&String> = keys.iter().filter(|k| !k.starts_with(&format!("{prefix}:dedup:"))).collect();
        kept.sort();
        assert_eq!(kept, [&format!("{root}:counters"), &format!("{root}:latencies:v2")], "{name}");

        store.record(&update(EventType::TaskCreated, "pending", 0)).await.unwrap();
        let (mut connection, keys) = redis_keys(&url, &prefix).await;
        let ttl: i64 =
            redis::cmd("PTTL").arg(format!("{root}:task:pending")).query_async(&mut connection).await.unwrap();
        assert!((1..=600_000).contains(&ttl), "{name}: an unfinished task's times expire: {ttl}");
        let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut connection).await.unwrap();
    }
}

#[tokio::test]
async fn the_redis_store_keeps_the_last_hour_in_a_hash_per_minute_that_expires() {
    for (name, url) in imagepipe_contracts::testing::redis_urls() {
        let clock = ManualClock::at_unix_ms(T0);
        let (store, prefix) = redis_store(&url, "hour").await;
        let store = store.with_clock(Arc::new(clock.clone()));
        last_hour(&store, &clock, true).await;

        let (mut connection, keys) = redis_keys(&url, &prefix).await;
        let root = root(&prefix);
        let minutes: Vec<&String> = keys.iter().filter(|k| k.starts_with(&format!("{root}:minute:"))).collect();
        assert!(!minutes.is_empty() && minutes.len() <= 9, "{name}: {minutes:?}");
        let latest = format!("{root}:minute:{}", minute_of(clock.unix_ms()));
        assert!(minutes.contains(&&latest), "{name}: {minutes:?}");
        for key in minutes {
            let ttl: i64 = redis::cmd("PTTL").arg(key).query_async(&mut connection).await.unwrap();
            assert!((1..=65 * 60_000).contains(&ttl), "{key} expires within 65 minutes: {ttl}");
        }
        let fields: std::collections::HashMap<String, String> =
            redis::cmd("HGETALL").arg(&latest).query_async(&mut connection).await.unwrap();
        let expected = [("tasks:failed", "1"), ("failures:http_404", "1"), ("failure_codes", "1")];
        let expected = expected.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
        assert_eq!(fields, expected, "{name}");
        let ttl: i64 = redis::cmd("PTTL").arg(&latest).query_async(&mut connection).await.unwrap();
        assert!(ttl > 64 * 60_000, "{name}: the current minute is kept the hour and the grace: {ttl}");
        let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut connection).await.unwrap();
    }
}

#[tokio::test]
async fn the_redis_store_counts_an_event_once_even_when_recorded_again_after_a_lost_reply() {
    for (name, url) in imagepipe_contracts::testing::redis_urls() {
        let (store, prefix) = redis_store(&url, "once").await;
        let downloaded = counts_a_recorded_again_event_once(&store).await;

        let (mut connection, keys) = redis_keys(&url, &prefix).await;
        let mark = format!("{}:{}", imagepipe_runtime::dedup::redis_prefix(&prefix, "analytics"), downloaded.event_id);
        assert!(keys.contains(&mark), "{name}: the event is marked where the handler's dedup looks: {keys:?}");
        let ttl: i64 = redis::cmd("PTTL").arg(&mark).query_async(&mut connection).await.unwrap();
        assert!((1..=60_000).contains(&ttl), "{name}: the mark expires with dedup.ttl: {ttl}");
        let _: () = redis::cmd("DEL").arg(&keys).query_async(&mut connection).await.unwrap();
    }
}

/// On a single server, the keys written before the hash tag are renamed at connect (counters,
/// histograms, a task's times), and an event marked under the old dedup key is a duplicate.
#[tokio::test]
async fn connecting_moves_the_keys_written_before_the_hash_tag() {
    let url = imagepipe_contracts::testing::redis_url();
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    let prefix = format!("imagepipe-test-analytics-legacy-{}-{nanos}", std::process::id());
    let mut connection = RedisConnection::open(&url).await.unwrap();
    let old = format!("{prefix}:analytics");
    let mut pipe = redis::pipe();
    pipe.cmd("HSET").arg(format!("{old}:counters")).arg("events:task.created").arg(7).ignore();
    pipe.cmd("HSET").arg(format!("{old}:latencies:v2")).arg("download:count").arg(1).ignore();
    pipe.cmd("HSET").arg(format!("{old}:task:t1")).arg("created").arg(T0).ignore();
    let update = update(EventType::TaskCreated, "t2", 0);
    pipe.cmd("SET").arg(format!("{prefix}:dedup:analytics:{}", update.event_id)).arg(1).arg("PX").arg(60_000).ignore();
    let () = pipe.query_async(&mut connection).await.unwrap();

    let store = RedisStore::connect(&url, &prefix, Duration::from_secs(600), Duration::from_secs(60)).await.unwrap();
    let (_, keys) = redis_keys(&url, &prefix).await;
    let root = root(&prefix);
    for moved in ["counters", "latencies:v2", "task:t1"] {
        assert!(keys.contains(&format!("{root}:{moved}")), "{moved} moved: {keys:?}");
        assert!(!keys.contains(&format!("{old}:{moved}")), "{moved} gone from the old name: {keys:?}");
    }
    assert_eq!(store.snapshot().await.unwrap().events.get("task.created"), Some(&7));
    store.record(&update).await.unwrap();
    assert_eq!(store.snapshot().await.unwrap().events.get("task.created"), Some(&7), "marked before the upgrade");
    let (mut connection, keys) = redis_keys(&url, &prefix).await;
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

/// A `queue.paused` event, which carries no task id.
fn queue_paused(at: u64) -> Vec<u8> {
    let payload = QueuePaused(QueueChanged { queue: names::queues::METADATA.to_owned(), reason: None });
    let mut event = Event::for_task("-", 0, TraceId::random(), at, "coordinator", payload);
    event.task_id = None;
    event.to_json()
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

/// `lastHour` in the JSON of `/v1/stats`, as the dashboard reads it: camelCase, 60 minutes,
/// every span, null percentiles where nothing was measured.
#[tokio::test]
async fn the_last_hour_is_served_in_its_documented_shape() {
    let clock = ManualClock::at_unix_ms(T0);
    let store = Arc::new(MemoryStore::default().with_clock(Arc::new(clock.clone())));
    for (task, at, latency_ms) in [("a", T0 - 125_000, 40), ("b", T0 - 65_000, 12), ("c", T0 - 5_000, 15)] {
        store.record(&update(EventType::TaskCreated, task, at - latency_ms)).await.unwrap();
        store.record(&update(EventType::ImageDownloaded, task, at)).await.unwrap();
        store.record(&update(EventType::TaskCompleted, task, at + 1_000)).await.unwrap();
    }
    store.record(&failed_with("d", T0 - 1_000, "http_404")).await.unwrap();
    let addr = testing::serve_api(api::routes(store)).await;

    let (status, body) = get(addr, "/v1/stats").await;
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let hour = &json["lastHour"];
    let mut keys: Vec<&str> = hour.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(keys, ["failureReasons", "latencies", "perMinute", "tasks", "tasksPerSecond", "windowSeconds"]);
    assert_eq!(hour["windowSeconds"], 3600);
    assert_eq!(hour["tasks"], serde_json::json!({"completed": 3, "failed": 1, "cancelled": 0}));
    assert_eq!(hour["tasksPerSecond"], 4.0 / 3600.0);
    let minutes = hour["perMinute"].as_array().unwrap();
    assert_eq!(minutes.len(), 60);
    let m = minute_of(T0);
    assert_eq!(minutes[0], serde_json::json!({"at": m - 59 * 60_000, "completed": 0, "failed": 0, "cancelled": 0}));
    assert_eq!(minutes[57], serde_json::json!({"at": m - 2 * 60_000, "completed": 1, "failed": 0, "cancelled": 0}));
    assert_eq!(minutes[59], serde_json::json!({"at": m, "completed": 1, "failed": 1, "cancelled": 0}));
    assert_eq!(hour["latencies"]["download"], serde_json::json!({"count": 3, "p50Ms": 15.0, "p95Ms": 40.0}));
    assert_eq!(hour["latencies"]["analysis"], serde_json::json!({"count": 0, "p50Ms": null, "p95Ms": null}));
    let spans: Vec<&String> = hour["latencies"].as_object().unwrap().keys().collect();
    let all_time: Vec<&String> = json["latencies"].as_object().unwrap().keys().collect();
    assert_eq!(spans, all_time, "the same span names as the all-time latencies");
    assert_eq!(hour["failureReasons"], serde_json::json!([{"code": "http_404", "count": 1}]));
    let answer: StatsResponse = serde_json::from_str(&body).unwrap();
    assert_eq!(serde_json::to_value(&answer).unwrap(), json, "the answer reads back as it was served");
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
    settings.http.auth_token = Some("stats-t0ken-0123456789abcdef0123456789".to_owned().into());
    let service = Service::start_with("analytics-worker", settings, Shutdown::new()).await.unwrap();
    let addr = service.http_addr();
    let checks = async {
        let answer =
            testing::get_until(addr, "/v1/stats", Some("stats-t0ken-0123456789abcdef0123456789"), |a| a.status != 404)
                .await;
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
    let addr = testing::serve_api(api::routes(store.clone())).await;
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
    publish("queue.paused", names::queues::METADATA, queue_paused(7_000)).await;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let stats = loop {
        let (status, body) = get(addr, "/v1/stats").await;
        assert_eq!(status, 200, "{body}");
        let stats: StatsResponse = serde_json::from_str(&body).unwrap();
        if stats.tasks["failed"] == 1
            && stats.events["image.downloaded"] == 2
            && stats.latencies["download"].count == 2
            && stats.events["queue.paused"] == 1
            // the redelivered event, last of its task's lane, may come after the others
            && metrics.render().contains(r#"imagepipe_subscriber_duplicates_total{source="analytics"} 1"#)
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
