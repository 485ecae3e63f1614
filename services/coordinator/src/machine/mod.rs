//! The task state machine as one pure function: `(task, input) → decision`.
//!
//! [`decide`] never performs I/O: it returns the new task, the history entry and the outbox
//! messages of the transition, which a [`crate::store::TaskStore`] then writes atomically. A
//! duplicate or stale input is [`Verdict::Ignore`]d; an input that has no edge from the task's
//! state is an [`IllegalTransition`], which the caller logs and counts and never applies.

use std::time::Duration;

use imagepipe_contracts::payload::{
    TaskCancelled, TaskCompleted, TaskCreated, TaskFailed, TaskPaused, TaskResumed, TaskRetrying,
};
use imagepipe_contracts::{
    AnalyzeCommand, DownloadCommand, Event, EventPayload, ImageSource, MetadataCommand, Priority, Step, StepError,
    StepOutcome, StepOutput, StepResult, SubmitTask, TraceId,
};
use imagepipe_runtime::backoff::ExponentialBackoff;
use imagepipe_runtime::clock::millis;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;

use crate::task::{
    Destination, HistoryEntry, HistoryEvent, OutboxEntry, Outputs, PausedAt, PendingCancel, PendingPause, StepRecord,
    Steps, Task, TaskFailure, TaskState, Timer, TimerKind,
};

/// The `source` of every event the coordinator publishes.
pub const SOURCE: &str = "coordinator";

/// Limits of one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepPolicy {
    /// Attempts before the task fails.
    pub max_attempts: u32,
    /// How long an attempt may stay silent before it counts as failed.
    pub deadline: Duration,
}

impl Default for StepPolicy {
    fn default() -> Self {
        Self { max_attempts: 5, deadline: Duration::from_secs(300) }
    }
}

/// Retry and deadline rules of every step.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// The download step.
    pub download: StepPolicy,
    /// The metadata step.
    pub metadata: StepPolicy,
    /// The analyze step.
    pub analyze: StepPolicy,
    /// Delay before each retry (default: 1 s doubling, cap 60 s, full jitter). Its maximum
    /// also caps a worker's `retry_after`, so no server holds a task longer than that.
    pub backoff: ExponentialBackoff,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            download: StepPolicy::default(),
            metadata: StepPolicy::default(),
            analyze: StepPolicy::default(),
            backoff: ExponentialBackoff::step_retries(),
        }
    }
}

impl Policy {
    /// The rules of `step`.
    pub fn step(&self, step: Step) -> StepPolicy {
        match step {
            Step::Download => self.download,
            Step::Metadata => self.metadata,
            Step::Analyze => self.analyze,
        }
    }

    /// The backoff after failed attempt `attempt` (from 1), its jitter drawn from `seed`.
    pub fn backoff(&self, attempt: u32, seed: u64) -> Duration {
        self.backoff.delay_with(attempt.saturating_sub(1), &mut StdRng::seed_from_u64(seed))
    }
}

/// What the machine needs from outside: the time, a seed for the backoff jitter, which stage
/// queues operators have paused, and what the stage queues still hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Context {
    /// Now, Unix ms.
    pub now: u64,
    /// Seeds the jitter of a retry backoff, so a decision is a pure function of its inputs.
    pub seed: u64,
    /// The steps whose queues are paused: their deadlines start over instead of firing, and a
    /// cancel of an attempt waiting in one that runs nothing is at once.
    pub paused: PausedSteps,
    /// What each step's queue and the results queue held at the last look: a deadline whose
    /// command (or result) may still wait there is postponed instead of firing.
    pub held: HeldSteps,
}

/// How much younger than an attempt's deadline window a held message may be and still count
/// as possibly the attempt's command: the relay sends a command a moment after the transition
/// wrote it, and the broker dates it by its own clock.
pub const HELD_SLACK: Duration = Duration::from_secs(5);

/// What a stage queue still holds (waiting or being handled), as far as its broker can tell.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Held {
    /// Nothing, or the broker could not be asked.
    #[default]
    Nothing,
    /// Messages, the oldest enqueued at this time (Unix ms).
    Since(u64),
    /// Messages the broker cannot date (Kafka counts a group's lag, not its age).
    Undated,
}

impl Held {
    /// What two queues hold together: the older, an undated backlog counting as the oldest.
    pub fn and(self, other: Held) -> Held {
        match (self, other) {
            (Held::Undated, _) | (_, Held::Undated) => Held::Undated,
            (Held::Since(a), Held::Since(b)) => Held::Since(a.min(b)),
            (Held::Nothing, held) | (held, Held::Nothing) => held,
        }
    }
}

/// What each step's queue and the results queue (every priority lane of them) still hold,
/// together: the oldest message of either.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeldSteps([Held; 3]);

impl HeldSteps {
    /// The same, with `step`'s queue holding `held`.
    pub fn with(mut self, step: Step, held: Held) -> Self {
        self.0[step_index(step)] = held;
        self
    }

    /// What `step`'s queue holds.
    pub fn get(&self, step: Step) -> Held {
        self.0[step_index(step)]
    }

    /// Why a command of `step` sent at `sent_at` (Unix ms) or earlier, or its result, may still
    /// wait: the step's queue or the results queue holds a message as old as that, or one the
    /// broker cannot date; `None` when everything they hold came later.
    fn may_hold(&self, step: Step, sent_at: u64) -> Option<String> {
        match self.get(step) {
            Held::Nothing => None,
            Held::Since(since) if since > sent_at.saturating_add(millis(HELD_SLACK)) => None,
            Held::Since(since) => Some(format!(
                "a message enqueued at {since}, as old as the attempt's command, still waits in the {step} queue or \
                 the results queue"
            )),
            Held::Undated => {
                Some(format!("the {step} queue or the results queue holds messages its broker cannot date"))
            }
        }
    }
}

/// Which steps' queues are paused, which of them run nothing, and when each was last resumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PausedSteps {
    paused: [bool; 3],
    idle: [bool; 3],
    resumed_at: [u64; 3],
}

impl PausedSteps {
    /// The set of `steps`.
    pub fn of(steps: impl IntoIterator<Item = Step>) -> Self {
        let mut set = Self::default();
        for step in steps {
            set.paused[step_index(step)] = true;
        }
        set
    }

    /// The same, with `step`'s queue last resumed at `at` (Unix ms).
    pub fn resumed(mut self, step: Step, at: u64) -> Self {
        self.resumed_at[step_index(step)] = at;
        self
    }

    /// The same, with `step`'s paused queue running nothing: the pause is in force at every
    /// live consumer and none of them holds a message, so a command of `step` still waits.
    pub fn idle(mut self, step: Step) -> Self {
        let i = step_index(step);
        self.idle[i] = self.paused[i];
        self
    }

    /// Whether `step`'s queue is paused.
    pub fn contains(&self, step: Step) -> bool {
        self.paused[step_index(step)]
    }

    /// Whether `step`'s queue is paused and runs nothing (see [`PausedSteps::idle`]).
    pub fn is_idle(&self, step: Step) -> bool {
        self.idle[step_index(step)]
    }

    /// When `step`'s queue was last resumed (0: never paused).
    pub fn resumed_at(&self, step: Step) -> u64 {
        self.resumed_at[step_index(step)]
    }
}

fn step_index(step: Step) -> usize {
    match step {
        Step::Download => 0,
        Step::Metadata => 1,
        Step::Analyze => 2,
    }
}

/// Something that may change a task.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Room under the in-flight cap: dispatch the first step of a queued task.
    Start,
    /// A worker's report.
    Result(Box<StepResult>),
    /// A timer came due.
    Timer(Timer),
    /// Cancellation through the API.
    Cancel {
        /// Why.
        reason: Option<String>,
    },
    /// Pause through the API: at once when no attempt runs, else at the step boundary.
    Pause {
        /// Why.
        reason: Option<String>,
    },
    /// Resume a paused task (or withdraw a pending pause).
    Resume,
    /// Run `from` and the steps after it again for a finished task, as a new generation.
    Reprocess {
        /// The first step to run again (`metadata` or `analyze`; `download` fetches anew).
        from: Step,
        /// The lanes the new generation runs in; `None` keeps the task's priority.
        priority: Option<Priority>,
    },
    /// The bus lost the commands in flight (an in-process bus restarted with the process):
    /// send the running attempt's command again, with a fresh deadline.
    Redispatch,
    /// A message the task's last transition queued can never be sent (larger than the bus
    /// takes): the task fails at its current step with `error`.
    Undeliverable {
        /// Why, with the code [`MESSAGE_TOO_LARGE`].
        error: StepError,
    },
}

/// The event-id ordinal of a `task.paused` / `task.resumed` event: the task version that
/// publishes it, offset past any attempt number, so every pause and resume gets its own id.
fn ordinal(version: u64) -> u32 {
    u32::try_from(version).unwrap_or(u32::MAX).saturating_add(1 << 30)
}

/// The error code of a task failed by [`Input::Undeliverable`].
pub const MESSAGE_TOO_LARGE: &str = "message_too_large";

impl Input {
    /// A short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Input::Start => "start",
            Input::Result(_) => "result",
            Input::Timer(_) => "timer",
            Input::Cancel { .. } => "cancel",
            Input::Pause { .. } => "pause",
            Input::Resume => "resume",
            Input::Reprocess { .. } => "reprocess",
            Input::Redispatch => "redispatch",
            Input::Undeliverable { .. } => "undeliverable",
        }
    }
}

/// Everything one transition writes, atomically.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The task after the transition; its version is one more than before.
    pub task: Task,
    /// The history entry.
    pub history: HistoryEntry,
    /// The messages to send, in order.
    pub outbox: Vec<OutboxEntry>,
}

/// Why an input was acknowledged without effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ignored {
    /// A result for a step the task has passed, an older attempt, or a finished task.
    StaleResult,
    /// A result the task has already counted.
    DuplicateResult,
    /// A timer that is no longer the task's timer.
    StaleTimer,
    /// A timer fired before its due time.
    TimerNotDue,
    /// A start for a task that is no longer queued.
    AlreadyStarted,
    /// A cancel for a task that is already stopping.
    AlreadyCancelling,
    /// A redispatch for a task with no attempt running.
    NotRunning,
    /// An undeliverable message of a task that has already finished.
    AlreadyFinished,
    /// A pause for a task that is paused or pausing.
    AlreadyPaused,
    /// A resume for a task that is not paused.
    NotPaused,
}

impl Ignored {
    /// A short name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Ignored::StaleResult => "stale_result",
            Ignored::DuplicateResult => "duplicate_result",
            Ignored::StaleTimer => "stale_timer",
            Ignored::TimerNotDue => "timer_not_due",
            Ignored::AlreadyStarted => "already_started",
            Ignored::AlreadyCancelling => "already_cancelling",
            Ignored::NotRunning => "not_running",
            Ignored::AlreadyFinished => "already_finished",
            Ignored::AlreadyPaused => "already_paused",
            Ignored::NotPaused => "not_paused",
        }
    }
}

/// What to do with an input.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Write this transition.
    Apply(Box<Decision>),
    /// Acknowledge the input and change nothing.
    Ignore(Ignored),
}

/// An input with no edge from the task's state; never applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal {input} for task {task_id} in state {state}: {reason}")]
pub struct IllegalTransition {
    /// The task.
    pub task_id: String,
    /// Its state.
    pub state: TaskState,
    /// The input kind.
    pub input: &'static str,
    /// Why there is no edge.
    pub reason: String,
}

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
    };
    let mut t = Transition::new(&task, now);
    t.task.version = 1;
    t.event(0, TaskCreated { source, callback_url: task.callback_url.clone(), labels: task.labels.clone() });
    t.finish(None, HistoryEvent::Created, None, None, None)
}

/// Decides what `input` does to `task`.
pub fn decide(task: &Task, input: &Input, ctx: &Context, policy: &Policy) -> Result<Verdict, IllegalTransition> {
    let illegal =
        |reason: String| IllegalTransition { task_id: task.id.clone(), state: task.state, input: input.kind(), reason };
    let outcome = match input {
        Input::Start => {
            if task.state != TaskState::Queued {
                return Ok(Verdict::Ignore(Ignored::AlreadyStarted));
            }
            let mut t = Transition::new(task, ctx.now);
            t.dispatch(Step::Download, 1, policy).map_err(illegal)?;
            t.finish(Some(task.state), HistoryEvent::Started, Some(Step::Download), Some(1), None)
        }
        Input::Cancel { reason } => {
            if task.state.is_terminal() {
                return Err(illegal(format!("the task is already {}", task.state)));
            }
            // An attempt whose queue is paused and runs nothing has not started: its command
            // still waits there (the worker that takes it after the resume reports a stale
            // result), so nothing is left to stop.
            let running = matches!(task.timer, Some(Timer { kind: TimerKind::Deadline, step, .. })
                if !ctx.paused.is_idle(step));
            if running {
                if task.cancel_requested.is_some() {
                    return Ok(Verdict::Ignore(Ignored::AlreadyCancelling));
                }
                let mut t = Transition::new(task, ctx.now);
                t.task.cancel_requested = Some(PendingCancel { reason: reason.clone(), at: ctx.now });
                let step = task.state.step();
                t.finish(
                    Some(task.state),
                    HistoryEvent::CancelRequested,
                    step,
                    Some(task.current_attempt()),
                    reason.clone(),
                )
            } else {
                let mut t = Transition::new(task, ctx.now);
                // A cancel asked before, while the attempt might run, keeps its reason and time.
                t.task.cancel_requested.get_or_insert(PendingCancel { reason: reason.clone(), at: ctx.now });
                t.cancel()
            }
        }
        Input::Pause { reason } => {
            if task.state.is_terminal() {
                return Err(illegal(format!("the task is already {}", task.state)));
            }
            if task.state == TaskState::Paused || task.pause_requested.is_some() {
                return Ok(Verdict::Ignore(Ignored::AlreadyPaused));
            }
            let mut t = Transition::new(task, ctx.now);
            t.task.pause_requested = Some(PendingPause { reason: reason.clone(), at: ctx.now });
            match task.timer {
                Some(Timer { kind: TimerKind::Deadline, step, attempt, .. }) => {
                    t.finish(Some(task.state), HistoryEvent::PauseRequested, Some(step), Some(attempt), reason.clone())
                }
                Some(Timer { kind: TimerKind::Retry, step, attempt, .. }) => t.pause(Some(step), attempt),
                None => t.pause(None, 0),
            }
        }
        Input::Resume => {
            if task.state.is_terminal() {
                return Err(illegal(format!("the task is already {}", task.state)));
            }
            if task.state != TaskState::Paused {
                if task.pause_requested.is_none() {
                    return Ok(Verdict::Ignore(Ignored::NotPaused));
                }
                let mut t = Transition::new(task, ctx.now);
                t.task.pause_requested = None;
                let step = task.state.step();
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
                Some(step) => t.dispatch(step, attempt.max(1), policy).map_err(illegal)?,
                None => t.task.state = TaskState::Queued,
            }
            let labels = t.task.labels.clone();
            t.event(ordinal(task.version + 1), TaskResumed { step, labels });
            t.finish(Some(task.state), HistoryEvent::Resumed, step, step.map(|_| attempt.max(1)), None)
        }
        Input::Reprocess { from, priority } => {
            if !task.state.is_terminal() {
                return Err(illegal(format!(
                    "the task is {}: only a completed, failed or cancelled task can be reprocessed",
                    task.state
                )));
            }
            let outputs = &task.outputs;
            let has_output = |step: Step| match step {
                Step::Download => outputs.download.is_some(),
                Step::Metadata => outputs.metadata.is_some(),
                Step::Analyze => outputs.analysis.is_some(),
            };
            if let Some(missing) = Step::ALL.into_iter().find(|step| step < from && !has_output(*step)) {
                return Err(illegal(format!(
                    "reprocessing from {from} needs the {missing} step's output, which the task lacks"
                )));
            }
            let t = Transition::new(task, ctx.now);
            t.reprocess(*from, *priority, policy).map_err(illegal)?
        }
        Input::Result(result) => return on_result(task, result, ctx, policy).map_err(illegal),
        Input::Redispatch => {
            let Some(Timer { kind: TimerKind::Deadline, step, attempt, .. }) = task.timer else {
                return Ok(Verdict::Ignore(Ignored::NotRunning));
            };
            let mut t = Transition::new(task, ctx.now);
            t.dispatch(step, attempt, policy).map_err(illegal)?;
            t.finish(
                Some(task.state),
                HistoryEvent::AttemptDispatched,
                Some(step),
                Some(attempt),
                Some("re-sent: the bus lost it in a restart".into()),
            )
        }
        Input::Undeliverable { error } => {
            if task.state.is_terminal() {
                return Ok(Verdict::Ignore(Ignored::AlreadyFinished));
            }
            let step = task.state.step().unwrap_or(Step::Download);
            let attempt = task.steps.get(step).attempts;
            let mut t = Transition::new(task, ctx.now);
            t.task.steps.get_mut(step).last_error = Some(error.clone());
            t.fail(step, attempt, error.clone())
        }
        Input::Timer(timer) => {
            if task.timer != Some(*timer) {
                return Ok(Verdict::Ignore(Ignored::StaleTimer));
            }
            if timer.due_at > ctx.now {
                return Ok(Verdict::Ignore(Ignored::TimerNotDue));
            }
            let mut t = Transition::new(task, ctx.now);
            match timer.kind {
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
                    t.dispatch(timer.step, timer.attempt, policy).map_err(illegal)?;
                    t.finish(
                        Some(task.state),
                        HistoryEvent::AttemptDispatched,
                        Some(timer.step),
                        Some(timer.attempt),
                        None,
                    )
                }
            }
        }
    };
    Ok(Verdict::Apply(Box::new(outcome)))
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

fn on_result(task: &Task, result: &StepResult, ctx: &Context, policy: &Policy) -> Result<Verdict, String> {
    if task.state.is_terminal() {
        return Ok(Verdict::Ignore(Ignored::StaleResult));
    }
    if result.attempt == 0 {
        return Err("attempts count from 1".into());
    }
    if let StepOutcome::Ok { output } = &result.outcome
        && output.step() != result.step
    {
        return Err(format!("the output of step {} was reported for step {}", output.step(), result.step));
    }
    if task.state == TaskState::Paused {
        // No attempt runs while paused: the result is a repeat, or late, of one already decided.
        return Ok(Verdict::Ignore(Ignored::StaleResult));
    }
    let Some(current) = task.state.step() else {
        return Err(format!("a {} result arrived for a task that has not started", result.step));
    };
    if result.step < current {
        return Ok(Verdict::Ignore(Ignored::StaleResult));
    }
    if result.step > current {
        return Err(format!("a {} result arrived while the task is at step {current}", result.step));
    }
    let dispatched = task.steps.get(current).attempts;
    if result.attempt > dispatched {
        return Err(format!("{current} attempt {} was never dispatched (latest is {dispatched})", result.attempt));
    }
    if result.attempt < dispatched {
        return Ok(Verdict::Ignore(Ignored::StaleResult));
    }
    let running = matches!(task.timer, Some(Timer { kind: TimerKind::Deadline, attempt, .. }) if attempt == dispatched);
    let mut t = Transition::new(task, ctx.now);
    let decision = match &result.outcome {
        StepOutcome::Ok { output } => t.succeeded(current, result.attempt, output.clone(), policy)?,
        _ if !running => return Ok(Verdict::Ignore(Ignored::DuplicateResult)),
        StepOutcome::Retryable { error, retry_after_ms } => {
            t.failed_attempt(current, result.attempt, error.clone(), *retry_after_ms, ctx, policy)
        }
        StepOutcome::Permanent { error } => {
            t.task.steps.get_mut(current).last_error = Some(error.clone());
            t.fail(current, result.attempt, error.clone())
        }
        StepOutcome::Deferred { reason, retry_after_ms } => {
            t.deferred(current, result.attempt, reason, *retry_after_ms, policy)
        }
    };
    Ok(Verdict::Apply(Box::new(decision)))
}

/// A transition being built from a task.
struct Transition {
    from: TaskState,
    task: Task,
    outbox: Vec<OutboxEntry>,
    now: u64,
}

impl Transition {
    fn new(task: &Task, now: u64) -> Self {
        let mut next = task.clone();
        next.version = task.version + 1;
        next.updated_at = now;
        Self { from: task.state, task: next, outbox: Vec::new(), now }
    }

    fn finish(
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
        let history =
            HistoryEntry { version: task.version, at: self.now, from, to: task.state, event, step, attempt, detail };
        Decision { task, history, outbox: self.outbox }
    }

    fn push(&mut self, destination: Destination, message_id: String, body: String) {
        let id = OutboxEntry::entry_id(self.task.version, self.outbox.len());
        self.outbox.push(OutboxEntry { id, destination, message_id, trace_id: self.task.trace_id, body });
    }

    fn event<P: EventPayload>(&mut self, attempt: u32, payload: P) {
        let event = Event::for_task(self.task.id.clone(), attempt, self.task.trace_id, self.now, SOURCE, payload);
        let body = String::from_utf8(event.to_json()).expect("serde_json writes UTF-8");
        self.push(Destination::Event(P::EVENT_TYPE.as_str().to_owned()), event.event_id.to_string(), body);
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

    fn dispatch(&mut self, step: Step, attempt: u32, policy: &Policy) -> Result<(), String> {
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
        }
        self.task.state = TaskState::of_step(step);
        let record = self.task.steps.get_mut(step);
        record.attempts = attempt;
        record.started_at.get_or_insert(self.now);
        let due_at = self.now.saturating_add(millis(policy.step(step).deadline));
        self.task.timer = Some(Timer { kind: TimerKind::Deadline, step, attempt, due_at });
        Ok(())
    }

    fn succeeded(mut self, step: Step, attempt: u32, output: StepOutput, policy: &Policy) -> Result<Decision, String> {
        self.task.steps.get_mut(step).finished_at = Some(self.now);
        match output {
            StepOutput::Download(o) => self.task.outputs.download = Some(o),
            StepOutput::Metadata(o) => self.task.outputs.metadata = Some(o),
            StepOutput::Analyze(o) => self.task.outputs.analysis = Some(o),
        }
        if self.task.cancel_requested.is_some() {
            return Ok(self.cancel());
        }
        let from = Some(self.from);
        // The next step's first attempt; in a reprocessed generation its numbers go on from
        // the earlier generations' (so its commands and events get new ids).
        let next_attempt = step.next().map_or(0, |next| self.task.steps.get(next).attempts + 1);
        match step.next() {
            Some(next) if self.task.pause_requested.is_some() => Ok(self.pause(Some(next), next_attempt)),
            Some(next) => {
                self.dispatch(next, next_attempt, policy)?;
                Ok(self.finish(from, HistoryEvent::StepSucceeded, Some(step), Some(attempt), None))
            }
            None => {
                let outputs = self.task.outputs.clone();
                let (Some(download), Some(metadata), Some(analysis)) =
                    (outputs.download, outputs.metadata, outputs.analysis)
                else {
                    return Err("the last step succeeded but an earlier step's output is missing".into());
                };
                self.task.state = TaskState::Completed;
                self.task.timer = None;
                let payload = TaskCompleted {
                    duration_ms: self.now.saturating_sub(self.task.created_at),
                    download,
                    metadata,
                    analysis,
                    callback_url: self.task.callback_url.clone(),
                    labels: self.task.labels.clone(),
                };
                self.event(self.task.generation, payload);
                Ok(self.finish(from, HistoryEvent::Completed, Some(step), Some(attempt), None))
            }
        }
    }

    fn failed_attempt(
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

    /// The worker did not start the attempt: send the same attempt again after
    /// `retry_after_ms` (capped by the backoff's maximum), charging nothing.
    fn deferred(
        mut self,
        step: Step,
        attempt: u32,
        reason: &StepError,
        retry_after_ms: u64,
        policy: &Policy,
    ) -> Decision {
        if self.task.cancel_requested.is_some() {
            return self.cancel();
        }
        // Counted before a pause too: the resume re-sends the attempt under a new id.
        self.task.steps.get_mut(step).deferrals += 1;
        if self.task.pause_requested.is_some() {
            return self.pause(Some(step), attempt);
        }
        let delay = retry_after_ms.min(millis(policy.backoff.max()));
        self.task.timer = Some(Timer { kind: TimerKind::Retry, step, attempt, due_at: self.now.saturating_add(delay) });
        let from = Some(self.from);
        self.finish(
            from,
            HistoryEvent::Deferred,
            Some(step),
            Some(attempt),
            Some(format!("{reason} (again in {delay} ms)")),
        )
    }

    fn fail(mut self, step: Step, attempt: u32, error: StepError) -> Decision {
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
    fn pause(mut self, step: Option<Step>, attempt: u32) -> Decision {
        let reason = self.task.pause_requested.take().and_then(|p| p.reason);
        self.task.state = TaskState::Paused;
        self.task.timer = None;
        self.task.paused = Some(PausedAt { step, attempt, reason: reason.clone(), at: self.now });
        let labels = self.task.labels.clone();
        self.event(ordinal(self.task.version), TaskPaused { step, reason: reason.clone(), labels });
        let from = Some(self.from);
        self.finish(from, HistoryEvent::Paused, step, step.map(|_| attempt), reason)
    }

    /// A new generation of a finished task from step `from`: the outputs of `from` and later
    /// are dropped, their attempt numbers go on (so the new events get new ids), and `from`
    /// is dispatched.
    fn reprocess(mut self, from: Step, priority: Option<Priority>, policy: &Policy) -> Result<Decision, String> {
        self.task.generation += 1;
        if let Some(priority) = priority {
            self.task.priority = priority;
        }
        for step in Step::ALL.into_iter().filter(|s| *s >= from) {
            let record = self.task.steps.get_mut(step);
            *record = StepRecord { attempts: record.attempts, attempt_base: record.attempts, ..StepRecord::default() };
            match step {
                Step::Download => self.task.outputs.download = None,
                Step::Metadata => self.task.outputs.metadata = None,
                Step::Analyze => self.task.outputs.analysis = None,
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

    fn cancel(mut self) -> Decision {
        let step = self.from.step();
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

#[cfg(test)]
pub(crate) mod tests;
