//! [`Input::Cancel`](super::Input::Cancel): cancellation through the API, at once when no
//! attempt can be running, else at the next step boundary.

use super::transition::Transition;
use super::{Context, Ignored, Verdict};
use crate::task::{HistoryEvent, PendingCancel, Task, Timer, TimerKind};

/// Cancels `task` at once, or asks it to stop when its running attempt ends.
pub(super) fn on_cancel(task: &Task, reason: &Option<String>, ctx: &Context) -> Result<Verdict, String> {
    if task.state.is_terminal() {
        return Err(format!("the task is already {}", task.state));
    }
    // An attempt whose queue is paused and runs nothing has not started: its command
    // still waits there (the worker that takes it after the resume reports a stale
    // result), so nothing is left to stop.
    let running = matches!(task.timer, Some(Timer { kind: TimerKind::Deadline, step, .. })
        if !ctx.paused.is_idle(step));
    let decision = if running {
        if task.cancel_requested.is_some() {
            return Ok(Verdict::Ignore(Ignored::AlreadyCancelling));
        }
        let mut t = Transition::new(task, ctx.now);
        t.task.cancel_requested = Some(PendingCancel { reason: reason.clone(), at: ctx.now });
        let step = task.current_step();
        t.finish(Some(task.state), HistoryEvent::CancelRequested, step, Some(task.current_attempt()), reason.clone())
    } else {
        let mut t = Transition::new(task, ctx.now);
        // A cancel asked before, while the attempt might run, keeps its reason and time.
        t.task.cancel_requested.get_or_insert(PendingCancel { reason: reason.clone(), at: ctx.now });
        t.cancel()
    };
    Ok(Verdict::Apply(Box::new(decision)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::fixtures::*;

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
        assert_eq!(
            (event.payload.step, event.payload.reason.as_deref()),
            (Some(Step::Download), Some("changed my mind"))
        );
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
        let Ok(Verdict::Apply(d)) = decide(&task, &Input::Cancel { reason: Some("test".into()) }, &idle, &policy())
        else {
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
    fn cancelling_a_paused_task_cancels_it() {
        let task = apply(&apply(&new_task(), Input::Start, 0).task, pause(), 1).task;
        let paused = apply(&task, ok(Step::Download, 1), 2).task;
        let d = apply(&paused, Input::Cancel { reason: Some("no more".into()) }, 3);
        assert_eq!(d.task.state, TaskState::Cancelled);
        assert_eq!(events(&d), ["task.cancelled"]);
        assert!(queues(&d).is_empty() && d.task.timer.is_none());
    }
}
