//! Nothing the coordinator keeps grows for ever: finished tasks go after `coordinator.retention`
//! (on both stores, with a manual clock), the dead-letter archive stays within `dlq.*`, blobs
//! no task references go after `blob.orphan_grace` (on both stores and both blob backends), and
//! a stopped coordinator leaves no `/v1/events` consumer on NATS.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use imagepipe_blob::{BlobKey, BlobStore, LocalBlobStore, ObjectBlobStore};
use imagepipe_bus::NatsConfig;
use imagepipe_bus::nats::NatsBus;
use imagepipe_contracts::names::{self, queues};
use imagepipe_contracts::step::StepOutput;
use imagepipe_contracts::{Step, SubmitTask};
use imagepipe_contracts::{StepOutcome, StepResult};
use imagepipe_coordinator::blob_sweep::{BlobSweeper, Swept};
use imagepipe_coordinator::consumers::DeadLetterArchiver;
use imagepipe_coordinator::engine::{Handled, Origin};
use imagepipe_coordinator::events::EventHub;
use imagepipe_coordinator::loops::{self, LoopsConfig};
use imagepipe_coordinator::retention::{Expired, Expirer, Retention};
use imagepipe_coordinator::store::TaskStore;
use imagepipe_coordinator::store::embedded::EmbeddedStore;
use imagepipe_coordinator::store::redis::RedisStore;
use imagepipe_coordinator::task::TaskState;
use imagepipe_coordinator::{Input, Task};
use imagepipe_runtime::clock::{Clock, ManualClock, SystemClock};
use imagepipe_runtime::config::WorkerConfig;
use imagepipe_runtime::shutdown::Shutdown;
use imagepipe_runtime::worker::{Handler, LoopConfig, Outcome};

const GRACE: Duration = Duration::from_secs(10);
const HOUR: Duration = Duration::from_secs(3600);

fn retention() -> Retention {
    Retention { tasks: HOUR, dlq_max_entries: 2, dlq_max_age: 24 * HOUR }
}

/// Submits `id` with idempotency key `key` and runs it to completion.
async fn complete(engine: &imagepipe_coordinator::engine::Engine, id: &str, key: &str) -> Task {
    let submit = SubmitTask {
        task_id: Some(id.into()),
        idempotency_key: Some(key.into()),
        ..SubmitTask::url("https://example.com/cat.jpg")
    };
    assert!(engine.submit(&submit, Origin::Http, String::new).await.unwrap().created);
    engine.start_queued().await.unwrap();
    let mut task = None;
    for step in Step::ALL {
        let handled = engine.handle(id, Input::Result(Box::new(ok(id, step, 1)))).await.unwrap();
        let Handled::Applied(applied) = handled else { panic!("{step}: {handled:?}") };
        task = Some(*applied);
    }
    task.unwrap()
}

/// A finished task is kept exactly `retention.tasks` after it finished, then every trace of it
/// is gone and its idempotency key takes a new task; the archiver keeps the dead-letter
/// archive within its count as letters arrive, and the expirer drops the old ones.
async fn expires_on(store: Arc<dyn TaskStore>) {
    let bus = memory_bus();
    let clock = ManualClock::at_unix_ms(T0);
    let engine = engine(store.clone(), &bus, &clock, 10);
    let expirer = Expirer::new(store.clone(), Arc::new(clock.clone()), retention());

    clock.advance(Duration::from_secs(5));
    let done = complete(&engine, "tsk_kept_an_hour", "order-9").await;
    assert_eq!(done.state, TaskState::Completed);
    let running = SubmitTask { task_id: Some("tsk_running".into()), ..SubmitTask::url("https://example.com/a.jpg") };
    engine.submit(&running, Origin::Http, String::new).await.unwrap();
    engine.start_queued().await.unwrap();
    assert_eq!(expirer.pass().await.unwrap(), Expired::default());

    clock.advance(HOUR - Duration::from_millis(1));
    assert_eq!(expirer.pass().await.unwrap().tasks, 0, "kept until the retention has passed");
    assert!(store.get("tsk_kept_an_hour").await.unwrap().is_some());
    clock.advance(Duration::from_millis(1));
    assert_eq!(expirer.pass().await.unwrap().tasks, 1);
    assert!(store.get("tsk_kept_an_hour").await.unwrap().is_none());
    assert!(store.history("tsk_kept_an_hour").await.unwrap().is_empty());
    assert_eq!(store.find_by_idempotency_key("order-9").await.unwrap(), None);
    assert_eq!(store.get("tsk_running").await.unwrap().unwrap().state, TaskState::Downloading);

    let again = SubmitTask { idempotency_key: Some("order-9".into()), ..SubmitTask::url("https://example.com/b.jpg") };
    let resubmitted = engine.submit(&again, Origin::Http, || "tsk_new".into()).await.unwrap();
    assert!(resubmitted.created, "the expired task's idempotency key is free again");

    let archiver = DeadLetterArchiver::new(engine.clone(), expirer.clone());
    let dlq = names::dead_letter_queue(queues::DOWNLOAD);
    for i in 0..3 {
        clock.advance(Duration::from_secs(1));
        let delivery = deliver(&bus, &dlq, format!("{{\"n\":{i}}}").into_bytes()).await;
        assert_eq!(archiver.handle(&delivery).await, Outcome::Ack);
        delivery.ack().await.unwrap();
        assert!(store.dead_letters(10, None).await.unwrap().entries.len() <= 2, "within dlq.max_entries");
    }
    let kept: Vec<_> = store.dead_letters(10, None).await.unwrap().entries.into_iter().map(|l| l.body).collect();
    assert_eq!(kept, [r#"{"n":1}"#, r#"{"n":2}"#], "the oldest went first");
    clock.advance(24 * HOUR);
    assert_eq!(expirer.pass().await.unwrap().dead_letters, 2, "older than dlq.max_age");
    assert!(store.dead_letters(10, None).await.unwrap().entries.is_empty());
}

#[tokio::test]
async fn finished_tasks_and_dead_letters_expire_in_the_embedded_store() {
    let dir = tempfile::tempdir().unwrap();
    expires_on(Arc::new(EmbeddedStore::open(dir.path(), GRACE).unwrap())).await;
}

#[tokio::test]
async fn finished_tasks_and_dead_letters_expire_in_redis() {
    let prefix = unique_prefix("retention");
    let _cleanup = RedisCleanup(prefix.clone());
    expires_on(Arc::new(RedisStore::connect(REDIS, &prefix, GRACE).await.unwrap())).await;
}

/// Uploads `bytes`; the key.
async fn put(blobs: &dyn BlobStore, bytes: &'static [u8]) -> BlobKey {
    blobs.put(bytes::Bytes::from_static(bytes)).await.unwrap()
}

/// Runs task `id`, submitted as uploaded blob `upload`, to completion: its metadata step wrote
/// `thumbnail`.
async fn complete_upload(
    engine: &imagepipe_coordinator::engine::Engine,
    id: &str,
    upload: &BlobKey,
    thumbnail: &BlobKey,
) {
    let submit = SubmitTask { task_id: Some(id.into()), blob: Some(upload.to_string()), ..SubmitTask::default() };
    assert!(engine.submit(&submit, Origin::Http, String::new).await.unwrap().created);
    engine.start_queued().await.unwrap();
    for step in Step::ALL {
        let output = match output(step) {
            StepOutput::Download(mut download) => {
                download.blob_key = upload.to_string();
                StepOutput::Download(download)
            }
            StepOutput::Metadata(mut metadata) => {
                metadata.thumbnail_key = thumbnail.to_string();
                StepOutput::Metadata(metadata)
            }
            other => other,
        };
        let result = StepResult { task_id: id.into(), step, attempt: 1, outcome: StepOutcome::Ok { output } };
        let handled = engine.handle(id, Input::Result(Box::new(result))).await.unwrap();
        assert!(matches!(handled, Handled::Applied(_)), "{step}: {handled:?}");
    }
}

async fn exists(blobs: &dyn BlobStore, keys: &[&BlobKey]) -> Vec<bool> {
    let mut found = Vec::new();
    for key in keys {
        found.push(blobs.exists(key).await.unwrap());
    }
    found
}

/// An upload never submitted and a derivative no result recorded go once `blob.orphan_grace`
/// old; a task's upload and derivatives stay while the task does and go when it expires, but
/// for a blob another task still references. The blobs' times are real: the clock starts a
/// second after the real time (every blob is written within that second) and is moved by hand.
async fn blobs_follow_their_tasks_on(store: Arc<dyn TaskStore>, blobs: Arc<dyn BlobStore>) {
    let grace = 24 * HOUR;
    let bus = memory_bus();
    let clock = ManualClock::at_unix_ms(SystemClock.unix_ms() + 1_000);
    let engine = engine(store.clone(), &bus, &clock, 10);
    let expirer = Expirer::new(store.clone(), Arc::new(clock.clone()), retention());
    let sweeper = BlobSweeper::new(store.clone(), blobs.clone(), Arc::new(clock.clone()), grace);

    let never_submitted = put(&*blobs, b"an upload nobody submitted").await;
    let stray = put(&*blobs, b"a thumbnail of an attempt whose result was lost").await;
    let (upload, thumbnail) = (put(&*blobs, b"an uploaded photo").await, put(&*blobs, b"its thumbnail").await);
    let shared = put(&*blobs, b"a photo uploaded twice").await;
    complete_upload(&engine, "tsk_blob_a", &upload, &thumbnail).await;
    complete_upload(&engine, "tsk_blob_b", &shared, &thumbnail).await;

    assert_eq!(sweeper.pass().await.unwrap(), Swept::default(), "everything is younger than the grace");
    clock.advance(grace - Duration::from_secs(2));
    assert_eq!(sweeper.pass().await.unwrap(), Swept::default(), "kept until the grace has passed");
    clock.advance(Duration::from_secs(2));
    assert_eq!(sweeper.pass().await.unwrap(), Swept { released: 0, orphans: 2 });
    let all = [&never_submitted, &stray, &upload, &thumbnail, &shared];
    assert_eq!(exists(&*blobs, &all).await, [false, false, true, true, true], "the unreferenced ones went");

    // The second upload is submitted again a day later: the same blob, now two tasks'.
    let other_thumbnail = put(&*blobs, b"the thumbnail of the second run").await;
    complete_upload(&engine, "tsk_blob_c", &shared, &other_thumbnail).await;
    // A one-hour retention: tsk_blob_a and tsk_blob_b expire, tsk_blob_c (finished now) stays.
    assert_eq!(expirer.pass().await.unwrap().tasks, 2);
    assert_eq!(sweeper.pass().await.unwrap(), Swept { released: 2, orphans: 0 }, "tsk_blob_a's upload, the thumbnail");
    assert_eq!(exists(&*blobs, &all[2..]).await, [false, false, true], "tsk_blob_c references the upload");
    clock.advance(HOUR);
    assert_eq!(expirer.pass().await.unwrap().tasks, 1);
    assert_eq!(sweeper.pass().await.unwrap(), Swept { released: 2, orphans: 0 });
    assert!(blobs.list(None, 10).await.unwrap().is_empty(), "nothing is left");
}

#[tokio::test]
async fn blobs_follow_their_tasks_in_the_embedded_store_and_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(EmbeddedStore::open(dir.path(), GRACE).unwrap());
    blobs_follow_their_tasks_on(store, Arc::new(LocalBlobStore::new(dir.path().join("blobs")))).await;
}

#[tokio::test]
async fn blobs_follow_their_tasks_in_redis_and_an_object_store() {
    let prefix = unique_prefix("blob-sweep");
    let _cleanup = RedisCleanup(prefix.clone());
    let store = Arc::new(RedisStore::connect(REDIS, &prefix, GRACE).await.unwrap());
    let objects = Arc::new(object_store::memory::InMemory::new());
    blobs_follow_their_tasks_on(store, Arc::new(ObjectBlobStore::new(objects, "blobs"))).await;
}

/// The same on the Redis Cluster of the tests (`IMAGEPIPE_TEST_REDIS_CLUSTER_URL`): a task's
/// blob references are found again when it expires though its keys and the reference index
/// are in different slots.
#[tokio::test]
async fn blobs_follow_their_tasks_in_a_redis_cluster_and_a_directory() {
    let Some(url) = imagepipe_contracts::testing::redis_urls().into_iter().find(|(n, _)| *n == "cluster").map(|u| u.1)
    else {
        return;
    };
    let prefix = unique_prefix("blob-sweep-cluster");
    let store = Arc::new(RedisStore::connect(&url, &prefix, GRACE).await.unwrap());
    let dir = tempfile::tempdir().unwrap();
    blobs_follow_their_tasks_on(store, Arc::new(LocalBlobStore::new(dir.path().join("blobs")))).await;
    let mut conn = imagepipe_runtime::redis_connection::RedisConnection::open(&url).await.unwrap();
    for key in conn.scan_match(&format!("{prefix}:*"), 1_000).await.unwrap() {
        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(key).query_async(&mut conn).await;
    }
}

/// The coordinator's `/v1/events` group on NATS 2.9 exists while a client watches (not before),
/// and the server deletes it once the coordinator has stopped (here after a 1 s idle threshold).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_coordinator_leaves_no_events_consumer_on_nats() {
    let url = std::env::var("IMAGEPIPE_TEST_NATS_URL").unwrap_or_else(|_| "nats://127.0.0.1:4222".into());
    let prefix = format!("nt_coord_sse_{}", uuid::Uuid::new_v4().simple());
    let nats = NatsBus::connect(&prefix, &NatsConfig { url: url.clone(), ..NatsConfig::default() })
        .await
        .unwrap_or_else(|e| panic!("NATS at {url}: {e} (run scripts/nats.sh)"));
    let streams = nats.stream_names();
    let bus = nats.into_bus();
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::at_unix_ms(T0);
    let engine = engine(Arc::new(EmbeddedStore::open(dir.path(), GRACE).unwrap()), &bus, &clock, 10);
    let group = format!("coordinator-sse-{}", uuid::Uuid::new_v4().simple());
    let mut worker = LoopConfig::from_settings("coordinator", &WorkerConfig::default());
    worker.fetch_wait = Duration::from_millis(200);
    let config = LoopsConfig {
        worker,
        max_batch: loops::MAX_BATCH,
        consumer: consumer_config(),
        shares: imagepipe_bus::Shares::default(),
        sweep_interval: Duration::from_secs(1),
        cap_recheck: Duration::from_millis(100),
        dlq_groups: Vec::new(),
        events_group: group.clone(),
        events_idle: Duration::from_secs(1),
        retention: retention(),
        expiry_interval: Duration::from_secs(60),
        cluster: None,
        shard_loops: 1,
    };
    let shutdown = Shutdown::new();
    let hub = EventHub::new(16, 4);
    let running = tokio::spawn(loops::run(engine, hub.clone(), config, shutdown.clone()));

    let js = async_nats::jetstream::new(async_nats::connect(&url).await.unwrap());
    let events = js.get_stream(&streams[1]).await.unwrap();
    let exists = |present: bool| {
        let events = events.clone();
        let group = group.clone();
        async move {
            let waiting = tokio::time::Instant::now();
            while events.consumer_info(&group).await.is_ok() != present {
                assert!(waiting.elapsed() < Duration::from_secs(30), "consumer {group} present: {}", !present);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    // The hub starts fed; the feeder marks it unfed when it starts (after every other consumer
    // is open) and feeds it only once subscribed: unfed and no group is the feeder waiting.
    let started = tokio::time::Instant::now();
    while hub.is_fed() {
        assert!(started.elapsed() < Duration::from_secs(30), "the event feeder never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(events.consumer_info(&group).await.is_err(), "no group while nobody watches");
    assert!(!hub.is_fed(), "no subscription while nobody watches");
    let watching = hub.watch().await.unwrap();
    exists(true).await;
    let info = events.consumer_info(&group).await.unwrap();
    assert_eq!(info.config.inactive_threshold, Duration::from_secs(1));

    shutdown.trigger();
    tokio::time::timeout(Duration::from_secs(30), running).await.unwrap().unwrap().unwrap();
    drop(watching);
    exists(false).await;
    for stream in streams {
        js.delete_stream(&stream).await.unwrap();
    }
}
