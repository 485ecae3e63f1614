//! How the commands show tasks to people: times, durations, sizes, where an image came from,
//! what the model found and how a task ended.

use std::time::{Duration, UNIX_EPOCH};

use imagepipe_contracts::Step;
use imagepipe_contracts::step::AnalysisOutput;
use imagepipe_coordinator::{Task, TaskState};

pub use imagepipe_coordinator::describe::{FILE_LABEL, attempts, failure_reason, source};

/// How many tags a one-line summary shows.
const SUMMARY_TAGS: usize = 5;

/// `2026-11-24T19:37:47.207Z`: a Unix-milliseconds time as RFC 3339, in UTC.
pub fn time(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

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

/// `espresso (95%)`: the model's best label.
pub fn top_label(analysis: &AnalysisOutput) -> Option<String> {
    analysis.predictions.first().map(|p| format!("{} ({:.0}%)", p.label, p.score * 100.0))
}

/// The first `n` tags, best first: `food, beverage, fluid`.
pub fn tags(analysis: &AnalysisOutput, n: usize) -> String {
    analysis.tags.iter().take(n).map(|t| t.label.as_str()).collect::<Vec<_>>().join(", ")
}

/// How a task ended, or where it is, in one line: `completed  espresso (95%)  food, beverage, …`,
/// `failed at download after 5 attempts: http_500: …`, `cancelled: not needed`, `analyzing`.
pub fn outcome(task: &Task) -> String {
    match (task.state, &task.outputs.analysis) {
        (TaskState::Completed, Some(analysis)) => format!(
            "completed  {}  {}",
            top_label(analysis).unwrap_or_else(|| "(no label)".to_owned()),
            tags(analysis, SUMMARY_TAGS)
        ),
        _ => failure_reason(task),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc_3339_in_utc_with_milliseconds() {
        assert_eq!(time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(time(1_795_549_067_207), "2026-11-24T19:37:47.207Z");
    }

    #[test]
    fn durations_and_sizes_read_like_prose() {
        assert_eq!(duration(340), "340 ms");
        assert_eq!(duration(1_240), "1.2 s");
        assert_eq!(size(71_300), "71.3 KB");
    }
}
