//! How a task is described to people, in the CLI and on the dashboard alike: where its image
//! came from and why it ended without completing.

use imagepipe_contracts::ImageSource;

use crate::task::{Task, TaskState};

/// The label a task made from an uploaded file carries: the file's name (`imagepipe submit` and
/// the dashboard's upload form set it), so the task can be shown by name (its blob key alone
/// does not say which image it is).
pub const FILE_LABEL: &str = "file";

/// Where the task's image comes from: `coffee.jpg (uploaded, sha256:1f2e3d4c5b6a…)` for an
/// upload (the name is its [`FILE_LABEL`]), or the URL with scheme, host and path only (user
/// info, query and fragment may carry credentials).
pub fn source(task: &Task) -> String {
    match (&task.source, task.labels.get(FILE_LABEL)) {
        (ImageSource::Blob(key), Some(name)) => format!("{name} (uploaded, {})", short_key(key)),
        _ => name(task),
    }
}

/// The task's image in a few words, where [`source`] would be too long (under a thumbnail):
/// the uploaded file's name, `uploaded sha256:1f2e3d4c5b6a…` for an upload without one, or the
/// URL as [`source`] shows it.
pub fn name(task: &Task) -> String {
    match &task.source {
        ImageSource::Url(url) => match url::Url::parse(url) {
            Ok(url) => imagepipe_net::redacted_url(&url),
            Err(_) => "(an unparsable URL)".to_owned(),
        },
        ImageSource::Blob(key) => match task.labels.get(FILE_LABEL) {
            Some(name) => name.clone(),
            None => format!("uploaded {}", short_key(key)),
        },
    }
}

/// `sha256:1f2e3d4c5b6a…`: a blob key's first 12 digits.
fn short_key(key: &str) -> String {
    format!("{}…", key.chars().take("sha256:".len() + 12).collect::<String>())
}

/// `1 attempt`, `5 attempts`.
pub fn attempts(n: u32) -> String {
    format!("{n} attempt{}", if n == 1 { "" } else { "s" })
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
    use imagepipe_contracts::{SubmitTask, TraceId};

    use super::*;
    use crate::machine;

    fn task(submit: SubmitTask) -> Task {
        let source = submit.validate().unwrap();
        machine::create("tsk_describe".into(), &submit, source, TraceId::random(), 0).task
    }

    #[test]
    fn a_url_source_is_shown_without_user_info_query_or_fragment() {
        let mut url = task(SubmitTask::url("https://img.example/cats/1.jpg?sig=s3cret#top"));
        assert_eq!(source(&url), "https://img.example/cats/1.jpg");
        // Submits refuse user info now; a task stored before that may still carry it.
        url.source = ImageSource::Url("https://ann:hunter2@img.example/cats/1.jpg?sig=s3cret#top".into());
        assert_eq!(source(&url), "https://img.example/cats/1.jpg");
        assert_eq!(name(&url), "https://img.example/cats/1.jpg");
    }

    #[test]
    fn an_upload_is_shown_by_its_file_name() {
        let key = format!("sha256:{}", "ab".repeat(32));
        let mut named = SubmitTask { blob: Some(key.clone()), ..SubmitTask::default() };
        named.labels.insert(FILE_LABEL.into(), "coffee.jpg".into());
        assert_eq!(source(&task(named.clone())), "coffee.jpg (uploaded, sha256:abababababab…)");
        assert_eq!(name(&task(named)), "coffee.jpg");
        let bare = SubmitTask { blob: Some(key), ..SubmitTask::default() };
        assert_eq!(source(&task(bare.clone())), "uploaded sha256:abababababab…");
        assert_eq!(name(&task(bare)), "uploaded sha256:abababababab…");
    }

    #[test]
    fn attempts_are_counted_in_words() {
        assert_eq!(attempts(1), "1 attempt");
        assert_eq!(attempts(5), "5 attempts");
    }

    #[test]
    fn the_coordinators_gave_up_note_is_not_repeated() {
        assert_eq!(without_gave_up("server error (gave up after 5 of 5 attempts)"), "server error");
        assert_eq!(without_gave_up("not found"), "not found");
    }
}
