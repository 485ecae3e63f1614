//! What the machine's tests share: a policy and context, new tasks, worker results, and readers
//! of a decision's outbox. Each test module takes them with `use crate::machine::fixtures::*`,
//! which also brings the types the tests name.

pub(super) use std::time::Duration;

pub(super) use imagepipe_contracts::payload::{TaskCancelled, TaskCompleted, TaskFailed, TaskPaused, TaskRetrying};
use imagepipe_contracts::step::{AnalysisOutput, DownloadOutput, MetadataOutput, Prediction};
pub(super) use imagepipe_contracts::{
    DownloadCommand, Event, MetadataCommand, Priority, Step, StepError, StepOutcome, StepOutput, StepResult,
    SubmitTask, TraceId,
};

pub(super) use super::*;
pub(super) use crate::task::{Destination, HistoryEvent, OutboxEntry, Task, TaskState, Timer, TimerKind};

pub(super) const BLOB: &str = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

pub(super) fn policy() -> Policy {
    let step = StepPolicy { max_attempts: 3, deadline: Duration::from_secs(60) };
    Policy { download: step, metadata: step, analyze: step, ..Policy::default() }
}

pub(super) fn ctx(now: u64) -> Context {
    Context { now, seed: 7, ..Context::default() }
}

pub(super) fn new_task() -> Task {
    let submit = SubmitTask::url("https://example.com/cat.jpg");
    let source = submit.validate().unwrap();
    create("tsk_1".into(), &submit, source, TraceId::random(), 1_000).task
}

pub(super) fn task_of(priority: Priority) -> Task {
    let submit = SubmitTask { priority, ..SubmitTask::url("https://example.com/cat.jpg") };
    let source = submit.validate().unwrap();
    create("tsk_1".into(), &submit, source, TraceId::random(), 1_000).task
}

pub(crate) fn output(step: Step) -> StepOutput {
    match step {
        Step::Download => StepOutput::Download(DownloadOutput {
            blob_key: BLOB.into(),
            size: 10,
            sha256: BLOB[7..].into(),
            format: "jpeg".into(),
            final_url: None,
        }),
        Step::Metadata => StepOutput::Metadata(MetadataOutput {
            format: "jpeg".into(),
            width: 1,
            height: 1,
            color_type: "rgb8".into(),
            bit_depth: 8,
            has_alpha: false,
            frame_count: 1,
            exif: None,
            has_icc_profile: false,
            dominant_colors: vec![],
            mean_brightness: 0.5,
            phash: "0000000000000000".into(),
            blurhash: "L00000fQfQfQfQfQfQfQfQfQfQfQ".into(),
            thumbnail_key: BLOB.into(),
            thumbnails: Vec::new(),
            preview_key: None,
        }),
        Step::Analyze => StepOutput::Analyze(AnalysisOutput {
            model: "m".into(),
            predictions: vec![Prediction { label: "cat".into(), score: 0.9 }],
            tags: vec![],
            embedding: None,
        }),
        Step::Custom(stage) => {
            let output = serde_json::json!({ "count": 1, "tags": [format!("{stage}:1")] });
            StepOutput::Stage(output.as_object().expect("an object").clone())
        }
    }
}

pub(super) fn ok(step: Step, attempt: u32) -> Input {
    Input::Result(Box::new(StepResult {
        task_id: "tsk_1".into(),
        step,
        attempt,
        outcome: StepOutcome::Ok { output: output(step) },
    }))
}

pub(super) fn retryable(step: Step, attempt: u32) -> Input {
    let error = StepError::new("http_503", "unavailable");
    Input::Result(Box::new(StepResult {
        task_id: "tsk_1".into(),
        step,
        attempt,
        outcome: StepOutcome::Retryable { error, retry_after_ms: None },
    }))
}

pub(super) fn retry_after(step: Step, attempt: u32, retry_after_ms: u64) -> Input {
    let error = StepError::new("http_503", "Retry-After");
    Input::Result(Box::new(StepResult {
        task_id: "tsk_1".into(),
        step,
        attempt,
        outcome: StepOutcome::Retryable { error, retry_after_ms: Some(retry_after_ms) },
    }))
}

pub(super) fn permanent(step: Step, attempt: u32) -> Input {
    let error = StepError::new("http_404", "not found");
    Input::Result(Box::new(StepResult {
        task_id: "tsk_1".into(),
        step,
        attempt,
        outcome: StepOutcome::Permanent { error },
    }))
}

pub(super) fn deferred(step: Step, attempt: u32, retry_after_ms: u64) -> Input {
    Input::Result(Box::new(StepResult {
        task_id: "tsk_1".into(),
        step,
        attempt,
        outcome: StepOutcome::Deferred { reason: StepError::new("host_busy", "busy host"), retry_after_ms },
    }))
}

pub(super) fn pause() -> Input {
    Input::Pause { reason: Some("operator".into()) }
}

pub(super) fn apply(task: &Task, input: Input, now: u64) -> Decision {
    apply_in(task, input, &ctx(now))
}

/// The transition `input` makes in context `ctx`, which must apply.
pub(super) fn apply_in(task: &Task, input: Input, ctx: &Context) -> Decision {
    match decide(task, &input, ctx, &policy()) {
        Ok(Verdict::Apply(d)) => *d,
        other => panic!("{input:?} on {:?}: {other:?}", task.state),
    }
}

pub(super) fn verdict(task: &Task, input: Input, now: u64) -> Verdict {
    decide(task, &input, &ctx(now), &policy()).unwrap_or_else(|e| panic!("{input:?}: {e}"))
}

pub(super) fn events(d: &Decision) -> Vec<&str> {
    d.outbox
        .iter()
        .filter_map(|e| match &e.destination {
            Destination::Event(t) => Some(t.as_str()),
            Destination::Queue(_) => None,
        })
        .collect()
}

pub(super) fn queues(d: &Decision) -> Vec<&str> {
    d.outbox
        .iter()
        .filter_map(|e| match &e.destination {
            Destination::Queue(q) => Some(q.as_str()),
            Destination::Event(_) => None,
        })
        .collect()
}

/// The commands a decision sends: (lane, message id, attempt in the body).
pub(super) fn sent(d: &Decision) -> Vec<(&str, &str, u32)> {
    d.outbox
        .iter()
        .filter_map(|e| match &e.destination {
            Destination::Queue(q) => {
                let body: serde_json::Value = serde_json::from_str(&e.body).unwrap();
                let attempt = u32::try_from(body["attempt"].as_u64().unwrap()).unwrap();
                Some((q.as_str(), e.message_id.as_str(), attempt))
            }
            Destination::Event(_) => None,
        })
        .collect()
}

/// The ids of the events a decision publishes.
pub(super) fn event_ids(d: &Decision) -> Vec<String> {
    d.outbox.iter().filter(|e| matches!(e.destination, Destination::Event(_))).map(|e| e.message_id.clone()).collect()
}

/// A task that ran every step once and completed, and the decision that completed it.
pub(super) fn completed(priority: Priority) -> Decision {
    let task = apply(&task_of(priority), Input::Start, 0).task;
    let task = apply(&task, ok(Step::Download, 1), 1).task;
    let task = apply(&task, ok(Step::Metadata, 1), 2).task;
    let d = apply(&task, ok(Step::Analyze, 1), 3);
    assert_eq!(d.task.state, TaskState::Completed);
    d
}
