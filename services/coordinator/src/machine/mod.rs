//! The task state machine as one pure function: `(task, input) → decision`.
//!
//! [`decide`] never performs I/O: it returns the new task, the history entry and the outbox
//! messages of the transition, which a [`crate::store::TaskStore`] then writes atomically. A
//! duplicate or stale input is [`Verdict::Ignore`]d; an input that has no edge from the task's
//! state is an [`IllegalTransition`], which the caller logs and counts and never applies.
//!
//! One file per [`Input`] holds that input's transition and its tests (`start.rs`, `result.rs`,
//! `timer.rs`, `cancel.rs`, `pause.rs`, `resume.rs`, `reprocess.rs`, `redispatch.rs`,
//! `undeliverable.rs`); `create.rs` makes a new task. Each builds its [`Decision`] with the
//! `Transition` of `transition.rs`. What the caller passes in lives in `policy.rs` ([`Policy`])
//! and `context.rs` ([`Context`]); the tests share the fixtures of `fixtures.rs`, and `tests.rs`
//! runs the whole machine (every step in order, random interleavings of every input).

use imagepipe_contracts::{Priority, Step, StepError, StepResult};

use crate::task::{HistoryEntry, OutboxEntry, Task, TaskState, Timer};

mod cancel;
mod context;
mod create;
mod pause;
mod policy;
mod redispatch;
mod reprocess;
mod result;
mod resume;
mod start;
mod timer;
mod transition;
mod undeliverable;

pub use context::{Context, HELD_SLACK, Held, HeldSteps, PausedSteps};
pub use create::create;
pub use policy::{Policy, Stage, StepPolicy};

/// The `source` of every event the coordinator publishes.
pub const SOURCE: &str = "coordinator";

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
    /// The lease the write is made under: the store writes it only while this lease on the
    /// task's shard is current (the machine leaves it empty; the engine sets it).
    pub fence: Option<Fence>,
}

/// A lease on a shard as a write carries it: the store refuses the write when the shard's
/// lease has another token or has run out (docs/design.md, "Shards").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    /// The task's shard.
    pub shard: u16,
    /// The lease's fencing token.
    pub token: u64,
    /// When the writer believes it is (Unix ms): the lease must run past it.
    pub now: u64,
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

/// Decides what `input` does to `task`: the transition of each input is in the file named after it.
pub fn decide(task: &Task, input: &Input, ctx: &Context, policy: &Policy) -> Result<Verdict, IllegalTransition> {
    let decided = match input {
        Input::Start => start::on_start(task, ctx, policy),
        Input::Result(result) => result::on_result(task, result, ctx, policy),
        Input::Timer(timer) => timer::on_timer(task, timer, ctx, policy),
        Input::Cancel { reason } => cancel::on_cancel(task, reason, ctx),
        Input::Pause { reason } => pause::on_pause(task, reason, ctx),
        Input::Resume => resume::on_resume(task, ctx, policy),
        Input::Reprocess { from, priority } => reprocess::on_reprocess(task, *from, *priority, ctx, policy),
        Input::Redispatch => redispatch::on_redispatch(task, ctx, policy),
        Input::Undeliverable { error } => undeliverable::on_undeliverable(task, error, ctx),
    };
    decided.map_err(|reason| IllegalTransition {
        task_id: task.id.clone(),
        state: task.state,
        input: input.kind(),
        reason,
    })
}

#[cfg(test)]
mod fixtures;
#[cfg(test)]
pub(crate) mod tests;
