//! The controls with an engine: what worker replicas report decides whether a cancel of a task
//! waiting in a paused queue is at once, and when a pause is in force.

use std::sync::Arc;
use std::time::Duration;

use imagepipe_bus::{Bus, BusConfig};
use imagepipe_contracts::names::queues;
use imagepipe_contracts::{Step, StepOutcome, StepResult, SubmitTask};
use imagepipe_runtime::clock::ManualClock;
use imagepipe_runtime::control::{Beat, ControlStore, MemoryControl};

use super::*;
use crate::engine::{Engine, EngineConfig, Handled, Origin};
use crate::machine::Input;
use crate::machine::tests::output;
use crate::store::embedded::EmbeddedStore;
use crate::task::{HistoryEvent, Task, TaskState};

const T0: u64 = 1_763_800_000_000;

struct Setup {
    engine: Engine,
    control: Arc<MemoryControl>,
    clock: ManualClock,
    _dir: tempfile::TempDir,
}

async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(EmbeddedStore::open(dir.path(), Duration::from_secs(10)).unwrap());
    let bus = Bus::connect(&BusConfig::default()).await.unwrap();
    let clock = ManualClock::at_unix_ms(T0);
    let control = Arc::new(MemoryControl::ephemeral());
    let engine =
        Engine::new(store, bus, Arc::new(clock.clone()), EngineConfig::default()).with_control(control.clone());
    Setup { engine, control, clock, _dir: dir }
}

impl Setup {
    /// A task whose metadata command has gone out.
    async fn at_metadata(&self, id: &str) -> Task {
        let submit = SubmitTask { task_id: Some(id.into()), ..SubmitTask::url("https://example.com/coffee.jpg") };
        self.engine.submit(&submit, Origin::Http, || unreachable!()).await.unwrap();
        self.applied(id, Input::Start).await;
        let downloaded = StepResult {
            task_id: id.into(),
            step: Step::Download,
            attempt: 1,
            outcome: StepOutcome::Ok { output: output(Step::Download) },
        };
        let task = self.applied(id, Input::Result(Box::new(downloaded))).await;
        assert_eq!(task.state, TaskState::ExtractingMetadata);
        task
    }

    async fn applied(&self, id: &str, input: Input) -> Task {
        match self.engine.handle(id, input).await.unwrap() {
            Handled::Applied(task) => *task,
            other => panic!("{other:?}"),
        }
    }

    /// Pauses the metadata queue through the controls.
    async fn pause_metadata(&self) -> u64 {
        let controls = self.engine.controls();
        controls.set_paused(self.engine.bus(), &self.clock, queues::METADATA, true, None).await.unwrap();
        self.control.state().await.unwrap().queue(queues::METADATA).updated_at
    }

    /// Metadata replica `replica` reports holding `in_flight` messages, stopped by the pause
    /// of `paused_at` (0: taking messages).
    async fn beat(&self, replica: &str, in_flight: u32, paused_at: u64) {
        let beat = Beat { at: self.clock.unix_ms(), in_flight, concurrency: 4, taken: 0, paused_at };
        self.control.beat(queues::METADATA, replica, beat).await.unwrap();
    }
}

#[tokio::test]
async fn a_cancel_of_a_task_waiting_in_a_paused_queue_that_runs_nothing_is_at_once() {
    let s = setup().await;
    let task = s.at_metadata("tsk_coffee").await;
    let paused_at = s.pause_metadata().await;
    s.beat("r1", 0, paused_at).await;
    s.beat("r2", 0, paused_at).await;
    s.engine.controls().refresh().await.unwrap();
    assert!(s.engine.controls().paused_steps().is_idle(Step::Metadata));

    s.clock.advance(Duration::from_secs(1));
    let cancelled = s.applied(&task.id, Input::Cancel { reason: Some("test".into()) }).await;
    assert_eq!(cancelled.state, TaskState::Cancelled, "no step runs: {cancelled:?}");
    let history = s.engine.store().history(&task.id).await.unwrap();
    let last = history.last().unwrap();
    assert_eq!((last.event, last.from), (HistoryEvent::Cancelled, Some(TaskState::ExtractingMetadata)));
    assert!(!history.iter().any(|h| h.event == HistoryEvent::CancelRequested), "{history:?}");
}

#[tokio::test]
async fn a_cancel_waits_for_the_step_while_a_replica_of_the_paused_queue_may_run_it() {
    let s = setup().await;
    let paused_at = s.pause_metadata().await;
    // r2 has not stopped yet; then it has, but holds a message (maybe this task's command).
    for (id, r2_in_flight, r2_paused_at) in [("tsk_a", 0, 0), ("tsk_b", 1, paused_at), ("tsk_c", 0, paused_at - 1)] {
        let task = s.at_metadata(id).await;
        s.beat("r1", 0, paused_at).await;
        s.beat("r2", r2_in_flight, r2_paused_at).await;
        s.engine.controls().refresh().await.unwrap();
        let asked = s.applied(&task.id, Input::Cancel { reason: None }).await;
        assert_eq!(asked.state, TaskState::ExtractingMetadata, "{id}");
        assert!(asked.cancel_requested.is_some(), "{id}");
    }
    // Once r2 reports it has stopped under this pause and holds nothing, a cancel ends one.
    s.beat("r2", 0, paused_at).await;
    s.engine.controls().refresh().await.unwrap();
    let cancelled = s.applied("tsk_b", Input::Cancel { reason: None }).await;
    assert_eq!(cancelled.state, TaskState::Cancelled);
}

#[tokio::test(start_paused = true)]
async fn a_pause_is_waited_for_until_every_live_replica_has_stopped() {
    let s = setup().await;
    let controls = s.engine.controls().clone();
    s.beat("r1", 0, 0).await;
    let paused_at = s.pause_metadata().await;
    let wait = tokio::spawn({
        let controls = controls.clone();
        async move { controls.until_paused(queues::METADATA, PAUSE_WAIT).await.unwrap() }
    });
    tokio::time::sleep(PAUSE_WAIT / 2).await;
    assert!(!wait.is_finished(), "r1 still takes messages");
    s.beat("r1", 0, paused_at).await;
    assert!(wait.await.unwrap(), "in force once r1 reports it");

    // A replica that never reports it: the wait ends after PAUSE_WAIT, saying so.
    s.beat("r2", 0, 0).await;
    let started = tokio::time::Instant::now();
    assert!(!controls.until_paused(queues::METADATA, PAUSE_WAIT).await.unwrap());
    assert!(started.elapsed() >= PAUSE_WAIT);
}
