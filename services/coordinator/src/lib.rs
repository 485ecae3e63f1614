//! The imagepipe task coordinator: the only writer of task state (DESIGN.md, "Task state machine").
//!
//! - [`machine`]: the state machine, a pure function from a task and an input to a decision.
//! - [`task`]: the task record, its history entries and outbox entries.

pub mod api;
pub mod consumers;
pub mod engine;
pub mod events;
pub mod machine;
pub mod metrics;
pub mod service;
pub mod store;
pub mod task;

pub use machine::{Context, Decision, Ignored, IllegalTransition, Input, Outcome, Policy, StepPolicy};
pub use task::{HistoryEntry, OutboxEntry, Task, TaskState, Timer, TimerKind};

/// The issue that builds this service; the binary refuses to start until its runtime lands.
pub const BUILT_BY_ISSUE: u32 = 4;
