//! A transition being built: the next version of a task, its history entry and its outbox, and
//! the steps several inputs share (dispatch an attempt, fail one, pause, cancel, fail the task).

use imagepipe_contracts::payload::{StageCompleted, TaskCancelled, TaskFailed, TaskPaused, TaskRetrying};
use imagepipe_contracts::{
    AnalyzeCommand, DownloadCommand, Event, EventPayload, EventType, MetadataCommand, StageBlobs, StageCommand, Step,
    StepError, stage_event_id,
};
use imagepipe_runtime::clock::millis;
use serde::Serialize;

use super::{Context, Decision, Policy, SOURCE};
use crate::task::{
    Destination, HistoryEntry, HistoryEvent, OutboxEntry, PausedAt, Task, TaskFailure, TaskState, Timer, TimerKind,
};

/// The event-id ordinal of a `task.paused` / `task.resumed` event: the task version that
/// publishes it, offset past any attempt number, so every pause and resume gets its own id.
pub(super) fn ordinal(version: u64) -> u32 {
    u32::try_from(version).unwrap_or(u32::MAX).saturating_add(1 << 30)
}

/// A transition being built from a task.
pub(super) struct Transition {
    pub(super) from: TaskState,
    /// The step that ran before the transition, if any.
    pub(super) from_step: Option<Step>,
    pub(super) task: Task,
    outbox: Vec<OutboxEntry>,
    pub(super) now: u64,
}

impl Transition {
    pub(super) fn new(task: &Task, now: u64) -> Self {
        let mut next = task.clone();
        next.version = task.version + 1;
        next.updated_at = now;
        Self { from: task.state, from_step: task.current_step(), task: next, outbox: Vec::new(), now }
    }

    pub(super) fn finish(
        self,
        from: Option<TaskState>,
        event: HistoryEvent,
        step: Option<Step>,
        attempt: Option<u32>,
        detail: Option<String>,
    ) -> Decision {
        let mut task = self.task;
        if task.state.is_terminal() {
            // A pause still pending has nothing left to stop.
            task.pause_requested = None;
        }
        let history = HistoryEntry {
            version: task.version,
            at: self.now,
            from,
            to: task.state,
            event,
            step,
            attempt,
            detail,
            replica: None,
        };
        Decision { task, history, outbox: self.outbox, fence: None }
    }

    fn push(&mut self, destination: Destination, message_id: String, body: String) {
        let id = OutboxEntry::entry_id(self.task.version, self.outbox.len());
        self.outbox.push(OutboxEntry { id, destination, message_id, trace_id: self.task.trace_id, body });
    }

    pub(super) fn event<P: EventPayload>(&mut self, attempt: u32, payload: P) {
        let event = Event::for_task(self.task.id.clone(), attempt, self.task.trace_id, self.now, SOURCE, payload);
        let body = String::from_utf8(event.to_json()).expect("serde_json writes UTF-8");
        self.push(Destination::Event(P::EVENT_TYPE.as_str().to_owned()), event.event_id.to_string(), body);
    }

    /// Publishes `stage.completed` for attempt `attempt` of custom stage `stage`, under the
    /// id of that stage's attempt ([`stage_event_id`]).
    pub(super) fn stage_event(&mut self, stage: Step, attempt: u32, payload: StageCompleted) {
        let mut event = Event::for_task(self.task.id.clone(), attempt, self.task.trace_id, self.now, SOURCE, payload);
        event.event_id = stage_event_id(&self.task.id, stage.as_str(), attempt);
        let body = String::from_utf8(event.to_json()).expect("serde_json writes UTF-8");
        self.push(Destination::Event(EventType::StageCompleted.as_str().to_owned()), event.event_id.to_string(), body);
    }

    /// Queues `command` on the lane of `step`'s queue for the task's priority. Its message id
    /// names the attempt, and each re-send of a deferred attempt, so no broker drops a re-send
    /// as a duplicate.
    fn command<C: Serialize>(&mut self, step: Step, attempt: u32, command: &C) {
        let body = serde_json::to_string(command).expect("commands serialize infallibly");
        let mut message_id = format!("{}.{}.{attempt}", self.task.id, step.as_str());
        let deferrals = self.task.steps.get(step).deferrals;
        if deferrals > 0 {
            message_id.push_str(&format!(".d{deferrals}"));
        }
        self.push(Destination::Queue(self.task.priority.lane(step.queue())), message_id, body);
    }

    pub(super) fn dispatch(&mut self, step: Step, attempt: u32, policy: &Policy) -> Result<(), String> {
        let task_id = self.task.id.clone();
        let labels = self.task.labels.clone();
        match step {
            Step::Download => {
                let source = self.task.source.clone();
                self.command(step, attempt, &DownloadCommand { task_id, attempt, source, labels });
            }
            Step::Metadata | Step::Analyze => {
                let blob_key = self
                    .task
                    .blob_key()
                    .ok_or_else(|| format!("cannot dispatch {step}: the download output is missing"))?
                    .to_owned();
                if step == Step::Metadata {
                    self.command(step, attempt, &MetadataCommand { task_id, attempt, blob_key, labels });
                } else {
                    let preview_key = self.task.outputs.metadata.as_ref().and_then(|m| m.preview_key.clone());
                    self.command(step, attempt, &AnalyzeCommand { task_id, attempt, blob_key, preview_key, labels });
                }
            }
            Step::Custom(_) => {
                let command = self.stage_command(step, attempt, policy)?;
                self.command(step, attempt, &command);
            }
        }
        self.task.state = TaskState::of_step(step);
        self.task.stage = step.is_custom().then_some(step);
        let record = self.task.steps.get_mut(step);
        record.attempts = attempt;
        record.started_at.get_or_insert(self.now);
        let due_at = self.now.saturating_add(millis(policy.step(step).deadline));
        self.task.timer = Some(Timer { kind: TimerKind::Deadline, step, attempt, due_at });
        Ok(())
    }

    /// The command of attempt `attempt` of custom stage `step`: the task's blobs, its
    /// detected format and the earlier outputs the stage asked for.
    fn stage_command(&self, step: Step, attempt: u32, policy: &Policy) -> Result<StageCommand, String> {
        let download = (self.task.outputs.download.as_ref())
            .ok_or_else(|| format!("cannot dispatch {step}: the download output is missing"))?;
        let metadata = self.task.outputs.metadata.as_ref();
        let blobs = StageBlobs {
            original: download.blob_key.clone(),
            derivatives: metadata
                .map(|m| m.thumbnails.iter().map(|t| (t.name.clone(), t.key.clone())).collect())
                .unwrap_or_default(),
            preview: metadata.and_then(|m| m.preview_key.clone()),
        };
        let mut inputs = serde_json::Map::new();
        if let Some(stage) = policy.stage(step)
            && !stage.inputs.is_empty()
        {
            let outputs = self.task.outputs.as_json();
            for name in &stage.inputs {
                if let Some(output) = outputs.get(imagepipe_runtime::config::output_key(name)) {
                    inputs.insert(name.clone(), output.clone());
                }
            }
        }
        Ok(StageCommand {
            task_id: self.task.id.clone(),
            stage: step,
            attempt,
            blobs,
            format: download.format.clone(),
            inputs: inputs.into_iter().collect(),
            labels: self.task.labels.clone(),
        })
    }

    pub(super) fn failed_attempt(
        mut self,
        step: Step,
        attempt: u32,
        error: StepError,
        retry_after_ms: Option<u64>,
        ctx: &Context,
        policy: &Policy,
    ) -> Decision {
        self.task.steps.get_mut(step).last_error = Some(error.clone());
        if self.task.cancel_requested.is_some() {
            return self.cancel();
        }
        let max = policy.step(step).max_attempts;
        let used = attempt.saturating_sub(self.task.steps.get(step).attempt_base);
        if used >= max {
            let error =
                StepError::new(error.code, format!("{} (gave up after {used} of {max} attempts)", error.message));
            return self.fail(step, attempt, error);
        }
        if self.task.pause_requested.is_some() {
            return self.pause(Some(step), attempt + 1);
        }
        let delay = millis(policy.backoff(attempt, ctx.seed))
            .max(retry_after_ms.unwrap_or(0))
            .min(millis(policy.backoff.max()));
        let due_at = self.now.saturating_add(delay);
        self.task.timer = Some(Timer { kind: TimerKind::Retry, step, attempt: attempt + 1, due_at });
        let ordinal = self.task.steps.total_attempts();
        let labels = self.task.labels.clone();
        let detail = error.to_string();
        self.event(ordinal, TaskRetrying { step, attempt, delay_ms: delay, error, labels });
        let from = Some(self.from);
        self.finish(from, HistoryEvent::RetryScheduled, Some(step), Some(attempt), Some(detail))
    }

    pub(super) fn fail(mut self, step: Step, attempt: u32, error: StepError) -> Decision {
        self.task.state = TaskState::Failed;
        self.task.timer = None;
        self.task.failure = Some(TaskFailure { step, attempt, error: error.clone() });
        let detail = error.to_string();
        let payload = TaskFailed {
            step,
            attempt,
            error,
            callback_url: self.task.callback_url.clone(),
            labels: self.task.labels.clone(),
        };
        self.event(self.task.generation, payload);
        let from = Some(self.from);
        self.finish(from, HistoryEvent::Failed, Some(step), Some(attempt), Some(detail))
    }

    /// Stops the task at a step boundary: `step`'s attempt `attempt` is what a resume sends
    /// (`None`: the task had not started). No timer runs while paused.
    pub(super) fn pause(mut self, step: Option<Step>, attempt: u32) -> Decision {
        let reason = self.task.pause_requested.take().and_then(|p| p.reason);
        self.task.state = TaskState::Paused;
        self.task.timer = None;
        self.task.paused = Some(PausedAt { step, attempt, reason: reason.clone(), at: self.now });
        let labels = self.task.labels.clone();
        self.event(ordinal(self.task.version), TaskPaused { step, reason: reason.clone(), labels });
        let from = Some(self.from);
        self.finish(from, HistoryEvent::Paused, step, step.map(|_| attempt), reason)
    }

    pub(super) fn cancel(mut self) -> Decision {
        let step = self.from_step;
        let attempt = step.map(|s| self.task.steps.get(s).attempts);
        let reason = self.task.cancel_requested.as_ref().and_then(|c| c.reason.clone());
        self.task.state = TaskState::Cancelled;
        self.task.timer = None;
        let payload = TaskCancelled {
            step,
            reason: reason.clone(),
            callback_url: self.task.callback_url.clone(),
            labels: self.task.labels.clone(),
        };
        self.event(self.task.generation, payload);
        let from = Some(self.from);
        self.finish(from, HistoryEvent::Cancelled, step, attempt, reason)
    }
}
