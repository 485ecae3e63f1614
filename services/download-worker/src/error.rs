//! Why a download failed, whether a later attempt may succeed, and the stable code its step
//! result carries.

use std::time::Duration;

use imagepipe_blob::{BlobError, InvalidBlobKey};
use imagepipe_contracts::StepError;
use imagepipe_net::{FetchError, StatusCode};
use imagepipe_runtime::step::{self, StepFailure};

use crate::politeness::Deferral;

/// Longest `Retry-After` reported; a server asking for more is reported as asking for this. The
/// coordinator holds a task no longer than `coordinator.retry_max_backoff` whatever is reported.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Stable error codes of the download step (the `code` of its [`StepError`]s). An HTTP status
/// the server answered with is `http_<status>` (`http_404`, `http_503`); blob store failures
/// have the codes every step shares ([`imagepipe_runtime::step::codes`]).
pub mod codes {
    /// The bytes are not an image.
    pub const NOT_AN_IMAGE: &str = "not_an_image";
    /// The body or blob is larger than `download.max_bytes`.
    pub const TOO_LARGE: &str = "too_large";
    /// A connect, read (no byte for `download.read_timeout`) or total timeout ran out.
    pub const TIMEOUT: &str = "timeout";
    /// The SSRF guard refused an address the URL leads to; the message names the setting that
    /// would allow it (`download.allow_cidrs`).
    pub const ADDRESS_REFUSED: &str = "address_refused";
    /// The URL is unusable (does not parse, has no host, or a scheme other than http/https).
    pub const INVALID_URL: &str = "invalid_url";
    /// More redirects than `download.max_redirects`.
    pub const TOO_MANY_REDIRECTS: &str = "too_many_redirects";
    /// A redirect with a missing or unusable `Location`.
    pub const BAD_REDIRECT: &str = "bad_redirect";
    /// The host name could not be resolved.
    pub const DNS_FAILED: &str = "dns_failed";
    /// No connection could be made.
    pub const CONNECT_FAILED: &str = "connect_failed";
    /// The connection failed during the transfer.
    pub const TRANSFER_FAILED: &str = "transfer_failed";
}

/// Why an image could not be downloaded or validated.
#[derive(Debug, thiserror::Error)]
pub enum DownloadError {
    /// The request did not produce a response (refused address, timeout, connection, size, ...).
    #[error(transparent)]
    Fetch(#[from] FetchError),
    /// The server answered with a status other than 2xx.
    #[error("{url}: the server answered {status}")]
    Status {
        /// The URL that answered (after redirects).
        url: String,
        /// Its status.
        status: StatusCode,
        /// The delay its `Retry-After` asked for, capped at [`MAX_RETRY_AFTER`].
        retry_after: Option<Duration>,
    },
    /// The bytes are not an image.
    #[error("not an image (detected: {detected})")]
    NotAnImage {
        /// What they looked like.
        detected: &'static str,
    },
    /// An uploaded blob is larger than `download.max_bytes`.
    #[error("the blob is {size} bytes, over the limit of {limit}")]
    BlobTooLarge {
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The command's blob key is malformed.
    #[error("the command's blob key: {0}")]
    InvalidBlobKey(#[from] InvalidBlobKey),
    /// The blob store failed or lacks the blob.
    #[error(transparent)]
    Blob(#[from] BlobError),
    /// The download was not started: its host is at its politeness limits. Reported as a
    /// deferral (the same attempt is sent again later, charging nothing), not as a failure.
    #[error("the host is at its limits: {0}")]
    Deferred(#[from] Deferral),
}

impl DownloadError {
    /// The stable code of the step result.
    pub fn code(&self) -> String {
        let code = match self {
            DownloadError::Fetch(error) => match error {
                FetchError::InvalidUrl { .. } | FetchError::Scheme { .. } => codes::INVALID_URL,
                FetchError::Refused { .. } | FetchError::DialRefused { .. } => codes::ADDRESS_REFUSED,
                FetchError::Resolve { .. } => codes::DNS_FAILED,
                FetchError::TooManyRedirects { .. } => codes::TOO_MANY_REDIRECTS,
                FetchError::BadRedirect { .. } => codes::BAD_REDIRECT,
                FetchError::TooLarge { .. } => codes::TOO_LARGE,
                FetchError::Timeout { .. } => codes::TIMEOUT,
                FetchError::Connect { .. } => codes::CONNECT_FAILED,
                FetchError::Transport { .. } => codes::TRANSFER_FAILED,
            },
            DownloadError::Status { status, .. } => return format!("http_{}", status.as_u16()),
            DownloadError::NotAnImage { .. } => codes::NOT_AN_IMAGE,
            DownloadError::BlobTooLarge { .. } => codes::TOO_LARGE,
            DownloadError::InvalidBlobKey(_) => step::codes::INVALID_BLOB_KEY,
            DownloadError::Blob(error) => step::blob_code(error),
            DownloadError::Deferred(deferral) => deferral.code,
        };
        code.to_owned()
    }

    /// Whether a later attempt may succeed: timeouts, connection and DNS failures, 5xx, 408,
    /// 425 and 429, blob store I/O, and a deferral (which is not even an attempt). Everything
    /// else (404, 410, 403, other 4xx, not an image, too large, refused addresses) fails the
    /// task at once.
    pub fn is_retryable(&self) -> bool {
        match self {
            DownloadError::Deferred(_) => true,
            DownloadError::Fetch(error) => error.is_retryable(),
            DownloadError::Status { status, .. } => {
                status.is_server_error() || matches!(status.as_u16(), 408 | 425 | 429)
            }
            DownloadError::Blob(BlobError::Io { .. }) => true,
            _ => false,
        }
    }

    /// The least delay before the next attempt, from the server's `Retry-After` (or, for a
    /// deferral, when the host's limits may let it start).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            DownloadError::Status { retry_after, .. } => *retry_after,
            DownloadError::Deferred(deferral) => Some(deferral.retry_after),
            _ => None,
        }
    }

    /// The error as a step result reports it: its code, and its message with every cause.
    pub fn to_step_error(&self) -> StepError {
        StepError::new(self.code(), crate::error_chain(self))
    }
}

impl From<DownloadError> for StepFailure {
    fn from(error: DownloadError) -> Self {
        if let DownloadError::Deferred(deferral) = &error {
            return StepFailure::deferred(deferral.code, deferral.to_string(), deferral.retry_after);
        }
        let retry_after = error.retry_after();
        let step_error = error.to_step_error();
        if error.is_retryable() {
            StepFailure::Retryable { error: step_error, retry_after }
        } else {
            StepFailure::Permanent(step_error)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, retry_after: Option<u64>) -> DownloadError {
        DownloadError::Status {
            url: "http://example.com/a.jpg".into(),
            status: StatusCode::from_u16(code).unwrap(),
            retry_after: retry_after.map(Duration::from_secs),
        }
    }

    #[test]
    fn statuses_are_classified() {
        for code in [403, 404, 410, 400, 401, 451, 304] {
            let error = status(code, None);
            assert!(!error.is_retryable(), "{code}");
            assert_eq!(error.code(), format!("http_{code}"));
        }
        for code in [500, 502, 503, 504, 408, 429] {
            assert!(status(code, None).is_retryable(), "{code}");
        }
        assert_eq!(status(503, Some(7)).retry_after(), Some(Duration::from_secs(7)));
    }

    #[test]
    fn a_deferral_is_reported_as_deferred_not_as_a_failure() {
        let deferral = Deferral {
            code: "host_busy",
            host: "example.com:443".into(),
            detail: "4 of 4 downloads running (waited 2s)".into(),
            retry_after: Duration::from_millis(750),
        };
        let error = DownloadError::from(deferral);
        assert_eq!((error.code().as_str(), error.retry_after()), ("host_busy", Some(Duration::from_millis(750))));
        assert_eq!(
            StepFailure::from(error),
            StepFailure::deferred(
                "host_busy",
                "example.com:443: 4 of 4 downloads running (waited 2s)",
                Duration::from_millis(750)
            )
        );
    }

    #[test]
    fn not_an_image_names_what_was_found() {
        let error = DownloadError::NotAnImage { detected: "text" };
        assert_eq!(error.to_step_error(), StepError::new("not_an_image", "not an image (detected: text)"));
        assert!(!error.is_retryable());
    }
}
