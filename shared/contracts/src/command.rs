//! Task-queue commands: the public submit command and the three step commands the
//! coordinator sends to the workers.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Labels, Priority};

/// Longest accepted task id or idempotency key, in bytes.
pub const MAX_ID_LEN: usize = 128;
/// Longest accepted source or callback URL, in bytes.
pub const MAX_URL_LEN: usize = 2048;
/// Most labels a task may carry.
pub const MAX_LABELS: usize = 64;
/// Longest label key, in bytes.
pub const MAX_LABEL_KEY_LEN: usize = 64;
/// Longest label value, in bytes.
pub const MAX_LABEL_VALUE_LEN: usize = 1024;
/// Most bytes of all label keys and values together.
pub const MAX_LABELS_TOTAL_LEN: usize = 8 * 1024;

/// The submit command: plain JSON, the same on NATS, Kafka and HTTP (docs/design.md, "Interfaces").
///
/// Exactly one of `url` and `blob` names the image; [`SubmitTask::validate`] checks that and
/// every other rule, so a malformed submit can be dead-lettered with a precise reason.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(
    title = "imagepipe submit command",
    extend("oneOf" = [{"required": ["url"]}, {"required": ["blob"]}])
)]
pub struct SubmitTask {
    /// Caller-chosen task id (`[A-Za-z0-9_.-]`, at most 128 bytes); generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// The image to fetch (http or https).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// An already uploaded image, `sha256:<64 hex digits>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blob: Option<String>,
    /// A repeat with the same key returns the existing task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// Where the notification worker posts `task.completed` / `task.failed` / `task.cancelled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// Free-form labels copied into every event's payload.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
    /// `high`, `normal` (default) or `low`: which lane of each queue carries the task's work.
    #[serde(default, skip_serializing_if = "Priority::is_normal")]
    pub priority: Priority,
}

/// Where a task's image comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ImageSource {
    /// Fetch it from this http(s) URL.
    Url(String),
    /// It is already in the blob store under this content-addressed key.
    Blob(String),
}

/// Why a submit command was refused. Each message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// Neither `url` nor `blob` was given.
    #[error("one of `url` or `blob` is required")]
    MissingSource,
    /// Both `url` and `blob` were given.
    #[error("give either `url` or `blob`, not both")]
    BothSources,
    /// A URL field is not an absolute http(s) URL.
    #[error("`{field}` must be an absolute http:// or https:// URL of at most {MAX_URL_LEN} bytes (got {value:?})")]
    InvalidUrl {
        /// `url` or `callbackUrl`.
        field: &'static str,
        /// The rejected value, without query or fragment, cut to 200 bytes.
        value: String,
    },
    /// `blob` is not `sha256:<64 lowercase hex digits>`.
    #[error("`blob` must be `sha256:` followed by 64 lowercase hex digits (got {0:?})")]
    InvalidBlob(String),
    /// An id field has characters outside `[A-Za-z0-9_.-]` or is too long.
    #[error("`{field}` must be 1 to {MAX_ID_LEN} characters of [A-Za-z0-9_.-] (got {value:?})")]
    InvalidId {
        /// `taskId` or `idempotencyKey`.
        field: &'static str,
        /// The rejected value (cut to 200 bytes).
        value: String,
    },
    /// A URL field carries user info (`user:password@`): credentials do not belong in a URL
    /// that is stored, logged and sent on.
    #[error("`{field}` must not carry user info (`user:password@host`); put credentials elsewhere (got {value:?})")]
    UrlWithUserInfo {
        /// `url` or `callbackUrl`.
        field: &'static str,
        /// The rejected value, with the user info masked.
        value: String,
    },
    /// More than [`MAX_LABELS`] labels.
    #[error("at most {MAX_LABELS} labels are allowed (got {0})")]
    TooManyLabels(usize),
    /// A label key is empty or longer than [`MAX_LABEL_KEY_LEN`] bytes.
    #[error("label keys must be 1 to {MAX_LABEL_KEY_LEN} bytes (got {len} bytes: {key:?})")]
    LabelKey {
        /// The key (cut to 200 bytes).
        key: String,
        /// Its length in bytes.
        len: usize,
    },
    /// A label value is longer than [`MAX_LABEL_VALUE_LEN`] bytes.
    #[error("label `{key}` has a value of {len} bytes; at most {MAX_LABEL_VALUE_LEN} are allowed")]
    LabelValue {
        /// The label's key.
        key: String,
        /// The value's length in bytes.
        len: usize,
    },
    /// All labels together are longer than [`MAX_LABELS_TOTAL_LEN`] bytes.
    #[error("labels take {0} bytes in all (keys and values); at most {MAX_LABELS_TOTAL_LEN} are allowed")]
    LabelsTooLarge(usize),
}

impl SubmitTask {
    /// A submit of `url` with nothing else set.
    pub fn url(url: impl Into<String>) -> Self {
        Self { url: Some(url.into()), ..Self::default() }
    }

    /// The lane of the submit queue this command belongs on (`tasks.submit`,
    /// `tasks.submit.high`, `tasks.submit.low`): a publisher that sends a `high` submit there
    /// puts it ahead of queued `low` ones.
    pub fn lane(&self) -> String {
        self.priority.lane(crate::names::queues::SUBMIT)
    }

    /// Checks every rule of the submit command and returns where the image comes from.
    pub fn validate(&self) -> Result<ImageSource, SubmitError> {
        if let Some(id) = &self.task_id {
            check_id("taskId", id)?;
        }
        if let Some(key) = &self.idempotency_key {
            check_id("idempotencyKey", key)?;
        }
        if let Some(callback) = &self.callback_url {
            check_url("callbackUrl", callback)?;
        }
        check_labels(&self.labels)?;
        match (&self.url, &self.blob) {
            (None, None) => Err(SubmitError::MissingSource),
            (Some(_), Some(_)) => Err(SubmitError::BothSources),
            (Some(url), None) => check_url("url", url).map(|()| ImageSource::Url(url.clone())),
            (None, Some(blob)) => {
                if is_blob_key(blob) {
                    Ok(ImageSource::Blob(blob.clone()))
                } else {
                    Err(SubmitError::InvalidBlob(cut(blob)))
                }
            }
        }
    }
}

/// Whether `key` is a content-addressed blob key, `sha256:<64 lowercase hex digits>`.
pub fn is_blob_key(key: &str) -> bool {
    key.strip_prefix("sha256:")
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// Whether `id` is usable as a task id or key: 1..=128 bytes of `[A-Za-z0-9_.-]`.
pub fn is_valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_ID_LEN
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

fn check_id(field: &'static str, id: &str) -> Result<(), SubmitError> {
    if is_valid_id(id) { Ok(()) } else { Err(SubmitError::InvalidId { field, value: cut(id) }) }
}

fn check_url(field: &'static str, url: &str) -> Result<(), SubmitError> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    let host_present = rest.is_some_and(|r| !r.is_empty() && !r.starts_with('/'));
    let clean = !url.chars().any(|c| c.is_whitespace() || c.is_control());
    if !(host_present && clean && url.len() <= MAX_URL_LEN) {
        return Err(SubmitError::InvalidUrl { field, value: cut(shown_url(url)) });
    }
    let rest = rest.unwrap_or_default();
    let authority = &rest[..rest.find(['/', '?', '#']).unwrap_or(rest.len())];
    match authority.rfind('@') {
        Some(at) => Err(SubmitError::UrlWithUserInfo {
            field,
            value: cut(shown_url(&url.replacen(&authority[..at], "***", 1))),
        }),
        None => Ok(()),
    }
}

/// `url` as an error may show it: without its query and fragment, which may carry secrets
/// (signed links, tokens).
fn shown_url(url: &str) -> &str {
    &url[..url.find(['?', '#']).unwrap_or(url.len())]
}

fn check_labels(labels: &Labels) -> Result<(), SubmitError> {
    if labels.len() > MAX_LABELS {
        return Err(SubmitError::TooManyLabels(labels.len()));
    }
    let mut total = 0;
    for (key, value) in labels {
        if key.is_empty() || key.len() > MAX_LABEL_KEY_LEN {
            return Err(SubmitError::LabelKey { key: cut(key), len: key.len() });
        }
        if value.len() > MAX_LABEL_VALUE_LEN {
            return Err(SubmitError::LabelValue { key: key.clone(), len: value.len() });
        }
        total += key.len() + value.len();
    }
    if total > MAX_LABELS_TOTAL_LEN {
        return Err(SubmitError::LabelsTooLarge(total));
    }
    Ok(())
}

fn cut(value: &str) -> String {
    let mut end = value.len().min(200);
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    value[..end].to_owned()
}

/// Command on `tasks.download`: fetch the task's image into the blob store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DownloadCommand {
    /// The task.
    pub task_id: String,
    /// Which attempt of the download step this is, from 1.
    pub attempt: u32,
    /// Where the image comes from.
    pub source: ImageSource,
    /// The task's labels, for the event payload.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
}

/// Command on `tasks.metadata`: decode the stored image, extract metadata, write a thumbnail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MetadataCommand {
    /// The task.
    pub task_id: String,
    /// Which attempt of the metadata step this is, from 1.
    pub attempt: u32,
    /// Blob key of the downloaded image.
    pub blob_key: String,
    /// The task's labels, for the event payload.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
}

/// Command on `tasks.ai`: run the model over the stored image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AnalyzeCommand {
    /// The task.
    pub task_id: String,
    /// Which attempt of the analyze step this is, from 1.
    pub attempt: u32,
    /// Blob key of the downloaded image.
    pub blob_key: String,
    /// Blob key of the upright, downscaled preview the metadata step wrote: the worker reads it
    /// instead of decoding the original again. Absent in commands from coordinators older than
    /// this field; the worker then reads `blob_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview_key: Option<String>,
    /// The task's labels, for the event payload.
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOB: &str = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn a_url_or_a_blob_is_required_but_not_both() {
        assert_eq!(SubmitTask::default().validate(), Err(SubmitError::MissingSource));
        let both = SubmitTask { blob: Some(BLOB.into()), ..SubmitTask::url("https://example.com/a.jpg") };
        assert_eq!(both.validate(), Err(SubmitError::BothSources));
        let blob = SubmitTask { blob: Some(BLOB.into()), ..SubmitTask::default() };
        assert_eq!(blob.validate(), Ok(ImageSource::Blob(BLOB.into())));
    }

    #[test]
    fn urls_must_be_absolute_http() {
        for bad in ["ftp://x/a.jpg", "https://", "http:///a", "/a.jpg", "https://a b"] {
            assert!(
                matches!(SubmitTask::url(bad).validate(), Err(SubmitError::InvalidUrl { field: "url", .. })),
                "{bad}"
            );
        }
        assert!(SubmitTask::url("http://example.com/cat.jpg").validate().is_ok());
    }

    #[test]
    fn ids_and_blob_keys_are_checked() {
        let bad_id = SubmitTask { task_id: Some("a/b".into()), ..SubmitTask::url("https://e.com/a") };
        assert!(matches!(bad_id.validate(), Err(SubmitError::InvalidId { field: "taskId", .. })));
        let bad_blob = SubmitTask { blob: Some("sha256:XYZ".into()), ..SubmitTask::default() };
        assert!(matches!(bad_blob.validate(), Err(SubmitError::InvalidBlob(_))));
    }

    #[test]
    fn urls_with_user_info_are_refused_without_echoing_the_secret() {
        for (field, task) in [
            ("url", SubmitTask::url("http://user:secret@example.com/a.jpg")),
            ("url", SubmitTask::url("https://token@example.com")),
            (
                "callbackUrl",
                SubmitTask {
                    callback_url: Some("https://a:b@hooks.example.com/x".into()),
                    ..SubmitTask::url("https://e.com/a")
                },
            ),
        ] {
            let err = task.validate().unwrap_err();
            assert!(matches!(err, SubmitError::UrlWithUserInfo { field: f, .. } if f == field), "{err}");
            assert!(!err.to_string().contains("secret") && !err.to_string().contains("token@"), "{err}");
        }
        // An @ after the authority is a path or query character, not user info.
        assert!(SubmitTask::url("https://example.com/@me/a.jpg?by=a@b").validate().is_ok());
    }

    #[test]
    fn refused_urls_are_echoed_without_query_or_fragment() {
        let err = SubmitTask::url("ftp://host/a.jpg?token=s3cret#frag").validate().unwrap_err();
        assert!(err.to_string().contains("ftp://host/a.jpg") && !err.to_string().contains("s3cret"), "{err}");
        let err = SubmitTask::url("https://u:p@host/a.jpg?sig=s3cret").validate().unwrap_err();
        assert!(!err.to_string().contains("s3cret") && !err.to_string().contains("u:p"), "{err}");
    }

    #[test]
    fn urls_are_capped_at_2_kib() {
        let base = "https://example.com/";
        let fits = format!("{base}{}", "a".repeat(MAX_URL_LEN - base.len()));
        assert!(SubmitTask::url(&fits).validate().is_ok());
        let over = format!("{fits}a");
        assert!(matches!(SubmitTask::url(over).validate(), Err(SubmitError::InvalidUrl { .. })));
    }

    #[test]
    fn labels_are_capped_per_key_value_and_in_all() {
        let with = |labels: &[(String, String)]| SubmitTask {
            labels: labels.iter().cloned().collect(),
            ..SubmitTask::url("https://e.com/a")
        };
        let key = |n: usize| "k".repeat(n);
        assert!(with(&[(key(64), "v".repeat(1024))]).validate().is_ok());
        assert!(matches!(with(&[(key(65), "v".into())]).validate(), Err(SubmitError::LabelKey { len: 65, .. })));
        assert!(matches!(with(&[(String::new(), "v".into())]).validate(), Err(SubmitError::LabelKey { len: 0, .. })));
        assert!(matches!(
            with(&[("album".into(), "v".repeat(1025))]).validate(),
            Err(SubmitError::LabelValue { len: 1025, .. })
        ));
        let nine: Vec<_> = (0..9).map(|i| (format!("k{i}"), "v".repeat(1000))).collect();
        assert!(matches!(with(&nine).validate(), Err(SubmitError::LabelsTooLarge(n)) if n > MAX_LABELS_TOTAL_LEN));
        let many: Vec<_> = (0..65).map(|i| (format!("k{i}"), String::new())).collect();
        assert!(matches!(with(&many).validate(), Err(SubmitError::TooManyLabels(65))));
    }
}
