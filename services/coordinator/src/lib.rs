//! imagepipe coordinator: the task coordinator: task state machine, state store, timers, HTTP API.
//!
//! Not built yet: issue #4 builds it. The binary refuses to start until then.

/// The issue that builds this service.
pub const BUILT_BY_ISSUE: u32 = 4;
