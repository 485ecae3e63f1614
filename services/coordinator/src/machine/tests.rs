use imagepipe_contracts::step::{AnalysisOutput, DownloadOutput, MetadataOutput, Prediction};
use proptest::prelude::*;

use super::*;

const BLOB: &str = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

fn policy() -> Policy {
    let step = StepPolicy { max_attempts: 3, deadline: Duration::from_secs(60) };
    Policy { download: step, metadata: step, analyze: step, ..Policy::default() }
}

fn ctx(now: u64) -> Context {
    Context { now, seed: 7, ..Context::default() }
}

fn new_task() -> Task {
    let submit = SubmitTask::url("https://example.com/cat.jpg");
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
    }
}

fn ok(step: Step, attempt: u32) -> Input {
    Input::Result(Box::new(StepResult {
        task_id: "tsk_1".into(),
        step,
        attempt,
        outcome: StepOutcome::Ok { output: output(step) },
    }))
}

fn retryable(step: Step, attempt: u32) -> Input {
    let error = StepError::new("http_503", "unavailable");
    Input::Result(Box::new(StepResult {
        task_id: "tsk_1".into(),
        step,
        attempt,
        outcome: StepOutcome::Retryable { error, retry_after_ms: None },
    }))
}

fn retry_after(step: Step, attempt: u32, retry_after_ms: u64) -> Input {
    let error = StepError::new("http_503", "Retry-After");
    Input::Result(Box::new(StepResult {
        task_id: "tsk_1".into(),
        step,
        attempt,
        outcome: StepOutcome::Retryable { error, retry_after_ms: Some(retry_after_ms) },
    }))
}

fn permanent(step: Step, attempt: u32) -> Input {
    let error = StepError::new("http_404", "not found");
    Input::Result(Box::new(StepResult {
        task_id: "tsk_1".into(),
        step,
        attempt,
        outcome: StepOutcome::Permanent { error },
    }))
}

fn apply(task: &Task, input: Input, now: u64) -> Decision {
    apply_in(task, input, &ctx(now))
}

/// The transition `input` makes in context `ctx`, which must apply.
fn apply_in(task: &Task, input: Input, ctx: &Context) -> Decision {
    match decide(task, &input, ctx, &policy()) {
        Ok(Verdict::Apply(d)) => *d,
        other => panic!("{input:?} on {:?}: {other:?}", task.state),
    }
}

fn events(d: &Decision) -> Vec<&str> {
    d.outbox
        .iter()
        .filter_map(|e| match &e.destination {
            Destination::Event(t) => Some(t.as_str()),
            Destination::Queue(_) => None,
        })
        .collect()
}

fn queues(d: &Decision) -> Vec<&str> {
    d.outbox
        .iter()
        .filter_map(|e| match &e.destination {
            Destination::Queue(q) => Some(q.as_str()),
            Destination::Event(_) => None,
        })
        .collect()
}

#[test]
fn creation_queues_the_task_and_announces_it() {
    let submit = SubmitTask::url("https://example.com/cat.jpg");
    let d = create("tsk_1".into(), &submit, submit.validate().unwrap(), TraceId::random(), 5);
    assert_eq!((d.task.state, d.task.version, d.history.version), (TaskState::Queued, 1, 1));
    assert_eq!(events(&d), ["task.created"]);
    assert!(d.task.timer.is_none());
}

#[test]
fn the_happy_path_runs_every_step_in_order_and_completes_once() {
    let mut task = new_task();
    let d = apply(&task, Input::Start, 2_000);
    assert_eq!(queues(&d), ["tasks.download"]);
    let command: DownloadCommand = serde_json::from_str(&d.outbox[0].body).unwrap();
    assert_eq!(command.attempt, 1);
    task = d.task;
    assert_eq!(task.state, TaskState::Downloading);

    let d = apply(&task, ok(Step::Download, 1), 3_000);
    assert_eq!(queues(&d), ["tasks.metadata"]);
    let command: MetadataCommand = serde_json::from_str(&d.outbox[0].body).unwrap();
    assert_eq!(command.blob_key, BLOB);
    task = d.task;
    let d = apply(&task, ok(Step::Metadata, 1), 4_000);
    assert_eq!(queues(&d), ["tasks.ai"]);
    task = d.task;
    let d = apply(&task, ok(Step::Analyze, 1), 5_000);
    assert_eq!(d.task.state, TaskState::Completed);
    assert_eq!(events(&d), ["task.completed"]);
    let event: Event<TaskCompleted> = Event::from_json(d.outbox[0].body.as_bytes()).unwrap();
    assert_eq!(event.payload.duration_ms, 4_000);
    assert_eq!(d.task.version, 5);
    assert!(d.task.timer.is_none());

    let again = decide(&d.task, &ok(Step::Analyze, 1), &ctx(6_000), &policy()).unwrap();
    assert_eq!(again, Verdict::Ignore(Ignored::StaleResult));
}

#[test]
fn retryable_errors_back_off_then_redispatch_until_attempts_run_out() {
    let mut task = apply(&new_task(), Input::Start, 0).task;
    for attempt in 1..=2 {
        let d = apply(&task, retryable(Step::Download, attempt), 10);
        assert_eq!(events(&d), ["task.retrying"]);
        let timer = d.task.timer.unwrap();
        assert_eq!((timer.kind, timer.attempt), (TimerKind::Retry, attempt + 1));
        assert!(timer.due_at - 10 <= 1_000 * (1 << (attempt - 1)), "full jitter under 1 s · 2^(attempt-1)");
        let early = decide(&d.task, &Input::Timer(timer), &ctx(timer.due_at - 1), &policy()).unwrap();
        assert_eq!(early, Verdict::Ignore(Ignored::TimerNotDue));
        let d = apply(&d.task, Input::Timer(timer), timer.due_at);
        assert_eq!(queues(&d), ["tasks.download"]);
        task = d.task;
    }
    let d = apply(&task, retryable(Step::Download, 3), 99);
    assert_eq!(d.task.state, TaskState::Failed);
    assert_eq!(events(&d), ["task.failed"]);
    let failure = d.task.failure.unwrap();
    assert_eq!((failure.attempt, failure.error.code.as_str()), (3, "http_503"));
    assert!(failure.error.message.contains("gave up after 3 of 3 attempts"), "{}", failure.error.message);
}

#[test]
fn retry_after_from_the_worker_lengthens_the_backoff() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let input = Input::Result(Box::new(StepResult {
        task_id: "tsk_1".into(),
        step: Step::Download,
        attempt: 1,
        outcome: StepOutcome::Retryable {
            error: StepError::new("http_429", "slow down"),
            retry_after_ms: Some(30_000),
        },
    }));
    assert_eq!(apply(&task, input, 0).task.timer.unwrap().due_at, 30_000);
}

#[test]
fn a_retry_after_longer_than_the_backoff_cap_is_cut_to_the_cap() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let input = retry_after(Step::Download, 1, 3_600_000);
    let settings = imagepipe_runtime::config::CoordinatorConfig {
        retry_max_backoff: Duration::from_secs(45),
        ..Default::default()
    };
    let policy = crate::app::policy(&settings);
    let Ok(Verdict::Apply(d)) = decide(&task, &input, &ctx(5_000), &policy) else { panic!("the retry applies") };
    assert_eq!(d.task.timer.unwrap().due_at, 5_000 + 45_000, "coordinator.retry_max_backoff away, not an hour");
    let event: Event<TaskRetrying> = Event::from_json(d.outbox[0].body.as_bytes()).unwrap();
    assert_eq!(event.payload.delay_ms, 45_000);
    let d = apply(&task, retry_after(Step::Download, 1, 3_600_000), 5_000);
    assert_eq!(d.task.timer.unwrap().due_at, 5_000 + 60_000, "the default cap is 60 s");
}

#[test]
fn a_permanent_error_fails_the_task_at_once_with_the_reason() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let d = apply(&task, permanent(Step::Download, 1), 5);
    assert_eq!(d.task.state, TaskState::Failed);
    let event: Event<TaskFailed> = Event::from_json(d.outbox[0].body.as_bytes()).unwrap();
    assert_eq!(event.payload.error.code, "http_404");
}

#[test]
fn a_redispatch_resends_the_running_attempt_with_a_fresh_deadline() {
    let queued = new_task();
    assert_eq!(decide(&queued, &Input::Redispatch, &ctx(0), &policy()).unwrap(), Verdict::Ignore(Ignored::NotRunning));

    let running = apply(&queued, Input::Start, 0);
    let again = apply(&running.task, Input::Redispatch, 30_000);
    assert_eq!(queues(&again), ["tasks.download"]);
    assert_eq!(
        again.outbox[0].message_id,
        running.outbox.iter().find(|e| matches!(e.destination, Destination::Queue(_))).unwrap().message_id
    );
    assert_eq!(again.task.state, TaskState::Downloading);
    assert_eq!(again.task.steps.download.attempts, 1, "the same attempt, not a new one");
    let timer = again.task.timer.unwrap();
    assert_eq!((timer.kind, timer.attempt, timer.due_at), (TimerKind::Deadline, 1, 90_000));
    // the re-sent attempt's result is taken as usual
    let d = apply(&again.task, ok(Step::Download, 1), 31_000);
    assert_eq!(d.task.state, TaskState::ExtractingMetadata);
}

#[test]
fn a_missed_deadline_counts_as_a_failed_attempt() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let deadline = task.timer.unwrap();
    assert_eq!((deadline.kind, deadline.due_at), (TimerKind::Deadline, 60_000));
    let d = apply(&task, Input::Timer(deadline), 60_000);
    assert_eq!(d.task.steps.download.last_error.as_ref().unwrap().code, "deadline_exceeded");
    assert_eq!(d.task.timer.unwrap().kind, TimerKind::Retry);
    // the late failure of the timed-out attempt was already counted
    let late = decide(&d.task, &retryable(Step::Download, 1), &ctx(60_001), &policy()).unwrap();
    assert_eq!(late, Verdict::Ignore(Ignored::DuplicateResult));
    // but its late success is still taken
    let d = apply(&d.task, ok(Step::Download, 1), 60_002);
    assert_eq!(d.task.state, TaskState::ExtractingMetadata);
}

#[test]
fn stale_duplicate_and_future_results_are_told_apart() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let task = apply(&task, retryable(Step::Download, 1), 0).task;
    let task = apply(&task, Input::Timer(task.timer.unwrap()), 10_000).task;
    assert_eq!(task.current_attempt(), 2);
    let stale = decide(&task, &ok(Step::Download, 1), &ctx(1), &policy()).unwrap();
    assert_eq!(stale, Verdict::Ignore(Ignored::StaleResult));
    let err = decide(&task, &ok(Step::Download, 3), &ctx(1), &policy()).unwrap_err();
    assert!(err.reason.contains("never dispatched"), "{err}");
    let err = decide(&task, &ok(Step::Metadata, 1), &ctx(1), &policy()).unwrap_err();
    assert!(err.reason.contains("while the task is at step download"), "{err}");
    let mismatched = Input::Result(Box::new(StepResult {
        task_id: "tsk_1".into(),
        step: Step::Download,
        attempt: 2,
        outcome: StepOutcome::Ok { output: output(Step::Analyze) },
    }));
    assert!(decide(&task, &mismatched, &ctx(1), &policy()).is_err());
    let queued = new_task();
    assert!(decide(&queued, &ok(Step::Download, 1), &ctx(1), &policy()).is_err());
}

#[test]
fn cancel_stops_at_the_next_step_boundary() {
    let queued = new_task();
    assert_eq!(apply(&queued, Input::Cancel { reason: None }, 1).task.state, TaskState::Cancelled);

    let running = apply(&new_task(), Input::Start, 0).task;
    let d = apply(&running, Input::Cancel { reason: Some("changed my mind".into()) }, 1);
    assert_eq!(d.task.state, TaskState::Downloading);
    assert!(d.outbox.is_empty());
    let again = decide(&d.task, &Input::Cancel { reason: None }, &ctx(2), &policy()).unwrap();
    assert_eq!(again, Verdict::Ignore(Ignored::AlreadyCancelling));
    let d = apply(&d.task, ok(Step::Download, 1), 3);
    assert_eq!(d.task.state, TaskState::Cancelled);
    assert_eq!(events(&d), ["task.cancelled"]);
    let event: Event<TaskCancelled> = Event::from_json(d.outbox[0].body.as_bytes()).unwrap();
    assert_eq!((event.payload.step, event.payload.reason.as_deref()), (Some(Step::Download), Some("changed my mind")));
    assert!(decide(&d.task, &Input::Cancel { reason: None }, &ctx(4), &policy()).is_err());

    let backing_off = apply(&running, retryable(Step::Download, 1), 1).task;
    assert_eq!(apply(&backing_off, Input::Cancel { reason: None }, 2).task.state, TaskState::Cancelled);
}

/// A task whose metadata command went out at 1 s.
fn waiting_at_metadata() -> Task {
    let task = apply(&new_task(), Input::Start, 0).task;
    apply(&task, ok(Step::Download, 1), 1_000).task
}

#[test]
fn a_cancel_of_an_attempt_waiting_in_a_paused_queue_that_runs_nothing_is_at_once() {
    let task = waiting_at_metadata();
    let idle = Context { paused: PausedSteps::of([Step::Metadata]).idle(Step::Metadata), ..ctx(2_000) };
    let Ok(Verdict::Apply(d)) = decide(&task, &Input::Cancel { reason: Some("test".into()) }, &idle, &policy()) else {
        panic!("the cancel applies")
    };
    assert_eq!(d.task.state, TaskState::Cancelled, "no worker has the command: nothing to wait for");
    assert_eq!((d.history.from, d.history.event), (Some(TaskState::ExtractingMetadata), HistoryEvent::Cancelled));
    assert_eq!(d.task.timer, None);
    assert_eq!(events(&d), ["task.cancelled"]);
    let event: Event<TaskCancelled> = Event::from_json(d.outbox[0].body.as_bytes()).unwrap();
    assert_eq!((event.payload.step, event.payload.reason.as_deref()), (Some(Step::Metadata), Some("test")));
    // The command is delivered after the resume: what its worker reports changes nothing.
    let late = decide(&d.task, &ok(Step::Metadata, 1), &ctx(9_000), &policy()).unwrap();
    assert_eq!(late, Verdict::Ignore(Ignored::StaleResult));
    let late = decide(&d.task, &retryable(Step::Metadata, 1), &ctx(9_000), &policy()).unwrap();
    assert_eq!(late, Verdict::Ignore(Ignored::StaleResult));
}

#[test]
fn a_cancel_waits_for_the_step_when_its_paused_queue_may_still_run_it() {
    let task = waiting_at_metadata();
    // Paused, but a consumer may not have stopped yet or still holds messages; or the idle
    // queue is another step's.
    for paused in [PausedSteps::of([Step::Metadata]), PausedSteps::of([Step::Analyze]).idle(Step::Analyze)] {
        let d = apply_in(&task, Input::Cancel { reason: None }, &Context { paused, ..ctx(2_000) });
        assert_eq!((d.task.state, d.history.event), (TaskState::ExtractingMetadata, HistoryEvent::CancelRequested));
        assert!(d.outbox.is_empty());
    }
    assert!(!PausedSteps::default().idle(Step::Metadata).is_idle(Step::Metadata), "only a paused queue is idle");
}

#[test]
fn a_cancel_asked_while_the_step_might_run_ends_at_once_when_asked_again_with_its_queue_idle() {
    let task = waiting_at_metadata();
    let asked = apply(&task, Input::Cancel { reason: Some("first".into()) }, 2_000).task;
    assert!(asked.cancel_requested.is_some() && !asked.state.is_terminal());
    let idle = Context { paused: PausedSteps::of([Step::Metadata]).idle(Step::Metadata), ..ctx(3_000) };
    let d = apply_in(&asked, Input::Cancel { reason: Some("second".into()) }, &idle);
    assert_eq!(d.task.state, TaskState::Cancelled);
    let cancel = d.task.cancel_requested.as_ref().unwrap();
    assert_eq!((cancel.reason.as_deref(), cancel.at), (Some("first"), 2_000), "the first request is kept");
}

#[test]
fn full_jitter_stays_under_the_doubling_cap_and_is_reproducible() {
    let p = Policy::default();
    for seed in 0..200 {
        assert!(p.backoff(1, seed) <= Duration::from_secs(1));
        assert!(p.backoff(3, seed) <= Duration::from_secs(4));
        assert!(p.backoff(40, seed) <= Duration::from_secs(60));
        assert_eq!(p.backoff(5, seed), p.backoff(5, seed));
    }
    let spread: std::collections::HashSet<_> = (0..50).map(|seed| p.backoff(10, seed)).collect();
    assert!(spread.len() > 40, "jitter spreads retries");
}

fn task_of(priority: Priority) -> Task {
    let submit = SubmitTask { priority, ..SubmitTask::url("https://example.com/cat.jpg") };
    let source = submit.validate().unwrap();
    create("tsk_1".into(), &submit, source, TraceId::random(), 1_000).task
}

fn deferred(step: Step, attempt: u32, retry_after_ms: u64) -> Input {
    Input::Result(Box::new(StepResult {
        task_id: "tsk_1".into(),
        step,
        attempt,
        outcome: StepOutcome::Deferred { reason: StepError::new("host_busy", "busy host"), retry_after_ms },
    }))
}

fn pause() -> Input {
    Input::Pause { reason: Some("operator".into()) }
}

fn verdict(task: &Task, input: Input, now: u64) -> Verdict {
    decide(task, &input, &ctx(now), &policy()).unwrap_or_else(|e| panic!("{input:?}: {e}"))
}

/// The commands a decision sends: (lane, message id, attempt in the body).
fn sent(d: &Decision) -> Vec<(&str, &str, u32)> {
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
fn event_ids(d: &Decision) -> Vec<String> {
    d.outbox.iter().filter(|e| matches!(e.destination, Destination::Event(_))).map(|e| e.message_id.clone()).collect()
}

/// A task that ran every step once and completed, and the decision that completed it.
fn completed(priority: Priority) -> Decision {
    let task = apply(&task_of(priority), Input::Start, 0).task;
    let task = apply(&task, ok(Step::Download, 1), 1).task;
    let task = apply(&task, ok(Step::Metadata, 1), 2).task;
    let d = apply(&task, ok(Step::Analyze, 1), 3);
    assert_eq!(d.task.state, TaskState::Completed);
    d
}

// --- priorities -----------------------------------------------------------------------------

#[test]
fn a_high_priority_task_sends_every_step_to_the_high_lanes() {
    let d = apply(&task_of(Priority::High), Input::Start, 0);
    assert_eq!(queues(&d), ["tasks.download.high"]);
    let d = apply(&d.task, ok(Step::Download, 1), 1);
    assert_eq!(queues(&d), ["tasks.metadata.high"]);
    let d = apply(&d.task, ok(Step::Metadata, 1), 2);
    assert_eq!(queues(&d), ["tasks.ai.high"]);
    // a retry stays in its lane
    let d = apply(&d.task, retryable(Step::Analyze, 1), 3);
    let d = apply(&d.task, Input::Timer(d.task.timer.unwrap()), 100_000);
    assert_eq!(queues(&d), ["tasks.ai.high"]);
}

#[test]
fn normal_and_low_priority_tasks_use_the_plain_queue_and_the_low_lane() {
    let d = apply(&task_of(Priority::Normal), Input::Start, 0);
    assert_eq!(queues(&d), ["tasks.download"]);
    let d = apply(&d.task, ok(Step::Download, 1), 1);
    assert_eq!(queues(&d), ["tasks.metadata"]);

    let d = apply(&task_of(Priority::Low), Input::Start, 0);
    assert_eq!(queues(&d), ["tasks.download.low"]);
    let d = apply(&d.task, ok(Step::Download, 1), 1);
    assert_eq!(queues(&d), ["tasks.metadata.low"]);
}

// --- deferrals ------------------------------------------------------------------------------

#[test]
fn a_deferral_resends_the_same_attempt_uncharged_under_a_new_message_id() {
    let started = apply(&new_task(), Input::Start, 0);
    let first_id = sent(&started)[0].1.to_owned();
    assert_eq!(first_id, "tsk_1.download.1");

    let d = apply(&started.task, deferred(Step::Download, 1, 2_000), 500);
    assert!(d.outbox.is_empty(), "no event, no command until the timer: {:?}", d.outbox);
    assert_eq!(d.history.event, HistoryEvent::Deferred);
    assert_eq!(d.task.state, TaskState::Downloading);
    assert_eq!((d.task.steps.download.attempts, d.task.steps.download.deferrals), (1, 1));
    assert!(d.task.steps.download.last_error.is_none(), "a deferral is no failure");
    let timer = d.task.timer.unwrap();
    assert_eq!(
        (timer.kind, timer.step, timer.attempt, timer.due_at),
        (TimerKind::Retry, Step::Download, 1, 2_500),
        "the same attempt, again after retry_after"
    );
    // the attempt's deadline does not run while it waits
    let old_deadline = started.task.timer.unwrap();
    assert_eq!(verdict(&d.task, Input::Timer(old_deadline), 60_000), Verdict::Ignore(Ignored::StaleTimer));

    let resent = apply(&d.task, Input::Timer(timer), 2_500);
    assert_eq!(sent(&resent), [("tasks.download", "tsk_1.download.1.d1", 1)]);
    assert_eq!(resent.history.event, HistoryEvent::AttemptDispatched);
    let deadline = resent.task.timer.unwrap();
    assert_eq!((deadline.kind, deadline.attempt, deadline.due_at), (TimerKind::Deadline, 1, 62_500));

    // a second deferral gets the next id
    let d = apply(&resent.task, deferred(Step::Download, 1, 1_000), 3_000);
    let resent = apply(&d.task, Input::Timer(d.task.timer.unwrap()), 4_000);
    assert_eq!(sent(&resent), [("tasks.download", "tsk_1.download.1.d2", 1)]);
    // and the attempt's result is then taken as usual
    let d = apply(&resent.task, ok(Step::Download, 1), 5_000);
    assert_eq!(d.task.state, TaskState::ExtractingMetadata);
}

#[test]
fn deferrals_never_use_up_the_retry_budget() {
    let mut task = apply(&new_task(), Input::Start, 0).task;
    let mut now = 0;
    for _ in 0..10 {
        task = apply(&task, deferred(Step::Download, 1, 1_000), now).task;
        now = task.timer.unwrap().due_at;
        task = apply(&task, Input::Timer(task.timer.unwrap()), now).task;
    }
    assert_eq!((task.steps.download.attempts, task.steps.download.deferrals), (1, 10));
    // still max_attempts (3) real attempts
    for attempt in 1..=2 {
        let d = apply(&task, retryable(Step::Download, attempt), now);
        assert_eq!(d.task.timer.unwrap().kind, TimerKind::Retry, "attempt {attempt} is retried");
        now = d.task.timer.unwrap().due_at;
        task = apply(&d.task, Input::Timer(d.task.timer.unwrap()), now).task;
    }
    let d = apply(&task, retryable(Step::Download, 3), now);
    assert_eq!(d.task.state, TaskState::Failed);
    assert!(d.task.failure.unwrap().error.message.contains("gave up after 3 of 3 attempts"));
}

#[test]
fn a_deferral_longer_than_the_backoff_cap_is_cut_to_the_cap() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let d = apply(&task, deferred(Step::Download, 1, 3_600_000), 1_000);
    assert_eq!(d.task.timer.unwrap().due_at, 1_000 + 60_000, "the default backoff cap is 60 s");
    assert!(d.history.detail.as_deref().unwrap().contains("60000 ms"), "{:?}", d.history.detail);
}

#[test]
fn a_duplicate_deferral_is_ignored() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let d = apply(&task, deferred(Step::Download, 1, 5_000), 10);
    assert_eq!(verdict(&d.task, deferred(Step::Download, 1, 5_000), 20), Verdict::Ignore(Ignored::DuplicateResult));
    assert_eq!(d.task.steps.download.deferrals, 1);
}

#[test]
fn a_cancel_asked_while_an_attempt_runs_wins_over_its_deferral() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let task = apply(&task, Input::Cancel { reason: Some("stop".into()) }, 1).task;
    let d = apply(&task, deferred(Step::Download, 1, 5_000), 2);
    assert_eq!(d.task.state, TaskState::Cancelled);
    assert_eq!(events(&d), ["task.cancelled"]);
    assert!(queues(&d).is_empty() && d.task.timer.is_none());
}

#[test]
fn a_pause_asked_while_an_attempt_runs_wins_over_its_deferral_and_resume_resends_under_a_new_id() {
    let started = apply(&new_task(), Input::Start, 0);
    let task = apply(&started.task, pause(), 1).task;
    let d = apply(&task, deferred(Step::Download, 1, 5_000), 2);
    assert_eq!(d.task.state, TaskState::Paused);
    assert_eq!(events(&d), ["task.paused"]);
    assert!(d.task.timer.is_none(), "no timer while paused");
    let at = d.task.paused.clone().unwrap();
    assert_eq!((at.step, at.attempt), (Some(Step::Download), 1), "the deferred attempt, uncharged");

    let resumed = apply(&d.task, Input::Resume, 3);
    let (lane, id, attempt) = sent(&resumed)[0];
    assert_eq!((lane, attempt), ("tasks.download", 1));
    assert_ne!(id, sent(&started)[0].1, "a broker would drop a re-send under the first send's id as a duplicate");
}

// --- pausing a task -------------------------------------------------------------------------

#[test]
fn pausing_a_queued_task_pauses_it_at_once_and_resume_queues_it_again() {
    let d = apply(&new_task(), pause(), 5);
    assert_eq!((d.task.state, d.history.event), (TaskState::Paused, HistoryEvent::Paused));
    assert_eq!(events(&d), ["task.paused"]);
    let event: Event<TaskPaused> = Event::from_json(d.outbox[0].body.as_bytes()).unwrap();
    assert_eq!((event.payload.step, event.payload.reason.as_deref()), (None, Some("operator")));
    assert!(d.task.timer.is_none() && d.task.pause_requested.is_none());
    assert_eq!(d.task.paused.as_ref().unwrap().step, None);
    assert_eq!(
        verdict(&d.task, Input::Start, 6),
        Verdict::Ignore(Ignored::AlreadyStarted),
        "a paused task never starts"
    );

    let resumed = apply(&d.task, Input::Resume, 7);
    assert_eq!((resumed.task.state, resumed.history.event), (TaskState::Queued, HistoryEvent::Resumed));
    assert_eq!(events(&resumed), ["task.resumed"]);
    assert!(queues(&resumed).is_empty() && resumed.task.paused.is_none() && resumed.task.timer.is_none());
    assert_eq!(sent(&apply(&resumed.task, Input::Start, 8)), [("tasks.download", "tsk_1.download.1", 1)]);
}

#[test]
fn pausing_a_task_in_backoff_pauses_it_at_once_and_resume_dispatches_the_retry() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let backing_off = apply(&task, retryable(Step::Download, 1), 10).task;
    let retry = backing_off.timer.unwrap();
    assert_eq!((retry.kind, retry.attempt), (TimerKind::Retry, 2));

    let d = apply(&backing_off, pause(), 20);
    assert_eq!(d.task.state, TaskState::Paused);
    assert_eq!(events(&d), ["task.paused"]);
    assert!(d.task.timer.is_none());
    let at = d.task.paused.clone().unwrap();
    assert_eq!((at.step, at.attempt), (Some(Step::Download), 2));
    assert_eq!(verdict(&d.task, Input::Timer(retry), retry.due_at), Verdict::Ignore(Ignored::StaleTimer));

    let resumed = apply(&d.task, Input::Resume, 500_000);
    assert_eq!(sent(&resumed), [("tasks.download", "tsk_1.download.2", 2)]);
    assert_eq!(events(&resumed), ["task.resumed"]);
    assert_eq!(resumed.task.state, TaskState::Downloading);
    let deadline = resumed.task.timer.unwrap();
    assert_eq!((deadline.kind, deadline.attempt, deadline.due_at), (TimerKind::Deadline, 2, 560_000));
}

#[test]
fn pausing_a_running_step_lets_it_finish_then_pauses_before_the_next_step() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let d = apply(&task, pause(), 1);
    assert_eq!((d.task.state, d.history.event), (TaskState::Downloading, HistoryEvent::PauseRequested));
    assert!(d.outbox.is_empty());
    assert!(d.task.pause_requested.is_some() && d.task.paused.is_none());
    assert_eq!(d.task.timer, task.timer, "the running attempt keeps its deadline");

    let d = apply(&d.task, ok(Step::Download, 1), 2);
    assert_eq!((d.task.state, d.history.event), (TaskState::Paused, HistoryEvent::Paused));
    assert_eq!(events(&d), ["task.paused"], "the next step is not dispatched");
    assert!(d.task.outputs.download.is_some(), "the finished step's output is kept");
    assert!(d.task.pause_requested.is_none() && d.task.timer.is_none());
    let at = d.task.paused.clone().unwrap();
    assert_eq!((at.step, at.attempt, at.reason.as_deref()), (Some(Step::Metadata), 1, Some("operator")));

    let resumed = apply(&d.task, Input::Resume, 3);
    assert_eq!(sent(&resumed), [("tasks.metadata", "tsk_1.metadata.1", 1)]);
    assert_eq!(resumed.task.state, TaskState::ExtractingMetadata);
}

#[test]
fn a_retryable_failure_of_a_pausing_step_pauses_with_the_next_attempt() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let task = apply(&task, pause(), 1).task;
    let d = apply(&task, retryable(Step::Download, 1), 2);
    assert_eq!(d.task.state, TaskState::Paused);
    assert_eq!(events(&d), ["task.paused"], "no retry is scheduled");
    let at = d.task.paused.clone().unwrap();
    assert_eq!((at.step, at.attempt), (Some(Step::Download), 2));
    assert_eq!(sent(&apply(&d.task, Input::Resume, 3)), [("tasks.download", "tsk_1.download.2", 2)]);

    // a missed deadline is a failed attempt too
    let task = apply(&apply(&new_task(), Input::Start, 0).task, pause(), 1).task;
    let d = apply(&task, Input::Timer(task.timer.unwrap()), 60_000);
    assert_eq!(d.task.state, TaskState::Paused);
    assert_eq!(d.task.paused.unwrap().attempt, 2);
}

#[test]
fn a_pausing_step_that_runs_out_of_attempts_or_fails_for_good_still_fails() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let task = apply(&task, pause(), 1).task;
    let d = apply(&task, permanent(Step::Download, 1), 2);
    assert_eq!(d.task.state, TaskState::Failed);
    assert_eq!(events(&d), ["task.failed"]);

    let mut task = apply(&new_task(), Input::Start, 0).task;
    for attempt in 1..=2 {
        task = apply(&task, retryable(Step::Download, attempt), 0).task;
        task = apply(&task, Input::Timer(task.timer.unwrap()), 100_000).task;
    }
    let task = apply(&task, pause(), 100_001).task;
    let d = apply(&task, retryable(Step::Download, 3), 100_002);
    assert_eq!(d.task.state, TaskState::Failed, "the last attempt failed: nothing to pause before");
}

#[test]
fn a_second_pause_is_ignored() {
    let paused = apply(&new_task(), pause(), 1).task;
    assert_eq!(verdict(&paused, pause(), 2), Verdict::Ignore(Ignored::AlreadyPaused));
    let pausing = apply(&apply(&new_task(), Input::Start, 0).task, pause(), 1).task;
    assert_eq!(verdict(&pausing, pause(), 2), Verdict::Ignore(Ignored::AlreadyPaused));
}

#[test]
fn resume_withdraws_a_pending_pause() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let pausing = apply(&task, pause(), 1).task;
    let d = apply(&pausing, Input::Resume, 2);
    assert_eq!((d.task.state, d.history.event), (TaskState::Downloading, HistoryEvent::Resumed));
    assert!(d.outbox.is_empty(), "nothing stopped, nothing to announce or send");
    assert!(d.task.pause_requested.is_none());
    assert_eq!(d.task.timer, task.timer, "the attempt keeps running");
    let d = apply(&d.task, ok(Step::Download, 1), 3);
    assert_eq!(queues(&d), ["tasks.metadata"], "the next step goes on");
}

#[test]
fn resume_of_an_unfinished_task_that_is_not_paused_is_ignored() {
    let queued = new_task();
    assert_eq!(verdict(&queued, Input::Resume, 1), Verdict::Ignore(Ignored::NotPaused));
    let running = apply(&queued, Input::Start, 0).task;
    assert_eq!(verdict(&running, Input::Resume, 1), Verdict::Ignore(Ignored::NotPaused));
    let done = completed(Priority::Normal).task;
    assert!(decide(&done, &Input::Resume, &ctx(10), &policy()).is_err(), "a finished task's resume is refused");
}

#[test]
fn a_pause_pending_when_the_last_step_succeeds_ends_with_the_task() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let task = apply(&task, ok(Step::Download, 1), 1).task;
    let task = apply(&task, ok(Step::Metadata, 1), 2).task;
    let task = apply(&task, pause(), 3).task;
    let d = apply(&task, ok(Step::Analyze, 1), 4);
    assert_eq!(d.task.state, TaskState::Completed);
    assert!(d.task.pause_requested.is_none(), "a finished task has no pause pending");
    assert!(decide(&d.task, &Input::Resume, &ctx(5), &policy()).is_err(), "a finished task has nothing to resume");
}

#[test]
fn cancelling_a_paused_task_cancels_it() {
    let task = apply(&apply(&new_task(), Input::Start, 0).task, pause(), 1).task;
    let paused = apply(&task, ok(Step::Download, 1), 2).task;
    let d = apply(&paused, Input::Cancel { reason: Some("no more".into()) }, 3);
    assert_eq!(d.task.state, TaskState::Cancelled);
    assert_eq!(events(&d), ["task.cancelled"]);
    assert!(queues(&d).is_empty() && d.task.timer.is_none());
}

#[test]
fn pausing_or_resuming_a_finished_task_is_illegal() {
    let done = completed(Priority::Normal).task;
    let failed = apply(&apply(&new_task(), Input::Start, 0).task, permanent(Step::Download, 1), 1).task;
    let cancelled = apply(&new_task(), Input::Cancel { reason: None }, 1).task;
    for task in [done, failed, cancelled] {
        for (input, name) in [(pause(), "pause"), (Input::Resume, "resume")] {
            let err = decide(&task, &input, &ctx(100), &policy()).unwrap_err();
            assert_eq!(err.input, name);
            assert!(err.reason.contains("already"), "{err}");
        }
    }
}

#[test]
fn a_result_for_a_paused_task_is_stale_not_illegal() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let task = apply(&task, pause(), 1).task;
    let paused = apply(&task, retryable(Step::Download, 1), 2).task;
    // at-least-once: the failure again, or the late success of the attempt already decided
    for input in [retryable(Step::Download, 1), ok(Step::Download, 1)] {
        assert_eq!(verdict(&paused, input, 3), Verdict::Ignore(Ignored::StaleResult));
    }
}

#[test]
fn repeated_pauses_and_resumes_publish_events_with_distinct_ids() {
    let mut task = new_task();
    let mut ids = Vec::new();
    for i in 0..3 {
        let d = apply(&task, pause(), 10 + i);
        assert_eq!(events(&d), ["task.paused"]);
        ids.extend(event_ids(&d));
        let d = apply(&d.task, Input::Resume, 20 + i);
        assert_eq!(events(&d), ["task.resumed"]);
        ids.extend(event_ids(&d));
        task = d.task;
    }
    // and a pause at a step boundary after them
    let task = apply(&apply(&task, Input::Start, 30).task, pause(), 31).task;
    let d = apply(&task, ok(Step::Download, 1), 32);
    ids.extend(event_ids(&d));
    ids.extend(event_ids(&apply(&d.task, Input::Resume, 33)));
    let distinct: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!((ids.len(), distinct.len()), (8, 8), "{ids:?}");
}

// --- deadlines of paused queues -------------------------------------------------------------

#[test]
fn a_deadline_of_a_step_whose_queue_is_paused_starts_over_uncharged() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let task = apply(&task, ok(Step::Download, 1), 1_000).task;
    let deadline = task.timer.unwrap();
    assert_eq!((deadline.kind, deadline.step, deadline.due_at), (TimerKind::Deadline, Step::Metadata, 61_000));

    let paused = Context { paused: PausedSteps::of([Step::Metadata]), ..ctx(61_000) };
    let Ok(Verdict::Apply(d)) = decide(&task, &Input::Timer(deadline), &paused, &policy()) else {
        panic!("the deadline applies")
    };
    assert_eq!(d.history.event, HistoryEvent::DeadlinePostponed);
    assert!(d.outbox.is_empty(), "no retry, no re-send");
    assert_eq!(d.task.state, TaskState::ExtractingMetadata);
    assert_eq!(d.task.steps.metadata.attempts, 1);
    assert!(d.task.steps.metadata.last_error.is_none(), "no attempt was charged");
    let postponed = d.task.timer.unwrap();
    assert_eq!(
        (postponed.kind, postponed.attempt, postponed.due_at),
        (TimerKind::Deadline, 1, 121_000),
        "a whole deadline from now"
    );

    // once the queue runs again, the deadline fires as usual
    let d = apply(&d.task, Input::Timer(postponed), 121_000);
    assert_eq!(d.task.steps.metadata.last_error.as_ref().unwrap().code, "deadline_exceeded");
    let retry = d.task.timer.unwrap();
    assert_eq!((retry.kind, retry.attempt), (TimerKind::Retry, 2));
}

#[test]
fn a_task_that_waited_in_a_paused_queue_gets_its_whole_deadline_from_the_resume() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let task = apply(&task, ok(Step::Download, 1), 1_000).task;
    let deadline = task.timer.unwrap();
    // The queue was resumed at 50 s, 11 s before the deadline came due: it starts over from
    // the resume, not from the dispatch.
    let resumed = Context { paused: PausedSteps::default().resumed(Step::Metadata, 50_000), ..ctx(61_000) };
    let Ok(Verdict::Apply(d)) = decide(&task, &Input::Timer(deadline), &resumed, &policy()) else {
        panic!("the deadline applies")
    };
    assert_eq!(d.history.event, HistoryEvent::DeadlinePostponed);
    assert_eq!(d.task.steps.metadata.attempts, 1);
    let postponed = d.task.timer.unwrap();
    assert_eq!((postponed.kind, postponed.due_at), (TimerKind::Deadline, 110_000));
    // a whole deadline after the resume, it fires as usual
    let later = Context { paused: PausedSteps::default().resumed(Step::Metadata, 50_000), ..ctx(110_000) };
    let Ok(Verdict::Apply(d)) = decide(&d.task, &Input::Timer(postponed), &later, &policy()) else {
        panic!("the deadline applies")
    };
    assert_eq!(d.history.event, HistoryEvent::RetryScheduled);
}

#[test]
fn a_paused_queue_of_another_step_does_not_hold_a_deadline() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let deadline = task.timer.unwrap();
    let others = Context { paused: PausedSteps::of([Step::Metadata, Step::Analyze]), ..ctx(60_000) };
    let Ok(Verdict::Apply(d)) = decide(&task, &Input::Timer(deadline), &others, &policy()) else {
        panic!("the deadline applies")
    };
    assert_eq!(d.history.event, HistoryEvent::RetryScheduled);
    assert_eq!(d.task.steps.download.last_error.as_ref().unwrap().code, "deadline_exceeded");
    assert!(PausedSteps::of([Step::Metadata]).contains(Step::Metadata));
    assert!(!PausedSteps::default().contains(Step::Download));
}

// --- deadlines of commands still queued ----------------------------------------------------

#[test]
fn a_deadline_whose_command_may_still_wait_in_its_queue_starts_over_uncharged() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let task = apply(&task, ok(Step::Download, 1), 1_000).task;
    let deadline = task.timer.unwrap();
    assert_eq!(deadline.due_at, 61_000, "the command went out at 1 s");

    // The metadata queue still holds a message from 0.9 s: the command may wait behind it.
    let backlog = Context { held: HeldSteps::default().with(Step::Metadata, Held::Since(900)), ..ctx(61_000) };
    let Ok(Verdict::Apply(d)) = decide(&task, &Input::Timer(deadline), &backlog, &policy()) else {
        panic!("the deadline applies")
    };
    assert_eq!(d.history.event, HistoryEvent::DeadlinePostponed);
    assert!(d.history.detail.as_deref().unwrap().contains("a message enqueued at 900"), "{:?}", d.history);
    assert!(d.outbox.is_empty(), "no retry, no re-send");
    assert_eq!(d.task.steps.metadata.attempts, 1);
    assert!(d.task.steps.metadata.last_error.is_none(), "no attempt was charged");
    let postponed = d.task.timer.unwrap();
    assert_eq!((postponed.kind, postponed.attempt, postponed.due_at), (TimerKind::Deadline, 1, 121_000));

    // A whole deadline later the queue holds only messages sent since (past the slack): the
    // command was taken, and the silence counts.
    let since = 61_000 + millis(HELD_SLACK) + 1;
    let drained = Context { held: HeldSteps::default().with(Step::Metadata, Held::Since(since)), ..ctx(121_000) };
    let Ok(Verdict::Apply(d)) = decide(&d.task, &Input::Timer(postponed), &drained, &policy()) else {
        panic!("the deadline applies")
    };
    assert_eq!(d.history.event, HistoryEvent::RetryScheduled);
    assert_eq!(d.task.steps.metadata.last_error.as_ref().unwrap().code, "deadline_exceeded");
}

#[test]
fn a_message_the_broker_dated_within_the_slack_still_counts_as_the_command() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let deadline = task.timer.unwrap();
    let within = Context {
        held: HeldSteps::default().with(Step::Download, Held::Since(millis(HELD_SLACK))),
        ..ctx(deadline.due_at)
    };
    let Ok(Verdict::Apply(d)) = decide(&task, &Input::Timer(deadline), &within, &policy()) else {
        panic!("the deadline applies")
    };
    assert_eq!(d.history.event, HistoryEvent::DeadlinePostponed);
}

#[test]
fn an_undated_backlog_holds_the_deadline_and_another_step_s_backlog_does_not() {
    let task = apply(&new_task(), Input::Start, 0).task;
    let deadline = task.timer.unwrap();
    let undated = Context { held: HeldSteps::default().with(Step::Download, Held::Undated), ..ctx(60_000) };
    let Ok(Verdict::Apply(d)) = decide(&task, &Input::Timer(deadline), &undated, &policy()) else {
        panic!("the deadline applies")
    };
    assert_eq!(d.history.event, HistoryEvent::DeadlinePostponed);
    assert!(d.history.detail.as_deref().unwrap().contains("cannot date"), "{:?}", d.history);

    let others = Context {
        held: HeldSteps::default().with(Step::Metadata, Held::Since(0)).with(Step::Analyze, Held::Undated),
        ..ctx(60_000)
    };
    let Ok(Verdict::Apply(d)) = decide(&task, &Input::Timer(deadline), &others, &policy()) else {
        panic!("the deadline applies")
    };
    assert_eq!(d.history.event, HistoryEvent::RetryScheduled);
    assert_eq!(HeldSteps::default().get(Step::Download), Held::Nothing);
}

#[test]
fn a_step_queue_and_the_results_queue_hold_the_older_of_their_messages() {
    assert_eq!(Held::Since(5).and(Held::Since(3)), Held::Since(3));
    assert_eq!(Held::Nothing.and(Held::Since(1)), Held::Since(1));
    assert_eq!(Held::Since(1).and(Held::Nothing), Held::Since(1));
    assert_eq!(Held::Since(1).and(Held::Undated), Held::Undated);
    assert_eq!(Held::Nothing.and(Held::Nothing), Held::Nothing);
}

// --- reprocessing ---------------------------------------------------------------------------

#[test]
fn only_a_finished_task_can_be_reprocessed() {
    let queued = new_task();
    let running = apply(&queued, Input::Start, 0).task;
    let paused = apply(&queued, pause(), 0).task;
    let input = Input::Reprocess { from: Step::Metadata, priority: None };
    for task in [queued, running, paused] {
        let err = decide(&task, &input, &ctx(10), &policy()).unwrap_err();
        assert_eq!(err.input, "reprocess");
        assert!(err.reason.contains("only a completed, failed or cancelled task"), "{err}");
    }
}

#[test]
fn reprocessing_from_metadata_runs_a_new_generation_with_new_ids() {
    let first = completed(Priority::Normal);
    let done = first.task.clone();
    let input = Input::Reprocess { from: Step::Metadata, priority: Some(Priority::High) };
    let d = apply(&done, input, 10_000);
    assert_eq!((d.task.state, d.history.event), (TaskState::ExtractingMetadata, HistoryEvent::Reprocessed));
    assert_eq!((d.task.generation, d.task.priority), (1, Priority::High));
    assert_eq!(d.task.outputs.download, done.outputs.download, "the download is kept");
    assert!(d.task.outputs.metadata.is_none() && d.task.outputs.analysis.is_none());
    assert_eq!(d.task.steps.download, done.steps.download);
    assert_eq!(sent(&d), [("tasks.metadata.high", "tsk_1.metadata.2", 2)], "attempts go on, on the new lane");
    let timer = d.task.timer.unwrap();
    assert_eq!((timer.kind, timer.step, timer.attempt), (TimerKind::Deadline, Step::Metadata, 2));
    assert!(d.task.failure.is_none());

    // the steps after it get new attempt numbers too, so no broker or subscriber takes them
    // for the first generation's
    let d = apply(&d.task, ok(Step::Metadata, 2), 11_000);
    assert_eq!(sent(&d), [("tasks.ai.high", "tsk_1.analyze.2", 2)]);
    let d = apply(&d.task, ok(Step::Analyze, 2), 12_000);
    assert_eq!(d.task.state, TaskState::Completed);
    assert_eq!(events(&d), ["task.completed"]);
    assert_ne!(event_ids(&d), event_ids(&first), "the new generation's task.completed has its own id");
}

#[test]
fn reprocessing_without_a_priority_keeps_the_tasks_lanes() {
    let done = completed(Priority::Low).task;
    let d = apply(&done, Input::Reprocess { from: Step::Analyze, priority: None }, 10);
    assert_eq!(sent(&d), [("tasks.ai.low", "tsk_1.analyze.2", 2)]);
    assert!(d.task.outputs.metadata.is_some(), "only analyze runs again");
}

#[test]
fn a_reprocessed_generation_gets_the_whole_retry_budget_of_every_step() {
    // the first generation used up all of the metadata step's attempts
    let mut task = apply(&new_task(), Input::Start, 0).task;
    task = apply(&task, ok(Step::Download, 1), 1).task;
    for attempt in 1..=2 {
        task = apply(&task, retryable(Step::Metadata, attempt), 2).task;
        task = apply(&task, Input::Timer(task.timer.unwrap()), 100_000).task;
    }
    let failed = apply(&task, retryable(Step::Metadata, 3), 100_001).task;
    assert_eq!(failed.state, TaskState::Failed);

    let mut task = apply(&failed, Input::Reprocess { from: Step::Metadata, priority: None }, 200_000).task;
    assert_eq!(task.current_attempt(), 4);
    for attempt in 4..=5 {
        let d = apply(&task, retryable(Step::Metadata, attempt), 200_001);
        assert_eq!(d.task.timer.unwrap().kind, TimerKind::Retry, "attempt {attempt} is retried");
        task = apply(&d.task, Input::Timer(d.task.timer.unwrap()), 300_000).task;
    }
    let d = apply(&task, retryable(Step::Metadata, 6), 300_001);
    assert_eq!(d.task.state, TaskState::Failed);
    assert!(d.task.failure.unwrap().error.message.contains("gave up after 3 of 3 attempts"));

    // and the step after it, too: max_attempts attempts, not one more
    let done = completed(Priority::Normal).task;
    let mut task = apply(&done, Input::Reprocess { from: Step::Metadata, priority: None }, 10).task;
    task = apply(&task, ok(Step::Metadata, 2), 11).task;
    let first = task.current_attempt();
    for attempt in first..first + 2 {
        task = apply(&task, retryable(Step::Analyze, attempt), 12).task;
        task = apply(&task, Input::Timer(task.timer.unwrap()), 100_000).task;
    }
    let d = apply(&task, retryable(Step::Analyze, first + 2), 100_001);
    assert_eq!(d.task.state, TaskState::Failed, "the third attempt of the generation is its last");
}

#[test]
fn reprocessing_needs_the_outputs_of_the_steps_before() {
    let failed = apply(&apply(&new_task(), Input::Start, 0).task, permanent(Step::Download, 1), 1).task;
    let err =
        decide(&failed, &Input::Reprocess { from: Step::Metadata, priority: None }, &ctx(2), &policy()).unwrap_err();
    assert!(err.reason.contains("download"), "{err}");
    // from download it fetches anew
    let d = apply(&failed, Input::Reprocess { from: Step::Download, priority: None }, 2);
    assert_eq!(sent(&d), [("tasks.download", "tsk_1.download.2", 2)]);

    // a task that failed at metadata has nothing to analyze from
    let task = apply(&apply(&new_task(), Input::Start, 0).task, ok(Step::Download, 1), 1).task;
    let failed = apply(&task, permanent(Step::Metadata, 1), 2).task;
    let err =
        decide(&failed, &Input::Reprocess { from: Step::Analyze, priority: None }, &ctx(3), &policy()).unwrap_err();
    assert!(err.reason.contains("metadata"), "{err}");
    let d = apply(&failed, Input::Reprocess { from: Step::Metadata, priority: None }, 3);
    assert_eq!(sent(&d), [("tasks.metadata", "tsk_1.metadata.2", 2)]);
}

#[test]
fn a_cancelled_task_can_be_reprocessed_from_the_start() {
    let cancelled = apply(&new_task(), Input::Cancel { reason: Some("oops".into()) }, 1).task;
    let d = apply(&cancelled, Input::Reprocess { from: Step::Download, priority: None }, 2);
    assert_eq!(d.task.state, TaskState::Downloading);
    assert!(d.task.cancel_requested.is_none(), "the old cancellation does not stop the new generation");
    assert_eq!(sent(&d), [("tasks.download", "tsk_1.download.1", 1)]);
    let d = apply(&d.task, ok(Step::Download, 1), 3);
    assert_eq!(d.task.state, TaskState::ExtractingMetadata);
}

#[test]
fn every_edge_of_the_state_graph_is_known() {
    use TaskState::*;
    assert!(Queued.can_become(Downloading));
    assert!(!Queued.can_become(Analyzing));
    assert!(!Downloading.can_become(Queued));
    assert!(Analyzing.can_become(Cancelled));
    assert!(!Completed.can_become(Failed));
    assert!(!Failed.can_become(Failed));
}

/// One step of a random interleaving.
#[derive(Debug, Clone)]
enum Op {
    Start,
    Result {
        step: Step,
        attempt_offset: i8,
        /// 0, 1: ok; 2: retryable; 3: permanent; 4: deferred.
        kind: u8,
    },
    /// Fire the task's current timer at its due time.
    FireTimer,
    /// Fire a timer that is not (or no longer) the task's.
    FireStale {
        kind: bool,
        step: Step,
        attempt: u32,
    },
    /// Redeliver the last result.
    Duplicate,
    Cancel,
    Pause,
    Resume,
    Reprocess {
        from: Step,
        priority: Option<Priority>,
    },
    /// An operator pauses or resumes the queue of a step.
    ToggleQueue(Step),
    /// The bus lost the commands in flight.
    Redispatch,
    Advance(u32),
}

fn op() -> impl Strategy<Value = Op> {
    let step = prop_oneof![Just(Step::Download), Just(Step::Metadata), Just(Step::Analyze)];
    let priority =
        prop_oneof![Just(None), Just(Some(Priority::High)), Just(Some(Priority::Normal)), Just(Some(Priority::Low))];
    prop_oneof![
        1 => Just(Op::Start),
        7 => (step.clone(), -2i8..=1, 0u8..5).prop_map(|(step, attempt_offset, kind)| Op::Result { step, attempt_offset, kind }),
        3 => Just(Op::FireTimer),
        1 => (any::<bool>(), step.clone(), 0u32..5).prop_map(|(kind, step, attempt)| Op::FireStale { kind, step, attempt }),
        2 => Just(Op::Duplicate),
        1 => Just(Op::Cancel),
        1 => Just(Op::Pause),
        1 => Just(Op::Resume),
        1 => (step.clone(), priority).prop_map(|(from, priority)| Op::Reprocess { from, priority }),
        1 => step.prop_map(Op::ToggleQueue),
        1 => Just(Op::Redispatch),
        1 => (0u32..120_000).prop_map(Op::Advance),
    ]
}

fn check_task(task: &Task, policy: &Policy) {
    // Attempt `attempt` of `step` is within the current generation's retry budget.
    let in_budget = |step: Step, attempt: u32| {
        let used = attempt.saturating_sub(task.steps.get(step).attempt_base);
        assert!(used >= 1 && used <= policy.step(step).max_attempts, "{step} attempt {attempt}: {:?}", task.steps);
    };
    match (task.state, task.timer) {
        (TaskState::Queued, None) => {}
        (TaskState::Paused, None) => {
            let at = task.paused.as_ref().expect("a paused task knows where it stopped");
            if let Some(step) = at.step {
                let attempts = task.steps.get(step).attempts;
                assert!(at.attempt == attempts || at.attempt == attempts + 1, "paused at {at:?}, {attempts} sent");
                in_budget(step, at.attempt);
            }
        }
        (s, None) if s.is_terminal() => assert!(task.pause_requested.is_none(), "a finished task pauses no more"),
        (s, Some(timer)) if s.step() == Some(timer.step) => {
            let record = task.steps.get(timer.step);
            match timer.kind {
                TimerKind::Deadline => assert_eq!(timer.attempt, record.attempts),
                TimerKind::Retry => assert!(
                    timer.attempt == record.attempts + 1 || (timer.attempt == record.attempts && record.deferrals > 0),
                    "{timer:?} with {record:?}"
                ),
            }
            in_budget(timer.step, timer.attempt);
        }
        (s, t) => panic!("state {s} with timer {t:?} loses the task"),
    }
    if !task.state.is_terminal() && task.state != TaskState::Paused {
        assert!(task.paused.is_none(), "a running task is not paused");
    }
    if task.state == TaskState::Completed {
        assert!(task.outputs.download.is_some() && task.outputs.metadata.is_some() && task.outputs.analysis.is_some());
    }
    if task.state == TaskState::Failed {
        assert!(task.failure.is_some());
    }
}

/// Why `input` has no edge from `task`'s state, when the interleavings can produce such an
/// input: a cancel or pause of a finished task, a reprocessing of an unfinished one or of one
/// lacking an earlier step's output, or a result the task cannot have asked for (before the
/// start, for a later step, for an attempt never dispatched, or with another step's output).
/// [`decide`] must refuse exactly these with an [`IllegalTransition`].
fn expected_illegal(task: &Task, input: &Input) -> Option<&'static str> {
    match input {
        Input::Cancel { .. } if task.state.is_terminal() => Some("cancel of a finished task"),
        Input::Pause { .. } if task.state.is_terminal() => Some("pause of a finished task"),
        Input::Resume if task.state.is_terminal() => Some("resume of a finished task"),
        Input::Reprocess { .. } if !task.state.is_terminal() => Some("reprocessing of an unfinished task"),
        Input::Reprocess { from, .. } => {
            let outputs = &task.outputs;
            let lacks = (*from > Step::Download && outputs.download.is_none())
                || (*from > Step::Metadata && outputs.metadata.is_none());
            lacks.then_some("reprocessing without an earlier step's output")
        }
        Input::Result(result) if !task.state.is_terminal() => {
            let wrong_output = matches!(&result.outcome, StepOutcome::Ok { output } if output.step() != result.step);
            match task.state.step() {
                _ if result.attempt == 0 => Some("attempt 0"),
                _ if wrong_output => Some("another step's output"),
                None if task.state == TaskState::Paused => None,
                None => Some("result before the start"),
                Some(current) if result.step > current => Some("result for a later step"),
                Some(current) if result.step == current && result.attempt > task.steps.get(current).attempts => {
                    Some("result for an attempt never dispatched")
                }
                Some(_) => None,
            }
        }
        _ => None,
    }
}

/// The attempt in a command's body.
fn attempt_of(entry: &OutboxEntry) -> u32 {
    let body: serde_json::Value = serde_json::from_str(&entry.body).unwrap();
    u32::try_from(body["attempt"].as_u64().unwrap()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_interleavings_keep_every_invariant(ops in prop::collection::vec(op(), 0..80), seed in any::<u64>()) {
        let policy = policy();
        let mut task = new_task();
        let mut now = 1_000u64;
        let mut paused_queues: Vec<Step> = Vec::new();
        let mut last_result: Option<Input> = None;
        // Per generation: terminal events and task.completed events published.
        let mut terminal_events = 0;
        let mut completed_events = 0;
        // Over the whole run: every command sent (a broker drops a repeated id) and every event.
        let mut command_ids = std::collections::HashSet::new();
        let mut event_ids = std::collections::HashSet::new();
        // In a quarter of the runs the metadata queue keeps a backlog: its deadlines never fire.
        let held = if seed % 4 == 0 { HeldSteps::default().with(Step::Metadata, Held::Undated) } else { HeldSteps::default() };
        let mut step = |task: &mut Task, input: Input, now: u64, paused: PausedSteps, held: HeldSteps| {
            let before = task.clone();
            let decided = decide(task, &input, &Context { now, seed, paused, held }, &policy);
            if let Some(why) = expected_illegal(&before, &input) {
                assert!(decided.is_err(), "{input:?} on a {} task ({why}) was not refused: {decided:?}", before.state);
                return;
            }
            match decided {
                Err(error) => panic!("{input:?} on a {} task: unexpected {error}", before.state),
                Ok(Verdict::Apply(d)) => {
                    let reprocess = matches!(input, Input::Reprocess { .. });
                    assert_eq!(before.state.is_terminal(), reprocess, "{input:?} changed a {} task", before.state);
                    assert!(before.state.can_become(d.task.state), "{} -> {}", before.state, d.task.state);
                    assert_eq!(d.task.version, before.version + 1);
                    assert_eq!((d.history.version, d.history.to), (d.task.version, d.task.state));
                    check_task(&d.task, &policy);
                    if let Some(t @ Timer { kind: TimerKind::Deadline, .. }) = d.task.timer {
                        let postponed = before.timer.is_some_and(|b| {
                            (b.kind, b.step, b.attempt) == (TimerKind::Deadline, t.step, t.attempt)
                        });
                        let lane = d.task.priority.lane(t.step.queue());
                        assert!(
                            postponed || d.outbox.iter().any(|e| e.destination == Destination::Queue(lane.clone()) && attempt_of(e) == t.attempt),
                            "attempt dispatched without a command on {lane}: {:?}", d.outbox
                        );
                    }
                    for entry in &d.outbox {
                        match &entry.destination {
                            Destination::Queue(_) if matches!(input, Input::Redispatch) => {
                                assert!(command_ids.contains(&entry.message_id), "a redispatch re-sends what was sent");
                            }
                            Destination::Queue(_) => {
                                assert_ne!(d.task.state, TaskState::Paused, "a paused task sends nothing");
                                assert!(command_ids.insert(entry.message_id.clone()), "command id {} sent twice", entry.message_id);
                            }
                            Destination::Event(_) => {
                                assert!(event_ids.insert(entry.message_id.clone()), "event id {} published twice: {:?}", entry.message_id, events(&d));
                            }
                        }
                    }
                    if reprocess {
                        (terminal_events, completed_events) = (0, 0);
                    }
                    let evs = events(&d);
                    terminal_events += evs.iter().filter(|e| ["task.completed", "task.failed", "task.cancelled"].contains(e)).count();
                    completed_events += evs.iter().filter(|e| **e == "task.completed").count();
                    assert_eq!(d.task.state.is_terminal(), terminal_events == 1);
                    assert!(completed_events <= 1);
                    *task = d.task;
                }
                Ok(Verdict::Ignore(_)) => {}
            }
        };
        for op in ops {
            let input = match op {
                Op::Start => Input::Start,
                Op::Result { step, attempt_offset, kind } => {
                    let base = i64::from(task.steps.get(step).attempts);
                    let attempt = u32::try_from((base + i64::from(attempt_offset)).max(1)).unwrap();
                    let input = match kind {
                        0 | 1 => ok(step, attempt),
                        2 => retryable(step, attempt),
                        3 => permanent(step, attempt),
                        _ => deferred(step, attempt, 2_000),
                    };
                    last_result = Some(input.clone());
                    input
                }
                Op::FireTimer => match task.timer {
                    Some(timer) => {
                        now = now.max(timer.due_at);
                        Input::Timer(timer)
                    }
                    None => continue,
                },
                Op::FireStale { kind, step, attempt } => {
                    let kind = if kind { TimerKind::Deadline } else { TimerKind::Retry };
                    let timer = Timer { kind, step, attempt, due_at: now };
                    if task.timer.is_some_and(|t| Timer { due_at: now, ..t } == timer) {
                        continue;
                    }
                    Input::Timer(timer)
                }
                Op::Duplicate => match &last_result {
                    Some(input) => input.clone(),
                    None => continue,
                },
                Op::Cancel => Input::Cancel { reason: None },
                Op::Pause => Input::Pause { reason: None },
                Op::Resume => Input::Resume,
                Op::Reprocess { from, priority } => Input::Reprocess { from, priority },
                Op::ToggleQueue(queue) => {
                    match paused_queues.iter().position(|s| *s == queue) {
                        Some(i) => drop(paused_queues.remove(i)),
                        None => paused_queues.push(queue),
                    }
                    continue;
                }
                Op::Redispatch => Input::Redispatch,
                Op::Advance(ms) => {
                    now += u64::from(ms);
                    continue;
                }
            };
            let mut paused = PausedSteps::of(paused_queues.iter().copied());
            // In a third of the runs the paused queues run nothing: a cancel there is at once.
            if seed % 3 == 1 {
                paused = paused_queues.iter().fold(paused, |paused, step| paused.idle(*step));
            }
            step(&mut task, input, now, paused, held);
        }
        // Liveness: once operators resume the task and its queues and the queues drain, timers
        // alone (no worker answering) bring every task to an end.
        for _ in 0..32 {
            if task.state.is_terminal() {
                break;
            }
            let input = match task.timer {
                Some(timer) => {
                    now = now.max(timer.due_at);
                    Input::Timer(timer)
                }
                None if task.state == TaskState::Paused => Input::Resume,
                None => Input::Start,
            };
            step(&mut task, input, now, PausedSteps::default(), HeldSteps::default());
        }
        prop_assert!(task.state.is_terminal(), "task stuck in {}", task.state);
        prop_assert_eq!(terminal_events, 1);
    }
}
