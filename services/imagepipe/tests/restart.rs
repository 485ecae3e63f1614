//! `imagepipe run` stopped in the middle of a batch and started again on the same store and blob
//! directory: every task finishes, each completes exactly once, and no task goes backwards.
//!
//! The memory bus loses the commands in flight with the process; the second run's coordinator
//! re-sends each running step at start, long before its (default, 5 minute) deadline.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bytes::Bytes;
use imagepipe::Pipeline;
use imagepipe::samples::SAMPLES;
use imagepipe_bus::{Consumer, Selector, StartPosition, Subscription};
use imagepipe_contracts::{Event, EventType, SubmitTask, decode};
use imagepipe_coordinator::{Task, TaskState};

/// Tasks in the batch (each sample photo several times, under distinct task ids).
const BATCH: usize = 12;

/// Tasks to see finished before the first run is stopped.
const FINISHED_BEFORE_STOP: usize = 3;

/// Where a task is in the pipeline; finished states share the last rank.
fn rank(state: TaskState) -> usize {
    if state.is_terminal() {
        return TaskState::ALL.len();
    }
    TaskState::ALL.iter().position(|s| *s == state).expect("a state of TaskState::ALL")
}

/// Records each task's latest state and version, failing if one goes backwards.
#[derive(Default)]
struct Progress {
    latest: BTreeMap<String, (TaskState, u64)>,
}

impl Progress {
    fn observe(&mut self, task: &Task) {
        if let Some((state, version)) = self.latest.get(&task.id) {
            assert!(task.version >= *version, "{}: version {version} → {}", task.id, task.version);
            assert!(rank(task.state) >= rank(*state), "{}: {state:?} → {:?}", task.id, task.state);
            if state.is_terminal() {
                assert_eq!((task.state, task.version), (*state, *version), "{}: a finished task changed", task.id);
            }
        }
        self.latest.insert(task.id.clone(), (task.state, task.version));
    }

    fn finished(&self) -> usize {
        self.latest.values().filter(|(state, _)| state.is_terminal()).count()
    }
}

/// Every `task.completed` event id per task, from every delivery fetched so far.
#[derive(Default)]
struct Completions {
    event_ids: BTreeMap<String, BTreeSet<String>>,
}

impl Completions {
    async fn drain(&mut self, events: &dyn Consumer, wait: Duration) {
        loop {
            let batch = events.fetch(64, wait).await.unwrap();
            if batch.is_empty() {
                return;
            }
            for delivery in batch {
                let event: Event<serde_json::Value> = decode(&delivery.message.payload).unwrap();
                if event.event_type == EventType::TaskCompleted {
                    let task_id = event.task_id.clone().expect("task.completed names its task");
                    self.event_ids.entry(task_id).or_default().insert(event.event_id.to_string());
                }
                delivery.ack().await.unwrap();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_in_the_middle_of_a_batch_finishes_every_task_exactly_once() {
    let Some(model_dir) = common::model_dir() else { return };
    let work = tempfile::tempdir().unwrap();
    let mut settings = common::settings(&model_dir, &work);
    assert!(
        settings.coordinator.step_deadline >= Duration::from_secs(60),
        "the default deadline must not do the resuming"
    );
    settings.coordinator.relay_grace = Duration::from_secs(1);
    // One image at a time per worker, so the batch is still running when the first run stops.
    settings.worker.concurrency = 1;

    let first = Pipeline::start(settings.clone()).await.unwrap();
    let first_events = first.bus().events.subscribe(Subscription::new("restart-test", Selector::all())).await.unwrap();
    let mut ids = Vec::with_capacity(BATCH);
    for i in 0..BATCH {
        let sample = &SAMPLES[i % SAMPLES.len()];
        let key = first.blobs().put(Bytes::from_static(sample.bytes)).await.unwrap();
        let id = format!("tsk_restart_{i:02}");
        let submit = SubmitTask { task_id: Some(id.clone()), blob: Some(key.to_string()), ..SubmitTask::default() };
        first.submit(&submit).await.unwrap();
        ids.push(id);
    }

    // Submit commands still on the memory bus would be lost with it: stop once every task is
    // stored and a few, not all, are finished.
    let mut progress = Progress::default();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    loop {
        let mut stored = 0;
        for id in &ids {
            if let Some(task) = first.engine().store().get(id).await.unwrap() {
                progress.observe(&task);
                stored += 1;
            }
        }
        let finished = progress.finished();
        assert!(finished < BATCH, "the whole batch finished before the first run could be stopped");
        if stored == BATCH && finished >= FINISHED_BEFORE_STOP {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "first run: {stored} stored, {finished} finished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Held past the stop: the memory bus closes with its last handle, and the events the first
    // run published are still to be read.
    let first_bus = first.bus().clone();
    let store = first.engine().store().clone();
    first.stop().await.unwrap();
    for id in &ids {
        progress.observe(&store.get(id).await.unwrap().expect("stored before the stop"));
    }
    drop(store);
    let finished_in_first = progress.finished();
    assert!(finished_in_first < BATCH, "every task finished while the first run stopped");
    let mid_step = progress.latest.values().filter(|(s, _)| *s != TaskState::Queued && !s.is_terminal()).count();
    assert!(mid_step > 0, "no step was in flight at the stop: {:?}", progress.latest);
    let mut completions = Completions::default();
    completions.drain(first_events.as_ref(), Duration::from_millis(100)).await;
    drop((first_events, first_bus));

    let second = Pipeline::start(settings).await.unwrap();
    // From the beginning: the second run may finish tasks before this subscription exists.
    let second_events = second
        .bus()
        .events
        .subscribe(Subscription::new("restart-test", Selector::all()).starting(StartPosition::Beginning))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(50);
    loop {
        for id in &ids {
            progress.observe(&second.engine().store().get(id).await.unwrap().expect("still stored"));
        }
        if progress.finished() == BATCH {
            break;
        }
        let pending: Vec<_> = progress.latest.iter().filter(|(_, (s, _))| !s.is_terminal()).collect();
        assert!(tokio::time::Instant::now() < deadline, "second run did not finish: {pending:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for task in second.wait_for(&ids, Duration::from_secs(1)).await.unwrap() {
        assert_eq!(task.state, TaskState::Completed, "{}: {:?}", task.id, task.failure);
        let analysis = task.outputs.analysis.as_ref().expect("analysis output");
        assert!(!analysis.tags.is_empty(), "{}: {analysis:?}", task.id);
    }

    // Every task's completion reaches a subscriber, once (a relay repeated after the restart
    // carries the same eventId).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while completions.event_ids.len() < BATCH {
        completions.drain(second_events.as_ref(), Duration::from_millis(200)).await;
        assert!(
            tokio::time::Instant::now() < deadline,
            "task.completed missing for {:?}",
            ids.iter().filter(|id| !completions.event_ids.contains_key(*id)).collect::<Vec<_>>()
        );
    }
    completions.drain(second_events.as_ref(), Duration::from_millis(200)).await;
    for id in &ids {
        let seen = &completions.event_ids[id];
        assert_eq!(seen.len(), 1, "{id} completed more than once: {seen:?}");
    }
    eprintln!("{finished_in_first} of {BATCH} tasks finished and {mid_step} were mid-step at the restart");
    second.stop().await.unwrap();
}
