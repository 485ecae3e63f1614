//! The batch path against the one-by-one path: random inputs for a few tasks, cut into random
//! batches and handed to two engines over one store (two replicas: each one's copy of the tasks
//! it wrote goes stale when the other writes, so batches lose compare-and-sets), end in the same
//! tasks, and answer each input the same way, as the same inputs handled one at a time by a
//! single engine.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{T0, engine, memory_bus, ok};
use imagepipe_contracts::{Step, StepError, StepOutcome, StepResult, SubmitTask};
use imagepipe_coordinator::engine::{Engine, EngineError, Handled, Origin};
use imagepipe_coordinator::machine::Input;
use imagepipe_coordinator::store::TaskStore;
use imagepipe_coordinator::store::embedded::EmbeddedStore;
use imagepipe_runtime::clock::ManualClock;
use proptest::prelude::*;

const TASKS: usize = 3;

#[derive(Debug, Clone)]
enum Op {
    Start,
    Ok(Step, u32),
    Retryable(Step, u32),
    Permanent(Step, u32),
    Cancel,
}

fn op() -> impl Strategy<Value = Op> {
    let step = prop_oneof![Just(Step::Download), Just(Step::Metadata), Just(Step::Analyze)];
    prop_oneof![
        1 => Just(Op::Start),
        6 => (step.clone(), 1..3u32).prop_map(|(s, a)| Op::Ok(s, a)),
        1 => (step.clone(), 1..3u32).prop_map(|(s, a)| Op::Retryable(s, a)),
        1 => (step, 1..3u32).prop_map(|(s, a)| Op::Permanent(s, a)),
        1 => Just(Op::Cancel),
    ]
}

fn input(task: &str, op: &Op) -> Input {
    let result =
        |step, attempt, outcome| Input::Result(Box::new(StepResult { task_id: task.into(), step, attempt, outcome }));
    match op {
        Op::Start => Input::Start,
        Op::Ok(step, attempt) => Input::Result(Box::new(ok(task, *step, *attempt))),
        Op::Retryable(step, attempt) => result(
            *step,
            *attempt,
            StepOutcome::Retryable { error: StepError::new("timeout", "slow"), retry_after_ms: None },
        ),
        Op::Permanent(step, attempt) => {
            result(*step, *attempt, StepOutcome::Permanent { error: StepError::new("http_404", "gone") })
        }
        Op::Cancel => Input::Cancel { reason: None },
    }
}

/// What an input did, without what depends on the clock's jitter (timers' due times).
fn answer(handled: &Result<Handled, EngineError>) -> String {
    match handled {
        Ok(Handled::Applied(task)) => format!("applied v{} {}", task.version, task.state),
        Ok(Handled::Ignored(why)) => format!("ignored {why:?}"),
        Err(EngineError::Illegal(_)) => "illegal".into(),
        Err(e) => panic!("unexpected error: {e}"),
    }
}

/// Each task as the store holds it: state, version, attempts per step, history.
async fn tasks(store: &dyn TaskStore) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..TASKS {
        let id = format!("tsk_{i}");
        let task = store.get(&id).await.unwrap().unwrap();
        let history: Vec<String> =
            store.history(&id).await.unwrap().iter().map(|h| format!("{:?}>{}", h.event, h.to)).collect();
        let attempts: Vec<u32> = Step::ALL.iter().map(|s| task.steps.get(*s).attempts).collect();
        out.push(format!("{id} {} v{} {attempts:?} {}", task.state, task.version, history.join(",")));
    }
    out
}

async fn created(engine: &Engine) {
    for i in 0..TASKS {
        let submit = SubmitTask { task_id: Some(format!("tsk_{i}")), ..SubmitTask::url("https://example.com/a.jpg") };
        engine.submit(&submit, Origin::Http, String::new).await.unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn batches_on_two_replicas_end_as_one_by_one(
        ops in prop::collection::vec((0..TASKS, op()), 1..40),
        cuts in prop::collection::vec((1..8usize, any::<bool>()), 1..40),
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async {
            let inputs: Vec<(String, Input)> =
                ops.iter().map(|(t, op)| (format!("tsk_{t}"), input(&format!("tsk_{t}"), op))).collect();
            let clock = ManualClock::at_unix_ms(T0);

            let one_dir = tempfile::tempdir().unwrap();
            let one_store: Arc<dyn TaskStore> = Arc::new(EmbeddedStore::open(one_dir.path(), Duration::from_secs(10)).unwrap());
            let one = engine(one_store.clone(), &memory_bus(), &clock, 100);
            created(&one).await;
            let mut expected = Vec::new();
            for (id, input) in inputs.clone() {
                expected.push(answer(&one.handle(&id, input).await));
            }

            let dir = tempfile::tempdir().unwrap();
            let store: Arc<dyn TaskStore> = Arc::new(EmbeddedStore::open(dir.path(), Duration::from_secs(10)).unwrap());
            let bus = memory_bus();
            let replicas = [engine(store.clone(), &bus, &clock, 100), engine(store.clone(), &bus, &clock, 100)];
            created(&replicas[0]).await;
            let mut got = Vec::new();
            let mut rest = inputs.as_slice();
            for (len, second) in cuts.iter().cycle() {
                if rest.is_empty() {
                    break;
                }
                let (batch, later) = rest.split_at((*len).min(rest.len()));
                rest = later;
                let replica = &replicas[usize::from(*second)];
                let batch = batch.iter().map(|(id, input)| (id.clone(), input.clone(), tracing::Span::none())).collect();
                got.extend(replica.handle_batch(batch).await.iter().map(answer));
            }
            assert_eq!(got, expected, "each input answered as one by one");
            assert_eq!(tasks(store.as_ref()).await, tasks(one_store.as_ref()).await);
        });
    }
}
