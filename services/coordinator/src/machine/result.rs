//! [`Input::Result`](super::Input::Result): a worker's report of an attempt: its output (the
//! next step, or completion), a failure (a retry, or the task fails), or a deferral.

use imagepipe_contracts::payload::{StageCompleted, TaskCompleted};
use imagepipe_contracts::{Step, StepError, StepOutcome, StepOutput, StepResult};
use imagepipe_runtime::clock::millis;
use imagepipe_runtime::config::stage_output_too_large;

use super::transition::Transition;
use super::{Context, Decision, Ignored, Policy, Verdict};
use crate::task::{HistoryEvent, Task, TaskState, Timer, TimerKind};

/// Takes `result` if it reports the attempt `task` waits for; a repeat or a late one is ignored.
pub(super) fn on_result(task: &Task, result: &StepResult, ctx: &Context, policy: &Policy) -> Result<Verdict, String> {
    if task.state.is_terminal() {
        return Ok(Verdict::Ignore(Ignored::StaleResult));
    }
    if result.attempt == 0 {
        return Err("attempts count from 1".into());
    }
    let Some(reported) = policy.position(result.step) else {
        return Err(format!("a result arrived for {}, which is no stage of this pipeline", result.step));
    };
    if let StepOutcome::Ok { output } = &result.outcome {
        if !output.belongs_to(result.step) {
            return Err(format!("a {} output was reported for step {}", output.kind(), result.step));
        }
        if stage_output_too_large(output) {
            return Err(format!(
                "the output of stage {} is larger than {} bytes as JSON",
                result.step,
                imagepipe_contracts::stage::MAX_STAGE_OUTPUT_BYTES
            ));
        }
    }
    if task.state == TaskState::Paused {
        // No attempt runs while paused: the result is a repeat, or late, of one already decided.
        return Ok(Verdict::Ignore(Ignored::StaleResult));
    }
    let Some(current) = task.current_step() else {
        return Err(format!("a {} result arrived for a task that has not started", result.step));
    };
    let at = policy.position(current).unwrap_or(usize::MAX);
    if reported < at {
        return Ok(Verdict::Ignore(Ignored::StaleResult));
    }
    if reported > at {
        return Err(format!("a {} result arrived while the task is at step {current}", result.step));
    }
    let dispatched = task.steps.get(current).attempts;
    if result.attempt > dispatched {
        return Err(format!("{current} attempt {} was never dispatched (latest is {dispatched})", result.attempt));
    }
    if result.attempt < dispatched {
        return Ok(Verdict::Ignore(Ignored::StaleResult));
    }
    let running = matches!(task.timer, Some(Timer { kind: TimerKind::Deadline, attempt, .. }) if attempt == dispatched);
    let mut t = Transition::new(task, ctx.now);
    let decision = match &result.outcome {
        StepOutcome::Ok { output } => t.succeeded(current, result.attempt, output.clone(), policy)?,
        _ if !running => return Ok(Verdict::Ignore(Ignored::DuplicateResult)),
        StepOutcome::Retryable { error, retry_after_ms } => {
            t.failed_attempt(current, result.attempt, error.clone(), *retry_after_ms, ctx, policy)
        }
        StepOutcome::Permanent { error } => {
            t.task.steps.get_mut(current).last_error = Some(error.clone());
            t.fail(current, result.attempt, error.clone())
        }
        StepOutcome::Deferred { reason, retry_after_ms } => {
            t.deferred(current, result.attempt, reason, *retry_after_ms, policy)
        }
    };
    Ok(Verdict::Apply(Box::new(decision)))
}

impl Transition {
    fn succeeded(mut self, step: Step, attempt: u32, output: StepOutput, policy: &Policy) -> Result<Decision, String> {
        self.task.steps.get_mut(step).finished_at = Some(self.now);
        match output {
            StepOutput::Download(o) => self.task.outputs.download = Some(o),
            StepOutput::Metadata(o) => self.task.outputs.metadata = Some(o),
            StepOutput::Analyze(o) => self.task.outputs.analysis = Some(o),
            StepOutput::Stage(o) => {
                let payload =
                    StageCompleted { stage: step, attempt, output: o.clone(), labels: self.task.labels.clone() };
                self.stage_event(step, attempt, payload);
                self.task.outputs.stages.insert(step.as_str().to_owned(), o);
            }
        }
        if self.task.cancel_requested.is_some() {
            return Ok(self.cancel());
        }
        let from = Some(self.from);
        let (next, skipped) = self.next_stage(step, policy);
        let detail = (!skipped.is_empty()).then(|| skipped.join("; "));
        // The next step's first attempt; in a reprocessed generation its numbers go on from
        // the earlier generations' (so its commands and events get new ids).
        let next_attempt = next.map_or(0, |next| self.task.steps.get(next).attempts + 1);
        match next {
            Some(next) if self.task.pause_requested.is_some() => Ok(self.pause(Some(next), next_attempt)),
            Some(next) => {
                self.dispatch(next, next_attempt, policy)?;
                Ok(self.finish(from, HistoryEvent::StepSucceeded, Some(step), Some(attempt), detail))
            }
            None => {
                let outputs = self.task.outputs.clone();
                let (Some(download), Some(metadata), Some(analysis)) =
                    (outputs.download, outputs.metadata, outputs.analysis)
                else {
                    return Err("the last step succeeded but an earlier step's output is missing".into());
                };
                self.task.state = TaskState::Completed;
                self.task.timer = None;
                let payload = TaskCompleted {
                    duration_ms: self.now.saturating_sub(self.task.created_at),
                    download,
                    metadata,
                    analysis,
                    stages: outputs.stages,
                    callback_url: self.task.callback_url.clone(),
                    labels: self.task.labels.clone(),
                };
                self.task.stage = None;
                self.event(self.task.generation, payload);
                Ok(self.finish(from, HistoryEvent::Completed, Some(step), Some(attempt), detail))
            }
        }
    }

    /// The stage to run after `step`: the first later one whose condition holds, and why each
    /// one before it was passed over (`skipped faces: format png is not one of jpeg`).
    fn next_stage(&self, step: Step, policy: &Policy) -> (Option<Step>, Vec<String>) {
        let mut skipped = Vec::new();
        let mut outputs = None;
        for stage in policy.stages_after(step) {
            let Some(when) = &stage.when else { return (Some(stage.step), skipped) };
            let outputs = outputs.get_or_insert_with(|| self.task.outputs.as_json());
            let format = self.task.outputs.download.as_ref().map_or("", |d| d.format.as_str());
            match when.check(format, &self.task.labels, outputs) {
                Ok(()) => return (Some(stage.step), skipped),
                Err(reason) => skipped.push(format!("skipped {}: {reason}", stage.step)),
            }
        }
        (None, skipped)
    }

    /// The worker did not start the attempt: send the same attempt again after
    /// `retry_after_ms` (capped by the backoff's maximum), charging nothing.
    fn deferred(
        mut self,
        step: Step,
        attempt: u32,
        reason: &StepError,
        retry_after_ms: u64,
        policy: &Policy,
    ) -> Decision {
        if self.task.cancel_requested.is_some() {
            return self.cancel();
        }
        // Counted before a pause too: the resume re-sends the attempt under a new id.
        self.task.steps.get_mut(step).deferrals += 1;
        if self.task.pause_requested.is_some() {
            return self.pause(Some(step), attempt);
        }
        let delay = retry_after_ms.min(millis(policy.backoff.max()));
        self.task.timer = Some(Timer { kind: TimerKind::Retry, step, attempt, due_at: self.now.saturating_add(delay) });
        let from = Some(self.from);
        self.finish(
            from,
            HistoryEvent::Deferred,
            Some(step),
            Some(attempt),
            Some(format!("{reason} (again in {delay} ms)")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::fixtures::*;

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
        let policy = crate::app::policy(&settings, &Default::default());
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
    fn a_result_for_a_paused_task_is_stale_not_illegal() {
        let task = apply(&new_task(), Input::Start, 0).task;
        let task = apply(&task, pause(), 1).task;
        let paused = apply(&task, retryable(Step::Download, 1), 2).task;
        // at-least-once: the failure again, or the late success of the attempt already decided
        for input in [retryable(Step::Download, 1), ok(Step::Download, 1)] {
            assert_eq!(verdict(&paused, input, 3), Verdict::Ignore(Ignored::StaleResult));
        }
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

    /// The machine's policy over a pipeline of `stages` (`pipeline.stages` as JSON).
    fn policy_of(stages: serde_json::Value) -> Policy {
        let pipeline: imagepipe_runtime::config::PipelineConfig =
            serde_json::from_value(serde_json::json!({ "stages": stages })).unwrap();
        let coordinator = imagepipe_runtime::config::CoordinatorConfig { max_attempts: 3, ..Default::default() };
        crate::app::policy(&coordinator, &pipeline)
    }

    fn run(task: &Task, input: Input, now: u64, policy: &Policy) -> Decision {
        match decide(task, &input, &ctx(now), policy) {
            Ok(Verdict::Apply(d)) => *d,
            other => panic!("{input:?} on {:?}: {other:?}", task.state),
        }
    }

    fn faces() -> Step {
        Step::named("faces").unwrap()
    }

    /// A task of `policy`'s pipeline after its three built-in steps succeeded.
    fn analyzed(policy: &Policy) -> Decision {
        let task = run(&new_task(), Input::Start, 0, policy).task;
        let task = run(&task, ok(Step::Download, 1), 1, policy).task;
        let task = run(&task, ok(Step::Metadata, 1), 2, policy).task;
        run(&task, ok(Step::Analyze, 1), 3, policy)
    }

    #[test]
    fn a_stage_of_users_own_runs_after_the_built_in_ones_and_its_output_is_kept_and_announced() {
        let policy = policy_of(serde_json::json!([
            {"name": "download"}, {"name": "metadata"}, {"name": "analyze"},
            {"name": "faces", "attempts": 2, "deadline": "30s", "inputs": ["metadata"]},
        ]));
        let d = analyzed(&policy);
        assert_eq!((d.task.state, d.task.stage), (TaskState::Processing, Some(faces())));
        assert_eq!(queues(&d), ["tasks.faces"]);
        let command: imagepipe_contracts::StageCommand = serde_json::from_str(&d.outbox[0].body).unwrap();
        assert_eq!((command.stage, command.attempt, command.format.as_str()), (faces(), 1, "jpeg"));
        assert_eq!(command.blobs.original, BLOB);
        assert_eq!(command.inputs["metadata"]["width"], 1, "the metadata output it asked for");
        assert_eq!(d.task.timer.unwrap().due_at, 3 + 30_000, "the stage's own deadline");

        let done = run(&d.task, ok(faces(), 1), 4, &policy);
        assert_eq!(done.task.state, TaskState::Completed);
        assert_eq!(events(&done), ["stage.completed", "task.completed"]);
        assert_eq!(done.task.outputs.stages["faces"]["count"], 1);
        let completed: Event<TaskCompleted> = Event::from_json(done.outbox[1].body.as_bytes()).unwrap();
        assert_eq!(completed.payload.stages["faces"]["tags"][0], "faces:1");
        let announced: Event<serde_json::Value> = Event::from_json(done.outbox[0].body.as_bytes()).unwrap();
        assert_eq!(announced.event_id, imagepipe_contracts::stage_event_id("tsk_1", "faces", 1));
        assert_eq!(announced.payload["stage"], "faces");
        let json = serde_json::to_value(&done.task).unwrap();
        assert_eq!(json["outputs"]["faces"]["count"], 1, "kept under outputs.faces");
        assert_eq!(json["steps"]["faces"]["attempts"], 1);
    }

    #[test]
    fn a_stage_of_users_own_has_its_deadline_held_by_its_paused_or_busy_queue_and_is_cancelled_at_once_when_idle() {
        let policy = policy_of(serde_json::json!([
            {"name": "download"}, {"name": "metadata"}, {"name": "analyze"},
            {"name": "faces", "deadline": "30s"},
        ]));
        let task = analyzed(&policy).task;
        let deadline = task.timer.unwrap();
        assert_eq!((deadline.step, deadline.due_at), (faces(), 30_003));
        let postponed = |ctx: &Context| match decide(&task, &Input::Timer(deadline), ctx, &policy) {
            Ok(Verdict::Apply(d)) => d,
            other => panic!("the deadline applies: {other:?}"),
        };

        let paused = Context { paused: PausedSteps::of([faces()]), ..ctx(30_003) };
        let d = postponed(&paused);
        assert_eq!(d.history.event, HistoryEvent::DeadlinePostponed);
        assert!(d.history.detail.as_deref().unwrap().contains("faces queue is paused"), "{:?}", d.history);
        assert_eq!(d.task.timer.unwrap().due_at, 60_003, "the stage's whole deadline from now");
        assert!(d.task.steps.stages["faces"].last_error.is_none(), "no attempt was charged");

        let resumed = Context { paused: PausedSteps::default().resumed(faces(), 20_000), ..ctx(30_003) };
        assert_eq!(postponed(&resumed).task.timer.unwrap().due_at, 50_000, "a whole deadline from the resume");

        let backlog = Context { held: HeldSteps::default().with(faces(), Held::Since(2)), ..ctx(30_003) };
        assert_eq!(postponed(&backlog).history.event, HistoryEvent::DeadlinePostponed);

        // Another stage's pause or backlog does not hold it.
        let others = Context {
            paused: PausedSteps::of([Step::Analyze]),
            held: HeldSteps::default().with(Step::Metadata, Held::Undated),
            ..ctx(30_003)
        };
        assert_eq!(postponed(&others).history.event, HistoryEvent::RetryScheduled);

        // A cancel of the stage's command waiting in its paused, idle queue is at once.
        let idle = Context { paused: PausedSteps::of([faces()]).idle(faces()), ..ctx(5_000) };
        let cancel = Input::Cancel { reason: Some("test".into()) };
        let Ok(Verdict::Apply(d)) = decide(&task, &cancel, &idle, &policy) else { panic!("the cancel applies") };
        assert_eq!(d.task.state, TaskState::Cancelled);
    }

    #[test]
    fn a_stage_of_users_own_retries_with_its_own_attempts_then_fails_the_task() {
        let policy = policy_of(serde_json::json!([
            {"name": "download"}, {"name": "faces", "attempts": 2}, {"name": "metadata"}, {"name": "analyze"},
        ]));
        let task = run(&new_task(), Input::Start, 0, &policy).task;
        let d = run(&task, ok(Step::Download, 1), 1, &policy);
        assert_eq!(queues(&d), ["tasks.faces"], "right after the download, as configured");
        let d = run(&d.task, retryable(faces(), 1), 2, &policy);
        let timer = d.task.timer.unwrap();
        let d = run(&d.task, Input::Timer(timer), timer.due_at, &policy);
        assert_eq!(sent(&d)[0].0, "tasks.faces");
        let d = run(&d.task, retryable(faces(), 2), 3, &policy);
        assert_eq!(d.task.state, TaskState::Failed);
        assert!(d.task.failure.unwrap().error.message.contains("gave up after 2 of 2 attempts"));
    }

    #[test]
    fn a_stage_whose_condition_fails_is_skipped_and_the_history_says_why() {
        let policy = policy_of(serde_json::json!([
            {"name": "download"}, {"name": "metadata"}, {"name": "analyze"},
            {"name": "faces", "when": {"format": ["png"]}},
            {"name": "ocr", "when": {"labels": {"kind": "scan"}}},
        ]));
        let d = analyzed(&policy);
        assert_eq!(d.task.state, TaskState::Completed);
        assert_eq!(events(&d), ["task.completed"]);
        assert_eq!(
            d.history.detail.as_deref(),
            Some("skipped faces: format jpeg is not one of png; skipped ocr: label kind is not \"scan\"")
        );
        assert!(d.task.outputs.stages.is_empty());
    }

    #[test]
    fn a_condition_on_an_earlier_stage_output_decides_the_next_one() {
        let policy = policy_of(serde_json::json!([
            {"name": "download"}, {"name": "metadata"}, {"name": "analyze"},
            {"name": "faces"}, {"name": "face_embed", "when": {"field": "faces.count", "above": 0}},
        ]));
        let d = run(&analyzed(&policy).task, ok(faces(), 1), 4, &policy);
        assert_eq!(queues(&d), ["tasks.face_embed"], "one face was found");
        let none = StepResult {
            task_id: "tsk_1".into(),
            step: faces(),
            attempt: 1,
            outcome: StepOutcome::Ok {
                output: StepOutput::Stage(serde_json::Map::from_iter([("count".into(), 0.into())])),
            },
        };
        let d = run(&analyzed(&policy).task, Input::Result(Box::new(none)), 4, &policy);
        assert_eq!(d.task.state, TaskState::Completed);
        assert!(d.history.detail.unwrap().contains("skipped face_embed: faces.count is 0, not above 0"));
    }

    #[test]
    fn results_of_stages_the_pipeline_lacks_or_of_another_kind_or_too_large_are_refused() {
        let policy = policy_of(serde_json::json!([
            {"name": "download"}, {"name": "metadata"}, {"name": "analyze"}, {"name": "faces"},
        ]));
        let task = analyzed(&policy).task;
        let stranger = ok(Step::named("ocr").unwrap(), 1);
        let err = decide(&task, &stranger, &ctx(5), &policy).unwrap_err();
        assert!(err.to_string().contains("no stage of this pipeline"), "{err}");
        let wrong = Input::Result(Box::new(StepResult {
            task_id: "tsk_1".into(),
            step: faces(),
            attempt: 1,
            outcome: StepOutcome::Ok { output: output(Step::Analyze) },
        }));
        assert!(decide(&task, &wrong, &ctx(5), &policy).unwrap_err().to_string().contains("analyze output"));
        let big = serde_json::Map::from_iter([("blob".to_owned(), "x".repeat(70_000).into())]);
        let large = Input::Result(Box::new(StepResult {
            task_id: "tsk_1".into(),
            step: faces(),
            attempt: 1,
            outcome: StepOutcome::Ok { output: StepOutput::Stage(big) },
        }));
        assert!(decide(&task, &large, &ctx(5), &policy).unwrap_err().to_string().contains("larger than"));
    }
}
