//! [`Input::Result`](super::Input::Result): a worker's report of an attempt: its output (the
//! next step, or completion), a failure (a retry, or the task fails), or a deferral.

use imagepipe_contracts::payload::TaskCompleted;
use imagepipe_contracts::{Step, StepError, StepOutcome, StepOutput, StepResult};
use imagepipe_runtime::clock::millis;

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
    if let StepOutcome::Ok { output } = &result.outcome
        && output.step() != result.step
    {
        return Err(format!("the output of step {} was reported for step {}", output.step(), result.step));
    }
    if task.state == TaskState::Paused {
        // No attempt runs while paused: the result is a repeat, or late, of one already decided.
        return Ok(Verdict::Ignore(Ignored::StaleResult));
    }
    let Some(current) = task.state.step() else {
        return Err(format!("a {} result arrived for a task that has not started", result.step));
    };
    if result.step < current {
        return Ok(Verdict::Ignore(Ignored::StaleResult));
    }
    if result.step > current {
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
        }
        if self.task.cancel_requested.is_some() {
            return Ok(self.cancel());
        }
        let from = Some(self.from);
        // The next step's first attempt; in a reprocessed generation its numbers go on from
        // the earlier generations' (so its commands and events get new ids).
        let next_attempt = step.next().map_or(0, |next| self.task.steps.get(next).attempts + 1);
        match step.next() {
            Some(next) if self.task.pause_requested.is_some() => Ok(self.pause(Some(next), next_attempt)),
            Some(next) => {
                self.dispatch(next, next_attempt, policy)?;
                Ok(self.finish(from, HistoryEvent::StepSucceeded, Some(step), Some(attempt), None))
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
                    callback_url: self.task.callback_url.clone(),
                    labels: self.task.labels.clone(),
                };
                self.event(self.task.generation, payload);
                Ok(self.finish(from, HistoryEvent::Completed, Some(step), Some(attempt), None))
            }
        }
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
}
