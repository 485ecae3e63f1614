//! [`Input::Redispatch`](super::Input::Redispatch): the bus lost the commands in flight, so the
//! running attempt's command goes out again.

use super::transition::Transition;
use super::{Context, Ignored, Policy, Verdict};
use crate::task::{HistoryEvent, Task, Timer, TimerKind};

/// Sends the running attempt's command again, under the same id and with a fresh deadline.
pub(super) fn on_redispatch(task: &Task, ctx: &Context, policy: &Policy) -> Result<Verdict, String> {
    let Some(Timer { kind: TimerKind::Deadline, step, attempt, .. }) = task.timer else {
        return Ok(Verdict::Ignore(Ignored::NotRunning));
    };
    let mut t = Transition::new(task, ctx.now);
    t.dispatch(step, attempt, policy)?;
    let decision = t.finish(
        Some(task.state),
        HistoryEvent::AttemptDispatched,
        Some(step),
        Some(attempt),
        Some("re-sent: the bus lost it in a restart".into()),
    );
    Ok(Verdict::Apply(Box::new(decision)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::fixtures::*;

    #[test]
    fn a_redispatch_resends_the_running_attempt_with_a_fresh_deadline() {
        let queued = new_task();
        assert_eq!(
            decide(&queued, &Input::Redispatch, &ctx(0), &policy()).unwrap(),
            Verdict::Ignore(Ignored::NotRunning)
        );

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
}
