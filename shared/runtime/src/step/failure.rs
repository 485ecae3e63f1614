//! How a step attempt failed ([`StepFailure`]), and the failures every step shares: those of
//! the blob store, with their stable [`codes`].

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use imagepipe_blob::{BlobError, BlobKey, BlobStore, InvalidBlobKey};
use imagepipe_contracts::StepError;

use crate::worker::error_chain;

/// Stable error codes of blob store failures, the same in every step (the `code` of their
/// [`StepError`]s).
pub mod codes {
    /// The command's blob key is not a blob key.
    pub const INVALID_BLOB_KEY: &str = "invalid_blob_key";
    /// No blob is stored under the command's key.
    pub const BLOB_NOT_FOUND: &str = "blob_not_found";
    /// The stored blob does not hash to its key.
    pub const BLOB_CORRUPT: &str = "blob_corrupt";
    /// Reading or writing the blob store failed (retryable).
    pub const BLOB_IO: &str = "blob_io";
}

/// How a step attempt failed; the step result reports it to the coordinator, which retries
/// or fails the task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepFailure {
    /// A later attempt may succeed (timeouts, 5xx, store I/O).
    Retryable {
        /// What went wrong.
        error: StepError,
        /// The least delay before the next attempt, when the cause asked for one.
        retry_after: Option<Duration>,
    },
    /// No attempt can succeed for this input (404, not an image, too large): the task fails.
    Permanent(StepError),
    /// The step was not started (its host is at its politeness limit): the coordinator sends
    /// the same attempt again after `retry_after`, charging nothing.
    Deferred {
        /// Why it waits.
        reason: StepError,
        /// When to send it again.
        retry_after: Duration,
    },
}

impl StepFailure {
    /// A retryable failure with code `code`, retried after the coordinator's backoff.
    pub fn retryable(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Retryable { error: StepError::new(code, message), retry_after: None }
    }

    /// A permanent failure with code `code`.
    pub fn permanent(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Permanent(StepError::new(code, message))
    }

    /// The command's blob key does not parse: permanent.
    pub fn invalid_blob_key(error: &InvalidBlobKey) -> Self {
        Self::permanent(codes::INVALID_BLOB_KEY, format!("the command's blob key: {error}"))
    }

    /// A deferral with code `code`, sent again after `retry_after`.
    pub fn deferred(code: impl Into<String>, message: impl Into<String>, retry_after: Duration) -> Self {
        Self::Deferred { reason: StepError::new(code, message), retry_after }
    }

    /// What went wrong (or, for a deferral, why it waits).
    pub fn error(&self) -> &StepError {
        match self {
            Self::Retryable { error, .. } | Self::Permanent(error) | Self::Deferred { reason: error, .. } => error,
        }
    }

    /// Whether a later attempt may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Retryable { .. } | Self::Deferred { .. })
    }
}

impl fmt::Display for StepFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error().fmt(f)
    }
}

/// The bytes of the blob a command names by `key`: the failure every step reports the same way
/// when the key is malformed or the store fails.
pub async fn read_blob(blobs: &dyn BlobStore, key: &str) -> Result<Bytes, StepFailure> {
    let key: BlobKey = key.parse().map_err(|e| StepFailure::invalid_blob_key(&e))?;
    Ok(blobs.get(&key).await?)
}

/// The stable code of a blob store failure.
pub fn blob_code(error: &BlobError) -> &'static str {
    match error {
        BlobError::NotFound(_) => codes::BLOB_NOT_FOUND,
        BlobError::Corrupt { .. } => codes::BLOB_CORRUPT,
        BlobError::Io { .. } => codes::BLOB_IO,
    }
}

impl From<BlobError> for StepFailure {
    /// A missing or corrupt blob is permanent; store I/O is retryable.
    fn from(error: BlobError) -> Self {
        let step_error = StepError::new(blob_code(&error), error_chain(&error));
        match error {
            BlobError::Io { .. } => Self::Retryable { error: step_error, retry_after: None },
            BlobError::NotFound(_) | BlobError::Corrupt { .. } => Self::Permanent(step_error),
        }
    }
}

#[cfg(test)]
mod tests {
    use imagepipe_blob::BlobKey;

    use super::*;

    #[test]
    fn blob_failures_carry_their_codes_and_retryability() {
        let key: BlobKey = "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".parse().unwrap();
        let missing = StepFailure::from(BlobError::NotFound(key));
        assert_eq!((missing.error().code.as_str(), missing.is_retryable()), ("blob_not_found", false));
        let io = StepFailure::from(BlobError::Io { path: "ab/cd".into(), source: std::io::Error::other("disk gone") });
        assert!(io.is_retryable());
        assert_eq!(io.error().code, "blob_io");
        assert!(io.error().message.contains("disk gone"), "{io}");
    }
}
