//! The same cases against [`MemoryControl`] and [`RedisControl`] (a real Redis and a real
//! Redis Cluster, unique prefix per test).

use std::sync::Arc;

use super::*;

const T0: u64 = 1_763_800_000_000;

/// A [`RedisControl`] on each of the Redis deployments of the tests (a server, a cluster).
async fn redis(test: &str) -> Vec<Arc<dyn ControlStore>> {
    let mut stores: Vec<Arc<dyn ControlStore>> = Vec::new();
    for (_, url) in imagepipe_contracts::testing::redis_urls() {
        match crate::redis_connection::RedisConnection::open(&url).await {
            Ok(connection) => {
                let prefix = format!("test-control-{test}-{}", uuid::Uuid::new_v4().simple());
                stores.push(Arc::new(RedisControl::new(connection, &prefix)));
            }
            Err(error) => imagepipe_contracts::testing::environment_missing(&format!("Redis at {url}: {error}")),
        }
    }
    stores
}

async fn both(test: &str) -> Vec<Arc<dyn ControlStore>> {
    let mut stores: Vec<Arc<dyn ControlStore>> = vec![Arc::new(MemoryControl::ephemeral())];
    stores.extend(redis(test).await);
    stores
}

#[tokio::test]
async fn pausing_and_resuming_a_queue_says_whether_it_changed() {
    for store in both("pause").await {
        assert!(!store.state().await.unwrap().is_paused("tasks.metadata"));
        assert!(store.set_paused("tasks.metadata", true, T0).await.unwrap());
        assert!(!store.set_paused("tasks.metadata", true, T0 + 1).await.unwrap(), "already paused");
        let state = store.state().await.unwrap();
        assert!(state.is_paused("tasks.metadata") && !state.is_paused("tasks.ai"));
        assert_eq!(state.queue("tasks.metadata").updated_at, T0);
        assert!(store.set_paused("tasks.metadata", false, T0 + 2).await.unwrap());
        let resumed = store.state().await.unwrap().queue("tasks.metadata");
        assert_eq!((resumed.paused, resumed.resumed_at), (false, T0 + 2));
    }
}

#[tokio::test]
async fn concurrency_is_set_and_cleared_without_touching_the_pause() {
    for store in both("concurrency").await {
        store.set_paused("tasks.ai", true, T0).await.unwrap();
        store.set_concurrency("tasks.ai", Some(3), T0 + 1).await.unwrap();
        let q = store.state().await.unwrap().queue("tasks.ai");
        assert_eq!((q.paused, q.per_replica), (true, Some(3)));
        store.set_concurrency("tasks.ai", None, T0 + 2).await.unwrap();
        let q = store.state().await.unwrap().queue("tasks.ai");
        assert_eq!((q.paused, q.per_replica), (true, None));
    }
}

#[tokio::test]
async fn beats_count_live_consumers_and_the_rate_over_a_minute() {
    for store in both("beats").await {
        let beat = |at, in_flight, taken| Beat { at, in_flight, concurrency: 4, taken, paused_at: 0 };
        store.beat("tasks.download", "a", beat(T0, 2, 30)).await.unwrap();
        store.beat("tasks.download", "b", beat(T0 + 500, 1, 30)).await.unwrap();
        let now = T0 + 1_000;
        let activity = store.activity("tasks.download", now).await.unwrap();
        assert_eq!((activity.consumers, activity.in_flight, activity.concurrency), (2, 3, 8));
        assert!(activity.rate_per_sec > 0.0, "{activity:?}");
        let later = T0 + BEAT_TTL.as_millis() as u64 + 600;
        let activity = store.activity("tasks.download", later).await.unwrap();
        assert_eq!(activity.consumers, 0, "both beats are older than the TTL");
        let much_later = T0 + RATE_WINDOW.as_millis() as u64 + 20_000;
        assert_eq!(store.activity("tasks.download", much_later).await.unwrap().rate_per_sec, 0.0);
        assert_eq!(store.activity("tasks.ai", now).await.unwrap(), QueueActivity::default());
    }
}

#[tokio::test]
async fn a_pause_is_in_force_once_every_live_consumer_obeys_it() {
    for store in both("in-force").await {
        let queue = "tasks.metadata";
        store.set_paused(queue, true, T0).await.unwrap();
        let control = store.state().await.unwrap().queue(queue);
        let beat = |at, paused_at| Beat { at, in_flight: 0, concurrency: 2, taken: 0, paused_at };
        let now = T0 + 1_000;
        assert!(store.activity(queue, now).await.unwrap().pause_in_force(&control), "no consumer takes anything");
        store.beat(queue, "a", beat(T0 + 100, T0)).await.unwrap();
        store.beat(queue, "b", beat(T0 + 200, 0)).await.unwrap();
        let activity = store.activity(queue, now).await.unwrap();
        assert_eq!((activity.consumers, activity.paused, activity.oldest_pause), (2, 1, T0));
        assert!(!activity.pause_in_force(&control), "b still takes messages: {activity:?}");
        store.beat(queue, "b", beat(T0 + 700, T0 - 5_000)).await.unwrap();
        assert!(!store.activity(queue, now).await.unwrap().pause_in_force(&control), "b obeys an older pause");
        store.beat(queue, "b", beat(T0 + 900, T0)).await.unwrap();
        assert!(store.activity(queue, now).await.unwrap().pause_in_force(&control));
        let resumed = QueueControl { paused: false, ..control };
        assert!(!store.activity(queue, now).await.unwrap().pause_in_force(&resumed));
    }
}

#[tokio::test]
async fn cancellations_are_seen_until_they_expire() {
    for store in both("cancel").await {
        let ids = vec!["tsk_a".to_owned(), "tsk_b".to_owned()];
        assert_eq!(store.cancelled(&ids, T0).await.unwrap(), vec![false, false]);
        store.request_cancel("tsk_b", T0).await.unwrap();
        assert_eq!(store.cancelled(&ids, T0 + 1).await.unwrap(), vec![false, true]);
        let expired = T0 + CANCEL_TTL.as_millis() as u64 + 1;
        assert_eq!(store.cancelled(&ids, expired).await.unwrap(), vec![false, false]);
        assert!(store.cancelled(&[], T0).await.unwrap().is_empty());
        store.request_cancel("tsk_a", T0).await.unwrap();
        store.clear_cancel("tsk_a").await.unwrap();
        assert_eq!(store.cancelled(&ids, T0 + 2).await.unwrap(), vec![false, true], "cleared, the other kept");
    }
}

#[test]
fn the_rate_is_taken_over_the_window() {
    let now = 120 * RATE_BUCKET_MS + 2_500;
    let current = now / RATE_BUCKET_MS;
    let buckets: Vec<(u64, u64)> = (0..12).map(|i| (current - i, 30)).collect();
    let rate = rate_from_buckets(&buckets, now);
    // 12 buckets × 30 over 11 full buckets and half of the current one: 360 / 57.5 s.
    assert!((rate - 360.0 / 57.5).abs() < 1e-9, "{rate}");
    assert_eq!(rate_from_buckets(&[(current - 20, 1_000)], now), 0.0, "outside the window");
}

#[test]
fn the_memory_store_keeps_queue_settings_in_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join(memory::CONTROL_FILE);
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(async {
        let store = MemoryControl::in_file(file.clone()).unwrap();
        store.set_paused("tasks.download", true, T0).await.unwrap();
        store.set_concurrency("tasks.download", Some(2), T0).await.unwrap();
        let again = MemoryControl::in_file(file.clone()).unwrap();
        let q = again.state().await.unwrap().queue("tasks.download");
        assert_eq!((q.paused, q.per_replica), (true, Some(2)));
    });
    std::fs::write(&file, b"{not json").unwrap();
    assert!(matches!(MemoryControl::in_file(file), Err(ControlError::Corrupt { .. })));
}

#[tokio::test]
async fn one_directory_has_one_control_state_per_process() {
    let dir = tempfile::tempdir().unwrap();
    let a = MemoryControl::for_dir(dir.path()).unwrap();
    let b = MemoryControl::for_dir(dir.path()).unwrap();
    a.set_paused("tasks.ai", true, T0).await.unwrap();
    assert!(b.state().await.unwrap().is_paused("tasks.ai"));
}

#[tokio::test]
async fn job_records_are_kept_and_replaced() {
    for store in both("jobs").await {
        assert_eq!(store.job("rp_1").await.unwrap(), None);
        store.put_job("rp_1", r#"{"done":false}"#).await.unwrap();
        store.put_job("rp_1", r#"{"done":true}"#).await.unwrap();
        assert_eq!(store.job("rp_1").await.unwrap().as_deref(), Some(r#"{"done":true}"#));
    }
}
