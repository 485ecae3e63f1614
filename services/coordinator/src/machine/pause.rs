//! [`Input::Pause`](super::Input::Pause): pause through the API, at once when no attempt runs,
//! else at the step boundary (the pending pause takes effect in [`super::result`] and
//! [`super::timer`]).

use super::transition::Transition;
use super::{Context, Ignored, Verdict};
use crate::task::{HistoryEvent, PendingPause, Task, TaskState, Timer, TimerKind};

/// Pauses `task` at once, or asks it to pause when its running attempt ends.
pub(super) fn on_pause(task: &Task, reason: &Option<String>, ctx: &Context) -> Result<Verdict, String> {
    if task.state.is_terminal() {
        return Err(format!("the task is already {}", task.state));
    }
    if task.state == TaskState::Paused || task.pause_requested.is_some() {
        return Ok(Verdict::Ignore(Ignored::AlreadyPaused));
    }
    let mut t = Transition::new(task, ctx.now);
    t.task.pause_requested = Some(PendingPause { reason: reason.clone(), at: ctx.now });
    let decision = match task.timer {
        Some(Timer { kind: TimerKind::Deadline, step, attempt, .. }) => {
            t.finish(Some(task.state), HistoryEvent::PauseRequested, Some(step), Some(attempt), reason.clone())
        }
        Some(Timer { kind: TimerKind::Retry, step, attempt, .. }) => t.pause(Some(step), attempt),
        None => t.pause(None, 0),
    };
    Ok(Verdict::Apply(Box::new(decision)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::fixtures::*;

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
}
