//! The imagepipe task coordinator: the only writer of task state (docs/design.md, "Task state machine").
//!
//! - [`machine`]: the state machine, a pure function from a task and an input to a decision.
//! - [`task`]: the task record, its history entries and outbox entries.
//! - [`store`]: the [`store::TaskStore`] seam, Redis and embedded (redb) backends, one suite.
//! - [`engine`]: applies inputs with compare-and-set, relays the outbox, sweeps due timers,
//!   starts queued tasks under the in-flight cap.
//! - [`cluster`]: shards, the leases replicas own them by, the share-out, `/v1/cluster`.
//! - [`control`]: the operator controls (paused stages, live concurrency, cancelling running
//!   steps) the API writes and the machine reads.
//! - [`queue_wait`]: what the stage queues still hold, so a command waiting behind a backlog
//!   is not charged its step deadline.
//! - [`consumers`]: handlers of `tasks.submit`, `tasks.results` and the dead-letter queues.
//! - [`reprocess`]: reprocessing jobs (`POST /v1/reprocess`).
//! - [`retention`]: deletes finished tasks and old dead letters.
//! - [`blob_sweep`]: deletes the blobs no task references (expired tasks', unsubmitted uploads).
//! - [`describe`]: how a task is shown to people (its source, why it failed).
//! - [`api`]: the HTTP API; [`events`]: the SSE fan-out; [`loops`]: the loops; [`gauges`]:
//!   queue depth, consumer lag and dead-letter gauges;
//!   [`app`]: assembly from the runtime `Settings`.

pub mod api;
pub mod app;
pub mod blob_sweep;
pub mod cluster;
pub mod consumers;
pub mod control;
pub mod dashboard;
pub mod describe;
pub mod engine;
pub mod events;
pub mod gauges;
pub mod loops;
pub mod machine;
pub mod metrics;
pub mod queue_wait;
pub mod reprocess;
pub mod retention;
pub mod routing;
mod slots;
pub mod store;
pub mod task;

pub use app::serve;

/// The service's name: the `source` of its events, and its name in logs and traces.
pub const SERVICE: &str = machine::SOURCE;
pub use machine::{Context, Decision, Ignored, IllegalTransition, Input, Policy, StepPolicy, Verdict};
pub use task::{HistoryEntry, OutboxEntry, Task, TaskState, Timer, TimerKind};
