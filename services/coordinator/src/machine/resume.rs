//! [`Input::Resume`](super::Input::Resume): a paused task goes on from the step it stopped
//! before, or a pending pause is withdrawn.

use imagepipe_contracts::payload::TaskResumed;

use super::transition::{Transition, ordinal};
use super::{Context, Ignored, Policy, Verdict};
use crate::task::{HistoryEvent, Task, TaskState};

/// Resumes a paused `task` (dispatching the attempt it stopped before), or withdraws its pending pause.
pub(super) fn on_resume(task: &Task, ctx: &Context, policy: &Policy) -> Result<Verdict, String> {
    if task.state.is_terminal() {
        return Err(format!("the task is already {}", task.state));
    }
    if task.state != TaskState::Paused {
        if task.pause_requested.is_none() {
            return Ok(Verdict::Ignore(Ignored::NotPaused));
        }
        let mut t = Transition::new(task, ctx.now);
        t.task.pause_requested = None;
        let step = task.current_step();
        return Ok(Verdict::Apply(Box::new(t.finish(
            Some(task.state),
            HistoryEvent::Resumed,
            step,
            step.map(|_| task.current_attempt()),
            Some("the pending pause was withdrawn".into()),
        ))));
    }
    let mut t = Transition::new(task, ctx.now);
    let at = t.task.paused.take();
    let (step, attempt) = at.as_ref().map_or((None, 0), |p| (p.step, p.attempt));
    match step {
        Some(step) => t.dispatch(step, attempt.max(1), policy)?,
        None => t.task.state = TaskState::Queued,
    }
    let labels = t.task.labels.clone();
    t.event(ordinal(task.version + 1), TaskResumed { step, labels });
    let decision = t.finish(Some(task.state), HistoryEvent::Resumed, step, step.map(|_| attempt.max(1)), None);
    Ok(Verdict::Apply(Box::new(decision)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::fixtures::*;

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
}
