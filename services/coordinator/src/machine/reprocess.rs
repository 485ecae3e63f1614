//! [`Input::Reprocess`](super::Input::Reprocess): a finished task runs a step and the steps after
//! it again, as a new generation.

use imagepipe_contracts::{Priority, Step};

use super::transition::Transition;
use super::{Context, Decision, Policy, Verdict};
use crate::task::{HistoryEvent, Outputs, StepRecord, Task};

/// Starts a new generation of a finished `task` from step `from`, if it has the outputs of the
/// steps before.
pub(super) fn on_reprocess(
    task: &Task,
    from: Step,
    priority: Option<Priority>,
    ctx: &Context,
    policy: &Policy,
) -> Result<Verdict, String> {
    if !task.state.is_terminal() {
        return Err(format!(
            "the task is {}: only a completed, failed or cancelled task can be reprocessed",
            task.state
        ));
    }
    let outputs = &task.outputs;
    let has_output = |step: Step| match step {
        Step::Download => outputs.download.is_some(),
        Step::Metadata => outputs.metadata.is_some(),
        Step::Analyze => outputs.analysis.is_some(),
        // A stage of users' own may have been skipped by its condition: nothing requires it.
        Step::Custom(_) => true,
    };
    let Some(at) = policy.position(from) else {
        return Err(format!("{from} is no stage of this pipeline"));
    };
    if let Some(missing) = policy.stages[..at].iter().map(|s| s.step).find(|step| !has_output(*step)) {
        return Err(format!("reprocessing from {from} needs the {missing} step's output, which the task lacks"));
    }
    let t = Transition::new(task, ctx.now);
    Ok(Verdict::Apply(Box::new(t.reprocess(from, priority, policy)?)))
}

impl Transition {
    /// A new generation of a finished task from step `from`: the outputs of `from` and later
    /// are dropped, their attempt numbers go on (so the new events get new ids), and `from`
    /// is dispatched.
    fn reprocess(mut self, from: Step, priority: Option<Priority>, policy: &Policy) -> Result<Decision, String> {
        self.task.generation += 1;
        if let Some(priority) = priority {
            self.task.priority = priority;
        }
        for step in policy.stages_from(from).iter().map(|s| s.step) {
            let record = self.task.steps.get_mut(step);
            *record = StepRecord { attempts: record.attempts, attempt_base: record.attempts, ..StepRecord::default() };
            match step {
                Step::Download => self.task.outputs.download = None,
                Step::Metadata => self.task.outputs.metadata = None,
                Step::Analyze => self.task.outputs.analysis = None,
                Step::Custom(stage) => drop(self.task.outputs.stages.remove(stage.as_str())),
            }
        }
        self.task.failure = None;
        self.task.cancel_requested = None;
        self.task.pause_requested = None;
        self.task.paused = None;
        let attempt = self.task.steps.get(from).attempts + 1;
        if from == Step::Download {
            self.task.outputs = Outputs::default();
        }
        self.dispatch(from, attempt, policy)?;
        let detail = format!("generation {} from {from} ({} priority)", self.task.generation, self.task.priority);
        let from_state = Some(self.from);
        Ok(self.finish(from_state, HistoryEvent::Reprocessed, Some(from), Some(attempt), Some(detail)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::fixtures::*;

    #[test]
    fn only_a_finished_task_can_be_reprocessed() {
        let queued = new_task();
        let running = apply(&queued, Input::Start, 0).task;
        let paused = apply(&queued, pause(), 0).task;
        let input = Input::Reprocess { from: Step::Metadata, priority: None };
        for task in [queued, running, paused] {
            let err = decide(&task, &input, &ctx(10), &policy()).unwrap_err();
            assert_eq!(err.input, "reprocess");
            assert!(err.reason.contains("only a completed, failed or cancelled task"), "{err}");
        }
    }

    #[test]
    fn reprocessing_from_metadata_runs_a_new_generation_with_new_ids() {
        let first = completed(Priority::Normal);
        let done = first.task.clone();
        let input = Input::Reprocess { from: Step::Metadata, priority: Some(Priority::High) };
        let d = apply(&done, input, 10_000);
        assert_eq!((d.task.state, d.history.event), (TaskState::ExtractingMetadata, HistoryEvent::Reprocessed));
        assert_eq!((d.task.generation, d.task.priority), (1, Priority::High));
        assert_eq!(d.task.outputs.download, done.outputs.download, "the download is kept");
        assert!(d.task.outputs.metadata.is_none() && d.task.outputs.analysis.is_none());
        assert_eq!(d.task.steps.download, done.steps.download);
        assert_eq!(sent(&d), [("tasks.metadata.high", "tsk_1.metadata.2", 2)], "attempts go on, on the new lane");
        let timer = d.task.timer.unwrap();
        assert_eq!((timer.kind, timer.step, timer.attempt), (TimerKind::Deadline, Step::Metadata, 2));
        assert!(d.task.failure.is_none());

        // the steps after it get new attempt numbers too, so no broker or subscriber takes them
        // for the first generation's
        let d = apply(&d.task, ok(Step::Metadata, 2), 11_000);
        assert_eq!(sent(&d), [("tasks.ai.high", "tsk_1.analyze.2", 2)]);
        let d = apply(&d.task, ok(Step::Analyze, 2), 12_000);
        assert_eq!(d.task.state, TaskState::Completed);
        assert_eq!(events(&d), ["task.completed"]);
        assert_ne!(event_ids(&d), event_ids(&first), "the new generation's task.completed has its own id");
    }

    #[test]
    fn reprocessing_without_a_priority_keeps_the_tasks_lanes() {
        let done = completed(Priority::Low).task;
        let d = apply(&done, Input::Reprocess { from: Step::Analyze, priority: None }, 10);
        assert_eq!(sent(&d), [("tasks.ai.low", "tsk_1.analyze.2", 2)]);
        assert!(d.task.outputs.metadata.is_some(), "only analyze runs again");
    }

    #[test]
    fn a_reprocessed_generation_gets_the_whole_retry_budget_of_every_step() {
        // the first generation used up all of the metadata step's attempts
        let mut task = apply(&new_task(), Input::Start, 0).task;
        task = apply(&task, ok(Step::Download, 1), 1).task;
        for attempt in 1..=2 {
            task = apply(&task, retryable(Step::Metadata, attempt), 2).task;
            task = apply(&task, Input::Timer(task.timer.unwrap()), 100_000).task;
        }
        let failed = apply(&task, retryable(Step::Metadata, 3), 100_001).task;
        assert_eq!(failed.state, TaskState::Failed);

        let mut task = apply(&failed, Input::Reprocess { from: Step::Metadata, priority: None }, 200_000).task;
        assert_eq!(task.current_attempt(), 4);
        for attempt in 4..=5 {
            let d = apply(&task, retryable(Step::Metadata, attempt), 200_001);
            assert_eq!(d.task.timer.unwrap().kind, TimerKind::Retry, "attempt {attempt} is retried");
            task = apply(&d.task, Input::Timer(d.task.timer.unwrap()), 300_000).task;
        }
        let d = apply(&task, retryable(Step::Metadata, 6), 300_001);
        assert_eq!(d.task.state, TaskState::Failed);
        assert!(d.task.failure.unwrap().error.message.contains("gave up after 3 of 3 attempts"));

        // and the step after it, too: max_attempts attempts, not one more
        let done = completed(Priority::Normal).task;
        let mut task = apply(&done, Input::Reprocess { from: Step::Metadata, priority: None }, 10).task;
        task = apply(&task, ok(Step::Metadata, 2), 11).task;
        let first = task.current_attempt();
        for attempt in first..first + 2 {
            task = apply(&task, retryable(Step::Analyze, attempt), 12).task;
            task = apply(&task, Input::Timer(task.timer.unwrap()), 100_000).task;
        }
        let d = apply(&task, retryable(Step::Analyze, first + 2), 100_001);
        assert_eq!(d.task.state, TaskState::Failed, "the third attempt of the generation is its last");
    }

    #[test]
    fn reprocessing_needs_the_outputs_of_the_steps_before() {
        let failed = apply(&apply(&new_task(), Input::Start, 0).task, permanent(Step::Download, 1), 1).task;
        let err = decide(&failed, &Input::Reprocess { from: Step::Metadata, priority: None }, &ctx(2), &policy())
            .unwrap_err();
        assert!(err.reason.contains("download"), "{err}");
        // from download it fetches anew
        let d = apply(&failed, Input::Reprocess { from: Step::Download, priority: None }, 2);
        assert_eq!(sent(&d), [("tasks.download", "tsk_1.download.2", 2)]);

        // a task that failed at metadata has nothing to analyze from
        let task = apply(&apply(&new_task(), Input::Start, 0).task, ok(Step::Download, 1), 1).task;
        let failed = apply(&task, permanent(Step::Metadata, 1), 2).task;
        let err =
            decide(&failed, &Input::Reprocess { from: Step::Analyze, priority: None }, &ctx(3), &policy()).unwrap_err();
        assert!(err.reason.contains("metadata"), "{err}");
        let d = apply(&failed, Input::Reprocess { from: Step::Metadata, priority: None }, 3);
        assert_eq!(sent(&d), [("tasks.metadata", "tsk_1.metadata.2", 2)]);
    }

    #[test]
    fn a_cancelled_task_can_be_reprocessed_from_the_start() {
        let cancelled = apply(&new_task(), Input::Cancel { reason: Some("oops".into()) }, 1).task;
        let d = apply(&cancelled, Input::Reprocess { from: Step::Download, priority: None }, 2);
        assert_eq!(d.task.state, TaskState::Downloading);
        assert!(d.task.cancel_requested.is_none(), "the old cancellation does not stop the new generation");
        assert_eq!(sent(&d), [("tasks.download", "tsk_1.download.1", 1)]);
        let d = apply(&d.task, ok(Step::Download, 1), 3);
        assert_eq!(d.task.state, TaskState::ExtractingMetadata);
    }
}
