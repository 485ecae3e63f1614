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
    match decide(task, &input, &ctx(now), &policy()) {
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
    /// The bus lost the commands in flight.
    Redispatch,
    Advance(u32),
}

fn op() -> impl Strategy<Value = Op> {
    let step = prop_oneof![Just(Step::Download), Just(Step::Metadata), Just(Step::Analyze)];
    prop_oneof![
        1 => Just(Op::Start),
        6 => (step.clone(), -2i8..=1, 0u8..4).prop_map(|(step, attempt_offset, kind)| Op::Result { step, attempt_offset, kind }),
        3 => Just(Op::FireTimer),
        1 => (any::<bool>(), step, 0u32..5).prop_map(|(kind, step, attempt)| Op::FireStale { kind, step, attempt }),
        2 => Just(Op::Duplicate),
        1 => Just(Op::Cancel),
        1 => Just(Op::Redispatch),
        1 => (0u32..120_000).prop_map(Op::Advance),
    ]
}

fn check_task(task: &Task, policy: &Policy) {
    match (task.state, task.timer) {
        (TaskState::Queued, None) => {}
        (s, None) if s.is_terminal() => {}
        (s, Some(timer)) if s.step() == Some(timer.step) => {
            let attempts = task.steps.get(timer.step).attempts;
            match timer.kind {
                TimerKind::Deadline => assert_eq!(timer.attempt, attempts),
                TimerKind::Retry => assert_eq!(timer.attempt, attempts + 1),
            }
            assert!(attempts >= 1 && attempts <= policy.step(timer.step).max_attempts);
        }
        (s, t) => panic!("state {s} with timer {t:?} loses the task"),
    }
    if task.state == TaskState::Completed {
        assert!(task.outputs.download.is_some() && task.outputs.metadata.is_some() && task.outputs.analysis.is_some());
    }
    if task.state == TaskState::Failed {
        assert!(task.failure.is_some());
    }
}

/// Why `input` has no edge from `task`'s state, when the interleavings can produce such an
/// input: a cancel of a finished task, or a result the task cannot have asked for (before the
/// start, for a later step, for an attempt never dispatched, or with another step's output).
/// [`decide`] must refuse exactly these with an [`IllegalTransition`].
fn expected_illegal(task: &Task, input: &Input) -> Option<&'static str> {
    match input {
        Input::Cancel { .. } if task.state.is_terminal() => Some("cancel of a finished task"),
        Input::Result(result) if !task.state.is_terminal() => {
            let wrong_output = matches!(&result.outcome, StepOutcome::Ok { output } if output.step() != result.step);
            match task.state.step() {
                _ if result.attempt == 0 => Some("attempt 0"),
                _ if wrong_output => Some("another step's output"),
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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_interleavings_keep_every_invariant(ops in prop::collection::vec(op(), 0..80), seed in any::<u64>()) {
        let policy = policy();
        let mut task = new_task();
        let mut now = 1_000u64;
        let mut last_result: Option<Input> = None;
        let mut terminal_events = 0;
        let mut completed_events = 0;
        let mut step = |task: &mut Task, input: Input, now: u64| {
            let before = task.clone();
            let decided = decide(task, &input, &Context { now, seed, ..Context::default() }, &policy);
            if let Some(why) = expected_illegal(&before, &input) {
                assert!(decided.is_err(), "{input:?} on a {} task ({why}) was not refused: {decided:?}", before.state);
                return;
            }
            match decided {
                Err(error) => panic!("{input:?} on a {} task: unexpected {error}", before.state),
                Ok(Verdict::Apply(d)) => {
                    assert!(!before.state.is_terminal(), "{input:?} changed a {} task", before.state);
                    assert!(before.state.can_become(d.task.state), "{} -> {}", before.state, d.task.state);
                    assert_eq!(d.task.version, before.version + 1);
                    assert_eq!((d.history.version, d.history.to), (d.task.version, d.task.state));
                    check_task(&d.task, &policy);
                    if let Some(t @ Timer { kind: TimerKind::Deadline, .. }) = d.task.timer
                        && before.timer != Some(t)
                    {
                        let id = format!("{}.{}.{}", d.task.id, t.step.as_str(), t.attempt);
                        assert!(d.outbox.iter().any(|e| e.message_id == id), "attempt dispatched without a command");
                    }
                    let evs = events(&d);
                    terminal_events += evs.iter().filter(|e| ["task.completed", "task.failed", "task.cancelled"].contains(e)).count();
                    completed_events += evs.iter().filter(|e| **e == "task.completed").count();
                    assert_eq!(d.task.state.is_terminal(), terminal_events == 1);
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
                        _ => permanent(step, attempt),
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
                Op::Redispatch => Input::Redispatch,
                Op::Advance(ms) => {
                    now += u64::from(ms);
                    continue;
                }
            };
            step(&mut task, input, now);
        }
        // Liveness: with no worker answering, timers alone bring every task to an end.
        for _ in 0..32 {
            if task.state.is_terminal() {
                break;
            }
            let input = match task.timer {
                Some(timer) => {
                    now = now.max(timer.due_at);
                    Input::Timer(timer)
                }
                None => Input::Start,
            };
            step(&mut task, input, now);
        }
        prop_assert!(task.state.is_terminal(), "task stuck in {}", task.state);
        prop_assert!(completed_events <= 1);
        prop_assert_eq!(terminal_events, 1);
    }
}
