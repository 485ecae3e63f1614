//! Three coordinator replicas in one process, over one memory bus and one store, with no-op
//! stages: the shards are shared out 22/21/21, every task completes exactly once, and each
//! replica handles its share of the work (issue 32's balance test, in process; the process
//! and failover scenarios are in the e2e crate's `shards.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use imagepipe::bench::noop;
use imagepipe_bus::{Bus, Message};
use imagepipe_contracts::SubmitTask;
use imagepipe_contracts::names::queues;
use imagepipe_coordinator::app::{Coordinator, open_store};
use imagepipe_coordinator::store::TaskStore;
use imagepipe_coordinator::task::TaskState;
use imagepipe_runtime::clock::SystemClock;
use imagepipe_runtime::{Settings, Shutdown};
use tokio::task::JoinSet;

const REPLICAS: usize = 3;
const TASKS: usize = 10_000;

fn settings(work: &tempfile::TempDir) -> Settings {
    let mut settings = Settings::default();
    settings.store.path = work.path().join("store");
    settings.blob.dir = work.path().join("blobs");
    settings.bus.prefix = format!("shards-{}", uuid::Uuid::new_v4().simple());
    settings.coordinator.shard_loops = 1;
    settings.coordinator.max_in_flight = 2_000;
    settings
}

/// Waits until `done` holds, at most `limit`, polling every 100 ms.
async fn until<F: AsyncFnMut() -> bool>(what: &str, limit: Duration, mut done: F) {
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < limit, "{what} within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_the_shards_and_the_work() {
    let work = tempfile::tempdir().unwrap();
    let settings = settings(&work);
    let bus = Bus::connect(&settings.bus).await.unwrap();
    let store: Arc<dyn TaskStore> = open_store(&settings).await.unwrap();
    let stop = Shutdown::new();
    let mut running: JoinSet<Result<(), String>> = JoinSet::new();
    for _ in 0..REPLICAS {
        let coordinator = Coordinator::new(&settings, store.clone(), bus.clone(), Arc::new(SystemClock));
        let stop = stop.clone();
        running.spawn(async move { coordinator.run(stop).await.map_err(|e| e.to_string()) });
    }
    noop::spawn(&bus, &settings, &stop, &mut running).await.unwrap();

    let shards = usize::from(settings.coordinator.shards);
    until("every shard owned, 22/21/21", Duration::from_secs(30), async || {
        let now = imagepipe_runtime::clock::Clock::unix_ms(&SystemClock);
        let mut per_owner: BTreeMap<String, usize> = BTreeMap::new();
        let leases = store.leases().await.unwrap();
        for lease in leases.iter().filter(|l| l.is_held(now)) {
            *per_owner.entry(lease.owner.clone()).or_default() += 1;
        }
        let mut counts: Vec<usize> = per_owner.values().copied().collect();
        counts.sort_unstable();
        counts.len() == REPLICAS && counts.iter().sum::<usize>() == shards && counts[REPLICAS - 1] - counts[0] <= 1
    })
    .await;

    let ids: Vec<String> = (0..TASKS).map(|i| format!("tsk_shards_{i:05}")).collect();
    let messages = ids
        .iter()
        .map(|id| {
            let submit = SubmitTask {
                task_id: Some(id.clone()),
                blob: Some(noop::BLOB_KEY.to_owned()),
                ..SubmitTask::default()
            };
            Message::new(serde_json::to_vec(&submit).unwrap()).with_key(id.clone()).with_id(format!("submit-{id}"))
        })
        .collect();
    bus.queues.send_batch(queues::SUBMIT, messages).await.unwrap();

    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    until("every task completed", Duration::from_secs(240), async || {
        let tasks = store.get_many(&refs).await.unwrap();
        tasks.iter().all(|t| t.as_ref().is_some_and(|t| t.state == TaskState::Completed))
    })
    .await;

    // Each task completed once, written by its shard's owner; the owners' shares of the work.
    let mut handled: BTreeMap<String, usize> = BTreeMap::new();
    for id in &ids {
        let history = store.history(id).await.unwrap();
        let completed: Vec<_> = history.iter().filter(|h| h.to == TaskState::Completed).collect();
        assert_eq!(completed.len(), 1, "{id} completed once: {history:?}");
        let replica = completed[0].replica.clone().unwrap_or_else(|| panic!("{id}: completed under no lease"));
        *handled.entry(replica).or_default() += 1;
    }
    assert_eq!(handled.len(), REPLICAS, "every replica completed tasks: {handled:?}");
    let mean = TASKS as f64 / REPLICAS as f64;
    for (replica, n) in &handled {
        let off = (*n as f64 - mean).abs() / mean;
        assert!(off <= 0.2, "{replica} completed {n} tasks, {:.0} % off the mean {mean:.0}: {handled:?}", off * 100.0);
    }
    stop.trigger();
    while let Some(joined) = running.join_next().await {
        joined.unwrap().unwrap();
    }
    // Stopping handed every shard over: none is held.
    let now = imagepipe_runtime::clock::Clock::unix_ms(&SystemClock);
    assert!(store.leases().await.unwrap().iter().all(|l| !l.is_held(now)), "every lease released on shutdown");
}
