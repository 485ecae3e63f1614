//! [`Input::Timer`](super::Input::Timer): a retry's backoff ran out (dispatch the attempt), or an
//! attempt's deadline came due (a failed attempt, unless its command may still wait in a queue).

use imagepipe_contracts::StepError;
use imagepipe_runtime::clock::millis;

use super::transition::Transition;
use super::{Context, Ignored, Policy, Verdict};
use crate::task::{HistoryEvent, Task, Timer, TimerKind};

/// Fires `timer` if it is `task`'s timer and due.
pub(super) fn on_timer(task: &Task, timer: &Timer, ctx: &Context, policy: &Policy) -> Result<Verdict, String> {
    if task.timer != Some(*timer) {
        return Ok(Verdict::Ignore(Ignored::StaleTimer));
    }
    if timer.due_at > ctx.now {
        return Ok(Verdict::Ignore(Ignored::TimerNotDue));
    }
    let mut t = Transition::new(task, ctx.now);
    let decision = match timer.kind {
        TimerKind::Deadline => {
            let deadline = policy.step(timer.step).deadline;
            if let Some((due_at, why)) = postponement(timer, ctx, millis(deadline)) {
                t.task.timer = Some(Timer { due_at, ..*timer });
                t.finish(
                    Some(task.state),
                    HistoryEvent::DeadlinePostponed,
                    Some(timer.step),
                    Some(timer.attempt),
                    Some(why),
                )
            } else {
                let error = StepError::new(
                    "deadline_exceeded",
                    format!("no result for {} attempt {} within {deadline:?}", timer.step, timer.attempt),
                );
                t.failed_attempt(timer.step, timer.attempt, error, None, ctx, policy)
            }
        }
        TimerKind::Retry if task.cancel_requested.is_some() => t.cancel(),
        TimerKind::Retry => {
            t.dispatch(timer.step, timer.attempt, policy)?;
            t.finish(Some(task.state), HistoryEvent::AttemptDispatched, Some(timer.step), Some(timer.attempt), None)
        }
    };
    Ok(Verdict::Apply(Box::new(decision)))
}

/// When and why due deadline `timer` (of `deadline` ms) starts over uncharged instead of firing:
/// its step's queue is paused (a whole deadline from now), was resumed less than a deadline ago
/// (a whole deadline from the resume), or still holds a message as old as the attempt's command
/// (a backlog is not a silent step; what a dead worker held, the broker redelivers).
fn postponement(timer: &Timer, ctx: &Context, deadline: u64) -> Option<(u64, String)> {
    let step = timer.step;
    if ctx.paused.contains(step) {
        return Some((ctx.now.saturating_add(deadline), format!("the {step} queue is paused")));
    }
    let resumed = ctx.paused.resumed_at(step);
    if resumed.saturating_add(deadline) > ctx.now {
        return Some((resumed.saturating_add(deadline), format!("the {step} queue was resumed at {resumed}")));
    }
    // Every command of the attempt went out a whole deadline ago or earlier.
    let why = ctx.held.may_hold(step, ctx.now.saturating_sub(deadline))?;
    Some((ctx.now.saturating_add(deadline), why))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::fixtures::*;

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
}
