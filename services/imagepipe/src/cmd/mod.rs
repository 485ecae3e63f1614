//! One module per command.

#[macro_use]
pub mod output;
pub mod bench;
pub mod config;
pub mod demo;
pub mod dlq;
pub mod healthcheck;
pub mod run;
pub mod search;
pub mod stats;
pub mod status;
pub mod submit;
pub mod watch;

use std::time::Duration;

use imagepipe_contracts::Step;
use imagepipe_coordinator::Task;

/// Milliseconds a step took, from its first dispatch to its success.
pub fn step_ms(task: &Task, step: Step) -> Option<u64> {
    let record = task.steps.get(step);
    Some(record.finished_at?.saturating_sub(record.started_at?))
}

/// `1.2 s`, `340 ms`.
pub fn duration(ms: u64) -> String {
    let d = Duration::from_millis(ms);
    if d >= Duration::from_secs(1) { format!("{:.1} s", d.as_secs_f64()) } else { format!("{ms} ms") }
}

/// `34.3 KB`, `1.2 MB`.
pub fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1_000_000 => format!("{:.1} MB", b as f64 / 1e6),
        b if b >= 1_000 => format!("{:.1} KB", b as f64 / 1e3),
        b => format!("{b} B"),
    }
}

/// The one-line reason a task failed or was cancelled.
pub fn failure_reason(task: &Task) -> String {
    match &task.failure {
        Some(f) => format!("{} step failed: {}: {}", f.step, f.error.code, f.error.message),
        None => match &task.cancel_requested {
            Some(c) => format!("cancelled{}", c.reason.as_ref().map(|r| format!(": {r}")).unwrap_or_default()),
            None => task.state.to_string(),
        },
    }
}

/// Prints `value` as pretty JSON on stdout.
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}
