//! A new task: created queued from a validated submit.

use imagepipe_contracts::payload::TaskCreated;
use imagepipe_contracts::{ImageSource, SubmitTask, TraceId};

use super::Decision;
use super::transition::Transition;
use crate::task::{HistoryEvent, Outputs, Steps, Task, TaskState};

/// A new, queued task from a validated submit; its creation publishes `task.created`.
pub fn create(id: String, submit: &SubmitTask, source: ImageSource, trace_id: TraceId, now: u64) -> Decision {
    let task = Task {
        id,
        version: 1,
        state: TaskState::Queued,
        source: source.clone(),
        idempotency_key: submit.idempotency_key.clone(),
        callback_url: submit.callback_url.clone(),
        labels: submit.labels.clone(),
        priority: submit.priority,
        trace_id,
        created_at: now,
        updated_at: now,
        steps: Steps::default(),
        outputs: Outputs::default(),
        timer: None,
        cancel_requested: None,
        failure: None,
        pause_requested: None,
        paused: None,
        generation: 0,
        stage: None,
    };
    let mut t = Transition::new(&task, now);
    t.task.version = 1;
    t.event(0, TaskCreated { source, callback_url: task.callback_url.clone(), labels: task.labels.clone() });
    t.finish(None, HistoryEvent::Created, None, None, None)
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::fixtures::*;

    #[test]
    fn creation_queues_the_task_and_announces_it() {
        let submit = SubmitTask::url("https://example.com/cat.jpg");
        let d = create("tsk_1".into(), &submit, submit.validate().unwrap(), TraceId::random(), 5);
        assert_eq!((d.task.state, d.task.version, d.history.version), (TaskState::Queued, 1, 1));
        assert_eq!(events(&d), ["task.created"]);
        assert!(d.task.timer.is_none());
    }
}
