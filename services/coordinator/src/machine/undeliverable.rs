//! [`Input::Undeliverable`](super::Input::Undeliverable): a message the task's last transition
//! queued can never be sent, so the task fails at its current step.

use imagepipe_contracts::{Step, StepError};

use super::transition::Transition;
use super::{Context, Ignored, Verdict};
use crate::task::Task;

/// Fails an unfinished `task` at its current step (download when it has not started) with `error`.
pub(super) fn on_undeliverable(task: &Task, error: &StepError, ctx: &Context) -> Result<Verdict, String> {
    if task.state.is_terminal() {
        return Ok(Verdict::Ignore(Ignored::AlreadyFinished));
    }
    let step = task.current_step().unwrap_or(Step::Download);
    let attempt = task.steps.get(step).attempts;
    let mut t = Transition::new(task, ctx.now);
    t.task.steps.get_mut(step).last_error = Some(error.clone());
    Ok(Verdict::Apply(Box::new(t.fail(step, attempt, error.clone()))))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::fixtures::*;

    #[test]
    fn an_undeliverable_message_fails_the_task_at_its_current_step_once() {
        let task = apply(&apply(&new_task(), Input::Start, 0).task, ok(Step::Download, 1), 1).task;
        let error = StepError::new(MESSAGE_TOO_LARGE, "larger than the bus takes");
        let d = apply(&task, Input::Undeliverable { error: error.clone() }, 2);
        assert_eq!((d.task.state, d.history.event), (TaskState::Failed, HistoryEvent::Failed));
        assert_eq!(events(&d), ["task.failed"]);
        let failure = d.task.failure.clone().unwrap();
        assert_eq!((failure.step, failure.attempt, &failure.error), (Step::Metadata, 1, &error));
        assert_eq!(d.task.steps.metadata.last_error.as_ref(), Some(&error));
        assert!(d.task.timer.is_none());
        let again = verdict(&d.task, Input::Undeliverable { error }, 3);
        assert_eq!(again, Verdict::Ignore(Ignored::AlreadyFinished));
    }
}
