//! How the commands show tasks to people: times, durations, sizes, where an image came from,
//! what the model found and how a task ended.

use std::time::{Duration, UNIX_EPOCH};

use imagepipe_contracts::step::AnalysisOutput;
use imagepipe_contracts::{ImageSource, Step};
use imagepipe_coordinator::{Task, TaskState};

/// The label `imagepipe submit` gives a task made from an uploaded file: the file's name, so
/// `status` and `list` can show where the image came from (the blob key alone does not say).
pub const FILE_LABEL: &str = "file";

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

/// `1 attempt`, `5 attempts`.
pub fn attempts(n: u32) -> String {
    format!("{n} attempt{}", if n == 1 { "" } else { "s" })
}

/// Where the task's image comes from: `coffee.jpg (uploaded, sha256:1f2e3d4c5b6a…)` for an
/// upload (the name is its [`FILE_LABEL`]), or the URL with scheme, host and path only (user
/// info, query and fragment may carry credentials).
pub fn source(task: &Task) -> String {
    match &task.source {
        ImageSource::Url(url) => match url::Url::parse(url) {
            Ok(url) => imagepipe_net::redacted_url(&url),
            Err(_) => "(an unparsable URL)".to_owned(),
        },
        ImageSource::Blob(key) => {
            let short = format!("{}…", key.chars().take("sha256:".len() + 12).collect::<String>());
            match task.labels.get(FILE_LABEL) {
                Some(name) => format!("{name} (uploaded, {short})"),
                None => format!("uploaded {short}"),
            }
        }
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

/// Why a task failed (`failed at download after 5 attempts: http_500: …`) or was cancelled
/// (`cancelled: reason`); its state otherwise.
pub fn failure_reason(task: &Task) -> String {
    if let Some(f) = &task.failure {
        return format!(
            "failed at {} after {}: {}: {}",
            f.step,
            attempts(f.attempt),
            f.error.code,
            without_gave_up(&f.error.message)
        );
    }
    match (task.state, &task.cancel_requested) {
        (TaskState::Cancelled, Some(c)) => match &c.reason {
            Some(reason) => format!("cancelled: {reason}"),
            None => "cancelled".to_owned(),
        },
        (state, _) => state.to_string(),
    }
}

/// `message` without the ` (gave up after 5 of 5 attempts)` the coordinator appends when a
/// step ran out of attempts: [`failure_reason`] already says how many there were.
fn without_gave_up(message: &str) -> &str {
    match message.rfind(" (gave up after ") {
        Some(at) if message.ends_with(" attempts)") => &message[..at],
        _ => message,
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
        assert_eq!(attempts(1), "1 attempt");
        assert_eq!(attempts(5), "5 attempts");
    }

    #[test]
    fn the_coordinators_gave_up_note_is_not_repeated() {
        assert_eq!(without_gave_up("server error (gave up after 5 of 5 attempts)"), "server error");
        assert_eq!(without_gave_up("not found"), "not found");
    }
}
