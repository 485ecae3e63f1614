//! The operator controls on the whole pipeline, over the memory bus and over NATS (with a
//! second download worker replica): pausing a stage with tasks in flight, pausing a task,
//! priorities under a backlog, reprocessing, and cancelling a running step.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use bytes::Bytes;
use imagepipe::Pipeline;
use imagepipe::samples::SAMPLES;
use imagepipe_bus::{BusKind, Consumer, Selector, Subscription};
use imagepipe_contracts::{Event, EventType, Priority, SubmitTask, decode};
use imagepipe_coordinator::task::HistoryEvent;
use imagepipe_coordinator::{Task, TaskState};
use imagepipe_net::testing::{FixtureServer, Route};
use imagepipe_runtime::Shutdown;
use imagepipe_runtime::http::testing::{Answer, request_with_body};
use tempfile::TempDir;

const WAIT: Duration = Duration::from_secs(60);

/// A running pipeline, its work directory, and the extra download replica of a NATS run.
struct Running {
    pipeline: Pipeline,
    _work: TempDir,
    replica: Option<(Shutdown, tokio::task::JoinHandle<()>)>,
    nats_prefix: Option<String>,
}

impl Running {
    async fn start(bus: BusKind, configure: impl FnOnce(&mut imagepipe_runtime::Settings)) -> Option<Self> {
        let model_dir = common::model_dir()?;
        let work = tempfile::tempdir().unwrap();
        let mut settings = common::settings(&model_dir, &work);
        let mut nats_prefix = None;
        if bus == BusKind::Nats {
            let prefix = format!("ctl{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
            settings.bus.kind = BusKind::Nats;
            settings.bus.prefix = prefix.clone();
            settings.bus.nats.url = common::nats_url();
            nats_prefix = Some(prefix);
        }
        configure(&mut settings);
        let pipeline = Pipeline::start(settings.clone()).await.unwrap();
        let replica = (bus == BusKind::Nats).then(|| {
            let stop = Shutdown::new();
            let (bus, stop2) = (pipeline.bus().clone(), stop.clone());
            let handle = tokio::spawn(async move {
                imagepipe_download_worker::run(bus, &settings, stop2).await.unwrap();
            });
            (stop, handle)
        });
        Some(Self { pipeline, _work: work, replica, nats_prefix })
    }

    async fn api(&self, method: &str, path: &str, body: &str) -> Answer {
        request_with_body(self.pipeline.local_addr(), method, path, None, body.as_bytes()).await
    }

    async fn task(&self, id: &str) -> Task {
        self.pipeline.engine().store().get(id).await.unwrap().unwrap()
    }

    /// Waits until task `id` satisfies `done`.
    async fn until(&self, id: &str, what: &str, done: impl Fn(&Task) -> bool) -> Task {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let task = self.pipeline.engine().store().get(id).await.unwrap();
            if let Some(task) = task.as_ref().filter(|t| done(t)) {
                return task.clone();
            }
            assert!(tokio::time::Instant::now() < deadline, "{id} never {what}: {task:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Submits `n` sample photos as `prefix0..` at `priority` with label `run=prefix`.
    async fn submit(&self, prefix: &str, n: usize, priority: Priority) -> Vec<String> {
        let mut ids = Vec::new();
        for i in 0..n {
            let sample = &SAMPLES[i % SAMPLES.len()];
            let key = self.pipeline.blobs().put(Bytes::from_static(sample.bytes)).await.unwrap();
            let id = format!("tsk_{prefix}{i}");
            let submit = SubmitTask {
                task_id: Some(id.clone()),
                blob: Some(key.to_string()),
                priority,
                labels: [("run".to_owned(), prefix.to_owned())].into(),
                ..SubmitTask::default()
            };
            self.pipeline.submit(&submit).await.unwrap();
            ids.push(id);
        }
        ids
    }

    async fn history(&self, id: &str) -> Vec<HistoryEvent> {
        self.pipeline.engine().store().history(id).await.unwrap().into_iter().map(|h| h.event).collect()
    }

    async fn stop(self) {
        if let Some((stop, handle)) = self.replica {
            stop.trigger();
            handle.await.unwrap();
        }
        self.pipeline.stop().await.unwrap();
        if let Some(prefix) = self.nats_prefix {
            common::delete_nats_streams(&prefix).await;
        }
    }
}

/// A queue control applies on every replica within this long (the workers' control refresh).
const APPLIES_WITHIN: Duration = Duration::from_secs(1);

/// Event types seen on `events` until `want` are all there (or the wait is over).
async fn events_until(events: &dyn Consumer, want: &[(EventType, Option<&str>)]) -> Vec<Event<serde_json::Value>> {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while !want.iter().all(|(t, task)| {
        seen.iter().any(|e: &Event<serde_json::Value>| {
            e.event_type == *t && task.is_none_or(|id| e.task_id.as_deref() == Some(id))
        })
    }) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "missing events {want:?}; saw {:?}",
            seen.iter().map(|e: &Event<_>| e.event_type).collect::<Vec<_>>()
        );
        for delivery in events.fetch(64, Duration::from_millis(500)).await.unwrap() {
            seen.push(decode(&delivery.message.payload).unwrap());
            delivery.ack().await.unwrap();
        }
    }
    seen
}

async fn pausing_a_stage_holds_its_tasks_without_loss_or_deadline(bus: BusKind) {
    let Some(run) = Running::start(bus, |s| s.coordinator.metadata_deadline = Some(Duration::from_secs(2))).await
    else {
        return;
    };
    let events = run.pipeline.bus().events.subscribe(Subscription::new("ctl-test", Selector::all())).await.unwrap();
    let paused = run.api("POST", "/v1/queues/metadata/pause", r#"{"reason":"maintenance"}"#).await;
    assert_eq!(paused.status, 200, "{paused:?}");
    assert!(paused.body.contains(r#""paused":true"#), "{paused:?}");
    tokio::time::sleep(APPLIES_WITHIN).await;

    let ids = run.submit("pause", 4, Priority::Normal).await;
    for id in &ids {
        run.until(id, "waited at metadata", |t| t.state == TaskState::ExtractingMetadata).await;
    }
    // Past the 2 s deadline: each one starts over instead of counting as a failed attempt.
    for id in &ids {
        let deadline_due = tokio::time::Instant::now() + WAIT;
        while !run.history(id).await.contains(&HistoryEvent::DeadlinePostponed) {
            assert!(
                tokio::time::Instant::now() < deadline_due,
                "{id}: no postponed deadline: {:?} {:?}",
                run.history(id).await,
                run.task(id).await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let queues = run.api("GET", "/v1/queues", "").await;
    let view: serde_json::Value = serde_json::from_str(&queues.body).unwrap();
    let metadata = view["queues"].as_array().unwrap().iter().find(|q| q["name"] == "metadata").unwrap().clone();
    assert_eq!(metadata["paused"], true, "{metadata}");
    assert_eq!(metadata["depth"], 4, "every task waits in the paused queue: {metadata}");
    assert!(metadata["oldestWaitMs"].as_u64().unwrap() >= 2_000, "{metadata}");
    let download = view["queues"].as_array().unwrap().iter().find(|q| q["name"] == "download").unwrap().clone();
    let replicas = if bus == BusKind::Nats { 2 } else { 1 };
    assert_eq!(download["consumers"], replicas, "{download}");

    let resumed_at = run.pipeline.engine().clock().unix_ms();
    let resumed = run.api("POST", "/v1/queues/metadata/resume", "").await;
    assert_eq!(resumed.status, 200, "{resumed:?}");
    for task in run.pipeline.wait_for(&ids, WAIT).await.unwrap() {
        assert_eq!(task.state, TaskState::Completed, "{task:?}");
        let history = run.pipeline.engine().store().history(&task.id).await.unwrap();
        // After the resume a deadline counts again: a machine too busy to finish the step
        // within it may retry it.
        let deadline_fired = history
            .iter()
            .any(|h| h.at < resumed_at && h.detail.as_deref().is_some_and(|d| d.contains("deadline_exceeded")));
        assert!(!deadline_fired, "no deadline fired while the queue was paused: {history:?}");
    }
    let dlq = run.api("GET", "/v1/dlq", "").await;
    assert!(dlq.body.contains(r#""entries":[]"#), "nothing dead-lettered: {dlq:?}");
    events_until(&*events, &[(EventType::QueuePaused, None), (EventType::QueueResumed, None)]).await;
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_a_stage_holds_its_tasks_without_loss_or_deadline_memory() {
    pausing_a_stage_holds_its_tasks_without_loss_or_deadline(BusKind::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pausing_a_stage_holds_its_tasks_without_loss_or_deadline_nats() {
    pausing_a_stage_holds_its_tasks_without_loss_or_deadline(BusKind::Nats).await;
}

async fn a_paused_task_stops_at_the_step_boundary_and_resumes(bus: BusKind) {
    let Some(run) = Running::start(bus, |_| {}).await else { return };
    let events = run.pipeline.bus().events.subscribe(Subscription::new("ctl-test", Selector::all())).await.unwrap();
    assert_eq!(run.api("POST", "/v1/queues/metadata/pause", "").await.status, 200);
    tokio::time::sleep(APPLIES_WITHIN).await;
    let id = run.submit("tpause", 1, Priority::Normal).await.remove(0);
    run.until(&id, "reached metadata", |t| t.state == TaskState::ExtractingMetadata).await;
    let pausing = run.api("POST", &format!("/v1/tasks/{id}/pause"), r#"{"reason":"look first"}"#).await;
    assert_eq!(pausing.status, 202, "{pausing:?}");
    assert!(pausing.body.contains("pauseRequested"), "a step is running: the pause waits for its end: {pausing:?}");
    assert_eq!(run.api("POST", "/v1/queues/metadata/resume", "").await.status, 200);
    let paused = run.until(&id, "paused", |t| t.state == TaskState::Paused).await;
    assert!(paused.outputs.metadata.is_some() && paused.outputs.analysis.is_none(), "{paused:?}");
    // A task submitted now runs the step the paused one stopped before and completes: had the
    // pause let the paused task go on, it would have gone on meanwhile.
    let other = run.submit("tpass", 1, Priority::Normal).await;
    let other = run.pipeline.wait_for(&other, WAIT).await.unwrap().remove(0);
    assert_eq!(other.state, TaskState::Completed, "{other:?}");
    let still = run.task(&id).await;
    assert_eq!(still.state, TaskState::Paused, "a paused task stays paused: {still:?}");
    let history = run.history(&id).await;
    assert_eq!(history.last(), Some(&HistoryEvent::Paused), "nothing happened after the pause: {history:?}");
    assert_eq!(run.api("POST", &format!("/v1/tasks/{id}/resume"), "").await.status, 202);
    let done = run.pipeline.wait_for(std::slice::from_ref(&id), WAIT).await.unwrap().remove(0);
    assert_eq!(done.state, TaskState::Completed, "{done:?}");
    events_until(&*events, &[(EventType::TaskPaused, Some(&id)), (EventType::TaskResumed, Some(&id))]).await;
    assert_eq!(run.api("POST", &format!("/v1/tasks/{id}/pause"), "").await.status, 409, "a finished task");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_task_stops_at_the_step_boundary_and_resumes_memory() {
    a_paused_task_stops_at_the_step_boundary_and_resumes(BusKind::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_task_stops_at_the_step_boundary_and_resumes_nats() {
    a_paused_task_stops_at_the_step_boundary_and_resumes(BusKind::Nats).await;
}

async fn high_priority_tasks_overtake_a_low_backlog(bus: BusKind) {
    let Some(run) = Running::start(bus, |_| {}).await else { return };
    assert_eq!(run.api("POST", "/v1/queues/download/pause", "").await.status, 200);
    tokio::time::sleep(APPLIES_WITHIN).await;
    let low = run.submit("low", 24, Priority::Low).await;
    let high = run.submit("high", 3, Priority::High).await;
    for id in low.iter().chain(&high) {
        run.until(id, "waited at download", |t| t.state == TaskState::Downloading).await;
    }
    assert_eq!(run.api("POST", "/v1/queues/download/resume", "").await.status, 200);
    let all: Vec<String> = low.iter().chain(&high).cloned().collect();
    let tasks = run.pipeline.wait_for(&all, WAIT).await.unwrap();
    assert!(tasks.iter().all(|t| t.state == TaskState::Completed), "{tasks:?}");
    let high_ids: HashSet<&String> = high.iter().collect();
    let last_high = tasks.iter().filter(|t| high_ids.contains(&t.id)).map(|t| t.updated_at).max().unwrap();
    let low_before = tasks.iter().filter(|t| !high_ids.contains(&t.id) && t.updated_at < last_high).count();
    assert!(
        low_before <= 12,
        "the high tasks went first: {low_before} of 24 low tasks finished before the last high one"
    );
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_priority_tasks_overtake_a_low_backlog_memory() {
    high_priority_tasks_overtake_a_low_backlog(BusKind::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn high_priority_tasks_overtake_a_low_backlog_nats() {
    high_priority_tasks_overtake_a_low_backlog(BusKind::Nats).await;
}

/// Waits for reprocessing job `id` to end; its record.
async fn job(run: &Running, id: &str) -> serde_json::Value {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let answer = run.api("GET", &format!("/v1/reprocess/{id}"), "").await;
        assert_eq!(answer.status, 200, "{answer:?}");
        let job: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
        if job["status"] != "running" {
            return job;
        }
        assert!(tokio::time::Instant::now() < deadline, "{job}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn reprocessing_runs_missing_or_all_as_a_new_generation(bus: BusKind) {
    let Some(run) = Running::start(bus, |_| {}).await else { return };
    let events = run.pipeline.bus().events.subscribe(Subscription::new("ctl-test", Selector::all())).await.unwrap();
    let ids = run.submit("rep", 2, Priority::Normal).await;
    // A JPEG cut short passes the download's magic-byte check and fails the metadata step.
    let cut = run.pipeline.blobs().put(Bytes::copy_from_slice(&SAMPLES[0].bytes[..4096])).await.unwrap();
    let broken = SubmitTask {
        task_id: Some("tsk_rep_cut".into()),
        blob: Some(cut.to_string()),
        labels: [("run".to_owned(), "rep".to_owned())].into(),
        ..SubmitTask::default()
    };
    run.pipeline.submit(&broken).await.unwrap();
    let mut all = ids.clone();
    all.push("tsk_rep_cut".into());
    let first = run.pipeline.wait_for(&all, WAIT).await.unwrap();
    assert_eq!(first[2].state, TaskState::Failed, "{:?}", first[2]);

    let missing = run
        .api("POST", "/v1/reprocess", r#"{"from":"metadata","select":"missing","filter":{"labels":{"run":"rep"}}}"#)
        .await;
    assert_eq!(missing.status, 202, "{missing:?}");
    let id: serde_json::Value = serde_json::from_str(&missing.body).unwrap();
    let done = job(&run, id["id"].as_str().unwrap()).await;
    assert_eq!(
        (done["status"].as_str(), done["matched"].as_u64(), done["queued"].as_u64()),
        (Some("done"), Some(1), Some(1)),
        "{done}"
    );
    let again = run.until("tsk_rep_cut", "failed again", |t| t.generation == 1 && t.state == TaskState::Failed).await;
    assert!(run.history(&again.id).await.contains(&HistoryEvent::Reprocessed));

    let everything = run
        .api("POST", "/v1/reprocess", r#"{"from":"analyze","select":"all","filter":{"labels":{"run":"rep"},"state":"completed"},"priority":"high"}"#)
        .await;
    assert_eq!(everything.status, 202, "{everything:?}");
    let id: serde_json::Value = serde_json::from_str(&everything.body).unwrap();
    let done = job(&run, id["id"].as_str().unwrap()).await;
    assert_eq!((done["matched"].as_u64(), done["queued"].as_u64()), (Some(2), Some(2)), "{done}");
    for id in &ids {
        let task = run.until(id, "completed again", |t| t.generation == 1 && t.state == TaskState::Completed).await;
        assert!(task.outputs.analysis.is_some() && task.outputs.metadata.is_some(), "{task:?}");
        assert_eq!(task.priority, Priority::High);
    }
    let want: Vec<(EventType, Option<&str>)> =
        ids.iter().map(|id| (EventType::TaskCompleted, Some(id.as_str()))).collect();
    let mut seen = events_until(&*events, &want).await;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let completions: Vec<&Event<serde_json::Value>> = seen
            .iter()
            .filter(|e| e.event_type == EventType::TaskCompleted && e.task_id.as_deref() == Some(&ids[0]))
            .collect();
        let distinct: HashSet<_> = completions.iter().map(|e| e.event_id).collect();
        if distinct.len() == 2 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the new generation's task.completed has a new event id");
        for delivery in events.fetch(64, Duration::from_millis(500)).await.unwrap() {
            seen.push(decode(&delivery.message.payload).unwrap());
            delivery.ack().await.unwrap();
        }
    }
    let bad = run.api("POST", "/v1/reprocess", r#"{"from":"analyze","filter":{"state":"analyzing"}}"#).await;
    assert_eq!(bad.status, 400, "{bad:?}");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reprocessing_runs_missing_or_all_as_a_new_generation_memory() {
    reprocessing_runs_missing_or_all_as_a_new_generation(BusKind::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reprocessing_runs_missing_or_all_as_a_new_generation_nats() {
    reprocessing_runs_missing_or_all_as_a_new_generation(BusKind::Nats).await;
}

async fn cancelling_a_running_step_stops_it_within_a_second(bus: BusKind) {
    let Some(run) = Running::start(bus, |_| {}).await else { return };
    let server = FixtureServer::start([("/silent.jpg", Route::Silent)]).await.unwrap();
    let submit = SubmitTask {
        task_id: Some("tsk_cancel_running".into()),
        url: Some(server.url("/silent.jpg")),
        ..SubmitTask::default()
    };
    run.pipeline.submit(&submit).await.unwrap();
    let deadline = tokio::time::Instant::now() + WAIT;
    while server.requests().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "the download never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let asked = tokio::time::Instant::now();
    let answer = run.api("POST", "/v1/tasks/tsk_cancel_running/cancel", r#"{"reason":"wrong photo"}"#).await;
    assert_eq!(answer.status, 202, "{answer:?}");
    let task = run.until("tsk_cancel_running", "cancelled", |t| t.state == TaskState::Cancelled).await;
    let took = asked.elapsed();
    assert!(took < Duration::from_secs(3), "the running download stopped in {took:?}");
    assert_eq!(task.steps.download.last_error.as_ref().map(|e| e.code.as_str()), Some("cancelled"), "{task:?}");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_step_stops_it_within_a_second_memory() {
    cancelling_a_running_step_stops_it_within_a_second(BusKind::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_step_stops_it_within_a_second_nats() {
    cancelling_a_running_step_stops_it_within_a_second(BusKind::Nats).await;
}

/// The metadata queue as `GET /v1/queues` shows it.
async fn metadata_queue(run: &Running) -> serde_json::Value {
    let queues = run.api("GET", "/v1/queues", "").await;
    let view: serde_json::Value = serde_json::from_str(&queues.body).unwrap();
    view["queues"].as_array().unwrap().iter().find(|q| q["name"] == "metadata").unwrap().clone()
}

/// A queue pause is in force when its call returns, and a task whose command waits in the
/// paused queue is cancelled at once; the command, delivered after the resume, changes nothing.
async fn a_task_waiting_in_a_paused_queue_is_cancelled_at_once(bus: BusKind) {
    let Some(run) = Running::start(bus, |_| {}).await else { return };
    let paused = run.api("POST", "/v1/queues/metadata/pause", "").await;
    assert_eq!(paused.status, 200, "{paused:?}");
    let view: serde_json::Value = serde_json::from_str(&paused.body).unwrap();
    assert_eq!((&view["paused"], &view["pausing"]), (&true.into(), &false.into()), "in force on return: {view}");

    let id = run.submit("twait", 1, Priority::Normal).await.remove(0);
    run.until(&id, "reached metadata", |t| t.state == TaskState::ExtractingMetadata).await;
    // The command goes out right after the transition is written: it waits, nothing takes it.
    let deadline = tokio::time::Instant::now() + WAIT;
    let queue = loop {
        let queue = metadata_queue(&run).await;
        if queue["depth"] == 1 {
            break queue;
        }
        assert!(tokio::time::Instant::now() < deadline, "the command never reached the queue: {queue}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(queue["inFlight"], 0, "the command waits: {queue}");
    let answer = run.api("POST", &format!("/v1/tasks/{id}/cancel"), r#"{"reason":"test"}"#).await;
    assert_eq!(answer.status, 202, "{answer:?}");
    let task: serde_json::Value = serde_json::from_str(&answer.body).unwrap();
    assert_eq!(task["state"], "cancelled", "no step runs: nothing to wait for: {task}");

    assert_eq!(run.api("POST", "/v1/queues/metadata/resume", "").await.status, 200);
    let other = run.submit("tafter", 1, Priority::Normal).await;
    let other = run.pipeline.wait_for(&other, WAIT).await.unwrap().remove(0);
    assert_eq!(other.state, TaskState::Completed, "{other:?}");
    // The cancelled task's command went before the later task's: once nothing waits or runs
    // there, its worker has reported on it.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let queue = metadata_queue(&run).await;
        if queue["depth"] == 0 && queue["inFlight"] == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the metadata queue never drained: {queue}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let task = run.task(&id).await;
    assert_eq!(task.state, TaskState::Cancelled, "{task:?}");
    assert!(task.outputs.metadata.is_none(), "{task:?}");
    let history = run.history(&id).await;
    assert_eq!(history.last(), Some(&HistoryEvent::Cancelled), "{history:?}");
    assert!(!history.contains(&HistoryEvent::CancelRequested), "{history:?}");
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waiting_in_a_paused_queue_is_cancelled_at_once_memory() {
    a_task_waiting_in_a_paused_queue_is_cancelled_at_once(BusKind::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_waiting_in_a_paused_queue_is_cancelled_at_once_nats() {
    a_task_waiting_in_a_paused_queue_is_cancelled_at_once(BusKind::Nats).await;
}
