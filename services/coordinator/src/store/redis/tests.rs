use imagepipe_contracts::{ImageSource, SubmitTask, TraceId};

use super::*;
use crate::machine;
use crate::store::suite;

/// Any fixed time, Unix ms.
const T0: u64 = 1_763_800_000_000;

pub(crate) const URL: &str = "redis://127.0.0.1:6379";

/// Deletes every key of a test's prefix when dropped.
pub(crate) struct Cleanup(pub(crate) String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let Ok(mut conn) = redis::Client::open(URL).and_then(|c| c.get_connection()) else { return };
        let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{}:*", self.0)).query(&mut conn).unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut conn);
        }
    }
}

pub(crate) fn unique_prefix(name: &str) -> String {
    format!("test-coord-{name}-{}", uuid::Uuid::new_v4().simple())
}

async fn make(name: &'static str) -> (RedisStore, Cleanup) {
    let prefix = unique_prefix(name);
    (RedisStore::connect(URL, &prefix, suite::RELAY_GRACE).await.unwrap(), Cleanup(prefix))
}

crate::store_suite!(make);

/// Timings of listings at 100,000 tasks: `cargo nextest run --all-features -p
/// imagepipe-coordinator --run-ignored only --no-capture -E 'test(listing_timings)'`.
#[tokio::test]
#[ignore = "a timing, not a check: run by hand"]
async fn listing_timings_at_100_000_tasks() {
    let (store, _cleanup) = make("timings").await;
    let timings = suite::time_listings(&store, 100_000).await;
    assert!(timings[0].1 < 50.0, "{timings:?}");
}

#[tokio::test]
async fn survives_a_reconnect() {
    let prefix = unique_prefix("reconnect");
    let _cleanup = Cleanup(prefix.clone());
    let id = suite::write_a_started_task(&RedisStore::connect(URL, &prefix, suite::RELAY_GRACE).await.unwrap()).await;
    let again = RedisStore::connect(URL, &prefix, suite::RELAY_GRACE).await.unwrap();
    suite::check_a_started_task(&again, &id).await;
}

#[tokio::test]
async fn every_key_of_a_task_shares_its_hash_slot() {
    let (store, _cleanup) = make("slots").await;
    let slot = |key: &str| imagepipe_runtime::dedup::slot::hash_slot(key.as_bytes());
    let id = "tsk_01J";
    let shard = imagepipe_contracts::shard::shard_of(id, imagepipe_contracts::shard::DEFAULT_SHARDS);
    let tag = slot(&format!("{{{}:s{shard}}}", store.prefix));
    assert_eq!(slot(&store.task_key(id)), tag, "in the slot of the task's shard");
    let short = store.task_key(id).split_once('{').and_then(|(_, rest)| rest.split_once('}')).unwrap().0.to_owned();
    assert!(short.len() <= 3 && !short.contains(&store.prefix), "a short tag: {}", store.task_key(id));
    assert_eq!(slot(&store.history_key(id)), tag);
    assert_eq!(slot(&store.legacy_history_key(id)), tag);
    assert_eq!(slot(&store.outbox_key(id)), tag);
    assert_eq!(slot(&store.lease_key(shard)), tag, "the transition script checks the lease in the same slot");
    assert_eq!(slot(&store.layout_2_key("task", id)), tag, "layout 2's keys move within the slot");
    let other = store.clone().with_shards(7);
    let tag_7 = slot(&format!("{{{}:s{}}}", store.prefix, imagepipe_contracts::shard::shard_of(id, 7)));
    assert_eq!(slot(&other.task_key(id)), tag_7);
    assert_eq!(slot(&store.index_key("due")), slot(&store.index_key("claimed")));
    assert_eq!(slot(&store.state_key(TaskState::Queued)), slot(&store.index_key("all")));
    for name in ["due", "claimed", "queued"] {
        assert_eq!(slot(&store.shard_index_key(name, shard)), slot(&store.index_key("all")), "{name}: the index slot");
    }
    assert_eq!(slot(&store.cluster_key("replicas")), slot(&store.cluster_key("handovers")));
}

#[tokio::test]
async fn the_in_flight_set_of_an_older_store_is_built_at_connect() {
    let prefix = unique_prefix("in-flight");
    let _cleanup = Cleanup(prefix.clone());
    let store = RedisStore::connect(URL, &prefix, suite::RELAY_GRACE).await.unwrap();
    suite::write_a_started_task(&store).await;
    let () = store.conn.clone().del(store.index_key("in_flight")).await.unwrap();
    assert_eq!(store.count_in_flight().await.unwrap(), 0);
    let again = RedisStore::connect(URL, &prefix, suite::RELAY_GRACE).await.unwrap();
    assert_eq!(again.count_in_flight().await.unwrap(), 1);
}

#[tokio::test]
async fn a_transition_loads_its_script_when_the_server_lost_it() {
    let (store, _cleanup) = make("noscript").await;
    let created = machine::create(
        "tsk_noscript".into(),
        &SubmitTask::url("https://example.com/a.jpg"),
        ImageSource::Url("https://example.com/a.jpg".into()),
        TraceId::random(),
        T0,
    );
    assert_eq!(store.create(&created).await.unwrap(), Created::New);
    let () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut store.conn.clone()).await.unwrap();
    let ctx = machine::Context { now: T0 + 1, seed: 0, ..machine::Context::default() };
    let machine::Verdict::Apply(start) =
        machine::decide(&created.task, &machine::Input::Start, &ctx, &machine::Policy::default()).unwrap()
    else {
        panic!("a queued task starts")
    };
    assert_eq!(store.apply(&start).await.unwrap(), Applied::Yes);
    assert_eq!(store.get("tsk_noscript").await.unwrap().unwrap().state, TaskState::Downloading);
}

#[tokio::test]
async fn an_expired_task_leaves_no_key_behind() {
    let (store, _cleanup) = make("expired").await;
    suite::expire_the_only_task(&store).await;
    let mut keys: Vec<String> =
        redis::cmd("KEYS").arg(format!("{}:*", store.prefix)).query_async(&mut store.conn.clone()).await.unwrap();
    keys.sort();
    // The store's own markers, and the task's blobs, released for the blob sweeper.
    assert_eq!(
        keys,
        [store.index_key("blob_refs_built"), store.index_key("layout"), store.index_key("released_blobs")]
    );
    assert!(!store.take_released_blobs(10).await.unwrap().is_empty());
}

#[tokio::test]
async fn tasks_written_before_blob_references_were_kept_keep_their_blobs() {
    let (store, _cleanup) = make("legacy-blobs").await;
    let keys = suite::write_a_blob_task(&store).await;
    let mut conn = store.conn.clone();
    let mut dropped = vec![store.index_key("blob_refs_built"), store.task_blobs_key("tsk_blob_legacy")];
    dropped.extend(keys.iter().map(|k| store.blob_key(k)));
    let () = conn.del(&dropped).await.unwrap();
    assert_eq!(store.referenced_blobs(&[keys[0].as_str()]).await.unwrap(), [false]);
    let again = RedisStore::connect(URL, &store.prefix, suite::RELAY_GRACE).await.unwrap();
    suite::check_blobs_referenced(&again, &keys).await;
}

#[tokio::test]
async fn tasks_finished_before_the_finished_set_was_kept_expire_too() {
    let (store, _cleanup) = make("legacy").await;
    suite::write_a_cancelled_task(&store).await;
    let () = store.conn.clone().del(store.index_key("finished")).await.unwrap();
    let again = RedisStore::connect(URL, &store.prefix, suite::RELAY_GRACE).await.unwrap();
    suite::check_the_cancelled_task_expires(&again).await;
}

#[tokio::test]
async fn history_an_older_store_wrote_as_a_stream_is_read_first_and_expires_too() {
    let (store, _cleanup) = make("legacy-history").await;
    let created = machine::create(
        "tsk_stream".into(),
        &SubmitTask::url("https://example.com/a.jpg"),
        ImageSource::Url("https://example.com/a.jpg".into()),
        TraceId::random(),
        T0,
    );
    store.create(&created).await.unwrap();
    let mut conn = store.conn.clone();
    let first: Vec<u8> = conn.hget(store.task_key("tsk_stream"), "hist").await.unwrap();
    let () = conn.hdel(store.task_key("tsk_stream"), "hist").await.unwrap();
    let () = redis::cmd("XADD")
        .arg(store.legacy_history_key("tsk_stream"))
        .arg("1-0")
        .arg("entry")
        .arg(first)
        .query_async(&mut conn)
        .await
        .unwrap();
    let ctx = machine::Context { now: T0 + 1, seed: 0, ..machine::Context::default() };
    let cancel = machine::Input::Cancel { reason: None };
    let machine::Verdict::Apply(cancelled) =
        machine::decide(&created.task, &cancel, &ctx, &machine::Policy::default()).unwrap()
    else {
        panic!("a queued task is cancelled")
    };
    assert_eq!(store.apply(&cancelled).await.unwrap(), Applied::Yes);
    let versions: Vec<_> = store.history("tsk_stream").await.unwrap().iter().map(|h| h.version).collect();
    assert_eq!(versions, [1, 2]);

    assert_eq!(store.expire_finished(T0 + 1, 10).await.unwrap(), 1);
    let keys: Vec<String> =
        redis::cmd("KEYS").arg(format!("{}:*tsk_stream*", store.prefix)).query_async(&mut conn).await.unwrap();
    assert!(keys.is_empty(), "left behind: {keys:?}");
}

/// The decision `input` makes of `task` at `now`, written by `replica`.
fn decided(task: &Task, input: machine::Input, now: u64, replica: Option<&str>) -> Decision {
    let ctx = machine::Context { now, seed: 0, ..machine::Context::default() };
    let machine::Verdict::Apply(mut d) = machine::decide(task, &input, &ctx, &machine::Policy::default()).unwrap()
    else {
        panic!("{input:?} applies")
    };
    d.history.replica = replica.map(str::to_owned);
    *d
}

/// A task hash's `hist` field, line by line.
async fn hist_lines(store: &RedisStore, id: &str) -> Vec<String> {
    let field: Option<String> = store.conn.clone().hget(store.task_key(id), "hist").await.unwrap();
    field.unwrap_or_default().lines().map(str::to_owned).collect()
}

/// Entries keep their replica in the task hash only where it changes, and read back whole; the
/// entries a store written before kept in a list are read first, and its `state` field goes.
pub(crate) async fn history_names_a_replica_where_it_changes(store: &RedisStore) {
    let url = SubmitTask::url("https://example.com/a.jpg");
    let created = machine::create("tsk_replicas".into(), &url, url.validate().unwrap(), TraceId::random(), T0);
    assert_eq!(store.create(&created).await.unwrap(), Created::New);
    // As a store written before the `hist` field left it: the entry in a list, the version and
    // the state in fields of their own, the JSON alone.
    let mut conn = store.conn.clone();
    let key = store.task_key("tsk_replicas");
    let first: String = conn.hget(&key, "hist").await.unwrap();
    let () = conn.hdel(&key, "hist").await.unwrap();
    let () = conn.rpush(store.history_key("tsk_replicas"), &first).await.unwrap();
    let field: String = conn.hget(&key, "task").await.unwrap();
    let (version, json) = field.split_once(' ').unwrap();
    assert_eq!(version, "1");
    let () = conn.hset_multiple(&key, &[("task", json), ("version", "1"), ("state", "queued")]).await.unwrap();
    assert_eq!(store.get("tsk_replicas").await.unwrap().as_ref(), Some(&created.task), "read as before");

    use imagepipe_contracts::Step;
    let result = |task: &Task, step: Step| {
        let output = crate::machine::tests::output(step);
        let outcome = imagepipe_contracts::StepOutcome::Ok { output };
        machine::Input::Result(Box::new(imagepipe_contracts::StepResult {
            task_id: task.id.clone(),
            step,
            attempt: task.current_attempt(),
            outcome,
        }))
    };
    let mut task = created.task.clone();
    let mut written = vec![created.history.clone()];
    let steps: [(Option<Step>, Option<&str>); 7] = [
        (None, Some("replica-a")),
        (Some(Step::Download), Some("replica-a")),
        (Some(Step::Metadata), None),
        (Some(Step::Analyze), Some("replica-b")),
        (None, Some("replica-b")),
        (Some(Step::Analyze), Some("replica-b")),
        (None, Some("replica-a")),
    ];
    for (i, (step, replica)) in steps.into_iter().enumerate() {
        let input = match (step, i) {
            (Some(step), _) => result(&task, step),
            (None, 0) => machine::Input::Start,
            (None, 4) => machine::Input::Reprocess { from: Step::Analyze, priority: None },
            (None, _) => machine::Input::Reprocess { from: Step::Metadata, priority: None },
        };
        let d = decided(&task, input, T0 + 1 + i as u64, replica);
        assert_eq!(store.apply(&d).await.unwrap(), Applied::Yes, "transition {i}");
        written.push(d.history.clone());
        task = d.task;
    }
    // finish the last generation, so that the task expires
    for step in [Step::Metadata, Step::Analyze] {
        let d = decided(&task, result(&task, step), T0 + 20, Some("replica-a"));
        assert_eq!(store.apply(&d).await.unwrap(), Applied::Yes);
        written.push(d.history.clone());
        task = d.task;
    }
    assert_eq!(store.history("tsk_replicas").await.unwrap(), written, "read back as written, the list's first");
    let lines = hist_lines(store, "tsk_replicas").await;
    let compact: Vec<bool> = lines.iter().map(|l| l.starts_with('=')).collect();
    assert_eq!(compact, [false, true, false, false, true, true, false, true, true], "{lines:#?}");
    assert!(lines.iter().filter(|l| l.starts_with('=')).all(|l| !l.contains("replica")), "{lines:#?}");
    let old: (Option<String>, Option<String>) =
        redis::cmd("HMGET").arg(&key).arg("version").arg("state").query_async(&mut conn).await.unwrap();
    assert_eq!(old, (None, None), "the version is in the task field now, and the state went");
    assert_eq!(store.get("tsk_replicas").await.unwrap(), Some(task.clone()));

    assert_eq!(task.state, TaskState::Completed);
    assert_eq!(store.expire_finished(T0 + 20, 10).await.unwrap(), 1);
    let keys = conn.exists::<_, u32>(&[store.task_key("tsk_replicas"), store.history_key("tsk_replicas")]).await;
    assert_eq!(keys.unwrap(), 0, "the hash and the list go");
}

/// The blob keys a task's hash does not show are released with it all the same: those a store
/// written before kept in its per-task set, and those a refused write indexed.
pub(crate) async fn blob_keys_of_old_records_and_refused_writes_go_with_their_task(store: &RedisStore) {
    let keys = suite::write_a_blob_task(store).await;
    let id = "tsk_blob_legacy";
    let (kept, refused) = (format!("sha256:{}", "7".repeat(64)), format!("sha256:{}", "8".repeat(64)));
    // An older version kept the blobs of an earlier generation in the task's set.
    let mut conn = store.conn.clone();
    let () = conn.sadd(store.task_blobs_key(id), &kept).await.unwrap();
    let () = conn.sadd(store.blob_key(&kept), id).await.unwrap();
    // A write refused (an old version) after its index commands referenced a blob.
    let done = store.get(id).await.unwrap().unwrap();
    let mut stale = decided(
        &done,
        machine::Input::Reprocess { from: imagepipe_contracts::Step::Download, priority: None },
        T0 + 20,
        None,
    );
    stale.task.version -= 1;
    stale.task.source = ImageSource::Blob(refused.clone());
    assert_eq!(store.apply(&stale).await.unwrap(), Applied::Conflict);
    let all: Vec<&str> = keys.iter().chain([&kept, &refused]).map(String::as_str).collect();
    assert_eq!(store.referenced_blobs(&all).await.unwrap(), [true; 5]);
    let gone: Option<String> = conn.hget(store.task_key(id), "gone").await.unwrap();
    assert_eq!(gone.as_deref(), Some(refused.as_str()), "the refused write's key is kept");

    assert_eq!(store.expire_finished(T0 + 10, 10).await.unwrap(), 1);
    let mut released = store.take_released_blobs(10).await.unwrap();
    released.sort();
    let mut expected: Vec<String> = all.iter().map(|k| (*k).to_owned()).collect();
    expected.sort();
    assert_eq!(released, expected);
    assert!(!conn.exists::<_, bool>(store.task_blobs_key(id)).await.unwrap(), "the old set goes too");
}

/// A store of layout 2 (a task's keys tagged `{P:s<shard>}`) has them moved to the short tags
/// of their slots when opened, on one server and on a cluster (each move within one slot).
pub(crate) async fn a_store_of_layout_2_is_moved_when_opened(store: &RedisStore, url: &str) {
    let started = suite::write_a_started_task(store).await;
    let history = store.history(&started).await.unwrap();
    let outbox = store.outbox(&started).await.unwrap();
    assert!(!outbox.is_empty());
    let mut conn = store.conn.clone();
    for kind in ["task", "outbox"] {
        let new = match kind {
            "task" => store.task_key(&started),
            _ => store.outbox_key(&started),
        };
        let () = conn.rename(&new, store.layout_2_key(kind, &started)).await.unwrap();
    }
    let () = conn.set(store.index_key("layout"), 2).await.unwrap();

    let again = RedisStore::connect(url, &store.prefix, suite::RELAY_GRACE).await.unwrap();
    suite::check_a_started_task(&again, &started).await;
    assert_eq!(again.history(&started).await.unwrap(), history);
    assert_eq!(again.outbox(&started).await.unwrap(), outbox);
    let left: u32 =
        conn.exists(&[store.layout_2_key("task", &started), store.layout_2_key("outbox", &started)]).await.unwrap();
    assert_eq!(left, 0, "nothing left under layout 2's names");
    let layout: u32 = conn.get(store.index_key("layout")).await.unwrap();
    assert_eq!(layout, 3);
}

#[tokio::test]
async fn a_store_of_layout_2_is_moved_when_opened_on_one_server() {
    let (store, _cleanup) = make("layout-2").await;
    a_store_of_layout_2_is_moved_when_opened(&store, URL).await;
}

#[tokio::test]
async fn history_names_a_replica_where_it_changes_on_one_server() {
    let (store, _cleanup) = make("hist-replicas").await;
    history_names_a_replica_where_it_changes(&store).await;
}

#[tokio::test]
async fn blob_keys_of_old_records_and_refused_writes_go_with_their_task_on_one_server() {
    let (store, _cleanup) = make("blob-refs").await;
    blob_keys_of_old_records_and_refused_writes_go_with_their_task(&store).await;
}

#[tokio::test]
async fn a_prefix_with_braces_is_refused() {
    assert!(RedisStore::connect(URL, "a{b}", suite::RELAY_GRACE).await.is_err());
}

/// Turns the keys of tasks `ids` that `store` wrote into layout 1's (`P:<kind>:{<id>}`, the
/// layout before shards) and drops what layout 2 added: the per-shard sets and the marker.
async fn back_to_layout_1(store: &RedisStore, ids: &[&str]) {
    let mut conn = store.conn.clone();
    for id in ids {
        let shard = store.shard(id);
        for (kind, key) in
            [("task", store.task_key(id)), ("hist", store.history_key(id)), ("outbox", store.outbox_key(id))]
        {
            if conn.exists::<_, bool>(&key).await.unwrap() {
                let () = conn.rename(&key, store.unsharded_key(kind, id)).await.unwrap();
            }
        }
        for name in ["due", "claimed", "queued"] {
            let () = conn.del(store.shard_index_key(name, shard)).await.unwrap();
        }
    }
    let () = conn.del(store.index_key("layout")).await.unwrap();
}

#[tokio::test]
async fn a_store_of_the_layout_before_shards_is_moved_when_opened() {
    let prefix = unique_prefix("layout");
    let _cleanup = Cleanup(prefix.clone());
    let old = RedisStore::connect(URL, &prefix, suite::RELAY_GRACE).await.unwrap();
    let started = suite::write_a_started_task(&old).await;
    let queued = machine::create(
        "tsk_layout_queued".into(),
        &SubmitTask::url("https://example.com/b.jpg"),
        ImageSource::Url("https://example.com/b.jpg".into()),
        TraceId::random(),
        T0,
    );
    assert_eq!(old.create(&queued).await.unwrap(), Created::New);
    let history = old.history(&started).await.unwrap();
    let outbox = old.outbox(&started).await.unwrap();
    back_to_layout_1(&old, &[&started, "tsk_layout_queued"]).await;
    // A history stream of an even older store moves too.
    let mut conn = old.conn.clone();
    let () = redis::cmd("XADD")
        .arg(old.unsharded_key("history", "tsk_layout_queued"))
        .arg("1-0")
        .arg("entry")
        .arg(crate::store::encode(&queued.history))
        .query_async(&mut conn)
        .await
        .unwrap();
    let old_keys = format!("{prefix}:*:{{tsk_*}}");
    let before: Vec<String> = redis::cmd("KEYS").arg(&old_keys).query_async(&mut conn).await.unwrap();
    assert_eq!(before.len(), 5, "layout 1 (the history in the task hash, the stream aside): {before:?}");

    // Two replicas start at once: both move, each key once.
    let (a, b) = (
        RedisStore::connect(URL, &prefix, suite::RELAY_GRACE).await.unwrap(),
        RedisStore::connect(URL, &prefix, suite::RELAY_GRACE).await.unwrap(),
    );
    let (from_a, from_b) = tokio::join!(a.get(&started), b.get("tsk_layout_queued"));
    assert_eq!(from_a.unwrap().unwrap().state, TaskState::Downloading);
    assert_eq!(from_b.unwrap().unwrap(), queued.task);
    let after: Vec<String> = redis::cmd("KEYS").arg(&old_keys).query_async(&mut conn).await.unwrap();
    assert!(after.is_empty(), "left under old names: {after:?}");
    assert_eq!(a.history(&started).await.unwrap(), history);
    assert_eq!(a.outbox(&started).await.unwrap(), outbox);
    let queued_history = a.history("tsk_layout_queued").await.unwrap();
    assert_eq!(queued_history, [queued.history.clone(), queued.history.clone()], "the stream first, then the list");
    suite::check_a_started_task(&b, &started).await;

    // The per-shard sets were built from the global ones.
    let shard = a.shard("tsk_layout_queued");
    assert_eq!(a.queued_in(&[shard], 10, 10).await.unwrap(), std::slice::from_ref(&queued.task));
    let due = T0 + suite::RELAY_GRACE.as_millis() as u64;
    assert_eq!(a.claim_due_in(&[shard], due, Duration::from_secs(1), 10).await.unwrap(), ["tsk_layout_queued"]);
    let layout: u32 = conn.get(a.index_key("layout")).await.unwrap();
    assert_eq!(layout, 3);

    // The move fixed the shard count: a store opened with another refuses to work.
    let other = RedisStore::connect(URL, &prefix, suite::RELAY_GRACE).await.unwrap().with_shards(16);
    let refused = other.get(&started).await.unwrap_err();
    assert!(matches!(refused, StoreError::ShardsChanged { stored: 64, configured: 16 }), "{refused:?}");
    // And opening it again moves nothing.
    let again = RedisStore::connect(URL, &prefix, suite::RELAY_GRACE).await.unwrap();
    assert_eq!(again.history(&started).await.unwrap(), history);
}

/// The suite and the `store.redis.min_replicas` checks on the Redis Cluster of the tests
/// (scripts/redis-cluster.sh, `IMAGEPIPE_TEST_REDIS_CLUSTER_URL`).
mod cluster {
    use imagepipe_contracts::testing::{REDIS_CLUSTER_URL_ENV, environment_missing};
    use imagepipe_runtime::redis_connection::RedisConnection;

    use super::*;

    /// Deletes every key of a test's prefix on the cluster when dropped.
    pub(crate) struct ClusterCleanup {
        url: String,
        prefix: String,
    }

    impl Drop for ClusterCleanup {
        fn drop(&mut self) {
            let (url, pattern) = (self.url.clone(), format!("{}:*", self.prefix));
            // Drop runs inside the test's runtime: clean up on a thread with its own.
            let cleaning = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
                runtime.block_on(async {
                    let mut conn = RedisConnection::open(&url).await.ok()?;
                    let keys = conn.scan_match(&pattern, 1_000).await.ok()?;
                    for key in keys {
                        let _: redis::RedisResult<()> = redis::cmd("DEL").arg(key).query_async(&mut conn).await;
                    }
                    Some(())
                })
            });
            let _ = cleaning.join();
        }
    }

    /// The cluster's URL, or `None` after [`environment_missing`] allowed a skip.
    fn url() -> Option<String> {
        match std::env::var(REDIS_CLUSTER_URL_ENV) {
            Ok(url) => Some(url),
            Err(_) => {
                environment_missing(&format!(
                    "the Redis Cluster is not running: {REDIS_CLUSTER_URL_ENV} is not set \
                     (source scripts/redis-cluster.sh; ensure_redis_cluster)"
                ));
                None
            }
        }
    }

    async fn make(name: &'static str) -> Option<(RedisStore, ClusterCleanup)> {
        let url = url()?;
        let prefix = unique_prefix(name);
        let store = RedisStore::connect(&url, &prefix, suite::RELAY_GRACE)
            .await
            .unwrap_or_else(|e| panic!("Redis Cluster at {url}: {}", imagepipe_runtime::error_chain(&e)));
        assert!(store.conn.is_cluster(), "{url} opens a cluster connection");
        Some((store, ClusterCleanup { url, prefix }))
    }

    crate::store_suite!(optional make);

    #[tokio::test]
    async fn a_store_of_layout_2_is_moved_when_opened_on_a_cluster() {
        let (Some(url), Some((store, _cleanup))) = (url(), make("layout-2").await) else { return };
        super::a_store_of_layout_2_is_moved_when_opened(&store, &url).await;
    }

    #[tokio::test]
    async fn history_names_a_replica_where_it_changes_on_a_cluster() {
        let Some((store, _cleanup)) = make("hist-replicas").await else { return };
        super::history_names_a_replica_where_it_changes(&store).await;
    }

    #[tokio::test]
    async fn blob_keys_of_old_records_and_refused_writes_go_with_their_task_on_a_cluster() {
        let Some((store, _cleanup)) = make("blob-refs").await else { return };
        super::blob_keys_of_old_records_and_refused_writes_go_with_their_task(&store).await;
    }

    /// A batch of transitions over many shards (so over every primary) with
    /// `min_replicas` of `replicas`.
    async fn write_a_batch(replicas: u32) -> Option<(Result<Vec<Applied>, StoreError>, RedisStore, ClusterCleanup)> {
        let (store, cleanup) = make("min-replicas").await?;
        let store = store.with_min_replicas(replicas);
        let decisions: Vec<Decision> = (0..32)
            .map(|i| {
                let s = SubmitTask::url("https://example.com/a.jpg");
                machine::create(format!("tsk_wait{i}"), &s, s.validate().unwrap(), TraceId::random(), T0)
            })
            .collect();
        Some((store.apply_many(&decisions).await, store, cleanup))
    }

    #[tokio::test]
    async fn a_batch_acknowledged_by_one_replica_of_every_primary_is_applied() {
        let Some((written, store, _cleanup)) = write_a_batch(1).await else { return };
        let written = written.unwrap_or_else(|e| panic!("{}", imagepipe_runtime::error_chain(&e)));
        assert!(written.iter().all(|w| *w == Applied::Yes), "{written:?}");
        assert!(store.get("tsk_wait0").await.unwrap().is_some());
    }

    #[tokio::test]
    async fn a_batch_waiting_for_more_replicas_than_exist_is_a_store_error() {
        let Some((written, store, _cleanup)) = write_a_batch(2).await else { return };
        let error = written.expect_err("two replicas of one are not there");
        assert!(matches!(error, StoreError::NotReplicated { wanted: 2, acked: 1, .. }), "{error:?}");
        let message = error.to_string();
        assert!(message.contains("min_replicas is 2") && message.contains("retried"), "{message}");
        // The write itself happened: the retried input finds it (its compare-and-set fails).
        assert!(store.get("tsk_wait0").await.unwrap().is_some());
    }
}
