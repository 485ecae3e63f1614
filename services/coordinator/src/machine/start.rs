//! [`Input::Start`](super::Input::Start): room under the in-flight cap dispatches the first step
//! of a queued task.

use imagepipe_contracts::Step;

use super::transition::Transition;
use super::{Context, Ignored, Policy, Verdict};
use crate::task::{HistoryEvent, Task, TaskState};

/// Dispatches the first download attempt of a queued task; any other task has started already.
pub(super) fn on_start(task: &Task, ctx: &Context, policy: &Policy) -> Result<Verdict, String> {
    if task.state != TaskState::Queued {
        return Ok(Verdict::Ignore(Ignored::AlreadyStarted));
    }
    let mut t = Transition::new(task, ctx.now);
    t.dispatch(Step::Download, 1, policy)?;
    let decision = t.finish(Some(task.state), HistoryEvent::Started, Some(Step::Download), Some(1), None);
    Ok(Verdict::Apply(Box::new(decision)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::fixtures::*;

    #[test]
    fn a_start_dispatches_the_first_download_attempt_under_its_deadline() {
        let d = apply(&new_task(), Input::Start, 2_000);
        assert_eq!((d.history.from, d.history.event), (Some(TaskState::Queued), HistoryEvent::Started));
        assert_eq!(d.task.state, TaskState::Downloading);
        assert_eq!(sent(&d), [("tasks.download", "tsk_1.download.1", 1)]);
        let timer = d.task.timer.unwrap();
        assert_eq!(
            (timer.kind, timer.step, timer.attempt, timer.due_at),
            (TimerKind::Deadline, Step::Download, 1, 62_000)
        );
    }

    #[test]
    fn a_start_of_a_task_that_is_no_longer_queued_is_ignored() {
        let running = apply(&new_task(), Input::Start, 0).task;
        assert_eq!(verdict(&running, Input::Start, 1), Verdict::Ignore(Ignored::AlreadyStarted));
    }
}
